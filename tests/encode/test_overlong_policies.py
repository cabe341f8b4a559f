"""Length policies beyond drop / keep-head, each on its edge cases, against the real Qwen2-VL tokenizer and
template: ``--long-docs split`` (chunks of a long text), ``truncate_left`` (a text's tail) and
``keep_last_turns`` (whole early turns dropped). The reference for a turn-dropped conversation is the same
Encoder on the shortened record with no length limit (the template renders it afresh), and for one chat the
tokenizer's own ``apply_chat_template``; for chunks, the unsplit document's tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from packer.core.types import IGNORE_INDEX
from packer.encode.encoder import Encoder
from packer.encode.split import split_windows
from packer.errors import ConfigError, RecordError
from packer.models import get_profile
from tests.encode.helpers import example, msg

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def long_text(n_words: int) -> dict:
    return {"text": " ".join(WORDS[i % len(WORDS)] for i in range(n_words))}


@pytest.fixture(scope="module")
def full_text(tok):
    """The unsplit 200-word document's Encoded form (no bos for Qwen2; eos <|im_end|> appended)."""
    return Encoder(tok, get_profile("text")).encode(example(long_text(200)))


def split_encoder(tok, max_length: int, overlap: int = 0) -> Encoder:
    return Encoder(tok, get_profile("text"), max_length=max_length, long_docs="split", long_docs_overlap=overlap)


# ---------------------------------------------------------------- split


def test_split_windows_edges():
    assert split_windows(8, max_length=8) == [(0, 8)]  # exactly max_length: one window
    assert split_windows(9, max_length=8) == [(0, 8), (7, 9)]  # +1: the 1-token tail starts one earlier
    assert split_windows(9, max_length=8, overlap=2) == [(0, 8), (6, 9)]
    assert split_windows(28, max_length=8) == [(0, 8), (8, 16), (16, 24), (24, 28)]  # 3.5 x max_length
    assert split_windows(28, max_length=8, overlap=2) == [(0, 8), (6, 14), (12, 20), (18, 26), (24, 28)]
    with pytest.raises(ValueError, match="overlap must be in"):
        split_windows(9, max_length=8, overlap=8)


def test_split_exactly_max_length_and_one_more(tok, full_text):
    L = full_text.num_tokens
    whole = split_encoder(tok, L).encode(example(long_text(200)))
    assert whole.example_id == "t.jsonl:3" and whole.num_tokens == L  # fits: not split, its plain id
    parts = split_encoder(tok, L - 1).encode(example(long_text(200)))
    assert [p.example_id for p in parts] == ["t.jsonl:3@0", "t.jsonl:3@1"]
    assert [p.num_tokens for p in parts] == [L - 1, 2]  # the last token alone would carry no loss
    np.testing.assert_array_equal(parts[1].input_ids, full_text.input_ids[-2:])
    assert parts[1].labels.tolist() == [IGNORE_INDEX, int(full_text.input_ids[-1])]


@pytest.mark.parametrize("overlap", [0, 3])
def test_split_three_and_a_half_times(tok, full_text, overlap):
    ids = full_text.input_ids
    L = ids.shape[0]
    max_length = int(np.ceil(L / 3.5))
    parts = split_encoder(tok, max_length, overlap).encode(example(long_text(200)))
    windows = split_windows(L, max_length=max_length, overlap=overlap)
    stride = max_length - overlap
    assert len(parts) == len(windows) == 1 + int(np.ceil((L - max_length) / stride))
    assert [p.example_id for p in parts] == [f"t.jsonl:3@{k}" for k in range(len(parts))]
    covered = np.zeros(L, dtype=np.int64)  # how often each document token is an input
    trained = np.zeros(L, dtype=np.int64)  # how often it is a target (label not -100)
    for p, (a, b) in zip(parts, windows, strict=True):
        assert p.num_tokens <= max_length and p.node_offsets.tolist() == [0] and p.node_parents.tolist() == [-1]
        np.testing.assert_array_equal(p.input_ids, ids[a:b])  # the document's own tokens, in order
        np.testing.assert_array_equal(p.position_ids, np.arange(b - a))  # positions restart at 0
        assert p.labels[0] == IGNORE_INDEX
        loss = p.labels != IGNORE_INDEX
        np.testing.assert_array_equal(p.labels[loss], p.input_ids[loss])
        covered[a:b] += 1
        trained[a:b] += loss
    assert (covered >= 1).all()  # tokens lost = 0
    assert trained.max() == 1  # no token carries loss twice
    if overlap:  # every target of the unsplit document is trained exactly once
        np.testing.assert_array_equal(trained, full_text.labels != IGNORE_INDEX)
        for p in parts[1:]:
            assert (p.labels[:overlap] == IGNORE_INDEX).all()  # the overlap is context only
    else:  # each later chunk's first token is no target
        assert trained.sum() == (full_text.labels != IGNORE_INDEX).sum() - (len(parts) - 1)


