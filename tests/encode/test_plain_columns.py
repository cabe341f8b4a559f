"""The ``plain-columns`` fast path (a chunk's plain records from their JSONL lines to rows as columns) against the
general path it must equal: ``formats.read.text_chats`` takes exactly the lines ``parse_lines`` reads as a plain
record (``parse_plain``'s: no key it does not know) that is a chat whose every message is one text (linear or one
level of branches), with the same messages, or a text record, with the same text; ``Encoder.encode_chats`` and
``encode_texts`` give each record they finish the Encoded ``encode_batch`` gives it; and ``stages.encode_chunk`` with the path writes the same chunk file, rejects and
counts as without it. Random chunks mix such chats with roles a template
writes otherwise, special-token and marker text, images, text records, ids, branches of every shape, bad JSON,
blank lines and line 1, under ChatML templates with and without a default system prompt, a prefix and mRoPE."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import BuildConfig
from packer.core.types import Example, Node
from packer.encode.encoder import FAST_PATHS, Encoder
from packer.encode.finish import Row
from packer.encode.templates import CLOSE, OPEN
from packer.errors import RecordError
from packer.formats.plain import parse_plain
from packer.formats.read import parse_lines, text_chats
from packer.models import get_profile
from packer.pipeline import stages
from packer.pipeline.cache import EncodeCache
from packer.pipeline.faults import Hooks
from tests.encode.helpers import assert_same, builtin, nonempty, text

_GENERAL: dict[int, Encoder] = {}  # each module encoder without the path (made once: a native tokenizer each)
_PER_RECORD: dict[int, Encoder] = {}


def _per_record(encoder: Encoder) -> Encoder:
    """``encoder`` finishing every record by ``Encoder._finish`` (no ``batch-finish``, which this path reuses):
    the reference, made once per encoder."""
    if id(encoder) not in _PER_RECORD:
        _PER_RECORD[id(encoder)] = encoder.replace(fast=set(FAST_PATHS) - {"batch-finish", "plain-columns"})
    return _PER_RECORD[id(encoder)]


_ROLE = st.sampled_from(["user", "assistant", "user", "assistant", "system", "human", "gpt", "tool", "narrator"])
_LISTED = st.builds(lambda t: [{"type": "text", "text": t}], nonempty)  # OpenAI's parts: one text, taken as one
_SAID = st.one_of(nonempty, nonempty, nonempty, _LISTED)
_CONTENT = st.one_of(nonempty, nonempty, nonempty, nonempty, text, st.just(7), _LISTED, st.sampled_from([
    [{"type": "text", "text": ""}, {"type": "text", "text": "part"}],  # one text among empty ones: one text
    [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],  # two texts: the general path's
    [{"type": "text", "text": ""}], [], [{"type": "text", "text": 3}], [{"type": "text", "txt": "a"}],
    [{"type": "text", "text": "a", "x": 1}], [{"type": "image", "image": "a.jpg"}], ["a"]]))
_MESSAGE = st.one_of(*[st.builds(lambda r, c: {"role": r, "content": c}, _ROLE, _CONTENT)] * 12,
                     st.just({"role": "user"}), st.just({"role": "user", "content": "x", "loss": False}),
                     st.just({"role": ["user"], "content": "x"}), st.just("ab"))
_NODE = st.lists(_MESSAGE, min_size=0, max_size=4)
_TURN = st.builds(lambda q, a: [{"role": "user", "content": q}, {"role": "assistant", "content": a}], _SAID, _SAID)
_SYSTEM = st.lists(st.builds(lambda c: {"role": "system", "content": c}, nonempty), max_size=1)
_GOOD = st.builds(lambda s, turns: s + [m for t in turns for m in t], _SYSTEM, st.lists(_TURN, min_size=1, max_size=2))
_ANSWERS = st.lists(st.lists(st.builds(lambda a: {"role": "assistant", "content": a}, _SAID), min_size=1, max_size=2),
                    min_size=1, max_size=3)


@st.composite
def _line(draw, image: str) -> bytes:
    """One JSONL line: mostly a chat (maybe with an id and branches), else another record or no JSON."""
    kind = draw(st.sampled_from(["good"] * 6 + ["tree"] * 2 + ["chat"] * 3 + ["image", "text", "other", "bad", "blank"]))
    if kind in ("good", "tree"):  # a chat the path finishes, mostly (a tree: a question, answers as branches)
        rec = {"messages": draw(_GOOD)} if kind == "good" else {
            "messages": [{"role": "user", "content": draw(nonempty)}], "branches": draw(_ANSWERS)}
        return json.dumps(rec, ensure_ascii=draw(st.booleans())).encode()
    if kind == "blank":
        return draw(st.sampled_from([b"", b"  ", b"\t"]))
    if kind == "bad":
        return draw(st.sampled_from([b"{", b"[1, 2", b'{"messages": [}', b"nope", b"\xff\xfe"]))
    if kind == "text":
        doc = {"text": draw(st.one_of(text, text, st.just(3)))}
        if draw(st.booleans()):
            doc["id"] = draw(st.sampled_from(["d1", 2, None, 1.5]))
        return json.dumps(doc).encode()
    if kind == "other":
        return json.dumps(draw(st.sampled_from([[1, 2], "chat", {"conversations": []}, {"messages": None}]))).encode()
    rec: dict = {"messages": draw(st.one_of(_NODE, _NODE, _NODE, st.just("x")))}
    if kind == "image":
        rec["messages"] = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "?"}]},
                           {"role": "assistant", "content": draw(nonempty)}]
    if draw(st.booleans()):
        rec["id"] = draw(st.sampled_from(["r1", 5, None, True, 1.5, ["x"]]))
    if draw(st.integers(0, 3)) == 0:
        rec["branches"] = draw(st.one_of(st.lists(_NODE, max_size=3), st.just(None), st.just("b")))
    if draw(st.integers(0, 9)) == 0:
        rec["extra"] = 1
    return json.dumps(rec, ensure_ascii=draw(st.booleans())).encode()


def _lines(draw_lines: list[bytes]) -> list[tuple[int, bytes]]:
    return list(enumerate(draw_lines, start=1))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_text_chats_takes_exactly_the_plain_records_parse_lines_reads(data, img):
    lines = _lines(data.draw(st.lists(_line(str(img)), max_size=12)))
    chats, rest = text_chats(lines)
    parsed = {p.line: p for p in parse_lines(lines, path="t.jsonl", base_dir=str(img.parent))}
    assert sorted([*chats.lines, *chats.doc_lines, *(line for line, _ in rest)]) == sorted(parsed)  # each once
    assert [line for line, _ in rest] == sorted(line for line, _ in rest)
    for line, raw in rest:  # the general path's: line 1, a reject, another kind, or a record parse_plain leaves
        one = parsed[line]  # (an unknown key: parse_record reads it, the same chat)
        assert line == 1 or isinstance(one, RecordError) or not (_text_chat(one) or one.kind == "text") or _plain(
            raw, line, img.parent) is None
    for line, raw, doc in zip(chats.doc_lines, chats.doc_raws, chats.docs, strict=True):
        one = parsed[line]
        assert raw == dict(lines)[line] and isinstance(one, Example) and (one.kind, one.text) == ("text", doc)
    at = roles_at = 0
    for k, line in enumerate(chats.lines):
        one = parsed[line]
        assert chats.raws[k] == dict(lines)[line] and _text_chat(one)
        nodes = [one.root, *one.root.children]
        assert chats.nodes[k] == len(nodes)
        for node, count in zip(nodes, chats.counts[at : at + len(nodes)], strict=True):
            assert count == len(node.messages)
            for m in node.messages:
                assert (chats.roles[roles_at], [chats.contents[roles_at]]) == (m.role, m.parts)
                roles_at += 1
        at += len(nodes)
    assert at == len(chats.counts) and roles_at == len(chats.roles) == len(chats.contents)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_parse_lines_reads_the_values_text_chats_read_as_it_reads_the_lines(data, img):
    """The rest of ``text_chats`` with the JSON values it read (``TextChats.values``): ``parse_lines`` gives what it
    gives reading every line itself, and takes each value once."""
    lines = _lines(data.draw(st.lists(_line(str(img)), max_size=12)))
    chats, rest = text_chats(lines)
    assert set(chats.values) <= {line for line, _ in rest}
    values = dict(chats.values)
    kw = {"path": "t.jsonl", "base_dir": str(img.parent)}
    assert repr(list(parse_lines(rest, values=values, **kw))) == repr(list(parse_lines(rest, **kw)))
    assert not values


@pytest.mark.parametrize(("content", "taken"), [
    ("hi", True), ([{"type": "text", "text": "hi"}], True),
    ([{"type": "text", "text": ""}, {"type": "text", "text": "hi"}, {"type": "text", "text": ""}], True),
    ([{"type": "text", "text": "hi"}, {"type": "text", "text": "hi"}], False), ("", False), ([], False),
    ([{"type": "text", "text": ""}], False), ([{"type": "text", "text": "hi", "x": 1}], False),
    ([{"type": "text", "text": 3}], False), ([{"text": "hi", "kind": "text"}], False),
    ([{"type": "image", "image": "000000397133.jpg"}], False),
    ([{"type": "text", "text": "hi"}, {"type": "image", "image": "000000397133.jpg"}], False)])
def test_text_chats_takes_a_part_list_of_one_text(content, taken, img):
    """OpenAI-style content lists: the chat is the path's where ``parse_plain`` reads every message as one text
    (the empty text parts dropped), with the text ``parse_lines`` reads; else the general path's (a part of other
    keys is ``parse_record``'s, which may read it as a text too)."""
    raw = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]})
    chats, rest = text_chats([(2, raw.encode())])
    plain = _plain(raw.encode(), 2, img.parent)
    assert (chats.lines == [2], [r for r, _ in rest] == [2]) == (taken, not taken)
    assert (plain is not None and _text_chat(plain)) == taken
    if taken:
        (one,) = parse_lines([(2, raw.encode())], path="t.jsonl", base_dir=str(img.parent))
        assert chats.contents == ["q", "hi"] == [m.parts[0] for m in one.root.messages]


