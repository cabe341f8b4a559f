"""The parsing fast paths against the general paths they skip, on varied records: the same Example, or the same
reject (reason and message). ``chat_messages``' plain message vs ``chat_message``; ``chat.parse``'s record
with no pools, branches or tools vs the full checks; ``read._loads`` vs ``json.loads`` and its surrogate-escape regex vs two substring tests; ``common._file_type``
vs ``os.path.isdir`` / ``isfile``; the chunk reader's blank-line test vs ``bytes.strip``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import ImageRef
from packer.errors import RecordError
from packer.formats import parse_record
from packer.formats.common import Ctx, _file_type, chat_message, chat_messages
from packer.formats.read import _SURROGATE_ESCAPE, _loads

ROLE = st.sampled_from(["system", "user", "assistant", "tool", "human", "gpt", "bot", "", 1, None, ["user"]])
TEXT = st.sampled_from(["", "hi", " x ", "<image>", "a <image> b", "<video>", "\ue000", "é中🙂"])
PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.builds(lambda t: {"text": t}, TEXT),
    st.just({"type": "image"}),
    st.just({"type": "image", "image": "a.jpg"}),
    st.just({"type": "image", "image": "nope.jpg"}),
    st.just({"type": "text", "text": 5}),
    st.just({"type": "audio"}),
    st.just("x"),
)
CONTENT = st.one_of(TEXT, TEXT, st.lists(PART, max_size=3), st.sampled_from([None, 3, {"a": 1}]))
EXTRA = st.sampled_from([{}, {}, {}, {"loss": True}, {"loss": "yes"}, {"name": "f"}, {"tool_call_id": 1},
                         {"tool_calls": [{"function": {"name": "f", "arguments": {}}}]}, {"tool_calls": "x"}])


@st.composite
def message(draw):
    """A message dict: mostly ``{"role", "content"}`` (the fast path's shape, good or bad), sometimes a key
    missing or extra keys (the general path)."""
    msg = {"role": draw(ROLE), "content": draw(CONTENT)}
    shape = draw(st.sampled_from(["plain", "plain", "plain", "no role", "no content", "extra", "not a dict"]))
    if shape == "no role":
        del msg["role"]
    elif shape == "no content":
        del msg["content"]
    elif shape == "extra":
        msg.update(draw(EXTRA))
    elif shape == "not a dict":
        return [msg]
    return msg


GOOD = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "human", "gpt"]),
    "content": st.one_of(st.sampled_from(["hi", "a <image> b", "<video>"]),
                         st.lists(st.sampled_from([{"type": "text", "text": "x"}, {"type": "image"}]), min_size=1,
                                  max_size=2)),
})  # a valid message, so that what the record's other fields do shows


def outcome(fn):
    """What ``fn()`` gives: its value, or the reject's reason and message."""
    try:
        return fn()
    except RecordError as e:
        return (e.reason, e.message)


def ctx_for(root: Path, pool: str | None) -> Ctx:
    ctx = Ctx("in.jsonl", 3, str(root))
    if pool == "images":
        ctx.pool = [ImageRef(path=str(root / "a.jpg"))] * 2
    elif pool == "videos":
        ctx.video_pool = []
    return ctx


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(msg=message(), pool=st.sampled_from([None, None, "images", "videos"]))
def test_chat_messages_fast_path_equals_chat_message(msg, pool, tmp_path_factory):
    """One message through ``chat_messages`` (fast where it can) equals ``chat_message`` (every check), also
    where the record has placeholder pools (the fast path then leaves string content to ``content_parts``)."""
    root = tmp_path_factory.getbasetemp()
    (root / "a.jpg").touch()
    fast = outcome(lambda: chat_messages([msg], ctx_for(root, pool), "m"))
    general = outcome(lambda: [chat_message(msg, ctx_for(root, pool), "m[0]")])
    assert fast == general


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(messages=st.one_of(st.lists(st.one_of(GOOD, GOOD, message()), max_size=3), st.sampled_from(["x", None])),
       extra=st.sampled_from([{}, {}, {"id": 3}, {"id": [1]}, {"meta": {"a": 1}}, {"image": "a.jpg"},
                              {"images": ["a.jpg"]}, {"videos": []}, {"video": "v.mp4"},
                              {"tools": [{"function": {"name": "f"}}]}, {"tools": 3},
                              {"branches": [[{"role": "assistant", "content": "x"}]]}, {"branches": []}]))
def test_plain_chat_record_equals_full_checks(messages, extra, tmp_path_factory):
    """A chat record without pools, branches or tools (``chat.parse``'s fast path) parses as it does through
    every check: a None ``branches``, ``tools``, ``image`` or ``video`` is the same record to the parser but
    takes the general path. Records with pools, branches or tools check that the fast path leaves them alone."""
    root = tmp_path_factory.getbasetemp()
    (root / "a.jpg").touch()
    obj = {"messages": messages, **extra}

    def parsed(o):
        return outcome(lambda: parse_record(o, path="in.jsonl", line=3, base_dir=str(root)))

    for field in ("branches", "tools", "image", "video"):  # None there means absent ("image" loses to "images")
        if field not in obj:
            assert parsed(obj) == parsed({**obj, field: None}), field


LINES = [
    '{"a": 1}', '{"a": 1} ', ' {"a": 1}', '{"a": 1}\r', '{"a": 1}x', '{"a": 1}{}', "\ufeff{}", "", " ", "[1, 2]",
    '"s"', "3", "1e400", "nan", "NaN", '{"a": "\\ud800"}', '{"a": "\\x"}', '{"a": "b', '{"a" 1}', "[" * 5000,
    "1" * 5000, '{"a": 1, "a": 2}', "{}\u2028", "{}\x0b", "tru", "null",
]


@pytest.mark.parametrize("text", LINES)
def test_loads_equals_json_loads(text: str):
    """``_loads`` gives ``json.loads``' value, or its exception with the same message."""

    def run(fn):
        try:
            return ("ok", repr(fn(text)))
        except (ValueError, RecursionError) as e:
            return (type(e).__name__, str(e)[:200])

    assert run(_loads) == run(json.loads)


@given(obj=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                        max_leaves=10),
       ascii_only=st.booleans())
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
def test_loads_equals_json_loads_on_written_lines(obj, ascii_only: bool):
    text = json.dumps(obj, ensure_ascii=ascii_only)
    assert repr(_loads(text)) == repr(json.loads(text))