def test_split_in_a_batch_and_only_for_text(tok, full_text):
    enc = split_encoder(tok, 40)
    chat = example({"messages": [msg("user", " ".join(WORDS * 3)), msg("assistant", "ok")]})
    got = enc.encode_batch([example(long_text(200)), chat, example({"text": "short"})])
    assert isinstance(got[0], list) and len(got[0]) > 1
    assert isinstance(got[1], RecordError) and got[1].reason == "overlong"  # a conversation follows --overlong
    assert got[2].example_id == "t.jsonl:3"
    with pytest.raises(ConfigError, match=r"'long_docs_overlap' must be in \[0, max_length\), got 40"):
        split_encoder(tok, 40, 40)
    with pytest.raises(ConfigError, match=r"'long_docs' must be one of off, split, got 'chunk'"):
        Encoder(tok, get_profile("text"), long_docs="chunk")


# ---------------------------------------------------------------- truncate_left (text)


def test_truncate_left_text(tok, full_text):
    L = full_text.num_tokens
    fits = Encoder(tok, get_profile("text"), max_length=L, overlong="truncate_left").encode(example(long_text(200)))
    np.testing.assert_array_equal(fits.input_ids, full_text.input_ids)
    for keep in (L - 1, 7, 2):
        enc = Encoder(tok, get_profile("text"), max_length=keep, overlong="truncate_left").encode(
            example(long_text(200))
        )
        np.testing.assert_array_equal(enc.input_ids, full_text.input_ids[-keep:])  # the tail, eos last
        assert enc.labels[0] == IGNORE_INDEX and (enc.labels[1:] == enc.input_ids[1:]).all()
        np.testing.assert_array_equal(enc.position_ids, np.arange(keep))
    with pytest.raises(RecordError, match="no_loss_tokens"):  # one token: nothing predicts it
        Encoder(tok, get_profile("text"), max_length=1, overlong="truncate_left").encode(example(long_text(200)))


def test_keep_last_turns_on_text_keeps_the_head(tok, full_text):
    enc = Encoder(tok, get_profile("text"), max_length=9, overlong="keep_last_turns").encode(example(long_text(200)))
    np.testing.assert_array_equal(enc.input_ids, full_text.input_ids[:9])


# ---------------------------------------------------------------- keep_last_turns (conversations)


def chat(*, system: bool = True, image=None) -> dict:
    first = [{"type": "image", "image": str(image)}, {"type": "text", "text": "What is it?"}] if image else "Hi there"
    return {"messages": ([msg("system", "Be brief.")] if system else []) + [
        msg("user", first), msg("assistant", "A first answer."),
        msg("user", "And then?"), msg("assistant", "A second answer."),
        msg("user", "Last?"), msg("assistant", "The last answer."),
    ]}


def shortened(rec: dict, keep_from: int) -> dict:
    """``rec`` with its leading system message and messages[keep_from:] only."""
    msgs = rec["messages"]
    head = [m for m in msgs[:1] if m["role"] == "system"]
    return {**rec, "messages": head + msgs[keep_from:]}


def encoders(tok, max_length: int, policy: str = "keep_last_turns", profile: str = "qwen2-vl"):
    return Encoder(tok, get_profile(profile)), Encoder(tok, get_profile(profile), max_length=max_length,
                                                       overlong=policy)


@pytest.mark.parametrize("policy", ["keep_last_turns", "truncate_left"])
def test_keep_last_turns_drops_the_fewest_whole_turns(tok, policy):
    rec = chat()
    plain, _ = encoders(tok, 1)
    full = plain.encode(example(rec))
    minus1 = plain.encode(example(shortened(rec, 3)))
    minus2 = plain.encode(example(shortened(rec, 5)))
    for max_length, want in ((full.num_tokens, full), (full.num_tokens - 1, minus1), (minus1.num_tokens, minus1),
                             (minus1.num_tokens - 1, minus2), (minus2.num_tokens, minus2)):
        got = encoders(tok, max_length, policy)[1].encode(example(rec))
        np.testing.assert_array_equal(got.input_ids, want.input_ids)
        np.testing.assert_array_equal(got.labels, want.labels)
        np.testing.assert_array_equal(got.position_ids, want.position_ids)
    # the reference users trust: the tokenizer's own template on the kept messages
    kept = [{"role": m["role"], "content": m["content"]} for m in shortened(rec, 5)["messages"]]
    got = encoders(tok, minus2.num_tokens)[1].encode(example(rec))
    assert got.input_ids.tolist() == tok.apply_chat_template(kept, tokenize=True, return_dict=False)


