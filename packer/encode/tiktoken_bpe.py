"""An exact faster engine for tiktoken-BPE vocabularies (Qwen2's, Llama 3's, Llama 4's): the same ids as the HF
tokenizer, from ``tiktoken`` with the same ranks and split pattern.

``TiktokenBPE.of(backend)`` gives one only where it is exact by construction, else None (the HF tokenizer then
does everything, as before): the HF tokenizer's vocabulary is a rank file of ``shared.tokenizer.RANKS``, token for
token at the same ids; its pipeline is that rank file's (its split pattern, byte-level, no prefix space, a BPE
without dropout or affixes) with no normalizer or NFC; its added tokens are matched as written (not normalized,
no strip, not single-word) and none is a prefix of another, so tiktoken's leftmost-first split around them is
HF's leftmost-longest. Two differences of mechanism, and why they do not change an id:

- HF splits the added tokens out first and normalizes each piece between them (NFC); tiktoken has no
  normalizer, so ``encode`` gives None for a text that NFC would change (the HF tokenizer encodes it instead).
  A text in NFC is NFC piece by piece: the added tokens are ASCII starters, so no composition or reordering
  crosses them.
- tiktoken first looks a whole piece up, as HF's BPE does with ``ignore_merges`` (Llama 3's and 4's, and the
  builtins'); a BPE without it merges, which gives the same token where every token is its own BPE
  (``Ranks.own_bpe``: Qwen2's and Llama 4's vocabularies, all checked by tests/encode/test_builtin_tokenizers.py; 588 of
  Llama 3's tokens are not). Otherwise no engine.

tests/encode/test_tiktoken_bpe.py compares the ids on adversarial text and the build's own records.
"""

from __future__ import annotations

import json
import unicodedata
import weakref
from itertools import pairwise
from typing import Any

from packer.models.shared.tokenizer import RANKS

# tokenizers.Tokenizer -> (signature, TiktokenBPE | None); weak keys: it dies with its tokenizer
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# (rank file, pattern, added tokens) -> tiktoken.Encoding, built once per process (never pickled)
_ENCODINGS: dict[tuple, Any] = {}


class TiktokenBPE:
    """What tiktoken needs to encode as the HF tokenizer does: the rank file, the split pattern, the added
    tokens and their ids, and whether the HF tokenizer normalizes to NFC (then text NFC changes goes to HF)."""

    def __init__(self, ranks_file: str, pattern: str, added: dict[str, int], *, nfc: bool):
        self.ranks_file, self.pattern, self.added, self.nfc = ranks_file, pattern, added, nfc
        self._key = (ranks_file, pattern, tuple(sorted(added.items())))

    @classmethod
    def of(cls, backend: Any) -> TiktokenBPE | None:
        """The engine for this tokenizers.Tokenizer, or None where it is not exact; computed once per tokenizer
        and reused while its vocabulary and pipeline are unchanged."""
        model = backend.model  # not repr(model): that serializes the whole vocabulary
        signature = (backend.get_vocab_size(with_added_tokens=True), repr(backend.normalizer),
                     repr(backend.pre_tokenizer), type(model).__name__, getattr(model, "dropout", None),
                     getattr(model, "ignore_merges", None))
        cached = _ENGINES.get(backend)
        if cached is None or cached[0] != signature:
            cached = (signature, _engine(backend))
            _ENGINES[backend] = cached
        return cached[1]

    def encoding(self) -> Any:
        """The tiktoken.Encoding (built on first use in each process)."""
        enc = _ENCODINGS.get(self._key)
        if enc is None:
            import tiktoken
            from tiktoken.load import load_tiktoken_bpe

            enc = tiktoken.Encoding(name=f"packer:{self.ranks_file}", pat_str=self.pattern,
                                    mergeable_ranks=load_tiktoken_bpe(self.ranks_file), special_tokens=self.added)
            _ENCODINGS[self._key] = enc
        return enc

    def encode(self, texts: list[str]) -> list[list[int] | None]:
        """Each text's ids (no special tokens added), or None for a text this engine leaves to the HF tokenizer
        (one NFC would change, or one that is not valid Unicode)."""
        core = self.encoding()._core_bpe  # Encoding.encode minus its per-call checks: every added token allowed
        allowed = set(self.added)
        out: list[list[int] | None] = []
        for text in texts:
            if self.nfc and not text.isascii() and not unicodedata.is_normalized("NFC", text):
                out.append(None)
                continue
            try:
                out.append(core.encode(text, allowed))
            except UnicodeEncodeError:  # a lone surrogate: tiktoken's Encoding would replace it, HF does not
                out.append(None)
        return out

    def __getstate__(self) -> dict:
        return self.__dict__  # the recipe only: each process builds its own Encoding


def _engine(backend: Any) -> TiktokenBPE | None:
    from tokenizers import models, normalizers

    model = backend.model
    if not isinstance(model, models.BPE) or model.dropout or model.continuing_subword_prefix or \
            model.end_of_word_suffix or model.byte_fallback:
        return None
    if backend.normalizer is not None and not isinstance(backend.normalizer, normalizers.NFC):
        return None
    pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if len(steps) != 2 or steps[0].get("type") != "Split" or steps[1] != {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False
    } or steps[0].get("behavior") != "Isolated" or steps[0].get("invert"):
        return None
    pattern = steps[0].get("pattern", {}).get("Regex")
    size = backend.get_vocab_size(with_added_tokens=False)
    ranks = next((r for r in RANKS.values() if r.pattern == pattern and r.size == size), None)
    if ranks is None or not (getattr(model, "ignore_merges", False) or ranks.own_bpe):
        return None
    added_tokens = backend.get_added_tokens_decoder()
    if any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in added_tokens.values()):
        return None
    added = {t.content: i for i, t in added_tokens.items()}
    names = sorted(added)
    if any(b.startswith(a) for a, b in pairwise(names)):  # a prefix of another sorts right before one
        return None
    try:
        path = ranks.path()
    except Exception:  # the package is gone: the HF tokenizer still works
        return None
    if not _same_vocabulary(backend, str(path)):
        return None
    return TiktokenBPE(str(path), pattern, added, nfc=backend.normalizer is not None)


def _same_vocabulary(backend: Any, ranks_file: str) -> bool:
    """Whether the HF vocabulary (byte-level strings) is the rank file's, token for token at the same ids."""
    from tiktoken.load import load_tiktoken_bpe
    from tokenizers import pre_tokenizers

    chars = _bytes_to_unicode()
    if set(pre_tokenizers.ByteLevel.alphabet()) != set(chars):
        return False
    ranks = load_tiktoken_bpe(ranks_file)
    vocab = backend.get_vocab(with_added_tokens=False)
    if len(vocab) != len(ranks):
        return False
    to_latin1 = str.maketrans({c: chr(b) for b, c in enumerate(chars)})  # byte-level character -> its byte
    try:
        return all(ranks.get(token.translate(to_latin1).encode("latin-1")) == i for token, i in vocab.items())
    except UnicodeEncodeError:  # a character that spells no byte
        return False


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-to-character table (byte b -> the b-th character), as HF's ByteLevel spells bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]
