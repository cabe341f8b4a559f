"""Tokenize rendered texts and map character positions to token boundaries.

Two ways to find the token at a character, checked against each other at every character by
tests/encode/test_tokenize.py:

- ``offset_boundaries``: from the tokenizer's character offsets (any fast tokenizer).
- ``ByteOffsets``: from each token's UTF-8 length, for byte-level BPE tokenizers with no normalizer (Llama 3's,
  GPT-2's) or an NFC one (Qwen2's) and no offset trimming, whose tokens spell the text's bytes exactly (under
  NFC: on a text NFC leaves as it is; any other text takes the offsets, so a boundary inside text the
  normalizer rewrote, decomposed accents, comes from the tokenizer's own alignment). The tokenizer then runs
  without computing offsets (``encode_batch_fast``): less tokenizer time (docs/benchmarks.md). It answers
  for a whole batch of texts at once (``flat_ids``): numpy calls per batch, not per text.
"""

from __future__ import annotations

import unicodedata
import weakref
from collections.abc import Callable
from itertools import accumulate, chain, pairwise
from typing import Any, NamedTuple

import numpy as np

# tokenizers.Tokenizer -> (pipeline signature, token byte lengths); weak keys: it dies with its tokenizer
_BYTE_LENGTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Boundaries(NamedTuple):
    """Token boundaries of one tokenized text (L tokens)."""

    token_at: Callable[[int], int]
    """``token_at(c)``: the first token that ends after character ``c`` (L at the end of the text)."""
    starts_before: Callable[[int, int], bool]
    """``starts_before(t, c)``: whether token ``t`` starts before character ``c``."""


def special_token_mask(tokenizer: Any) -> np.ndarray:
    """(V,) bool: which token ids are special (control) tokens, V covering every id the tokenizer has."""
    special = [i for i, t in tokenizer.added_tokens_decoder.items() if t.special]
    mask = np.zeros(max([len(tokenizer), *special]) + 1, dtype=bool)
    mask[special] = True
    return mask


def tokenize(backend: Any, texts: list[str], *, offsets: bool) -> list:
    """tokenizers.Encoding of each text, no special tokens added; without character offsets unless
    ``offsets`` (``offset_boundaries`` then re-encodes the text it needs them for)."""
    if not texts:
        return []
    if len(texts) == 1:  # a batch call costs a thread-pool round trip; one text needs none
        return [backend.encode(texts[0], add_special_tokens=False)]
    if not offsets:
        return backend.encode_batch_fast(texts, add_special_tokens=False)
    return backend.encode_batch(texts, add_special_tokens=False)


def offset_boundaries(ids: np.ndarray, enc: Any, text: str) -> Boundaries:
    """``Boundaries`` from ``enc``'s character offsets (``enc``: the tokenizers.Encoding of ``text``)."""
    n, size = ids.shape[0], len(text)
    token_ends: list[np.ndarray] = []  # (L,) end character of each token, built only when needed

    def token_at(char: int) -> int:
        if char >= size:
            return n
        i = enc.char_to_token(char)  # the first token containing ``char``: no offsets list needed
        if i is not None:
            return i
        if not token_ends:  # ``char`` belongs to no token (a normalizer dropped it): use the offsets
            token_ends.append(np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 1])
        return int(np.searchsorted(token_ends[0], char, side="right"))

    return Boundaries(token_at, lambda token, char: enc.token_to_chars(token)[0] < char)


def flat_ids(encodings: Any) -> tuple[np.ndarray, list[int]]:
    """(T,) int32 ids of all ``encodings`` (tokenizers.Encodings, or lists of ids; a ``fastokens_bpe.Flat`` is
    already this, as it is) back to back, and where each starts: encoding k's ids are
    ``ids[starts[k]:starts[k + 1]]``. One conversion for the whole batch: numpy's per-call cost paid once.

        encodings' ids [5, 6, 7], [8, 9]  ->  ids [5, 6, 7, 8, 9], starts [0, 3, 5]
    """
    if isinstance(encodings, tuple):  # a Flat: one engine call gave the whole batch flat
        return encodings.ids, encodings.starts
    lists = [e if isinstance(e, list) else e.ids for e in encodings]
    starts = [0, *accumulate(map(len, lists))]
    return np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=starts[-1]), starts


