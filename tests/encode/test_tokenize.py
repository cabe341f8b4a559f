"""Token boundaries from byte lengths against those from character offsets, and when byte lengths apply."""

from __future__ import annotations

import json
import shutil
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.encode.tokenize import (
    ByteOffsets,
    cached_token_byte_lengths,
    flat_ids,
    normalizes_nfc,
    offset_boundaries,
    special_token_mask,
    token_byte_lengths,
    tokenize,
)
from tests.encode.helpers import ALPHABET


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(texts=st.lists(st.text(alphabet=ALPHABET + "\u0301\U0001f44d\u200d" + "<|im_end|>", max_size=50),
                      min_size=1, max_size=4))
def test_byte_offsets_equal_offsets(tok, texts):
    """Token boundaries from byte lengths, for a batch of texts at once, equal those from each text's character
    offsets at every character, including characters split across byte-level tokens (emoji, combining marks),
    special tokens in the text, empty texts and texts NFC would change (which byte lengths leave to the offsets)."""
    backend = tok.backend_tokenizer
    encs = [backend.encode(text, add_special_tokens=False) for text in texts]
    ids, starts = flat_ids(encs)
    assert ids.dtype == np.int32 and ids.tolist() == [i for e in encs for i in e.ids]
    assert normalizes_nfc(backend)  # Qwen2's tokenizer: byte lengths hold on text in NFC
    offsets = ByteOffsets(ids, starts, cached_token_byte_lengths(backend, size=special_token_mask(tok).shape[0]), nfc=True)
    for k, (text, enc) in enumerate(zip(texts, encs, strict=True)):
        chars = list(range(len(text) + 2))
        found = offsets.bytes_of(k, text, chars)
        if not text or not unicodedata.is_normalized("NFC", text):
            assert found is None
            continue
        a, b = starts[k], starts[k + 1]
        want_at, want_before = offset_boundaries(ids[a:b], enc, text)
        got = offsets.token_at(np.array(found), end=np.full(len(chars), b)) - a
        assert got.tolist() == [want_at(c) for c in chars]
        for t in range(b - a):
            before = offsets.starts_before(np.full(len(text) + 1, a + t), np.array(found[: len(text) + 1]))
            assert before.tolist() == [want_before(t, c) for c in range(len(text) + 1)], t


@pytest.mark.slow
def test_byte_lengths_only_for_byte_level_tokenizers(tok):
    """A normalizer other than NFC, a prefix space or trimmed offsets break "tokens spell the bytes": offsets are used."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors

    size = special_token_mask(tok).shape[0]
    assert token_byte_lengths(tok.backend_tokenizer, size=size) is not None
    original = tok.backend_tokenizer.to_str()
    for change in (
        lambda t: setattr(t, "normalizer", normalizers.NFKC()),  # NFC is taken (text in NFC spells its bytes)
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


@pytest.mark.slow
def test_llama3_builtin_is_llama3s_tokenizer() -> None:
    """Meta's llama-models ships Llama-3's ranks; the ids are Llama-3's own (published examples below)."""
    from tests.encode.helpers import builtin

    tok = builtin("llama3")
    assert tok("Hello world!", add_special_tokens=False).input_ids == [9906, 1917, 0]
    assert tok("Hello world!").input_ids == [128000, 9906, 1917, 0]  # as Llama 3's tokenizer.json: bos added
    assert (tok.bos_token_id, tok.eos_token_id, len(tok)) == (128000, 128009, 128256)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)["input_ids"]
    # <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant...
    assert ids == [128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2-vl", "llama3", "gemma3"])
def test_builtin_config_lists_added_tokens_without_changing_the_tokenizer(name, tmp_path) -> None:
    """A builtin's tokenizer_config.json lists its added tokens (so from_pretrained need not read tokenizer.json
    in Python); the directory without that entry, as save_pretrained wrote it, loads the same tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from packer.encode.tokenizers import ensure_builtin, fingerprint

    path = ensure_builtin(name)
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["added_tokens_decoder"]
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    del config["added_tokens_decoder"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    ours, theirs = (PreTrainedTokenizerFast.from_pretrained(str(p)) for p in (path, plain))
    assert str(ours).replace(str(path), "DIR") == str(theirs).replace(str(plain), "DIR")
    assert fingerprint(ours) == fingerprint(theirs)
    assert ours.added_tokens_decoder == theirs.added_tokens_decoder
    assert ours.special_tokens_map == theirs.special_tokens_map and ours.all_special_ids == theirs.all_special_ids
    assert ours.chat_template == theirs.chat_template
