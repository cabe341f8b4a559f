"""The fastest exact tokenizer engine packer has: ``fastokens`` (a Rust re-implementation of HF ``tokenizers``'
encode from the same tokenizer.json), batch in, flat ids + offsets out (no Python object per token or per text).

``FastokensBPE.of(backend)`` gives one only where packer can check it is exact, else None (the HF tokenizer then
encodes, as before); the last check runs where the engine is first used, in each process (building
the native tokenizer costs ~1.8 CPU-s for a 151k vocabulary: a build's parent pays it once where it forks its
workers, ``prepare``, else each worker on its first batch; a worker compares with the HF ids of the probe the
parent computed, and builds the HF tokenizer only for a text it must encode), and a failed one leaves every text
to the HF tokenizer:

- (the Encoder's condition) the pipeline is one whose boundaries come from token byte lengths
  (``tokenize.token_byte_lengths``: byte-level BPE, no normalizer or NFC, no prefix space or offset trimming):
  labels never need the offsets fastokens does not give; a byte-fallback (SentencePiece) vocabulary goes to the
  HF tokenizer with its offsets;
- no added token strips, matches as a single word or is normalized (none of the builtins' does; flags the fuzz
  tests do not cover go to the HF tokenizer);
- on a fixed probe of hard text (NFC-rewritten accents, literal special tokens, emoji, digits, long runs) its ids
  equal the HF tokenizer's: a construct fastokens would read otherwise fails here, before any text is encoded.

A text that is not valid Unicode (a lone surrogate) goes to the HF tokenizer, which raises as it always did.
tests/encode/test_fastokens_bpe.py fuzzes every builtin against transformers, NFC text and user files included;
docs/benchmarks.md, "Fast paths": 10x tiktoken's speed (the engine it replaced), ~50x HF tokenizers'.
"""

from __future__ import annotations

import warnings
import weakref
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np

# tokenizers.Tokenizer -> (signature, whether the engine may apply); weak keys: it dies with its tokenizer
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# tokenizers.Tokenizer (or an unpickled source) -> fastokens.Tokenizer from its tokenizer.json, or None where the probe failed; built once
# per process (never pickled)
_NATIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the same keys -> a fastokens.Tokenizer built by ``prepare`` and not yet probed (nor used: no rayon thread yet)
_UNPROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENCODED = False  # has fastokens encoded in this process (its rayon pool started: ``fork_safe``)?
# (tokenizer.json, its fastokens.Tokenizer) that ``prepare_here`` built last: a later engine of the same string in
# this process (another build's encoder, unpickled from a kept entry: a new key) takes it instead of building it
_LAST: tuple[str, Any] | None = None

_PROBE = [
    "cafe\u0301 na\u0308ive \u1100\u1161\u11a8 \uac00",  # decomposed accents and jamo: NFC rewrites them
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|image_pad|><|begin_of_text|><|eot_id|>",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd 12345678901234 \u0661\u0662 \uff11\uff12",
    "   \n\n\t\t  x  " + "a" * 300 + " " * 200 + "\u4e2d\u6587" * 50 + "\r\n\u2028\u00a0\u3000\u200b",
    "def f(x):\n    return x ** 2  # 'quote' \"q\" don't I'm we'll\n",
    "",
]


class Flat(NamedTuple):
    """A batch's tokens back to back: text k's ids are ``ids[starts[k]:starts[k + 1]]``."""

    ids: np.ndarray
    """(T,) int32 ids of every text."""
    starts: list[int]
    """(N+1,) where each text's ids start (and the last ends)."""


