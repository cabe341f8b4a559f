"""``render.stage_batch`` (a batch's common chats rendered together) against ``render.stage`` one example at a time:
the same Staged (texts, nodes, parents, spans) or the same located RecordError for every example, and the same
renderings counted in ``ChatTemplate.paths``, on random batches of linear conversations, one-level and deeper
trees, text records, records with tools, image parts and marker characters."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import Example, ImageRef, Message, Node
from packer.encode.encoder import Encoder
from packer.encode.render import stage, stage_batch
from packer.errors import RecordError
from packer.models import get_profile
from tests.encode.helpers import builtin, text

_ROLES = st.sampled_from(["system", "user", "assistant", "user", "assistant", "tool"])
_PART = st.one_of(text, text, text, text, st.just(None), st.just(0))  # None: an image, 0: a missing image
_MESSAGES = st.lists(st.tuples(_ROLES, st.lists(_PART, min_size=1, max_size=2)), min_size=0, max_size=3)
_BRANCH = st.tuples(_MESSAGES, st.lists(_MESSAGES, max_size=2))  # a branch's messages and its own branches
# a root of no message is no parser's record (``ChatTemplate.locate`` refuses one: tests/encode/test_templates.py)
_ROOT = st.lists(st.tuples(_ROLES, st.lists(_PART, min_size=1, max_size=2)), min_size=1, max_size=3)
_RECORD = st.tuples(st.sampled_from(["messages", "messages", "messages", "text", "tools"]), _ROOT,
                    st.lists(_BRANCH, max_size=3), text)


@pytest.fixture(scope="module")
def encoders(tok, img) -> dict[str, tuple[Encoder, ImageRef]]:
    """qwen2-vl (a ChatML renderer, images), text (qwen2.5's template: ChatML with its tool turns left to Jinja),
    molmo2 (ChatML after its bos) and gemma3 (another renderer: every example takes ``stage``)."""
    image = ImageRef(path=str(img))
    return {"qwen2-vl": (Encoder(tok, get_profile("qwen2-vl")), image),
            "text": (Encoder(builtin("qwen2.5"), get_profile("text")), image),
            "molmo2": (Encoder(builtin("molmo2"), get_profile("molmo2")), image),
            "gemma3": (Encoder(builtin("gemma3"), get_profile("gemma3")), image)}


def _messages(spec, image: ImageRef) -> list[Message]:
    parts = {None: image, 0: ImageRef(path="/nonexistent/missing.jpg")}
    return [Message(role, [parts[p] if not isinstance(p, str) else p for p in ps]) for role, ps in spec]


def _example(record, line: int, image: ImageRef) -> Example:
    kind, root, branches, whole = record
    children = [Node(_messages(own, image), [Node(_messages(sub, image), []) for sub in subs]) for own, subs in branches]
    node = Node(_messages(root, image), children)
    if kind == "text":
        return Example(Node([], []), "text", "t.jsonl", line, text=whole)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}] if kind == "tools" else None
    return Example(node, "messages", "t.jsonl", line, tools=tools)


def _outcome(one):
    return ("reject", one.reason, one.message, one.path, one.line) if isinstance(one, RecordError) else one


def _one_by_one(examples, chat, profile) -> list:
    out = []
    for example in examples:
        try:
            out.append(stage(example, chat, profile))
        except RecordError as e:
            out.append(e if e.path else e.located(example.path, example.line))
    return out


@pytest.mark.parametrize("name", ["qwen2-vl", "text", "molmo2", "gemma3"])
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(records=st.lists(_RECORD, max_size=10))
def test_stage_batch_equals_stage(encoders, name, records):
    encoder, image = encoders[name]
    chat = encoder._chat
    examples = [_example(r, line, image) for line, r in enumerate(records, start=1)]
    before = Counter(chat.paths)
    want = [_outcome(s) for s in _one_by_one(examples, chat, encoder.profile)]
    one_by_one = Counter(chat.paths) - before
    before = Counter(chat.paths)
    got = [_outcome(s) for s in stage_batch(examples, chat, encoder.profile)]
    assert got == want
    assert Counter(chat.paths) - before == one_by_one


def test_stage_batch_takes_the_common_chats(encoders):
    """A linear text chat and a one-level tree of text branches are the batch's: no ``locate`` call each."""
    encoder, _ = encoders["qwen2-vl"]
    chat = encoder._chat
    linear = Example(Node([Message("user", ["Hi"]), Message("assistant", ["Hello"])], []), "messages", "t.jsonl", 1)
    tree = Example(Node([Message("user", ["Q"])], [Node([Message("assistant", [a])], []) for a in "abc"]),
                   "messages", "t.jsonl", 2)
    calls = []
    real = chat.locate
    chat.locate = lambda *a, **k: calls.append(a) or real(*a, **k)  # type: ignore[method-assign]
    try:
        got = stage_batch([linear, tree], chat, encoder.profile)
    finally:
        del chat.locate
    assert calls == []
    assert got == [stage(linear, chat, encoder.profile), stage(tree, chat, encoder.profile)]
    assert [len(s.texts) for s in got] == [1, 4] and got[1].parents == [-1, 0, 0, 0]