def test_file_type_answers_isdir_and_isfile(tmp_path: Path):
    """One stat gives what ``os.path.isdir`` then ``isfile`` gave (links followed, errors as "no")."""
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "d").mkdir()
    os.symlink(tmp_path / "f", tmp_path / "link")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    os.mkfifo(tmp_path / "fifo")
    for name in ["f", "d", "link", "dangling", "fifo", "missing", "f/below", "nul\0byte"]:
        path = str(tmp_path / name)
        kind = _file_type(path)
        assert (kind == 0o040000, kind == 0o100000) == (os.path.isdir(path), os.path.isfile(path)), name


@pytest.mark.parametrize("raw", [b"", b" ", b"\n", b"\t\r\x0b\x0c ", b"\xa0", b"\x1c", b"\x85", b" {} ", b"x"])
def test_blank_line_test_equals_strip(raw: bytes):
    """stages._chunk_records skips a line by ``not raw or raw.isspace()``: the lines ``not raw.strip()`` skipped."""
    assert (not raw or raw.isspace()) == (not raw.strip())


@pytest.mark.parametrize("text", ['"\\ud800"', '"\\uD83D"', '"\\u00e9"', '"\\\\ud"', '"ud"', "\\u", '"\\uDx"', "\ud800"])
def test_surrogate_escape_regex_equals_substring_tests(text: str):
    """parse_line looks for a lone surrogate escape only in lines the regex finds: those the two tests found."""
    assert bool(_SURROGATE_ESCAPE.search(text)) == ("\\ud" in text or "\\uD" in text)
