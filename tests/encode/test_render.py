"""``render.stage_batch`` (a batch's common chats rendered together) against ``render.stage`` one example at a time:
the same Staged (texts, nodes, parents, spans) or the same located RecordError for every example, and the same
renderings counted in ``ChatTemplate.paths``, on random batches of linear conversations, one-level and deeper
trees, text records, records with tools, image parts and marker characters."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import Example, ImageRef, Message, Node
from packer.encode.draft import batch_tokens
from packer.encode.encoder import FAST_PATHS, Encoder
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


_LOSSES = st.lists(st.sampled_from([None, None, None, None, True, False, 0.5, 2.0]), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def offsets_encoder(tok) -> Encoder:
    """qwen2-vl without byte lengths: the loss rule from the HF tokenizer's offsets, one text at a time."""
    return Encoder(tok, get_profile("qwen2-vl"), fast=set(FAST_PATHS) - {"byte-lengths", "fastokens"})


@pytest.mark.parametrize("name", ["qwen2-vl", "text", "molmo2", "offsets"])
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(records=st.lists(_RECORD, max_size=10), losses=_LOSSES)
def test_batch_tokens_from_loss_columns(encoders, offsets_encoder, name, records, losses):
    """``draft.batch_tokens`` of ``stage_batch``'s Staged (their loss messages as columns, ``LossColumns``,
    where a path's messages follow the default loss rule) equals it of ``stage``'s (every node's assistant
    spans picked in Python): the same ids, labels and weights, on random batches with messages' own ``loss``
    (weights, False, True), images, trees, tools and non-ASCII texts. A Staged marked ``plain`` holds only
    one-text messages."""
    encoder, image = encoders["qwen2-vl"] if name == "offsets" else encoders[name]
    if name == "offsets":
        encoder = offsets_encoder
    chat = encoder._chat
    examples = [_example(r, line, image) for line, r in enumerate(records, start=1)]
    # a node of no message is no parser's (``empty_branch``), and ``batch_tokens``' per-node rule reads one as
    # the whole path's (``spans[-0:]``): such records are left out
    examples = [e for e in examples if all(n.messages for n, _ in e.root.walk()) or e.kind == "text"]
    k = 0
    for example in examples:
        for node, _ in example.root.walk():
            for m in node.messages:
                m.loss = losses[k % len(losses)]
                k += 1
    batch = stage_batch(examples, chat, encoder.profile)
    alone = _one_by_one(examples, chat, encoder.profile)
    good = [k for k, s in enumerate(batch) if not isinstance(s, RecordError)]
    assert good == [k for k, s in enumerate(alone) if not isinstance(s, RecordError)]
    texts: list[str] = []
    for k in good:
        batch[k].first = alone[k].first = len(texts)
        texts.extend(batch[k].texts)
        if batch[k].plain:
            assert all(len(m.parts) == 1 and isinstance(m.parts[0], str) and not m.tool_calls
                       for node in batch[k].nodes for m in node.messages)
    encodings = encoder._tokenize(texts)
    got = batch_tokens(encoder.context, [batch[k] for k in good], texts, encodings)
    want = batch_tokens(encoder.context, [alone[k] for k in good], texts, encodings)
    assert got.starts == want.starts
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.labels, want.labels)
    assert (got.weights is None) == (want.weights is None)
    if got.weights is not None:
        np.testing.assert_array_equal(got.weights, want.weights)


def test_loss_columns_take_the_common_chats(encoders):
    """A text chat and a one-level tree with no message's own ``loss`` give their loss messages as columns; one
    with a ``loss`` anywhere does not (``batch_tokens``' per-node rule); the labels are the same either way."""
    encoder, _ = encoders["text"]
    chat = encoder._chat
    linear = Example(Node([Message("user", ["Hi"]), Message("assistant", ["Hello"])], []), "messages", "t.jsonl", 1)
    tree = Example(Node([Message("user", ["Q"])], [Node([Message("assistant", [a])], []) for a in "ab"]),
                   "messages", "t.jsonl", 2)
    weighted = Example(Node([Message("user", ["Q"]), Message("assistant", ["A"], loss=0.5)], []), "messages",
                       "t.jsonl", 3)
    got = stage_batch([linear, tree, weighted], chat, encoder.profile)
    assert [s.loss is not None for s in got] == [True, True, False] and all(s.plain for s in got)
    assert got[0].loss is got[1].loss and (got[0].loss_at, got[1].loss_at) == (0, 1)
    texts: list[str] = []
    for s in got:
        s.first = len(texts)
        texts.extend(s.texts)
    tokens = batch_tokens(encoder.context, got, texts, encoder._tokenize(texts))
    alone = [stage(e, chat, encoder.profile) for e in (linear, tree, weighted)]
    for s, a in zip(got, alone, strict=True):
        a.first = s.first
    want = batch_tokens(encoder.context, alone, texts, encoder._tokenize(texts))
    np.testing.assert_array_equal(tokens.labels, want.labels)
    np.testing.assert_array_equal(tokens.weights, want.weights)