def test_keep_last_turns_untruncatable(tok):
    rec = chat()
    plain, _ = encoders(tok, 1)
    minus2 = plain.encode(example(shortened(rec, 5)))
    # the last assistant turn alone (with the system prompt) is too long
    with pytest.raises(RecordError, match=rf"^t.jsonl:3: untruncatable: the system prompt and the last turn alone are "
                       rf"{minus2.num_tokens} tokens > --max-length {minus2.num_tokens - 1}"):
        encoders(tok, minus2.num_tokens - 1)[1].encode(example(rec))
    # a system prompt that alone is too long: never dropped, so nothing fits
    long_sys = {"messages": [msg("system", " ".join(WORDS * 4))] + rec["messages"][1:]}
    with pytest.raises(RecordError, match="untruncatable: the system prompt and the last turn alone"):
        encoders(tok, 60)[1].encode(example(long_sys))
    # one turn only: nothing to drop
    with pytest.raises(RecordError, match="untruncatable"):
        encoders(tok, 5)[1].encode(example({"messages": [msg("user", "Hi"), msg("assistant", "Hello.")]}))
    # the turns that fit carry no loss
    no_loss = {"messages": rec["messages"][:6] + [msg("assistant", "Not trained.", loss=False)]}
    last_len = Encoder(tok, get_profile("qwen2-vl")).encode(example(shortened(rec, 5))).num_tokens
    with pytest.raises(RecordError, match=r"untruncatable: the last 1 turn\(s\) that fit --max-length .* carry no loss"):
        encoders(tok, last_len + 5)[1].encode(example(no_loss))


def test_keep_last_turns_assistant_first_and_no_system(tok):
    # messages before the first user message are a turn of their own; no system prompt to keep
    rec = {"messages": [msg("assistant", "Welcome! Ask me."), msg("user", "Q1"), msg("assistant", "A1."),
                        msg("user", "Q2"), msg("assistant", "A2.")]}
    plain, _ = encoders(tok, 1)
    full = plain.encode(example(rec))
    want = plain.encode(example({"messages": rec["messages"][1:]}))
    got = encoders(tok, full.num_tokens - 1)[1].encode(example(rec))
    np.testing.assert_array_equal(got.input_ids, want.input_ids)  # the kept part starts at a user message


def test_keep_last_turns_drops_an_image_whole(tok, img):
    rec = chat(image=img)
    plain, _ = encoders(tok, 1)
    full = plain.encode(example(rec))
    assert len(full.images) == 1
    want = plain.encode(example(shortened(rec, 3)))
    im = full.images[0]
    assert im.offset < want.num_tokens < im.offset + im.num_tokens  # a head cut here would split the image
    got = encoders(tok, want.num_tokens)[1].encode(example(rec))
    assert got.images == [] and got.num_tokens == want.num_tokens
    np.testing.assert_array_equal(got.input_ids, want.input_ids)
    np.testing.assert_array_equal(got.mrope_position_ids, want.mrope_position_ids)
    # an image in a kept turn stays whole, with its mRoPE positions
    late = {"messages": chat()["messages"][:5] + [
        msg("user", [{"type": "image", "image": str(img)}, {"type": "text", "text": "And this?"}]),
        msg("assistant", "A plane.")]}
    want = plain.encode(example(shortened(late, 5)))
    got = encoders(tok, want.num_tokens)[1].encode(example(late))
    assert got.images == want.images and len(got.images) == 1
    np.testing.assert_array_equal(got.mrope_position_ids, want.mrope_position_ids)


def test_keep_last_turns_on_a_tree_drops_root_turns_only(tok):
    rec = {"messages": [msg("system", "Be kind."), msg("user", "Earlier question, rather long this one."),
                        msg("assistant", "Earlier answer."), msg("user", "Q")],
           "branches": [[msg("assistant", "A1")], [msg("assistant", "A2"), msg("user", "Why?"),
                                                   msg("assistant", "Because.")]]}
    plain, _ = encoders(tok, 1)
    full = plain.encode(example(rec))
    want = plain.encode(example({**rec, "messages": [rec["messages"][0], rec["messages"][3]]}))
    got = encoders(tok, full.num_tokens - 1)[1].encode(example(rec))
    for name in ("input_ids", "labels", "position_ids", "node_offsets", "node_parents"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    # the root's last turn, which the branches continue, is never dropped
    with pytest.raises(RecordError, match="untruncatable"):
        encoders(tok, want.num_tokens - 1)[1].encode(example(rec))