class ByteOffsets:
    """Token boundaries of a whole batch of texts (``flat_ids``) from each token's UTF-8 length: those
    ``offset_boundaries`` gives, for all the batch's queries in one numpy call each.

    Valid for a text whose tokens spell its UTF-8 bytes exactly (``byte_lengths`` from ``token_byte_lengths``;
    checked per text on its total: ``bytes_of`` gives None where not). A character split across tokens
    belongs to the token holding its first byte, as in the offsets (where ``char_to_token`` returns the
    first token whose span holds the character). Positions are bytes counted from the batch's start:

        texts "hello", "wörld"; tokens [hel, lo] [w, ör, ld]; starts [0, 2, 5]
        start                  [0, 3, 5, 6, 9, 11]   byte where each token starts (and the last ends)
        bytes_of(1, "wörld", [2, 9])  -> [5 + 3, 5 + 6]   ("ö" is 2 bytes; 9 >= len: the text's end)
        token_at([8, 11], end=[5, 5]) -> [3, 5]           ("r" is in "ör"; 5: the text's end)
    """

    def __init__(self, ids: np.ndarray, starts: list[int], byte_lengths: np.ndarray, *, nfc: bool = False):
        self._nfc = nfc  # the tokenizer normalizes to NFC: only a text already in NFC spells its bytes
        # numba: imported where a batch is labeled by byte lengths
        from packer.encode.kernels import byte_starts, check_ids

        check_ids(ids, byte_lengths.shape[0])
        self.start = byte_starts(ids, byte_lengths)  # (T+1,) int64, one pass (a gather and a cumsum in numpy)
        self._ends = self.start[1:]  # (T,) end byte of each token
        self.text_start = self.start[starts]  # (texts + 1,) byte where each text starts (and the last one ends)
        self._base = self.text_start.tolist()
        self._empty = [a == b for a, b in pairwise(starts)]

    def bytes_of(self, k: int, text: str, chars: list[int]) -> list[int] | None:
        """The byte of each of ``chars`` in text ``k`` (a character at or past the end: the text's end),
        or None when its tokens do not spell its bytes (then use the offsets)."""
        base, size = self._base[k], len(text)
        if self._empty[k]:
            return None
        if text.isascii():
            if self._base[k + 1] - base != size:
                return None
            return [base + (c if c < size else size) for c in chars]
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            return None
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        width = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)  # UTF-8 bytes
        char_byte = np.concatenate([[0], np.cumsum(width)])  # byte offset of each character (no list per char)
        if self._base[k + 1] - base != int(char_byte[-1]):
            return None
        return (base + char_byte[np.minimum(chars, size)]).tolist()

    def token_at(self, byte: np.ndarray, *, end: np.ndarray) -> np.ndarray:
        """The first token that ends after each ``byte`` (a global token index), at most ``end`` (its text's
        end: a byte at the text's end gives its token count)."""
        return np.minimum(np.searchsorted(self._ends, byte, side="right"), end)

    def starts_before(self, token: np.ndarray, byte: np.ndarray) -> np.ndarray:
        """Whether each ``token`` (global index) starts before ``byte``."""
        return self.start[token] < byte


def cached_token_byte_lengths(backend: Any, *, size: int) -> np.ndarray | None:
    """``token_byte_lengths``, computed once per tokenizer (it reads the whole vocabulary) and reused while
    its vocabulary and pipeline are unchanged: a build may construct an Encoder per chunk."""
    model = backend.model  # not repr(model): that serializes the whole vocabulary
    signature = (
        backend.get_vocab_size(with_added_tokens=True), size, repr(backend.normalizer),
        repr(backend.pre_tokenizer), repr(backend.post_processor), type(model).__name__,
        getattr(model, "continuing_subword_prefix", None), getattr(model, "end_of_word_suffix", None),
        getattr(model, "dropout", None),
    )  # fmt: skip
    cached = _BYTE_LENGTHS.get(backend)
    if cached is None or cached[0] != signature:
        cached = (signature, token_byte_lengths(backend, size=size))
        _BYTE_LENGTHS[backend] = cached
    return cached[1]


def normalizes_nfc(backend: Any) -> bool:
    """Whether the tokenizer's normalizer is NFC (the one ``token_byte_lengths`` takes besides none)."""
    from tokenizers import normalizers

    return isinstance(backend.normalizer, normalizers.NFC)


def token_byte_lengths(backend: Any, *, size: int) -> np.ndarray | None:
    """(size,) int32 UTF-8 length of every token id when the tokens spell the text's bytes exactly
    (byte-level BPE, no normalizer or NFC, no offset trimming; the bos a post-processor may add is never added
    here), else None. ``backend``: a tokenizers.Tokenizer. Under NFC they spell the bytes of a text in NFC
    only: ``ByteOffsets(nfc=True)`` checks each text."""
    from tokenizers import models, pre_tokenizers, processors

    model, pre, post = backend.model, backend.pre_tokenizer, backend.post_processor
    if (backend.normalizer is not None and not normalizes_nfc(backend)) or not isinstance(model, models.BPE):
        return None
    if model.continuing_subword_prefix or model.end_of_word_suffix or model.dropout:
        return None
    steps = list(pre) if isinstance(pre, pre_tokenizers.Sequence) else [pre]
    if not any(isinstance(p, pre_tokenizers.ByteLevel) for p in steps) or not all(
        isinstance(p, pre_tokenizers.Split)
        or (isinstance(p, pre_tokenizers.ByteLevel) and not p.add_prefix_space)
        for p in steps
    ):
        return None
    posts = list(post) if isinstance(post, processors.Sequence) else [] if post is None else [post]
    if not all((isinstance(p, processors.ByteLevel) and not p.trim_offsets)
               or isinstance(p, processors.TemplateProcessing) for p in posts):  # a template adds only specials
        return None
    vocab = backend.get_vocab(with_added_tokens=False)
    if not set("".join(vocab)) <= set(pre_tokenizers.ByteLevel.alphabet()):  # one character per byte
        return None
    lengths = np.zeros(size, dtype=np.int32)
    lengths[np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))] = np.fromiter(
        map(len, vocab), dtype=np.int32, count=len(vocab)
    )
    for i, added in backend.get_added_tokens_decoder().items():  # matched in the raw text, as written
        lengths[i] = len(added.content.encode("utf-8"))
    return lengths
