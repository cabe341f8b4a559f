"""Token boundaries from byte lengths against those from character offsets, and when byte lengths apply."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.encode.tokenize import (
    byte_boundaries,
    cached_token_byte_lengths,
    offset_boundaries,
    special_token_mask,
    token_byte_lengths,
    tokenize,
)
from tests.encode.helpers import ALPHABET


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(text=st.text(alphabet=ALPHABET + "\u0301\U0001f44d\u200d" + "<|im_end|>", min_size=1, max_size=50))
def test_byte_boundaries_equal_offsets(tok, text):
    """Token boundaries from byte lengths equal those from character offsets at every character, including
    characters split across byte-level tokens (emoji, combining marks) and special tokens in the text."""
    backend = tok.backend_tokenizer
    enc = backend.encode(text, add_special_tokens=False)
    ids = np.array(enc.ids, dtype=np.int32)
    lengths = cached_token_byte_lengths(backend, size=special_token_mask(tok).shape[0])
    token_at, starts_before = byte_boundaries(ids, text, lengths)
    want_at, want_before = offset_boundaries(ids, enc, text)
    for c in range(len(text) + 1):
        assert token_at(c) == want_at(c), c
        for t in range(ids.shape[0]):
            assert starts_before(t, c) == want_before(t, c), (t, c)


def test_byte_lengths_only_for_byte_level_tokenizers(tok):
    """A normalizer, a prefix space or trimmed offsets break "tokens spell the bytes": offsets are used."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors

    size = special_token_mask(tok).shape[0]
    assert token_byte_lengths(tok.backend_tokenizer, size=size) is not None
    original = tok.backend_tokenizer.to_str()
    for change in (
        lambda t: setattr(t, "normalizer", normalizers.NFC()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace()),
        lambda t: setattr(t, "post_processor", processors.ByteLevel(trim_offsets=True)),
    ):
        backend = Tokenizer.from_str(original)
        assert cached_token_byte_lengths(backend, size=size) is not None
        change(backend)  # the same tokenizer object, changed in place: the cache must notice
        assert token_byte_lengths(backend, size=size) is None
        assert cached_token_byte_lengths(backend, size=size) is None


def test_tokenize_with_and_without_offsets(tok):
    """The batch call without offsets gives the same ids; one text skips the batch call; no text, no call."""
    backend = tok.backend_tokenizer
    texts = ["Hello world!", "<|im_start|>user\nHi 🙂<|im_end|>\n", ""]
    want = [backend.encode(t, add_special_tokens=False).ids for t in texts]
    assert [e.ids for e in tokenize(backend, texts, offsets=True)] == want
    assert [e.ids for e in tokenize(backend, texts, offsets=False)] == want
    [one] = tokenize(backend, texts[1:2], offsets=False)
    assert one.ids == want[1] and one.offsets[0] == (0, 12)  # one text: encoded with its offsets
    assert tokenize(backend, [], offsets=True) == []


def test_llama3_builtin_is_llama3s_tokenizer() -> None:
    """Meta's llama-models ships Llama-3's ranks; the ids are Llama-3's own (published examples below)."""
    from packer.encode.tokenizers import load_tokenizer

    tok = load_tokenizer("llama3")
    assert tok("Hello world!").input_ids == [9906, 1917, 0]
    assert (tok.bos_token_id, tok.eos_token_id, len(tok)) == (128000, 128009, 128256)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)["input_ids"]
    # <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant...
    assert ids == [128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271]