def _plain(raw: bytes, line: int, root: Path) -> Example | None:
    """What ``parse_plain`` reads a line as, as ``parse_lines`` gives it orjson's value (None: not a plain record,
    or not JSON)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parse_plain(obj, path="t.jsonl", line=line, root_dir=str(root))


def _text_chat(one) -> bool:
    """Whether a parsed record is a chat of one-text messages, linear or with one level of branches."""
    if not isinstance(one, Example) or one.kind != "messages" or one.tools:
        return False
    nodes = [one.root, *one.root.children]
    return all(not c.children for c in one.root.children) and all(
        m.loss is None and m.tool_calls is None and len(m.parts) == 1 and isinstance(m.parts[0], str)
        for node in nodes for m in node.messages)


@pytest.fixture(scope="module")
def chat_encoders(tok) -> dict[str, Encoder]:
    """ChatML renderers: qwen2-vl's (a default system prompt, mRoPE, images elsewhere), qwen2.5's (tool turns left
    to Jinja), molmo2's (a bos prefix, no default system prompt), qwen3-vl's (mRoPE, no default system prompt);
    a short max_length so that some records are over it."""
    return {"qwen2-vl": Encoder(tok, get_profile("qwen2-vl", max_pixels=64 * 28 * 28), max_length=96),
            "text": Encoder(builtin("qwen2.5"), get_profile("text"), max_length=96),
            "molmo2": Encoder(builtin("molmo2"), get_profile("molmo2"), max_length=96),
            "qwen3-vl": Encoder(builtin("qwen3-vl"), get_profile("qwen3-vl"))}


@pytest.mark.parametrize("name", ["qwen2-vl", "text", "molmo2", "qwen3-vl"])
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_encode_chats_equals_the_per_record_finish(chat_encoders, img, name, data):
    encoder = chat_encoders[name]
    assert encoder.takes_chats()
    lines = _lines(data.draw(st.lists(_line(str(img)), max_size=12)))
    chats, _ = text_chats(lines)
    block, records, rows = encoder.encode_chats(chats.nodes, chats.counts, chats.roles, chats.contents)
    assert chats.lines or block is None
    parsed = {p.line: p for p in parse_lines(lines, path="t.jsonl", base_dir=str(img.parent))}
    examples = [parsed[line] for line in chats.lines]
    want = _per_record(encoder).encode_batch(examples) if examples else []
    taken = dict(zip(records.tolist(), rows.tolist(), strict=True))
    renderer = encoder._chat._fast
    for k, (line, example, reference) in enumerate(zip(chats.lines, examples, want, strict=True)):
        if k in taken:
            assert_same(Row(block, taken[k], f"t.jsonl:{line}", "").encoded(), reference)
        elif not isinstance(reference, RecordError):  # what the finish leaves the general path rejects; an example
            # it finishes was left by the renderer: a role it does not write as a plain turn, or a marker
            messages = [m for node in (example.root, *example.root.children) for m in node.messages]
            assert any(renderer._head(m.role) is None or OPEN in m.parts[0] or CLOSE in m.parts[0] for m in messages)


@pytest.mark.parametrize("name", ["qwen2-vl", "text", "molmo2"])
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(docs=st.lists(st.one_of(nonempty, nonempty, st.just("x " * 120), st.just("<|image_pad|> a")), max_size=8))
def test_encode_texts_equals_the_per_record_finish(chat_encoders, name, docs):
    encoder = chat_encoders[name]
    block, rows = encoder.encode_texts(docs)
    want = _per_record(encoder).encode_batch([Example(Node([], []), "text", "t.jsonl", k + 2, text=d)
                                               for k, d in enumerate(docs)])
    taken = set(rows.tolist())
    for k, reference in enumerate(want):
        if k in taken:
            assert_same(Row(block, k, f"t.jsonl:{k + 2}", "").encoded(), reference)
        else:  # over max_length (split or dropped there), a literal placeholder, or too short: not a lone Encoded
            assert isinstance(reference, (RecordError, list)) or reference.input_ids.shape[0] > 96


def test_encode_chats_finishes_linear_chats_and_one_level_trees(chat_encoders):
    encoder = chat_encoders["qwen2-vl"]
    lines = _lines([b"", *(json.dumps(r).encode() for r in [  # (line 1 is ``parse_line``'s: a byte-order mark)
        {"id": 0, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q"}],
         "branches": [[{"role": "assistant", "content": "A."}], [{"role": "gpt", "content": "B."}]]},
        {"messages": [{"role": "user", "content": "no answer"}]},  # no loss token: the general path rejects it
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x " * 200}]},  # too long
    ])])
    chats, rest = text_chats(lines)
    assert chats.lines == [2, 3, 4, 5] and rest == [] and chats.nodes == [1, 3, 1, 1] and chats.counts[:4] == [2, 2, 1, 1]
    before = encoder.path_counts()["plain-columns"]
    block, records, rows = encoder.encode_chats(chats.nodes, chats.counts, chats.roles, chats.contents)
    assert records.tolist() == [0, 1] and encoder.path_counts()["plain-columns"] - before == 2
    tree = Row(block, int(rows[1]), "t.jsonl:3", "").encoded()
    assert tree.node_parents.tolist() == [-1, 0, 0] and tree.position_ids[tree.node_offsets[2]] == tree.node_offsets[1]


def _chunk_files(tmp: Path, lines: list[bytes], encoder: Encoder, *, strict: bool = False, name: str = "c"
                 ) -> tuple[list[bytes], object]:
    """Each encoder's ``stages.encode_chunk`` of one chunk holding ``lines``: the chunk file's and the rejects'
    bytes and the counts, or the error it raised."""
    corpus = tmp / f"{name}.jsonl"
    first = json.dumps({"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]})
    corpus.write_bytes(b"\n".join([first.encode(), *lines]) + b"\n")  # (a file opening with "[" is an array)
    config = BuildConfig.from_inputs([str(corpus)], str(tmp / f"{name}-out"), profile=encoder.profile.name,
                                     max_length=encoder.max_length, strict=strict)
    (chunk,) = stages.scan_chunks(config)
    out = []
    if id(encoder) not in _GENERAL:
        _GENERAL[id(encoder)] = encoder.replace(fast=set(FAST_PATHS) - {"plain-columns"})
    for k, one in enumerate((encoder, _GENERAL[id(encoder)])):
        cache = EncodeCache(tmp / f"{name}-cache{k}", 1)
        cache.root.mkdir()
        try:
            counts = stages.encode_chunk(chunk, encoder=one, cache=cache, config=config, hooks=Hooks())
        except RecordError as e:
            out.append(("raised", e.reason, e.path, e.line))
            continue
        out.append((cache.arrow(0).read_bytes(), cache.rejects_file(0).read_bytes(), counts))
    return out


@pytest.mark.parametrize("name", ["qwen2-vl", "text"])
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_a_chunk_with_plain_columns_is_the_chunk_without(chat_encoders, img, tmp_path_factory, name, data):
    lines = data.draw(st.lists(_line(str(img)), min_size=6, max_size=16))
    strict = data.draw(st.integers(0, 4)) == 0
    with_path, without = _chunk_files(tmp_path_factory.mktemp("chunk"), lines, chat_encoders[name], strict=strict)
    assert with_path == without


def test_a_mixed_chunk_with_plain_columns_is_the_general_paths_file(chat_encoders, img, tmp_path):
    """Chunk files byte for byte on a chunk of every kind of line, the path's rows merged into line order."""
    encoder = chat_encoders["qwen2-vl"]
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image", "image": str(img)}]},
                          {"role": "assistant", "content": "A photo."}]}
    tree = {"messages": [{"role": "user", "content": "Q"}], "branches": [[{"role": "assistant", "content": "A."}],
                                                                          [{"role": "assistant", "content": "B."}]]}
    lines = [json.dumps(chat).encode(), b"", json.dumps(image).encode(), json.dumps(tree).encode(), b"{bad",
             json.dumps({"text": "a document"}).encode(), json.dumps(chat).encode(), json.dumps(image).encode()]
    with_path, without = _chunk_files(tmp_path, lines, encoder)
    assert with_path == without
    assert with_path[2].records == 8 and with_path[2].rejected == 1