class FastokensBPE:
    """What fastokens needs to encode as the HF tokenizer does: the tokenizer's tokenizer.json (``source``: a
    ``TokenizerView``, pickled once with the encoder that holds both), whose string each process builds its
    native tokenizer from, once, and the HF tokenizer's ids of the probe, computed where the engine is made: a
    worker checks fastokens against them without building the HF tokenizer (~0.5 CPU-s of 151k vocabulary)."""

    def __init__(self, source: Any, want: list[list[int]]):
        self.source = source
        """Anything with ``backend`` (the tokenizers.Tokenizer) and ``json()`` (its tokenizer.json)."""
        self.want = want
        """The HF tokenizer's ids of ``_PROBE``."""

    @property
    def backend(self) -> Any:
        return self.source.backend

    @classmethod
    def of(cls, backend: Any, source: Any = None) -> FastokensBPE | None:
        """The engine for this tokenizers.Tokenizer, or None where it is not known exact; computed once per
        tokenizer and reused while its vocabulary and pipeline are unchanged. ``source``: what the engine
        holds it by (a ``TokenizerView`` of it; default: the tokenizer itself)."""
        model = backend.model  # not repr(model): that serializes the whole vocabulary
        signature = (backend.get_vocab_size(with_added_tokens=True), repr(backend.normalizer),
                     repr(backend.pre_tokenizer), type(model).__name__, getattr(model, "dropout", None),
                     getattr(model, "ignore_merges", None))
        cached = _ENGINES.get(backend)
        if cached is None or cached[0] != signature:
            cached = (signature, _eligible(backend))
            _ENGINES[backend] = cached
        if not cached[1]:
            return None
        want = [e.ids for e in backend.encode_batch(_PROBE, add_special_tokens=False)]
        return cls(source if source is not None else _Source(backend), want)

    def native(self) -> Any:
        """The fastokens.Tokenizer, or None where it failed the probe (built and probed on first use in each
        process)."""
        key = self._key()
        if key not in _NATIVE:
            _NATIVE[key] = _checked_native(self.source.json(), self.want, _UNPROBED.pop(key, None))
        return _NATIVE[key]

    def prepare(self, built: tuple[str, Any] | None = None) -> None:
        """Build the native tokenizer now, without encoding anything (no probe: that runs on first use), so
        that processes forked from this one inherit it instead of each building it (~1.6 CPU-s for a 151k
        vocabulary): building it starts no thread, so it is fork-safe where an encode is not (``fork_safe``).
        ``built``: (a tokenizer.json, ``build_native``'s tokenizer of it), taken where that string is this
        engine's own. Where fastokens cannot load the file, ``native`` says so on first use, as without this."""
        key = self._key()
        if key in _NATIVE or key in _UNPROBED:
            return
        json = self.source.json()
        native = built[1] if built is not None and built[0] == json else build_native(json)
        if native is not None:
            _UNPROBED[key] = native

    def prepare_here(self) -> None:
        """``prepare`` in a process that encodes itself, build after build (one-process builds, a notebook's):
        where it built the same tokenizer.json last (``_LAST``), that native tokenizer is taken, so that an
        engine of a new key (an encoder a kept entry gave, ``pipeline/local.py``) does not build it once per
        build, as an engine of a tokenizer the process keeps loaded never does."""
        global _LAST
        key = self._key()
        if key in _NATIVE or key in _UNPROBED:
            return
        json = self.source.json()
        last = _LAST
        if last is not None and (last[0] is json or last[0] == json):
            _UNPROBED[key] = last[1]
            return
        native = build_native(json)
        if native is not None:
            _UNPROBED[key] = native
            _LAST = (json, native)

    def _key(self) -> Any:
        # one per Rust tokenizer while the source holds one (engines of one tokenizer share it), else per source
        return vars(self.source).get("backend", self.source)

    def encode(self, texts: list[str]) -> tuple[Flat, list[int]]:
        """The ids of every text (no special tokens added), flat, and the texts it left to the HF tokenizer (not
        valid Unicode; every text where the probe failed): those have no ids in ``Flat`` (an empty span)."""
        native = self.native()
        if native is None:
            return Flat(np.zeros(0, dtype=np.int32), [0] * (len(texts) + 1)), list(range(len(texts)))
        return _encode(native, texts)


class _Source:
    """A bare tokenizers.Tokenizer as an engine's ``source``."""

    def __init__(self, backend: Any):
        self.backend = backend

    def json(self) -> str:
        return self.backend.to_str()


def build_native(json: str) -> Any:
    """fastokens' tokenizer of this tokenizer.json, built and not probed (``prepare``); None where fastokens
    cannot load it (``native`` then says so on first use, and the HF tokenizer encodes)."""
    import fastokens

    try:
        return fastokens.Tokenizer.from_json_str(json)
    except Exception:  # noqa: BLE001  # left to ``native``, which warns and takes the HF tokenizer
        return None


def fork_safe() -> bool:
    """Has no fastokens encode run in this process? Then its rayon thread pool does not exist yet and a forked
    child starts its own. rayon has no fork handler: a child forked after an encode would wait on threads it
    does not have (pipeline/local.py forks its workers only while this holds)."""
    return not _ENCODED


def _encode(native: Any, texts: list[str]) -> tuple[Flat, list[int]]:
    global _ENCODED
    _ENCODED = True
    left: list[int] = []
    try:
        ids, offsets = native.encode_batch_flat(texts, add_special_tokens=False)
    except UnicodeEncodeError:  # a lone surrogate somewhere: encode the others, leave it to HF
        left = [k for k, t in enumerate(texts) if not _valid(t)]
        keep = set(left)
        ids, offsets = native.encode_batch_flat(["" if k in keep else t for k, t in enumerate(texts)],
                                                add_special_tokens=False)
    return Flat(np.frombuffer(ids, dtype=np.uint32).astype(np.int32),
                np.frombuffer(offsets, dtype=np.uint64).tolist()), left


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _eligible(backend: Any) -> bool:
    try:
        import fastokens  # noqa: F401
    except ImportError:  # not installed: the HF tokenizer
        return False
    return not any(t.normalized or t.lstrip or t.rstrip or t.single_word
                   for t in backend.get_added_tokens_decoder().values())


def _checked_native(json: str, want: list[list[int]], native: Any = None) -> Any:
    """fastokens' tokenizer of this tokenizer.json (``native``: built already, from it) where its ids of the
    probe are ``want`` (the HF tokenizer's), else None."""
    import fastokens

    try:
        native = native if native is not None else fastokens.Tokenizer.from_json_str(json)
        flat, _ = _encode(native, _PROBE)
    except Exception as e:  # a pipeline fastokens cannot load: the HF tokenizer  # noqa: BLE001
        return _slower(f"fastokens cannot load it ({type(e).__name__}: {e})")
    if [flat.ids[a:b].tolist() for a, b in pairwise(flat.starts)] != want:
        return _slower("fastokens' ids of the probe texts differ from the HF tokenizer's")
    return native


def _slower(why: str) -> None:
    """Said once per tokenizer and process: the ids stay exact (the HF tokenizer's), the build is slower."""
    warnings.warn(f"{why}: this tokenizer encodes with the HF tokenizer (exact, several times slower)",
                  RuntimeWarning, stacklevel=3)
