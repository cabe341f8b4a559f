"""The loss rule (labels.py): on hand-made arrays, and through the Encoder against the real Qwen2-VL
tokenizer and template with hand-derived expectations.

Every expected sequence is built piece by piece: ``tok.encode`` of a known string (a role header, a
content, ``<|im_end|>``), each piece marked loss or not by hand. Pieces are split where the tokenizer
splits anyway (special tokens, newlines), and each linear case is also checked against
``apply_chat_template(tokenize=True)``, so the expectations do not lean on the encoder.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.core.types import IGNORE_INDEX, Message
from packer.encode.encoder import Encoder
from packer.encode.labels import batch_loss_labels, carries_loss, loss_labels
from packer.encode.tokenize import (
    Boundaries,
    ByteOffsets,
    cached_token_byte_lengths,
    flat_ids,
    offset_boundaries,
    special_token_mask,
)
from packer.errors import RecordError
from packer.models import get_profile
from tests.encode.helpers import ALPHABET, SYS_DEFAULT, Seq, assert_encoded, example, msg

NO = IGNORE_INDEX
# Hand-made tokens of a 14-character text: [hdr, "He", "llo", END, "\n", hdr, "Hi", END]; END (id 9) is
# the only special token. Message 0's content "Hello" is characters [2, 7), message 1's "Hi" [11, 13).
IDS = np.array([1, 2, 3, 9, 4, 1, 5, 9], dtype=np.int32)
STARTS = [0, 2, 4, 7, 8, 9, 11, 13]  # first character of each token
SPECIAL = np.zeros(10, dtype=bool)
SPECIAL[9] = True


def labels(spans, *, n: int = 8, size: int = 14) -> list[int]:
    """loss_labels of the first ``n`` tokens (a text of ``size`` characters), boundaries from STARTS."""
    ends = [*STARTS[1:n], size]
    bounds = Boundaries(
        lambda c: next((t for t, e in enumerate(ends) if e > c), n),  # the first token ending after c
        lambda t, c: STARTS[t] < c,
    )
    out = loss_labels(IDS[:n], spans, is_special=SPECIAL, boundaries=bounds)
    assert out.dtype == np.int32
    return out.tolist()


def test_loss_labels_on_hand_made_tokens():
    # the content's tokens and the END after it carry loss; the "\n" and the next header do not
    assert labels([(2, 7, 11)]) == [NO, 2, 3, 9, NO, NO, NO, NO]
    # content ending inside a token ("Hel" ends inside "llo"): the token overlaps it, so it carries loss
    assert labels([(2, 5, 11)]) == [NO, 2, 3, 9, NO, NO, NO, NO]
    # no special token after the content before the text ends: nothing past the content
    assert labels([(11, 13, 13)], n=7, size=13) == [NO, NO, NO, NO, NO, NO, 5]
    # content end unknown (prefix fallback): from the content start to the message's last special token
    assert labels([(2, None, 14)]) == [NO, 2, 3, 9, 4, 1, 5, 9]
    assert labels([(2, 7, 11), (11, 13, 14)]) == [NO, 2, 3, 9, NO, NO, 5, 9]
    assert labels([]) == [NO] * 8


@st.composite
def spans_of(draw, size: int) -> list[tuple[int, int | None, int]]:
    """Loss spans over a text of ``size`` characters: (content start, end or None: unknown, limit), in order,
    some past the text's end (a message the text does not reach)."""
    cuts = sorted(draw(st.lists(st.integers(0, size + 2), max_size=9).map(lambda c: c[: len(c) // 3 * 3])))
    return [(a, None if draw(st.integers(0, 4)) == 0 else b, c) for a, b, c in zip(*[iter(cuts)] * 3, strict=True)]


@st.composite
def labeled_texts(draw) -> tuple[list[str], list[list]]:
    pieces = st.sampled_from(["<|im_start|>assistant\n", "<|im_end|>", "\n", "<|image_pad|>"])
    texts = draw(st.lists(st.lists(st.one_of(st.text(alphabet=ALPHABET, max_size=12), pieces), max_size=6)
                          .map("".join), min_size=1, max_size=5))
    return texts, [draw(spans_of(len(t))) for t in texts]


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=labeled_texts())
def test_batch_loss_labels_equal_loss_labels(tok, batch):
    """The loss rule for a whole batch at once (byte lengths) equals ``loss_labels`` one text at a time
    with boundaries from character offsets (the general path), including the fallback for an unknown content
    end, multi-byte characters, special tokens, spans past a text's end and empty texts (left to the caller)."""
    texts, spans = batch
    backend = tok.backend_tokenizer
    special = special_token_mask(tok)
    encs = [backend.encode(t, add_special_tokens=False) for t in texts]
    ids, starts = flat_ids(encs)
    offsets = ByteOffsets(ids, starts, cached_token_byte_lengths(backend, size=special.shape[0]))
    got, rest = batch_loss_labels(ids, starts, texts, spans, is_special=special, offsets=offsets)
    assert got.dtype == np.int32
    assert rest == [k for k, t in enumerate(texts) if spans[k] and not encs[k].ids]
    for k, (text, enc) in enumerate(zip(texts, encs, strict=True)):
        a, b = starts[k], starts[k + 1]
        want = loss_labels(ids[a:b], spans[k], is_special=special, boundaries=offset_boundaries(ids[a:b], enc, text))
        assert got[a:b].tolist() == want.tolist(), (text, spans[k])


def test_carries_loss():
    assert carries_loss(Message("assistant", ["a"])) and not carries_loss(Message("user", ["q"]))
    assert carries_loss(Message("user", ["q"], loss=True))
    assert not carries_loss(Message("assistant", ["a"], loss=False))


# ---------------------------------------------------------------- through the Encoder, real tokenizer


def test_multi_turn_default_system(tok, qwen):
    msgs = [
        msg("user", "Hi!"),
        msg("assistant", "Hello there."),
        msg("user", "Bye."),
        msg("assistant", "See you."),
    ]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).add(SYS_DEFAULT)
    seq.turn("user", "Hi!", False).turn("assistant", "Hello there.", True)
    seq.turn("user", "Bye.", False).turn("assistant", "See you.", True)
    assert_encoded(enc, seq)
    np.testing.assert_array_equal(
        enc.input_ids, tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    )
    np.testing.assert_array_equal(enc.position_ids, np.arange(enc.num_tokens))
    np.testing.assert_array_equal(enc.mrope_position_ids, np.tile(np.arange(enc.num_tokens), (3, 1)))
    assert enc.node_offsets.tolist() == [0] and enc.node_parents.tolist() == [-1] and enc.images == []
    assert enc.example_id == "t.jsonl:3"
    assert enc.num_loss_tokens == len(tok.encode("Hello there.See you.")) + 2


def test_system_prompt_and_multiline_content(tok, qwen):
    msgs = [
        msg("system", "Answer in French."),
        msg("user", "Count:\n1, 2"),
        msg("assistant", "Un,\n deux\n\n"),  # trailing newlines are content: they carry loss
    ]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).turn("system", "Answer in French.", False).turn("user", "Count:\n1, 2", False)
    seq.turn("assistant", "Un,\n deux\n\n", True)
    assert_encoded(enc, seq)
    np.testing.assert_array_equal(
        enc.input_ids, tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    )


def test_loss_overrides(tok, qwen):
    msgs = [
        msg("user", "Teach me.", loss=True),
        msg("assistant", "Old answer.", loss=False),
        msg("user", "Again."),
        msg("assistant", "New answer."),
    ]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).add(SYS_DEFAULT).turn("user", "Teach me.", True).turn("assistant", "Old answer.", False)
    seq.turn("user", "Again.", False).turn("assistant", "New answer.", True)
    assert_encoded(enc, seq)


def test_token_straddling_content_edges(tok, qwen):
    """A token that overlaps content carries loss (documented rule): multi-byte characters split into several
    byte tokens at the content's end, and a newline run that BPE merges across the header/content edge."""
    msgs = [msg("user", "Draw 𝄞"), msg("assistant", "𝄞 snow 𝄞")]
    enc = qwen.encode(example({"messages": msgs}))
    assert_encoded(
        enc, Seq(tok).add(SYS_DEFAULT).turn("user", "Draw 𝄞", False).turn("assistant", "𝄞 snow 𝄞", True)
    )
    # one character, several byte tokens at both content edges: all of them trained
    assert (
        len(tok.encode("𝄞", add_special_tokens=False)) == 2
        and len(tok.encode(" 𝄞", add_special_tokens=False)) == 3
    )
    # "assistant\n" + "\n\nHi": the three newlines are one token, which overlaps the content -> loss
    msgs = [msg("user", "q"), msg("assistant", "\n\nHi")]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).add(SYS_DEFAULT).turn("user", "q", False).add("<|im_start|>assistant")
    seq.add("\n\n\nHi", True).add("<|im_end|>", True).add("\n")
    assert_encoded(enc, seq)
    np.testing.assert_array_equal(
        enc.input_ids, tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    )


def test_branch_first_token_is_loss_token(tok):
    """With a template that has no role headers, a branch's first token is content and carries loss:
    it is predicted from the parent's last token."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>{{ m['content'] }}<|im_end|>"
        "{% else %}{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
    )
    r = Encoder(tok, get_profile("text"), chat_template=template)
    rec = {"messages": [msg("user", "Q")], "branches": [[msg("assistant", "Yes")], [msg("assistant", "No")]]}
    enc = r.encode(example(rec))
    root = Seq(tok).add("<|im_start|>").add("Q").add("<|im_end|>")
    b1 = Seq(tok).add("Yes", True).add("<|im_end|>", True)
    b2 = Seq(tok).add("No", True).add("<|im_end|>", True)
    assert_encoded(
        enc,
        Seq(tok)
        .add("<|im_start|>Q<|im_end|>")
        .add("Yes", True)
        .add("<|im_end|>", True)
        .add("No", True)
        .add("<|im_end|>", True),
    )
    assert enc.node_offsets.tolist() == [0, len(root.ids), len(root.ids) + len(b1.ids)]
    assert enc.labels[enc.node_offsets[1]] == b1.ids[0] and enc.labels[enc.node_offsets[2]] == b2.ids[0]
    assert enc.mrope_position_ids is None


def test_no_loss_tokens(qwen):
    with pytest.raises(RecordError, match=r"^t.jsonl:3: no_loss_tokens: no token carries loss"):
        qwen.encode(example({"messages": [msg("user", "Just a question.")]}))
    with pytest.raises(RecordError, match=r"no_loss_tokens"):
        qwen.encode(example({"messages": [msg("user", "q"), msg("assistant", "a", loss=False)]}))
