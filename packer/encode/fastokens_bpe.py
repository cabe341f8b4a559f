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

Where the tokenizer.json is provably the BPE of a tiktoken rank file (``tiktoken_spec``: every builtin but
llama3's and mistral3's), the native tokenizer is built by ``fastokens.Tokenizer.from_tiktoken`` from those ranks
instead of by ``from_json_str`` (~1.1 CPU-s less for a 151k vocabulary, its peak memory ~230 -> ~105 MiB): the check runs once,
where the engine is made, and the engine keeps what the build needs (``FastokensBPE.spec``); tiktoken has no
normalizer, so where the tokenizer's is NFC only the texts that are NFC already go to it, the others to the HF
tokenizer. A text that is not valid Unicode (a lone surrogate) goes to the HF tokenizer, which raises as it always
did.
tests/encode/test_fastokens_bpe.py fuzzes every builtin against transformers, NFC text and user files included;
docs/benchmarks.md, "Fast paths": 10x tiktoken's speed (the engine it replaced), ~50x HF tokenizers'.
"""

from __future__ import annotations

import json as _json
import os
import unicodedata
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
# the first line of ``FastokensBPE.spec`` where the native tokenizer is built by ``from_tiktoken`` (``tiktoken_spec``)
TIKTOKEN_MAGIC = "packer-fastokens-tiktoken 1\n"
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
    hf: dict[int, Any] | None = None
    """Text k -> the HF tokenizer's tokenizers.Encoding of it, offsets included, where the HF tokenizer encoded it
    with them (``with_texts``): its labels read those offsets instead of encoding it again."""

    def with_texts(self, where: list[int], encodings: list[Any], *, offsets: bool) -> Flat:
        """This batch with the texts ``where`` (increasing, each an empty span here: left to the HF tokenizer)
        given the HF tokenizer's ``encodings``: still one flat array, so that a few such texts keep their batch on
        the batch path; ``offsets``: the encodings hold them, and are kept (``hf``)."""
        pieces, at, sizes = [], 0, []
        for k, encoding in zip(where, encodings, strict=True):
            ids = encoding.ids  # a new list at each access
            pieces += [self.ids[at:self.starts[k]], np.asarray(ids, dtype=np.int32)]
            sizes.append(len(ids))
            at = self.starts[k]
        lengths = np.diff(np.asarray(self.starts, dtype=np.int64))
        lengths[where] = sizes
        return Flat(np.concatenate([*pieces, self.ids[at:]]), [0, *np.cumsum(lengths).tolist()],
                    dict(zip(where, encodings, strict=True)) if offsets else None)


class FastokensBPE:
    """What fastokens needs to encode as the HF tokenizer does: the tokenizer's tokenizer.json (``source``: a
    ``TokenizerView``, pickled once with the encoder that holds both), whose string each process builds its
    native tokenizer from, once, and the HF tokenizer's ids of the probe, computed where the engine is made: a
    worker checks fastokens against them without building the HF tokenizer (~0.5 CPU-s of 151k vocabulary)."""

    def __init__(self, source: Any, want: list[list[int]], tiktoken: str | None = None):
        self.source = source
        """Anything with ``backend`` (the tokenizers.Tokenizer) and ``json()`` (its tokenizer.json)."""
        self.want = want
        """The HF tokenizer's ids of ``_PROBE``."""
        self.tiktoken = tiktoken
        """``tiktoken_spec`` of the tokenizer.json where it holds (the native tokenizer is then built by
        ``from_tiktoken`` from it), else None (``from_json_str``)."""
        self.nfc_only = tiktoken is not None and bool(_spec_header(tiktoken)["nfc"])
        """Does only a text that is NFC already go to the native tokenizer (tiktoken's has no normalizer; the HF
        tokenizer encodes the others)?"""

    def spec(self) -> str:
        """What the native tokenizer is built from (``build_native``): the ``tiktoken_spec``, else the
        tokenizer.json. The string a kept start builds it from (``Encoder.engine_json``)."""
        return self.tiktoken if self.tiktoken is not None else self.source.json()

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
        source = source if source is not None else _Source(backend)
        return cls(source, want, _tiktoken_spec_of(source.json()))

    def native(self) -> Any:
        """The fastokens.Tokenizer, or None where it failed the probe (built and probed on first use in each
        process)."""
        key = self._key()
        if key not in _NATIVE:
            built, native = _UNPROBED.pop(key, None), None
            if self.tiktoken is not None:  # where from_tiktoken refuses it or fails the probe: from_json_str
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    native = _checked_native(self.tiktoken, self.want, built, nfc_only=self.nfc_only)
                built = None
            _NATIVE[key] = native if native is not None else _checked_native(self.source.json(), self.want, built)
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
        json = self.spec()
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
        json = self.spec()
        last = _LAST
        if last is not None and (last[0] is json or last[0] == json):
            _UNPROBED[key] = last[1]
            return
        native = build_native(json)
        if native is not None:
            _UNPROBED[key] = native
            _LAST = (json, native)

    def _key(self) -> Any:
        # one per Rust tokenizer while the source holds one (engines of one tokenizer share it), else per source;
        # an unpickled source (a worker's) that builds its Rust tokenizer later, for a text only the HF tokenizer
        # encodes, keeps the key it had: a new one would build the native tokenizer again
        backend = vars(self.source).get("backend")
        if backend is None or self.source in _NATIVE or self.source in _UNPROBED:
            return self.source
        return backend

    def encode(self, texts: list[str]) -> tuple[Flat, list[int]]:
        """The ids of every text (no special tokens added), flat, and the texts it left to the HF tokenizer (not
        valid Unicode; every text where the probe failed): those have no ids in ``Flat`` (an empty span)."""
        native = self.native()
        if native is None:
            return Flat(np.zeros(0, dtype=np.int32), [0] * (len(texts) + 1)), list(range(len(texts)))
        if not self.nfc_only:
            return _encode(native, texts)
        away = {k for k, t in enumerate(texts) if not _nfc(t)}  # the HF tokenizer's: it NFC-normalizes them
        if not away:
            return _encode(native, texts)
        flat, left = _encode(native, ["" if k in away else t for k, t in enumerate(texts)])
        return flat, sorted(away.union(left))


class _Source:
    """A bare tokenizers.Tokenizer as an engine's ``source``."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._json: str | None = None

    def json(self) -> str:
        if self._json is None:
            self._json = self.backend.to_str()
        return self._json


def build_native(json: str) -> Any:
    """fastokens' tokenizer of this tokenizer.json (or ``tiktoken_spec``: ``FastokensBPE.spec``), built and not
    probed (``prepare``); None where fastokens cannot load it (``native`` then says so on first use, and the HF
    tokenizer encodes)."""
    try:
        return _build(json)
    except Exception:  # noqa: BLE001  # left to ``native``, which warns and takes the HF tokenizer
        return None


def _build(spec: str) -> Any:
    import fastokens

    if not spec.startswith(TIKTOKEN_MAGIC):
        return fastokens.Tokenizer.from_json_str(spec)
    head = _spec_header(spec)
    ranks = spec[spec.index("\n", len(TIKTOKEN_MAGIC)) + 1:].encode("ascii")
    # from_tiktoken reads its ranks from a file (~2.5 MB for a 151k vocabulary, written once per process)
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".tiktoken", delete=False) as f:
        f.write(ranks)
    try:
        return fastokens.Tokenizer.from_tiktoken(f.name, pattern=head["pattern"], special_tokens=head["special_tokens"])
    finally:
        os.unlink(f.name)


def _spec_header(spec: str) -> dict[str, Any]:
    return _json.loads(spec[len(TIKTOKEN_MAGIC):spec.index("\n", len(TIKTOKEN_MAGIC))])


def _nfc(text: str) -> bool:
    return text.isascii() or unicodedata.is_normalized("NFC", text)


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


def _checked_native(json: str, want: list[list[int]], native: Any = None, nfc_only: bool = False) -> Any:
    """fastokens' tokenizer of this tokenizer.json or ``tiktoken_spec`` (``native``: built already, from it)
    where its ids of the probe are ``want`` (the HF tokenizer's), else None. ``nfc_only``: of the probe texts that
    are NFC (the only ones it is given)."""
    keep = [k for k, t in enumerate(_PROBE) if not nfc_only or _nfc(t)]
    try:
        native = native if native is not None else _build(json)
        flat, _ = _encode(native, [_PROBE[k] for k in keep])
    except Exception as e:  # a pipeline fastokens cannot load: the HF tokenizer  # noqa: BLE001
        return _slower(f"fastokens cannot load it ({type(e).__name__}: {e})")
    if [flat.ids[a:b].tolist() for a, b in pairwise(flat.starts)] != [want[k] for k in keep]:
        return _slower("fastokens' ids of the probe texts differ from the HF tokenizer's")
    return native


def _slower(why: str) -> None:
    """Said once per tokenizer and process: the ids stay exact (the HF tokenizer's), the build is slower."""
    warnings.warn(f"{why}: this tokenizer encodes with the HF tokenizer (exact, several times slower)",
                  RuntimeWarning, stacklevel=3)


_SPECS: dict[str, str | None] = {}  # tokenizer.json -> its ``tiktoken_spec`` (the last few: each is checked once)


def _tiktoken_spec_of(json: str) -> str | None:
    if json not in _SPECS:
        if len(_SPECS) >= 4:
            _SPECS.pop(next(iter(_SPECS)))
        _SPECS[json] = tiktoken_spec(json)
    return _SPECS[json]


def tiktoken_spec(json: str) -> str | None:
    """What ``fastokens.Tokenizer.from_tiktoken`` needs to build the same tokenizer as ``from_json_str`` of this
    tokenizer.json (``TIKTOKEN_MAGIC``, a JSON line of the split pattern, the added tokens and whether the
    normalizer is NFC, then the ranks: one ``base64(token bytes) rank`` line per token), where it is provably
    the same BPE, else None. The condition, read off the file:

    - around the BPE: no normalizer, or NFC (then ``FastokensBPE`` hands tiktoken only texts that are NFC
      already, which NFC leaves as they are); the pre-tokenizer ``Sequence[Split(pattern, Isolated),
      ByteLevel(add_prefix_space=False, use_regex=False)]`` with a pattern of a builtin's rank file
      (``RANKS``: every character starts a match of it, so tiktoken's findall and the Isolated split cut a text
      into the same pieces, and ByteLevel maps each piece to its bytes); no truncation or padding; every added
      token after the vocabulary (id >= its size), matched as it is written (``_eligible``: not normalized, no
      strip, not a single word), as tiktoken's special tokens are;
    - the model: BPE with ``ignore_merges`` (a piece that is a token is that token, tiktoken's first rule), no
      byte fallback, no dropout, no subword prefix or word suffix; its vocabulary, as bytes by id (the ranks),
      byte for byte the rank file of that pattern's ``RANKS`` entry, one whose every token is its own BPE
      (``Ranks.own_bpe``: qwen2, llama4; from_tiktoken refuses Llama 3's ranks);
    - the merges are exactly those transformers' ``TikTokenConverter`` derives from these ranks (the builtins
      are made by it): each a split of a token into two tokens ``(l, r)``, strictly increasing in
      ``(rank(l + r), rank(l), rank(r))``, and as many as there are such splits (``RANK_SPLITS``): all of them.

    Why that is the same BPE: tiktoken merges, piece by piece, the adjacent pair whose concatenation has the
    lowest rank (the leftmost of equal ones) until none is a token; the HF BPE merges the adjacent pair that
    comes first in the merges (the leftmost of equal pairs). With every split a merge, an adjacent pair is a
    merge exactly where its concatenation is a token (the same candidates), and with the merges in the merged
    token's rank order the HF BPE's first candidate makes the lowest-ranked token, as tiktoken's does: each
    step makes the same token. They could part only where two overlapping pairs ``x|y`` and ``y|z`` make the
    same token by two splits (``x + y == y + z``), the left one for tiktoken, the one first in the merges for
    HF: transformers' conversion rests on that not happening in a rank file's BPE, and fastokens'
    ``from_tiktoken`` takes only rank files where each token is the tiktoken merge of two lower-ranked ones; a
    brute-force search over random such vocabularies found no text where the three differ (docs/benchmarks-log.md,
    session 19, lane T). The probe (``_checked_native``) runs on the native tokenizer built either way, and
    tests/encode/test_fastokens_bpe.py fuzzes it against transformers for every builtin."""
    import gc

    import orjson

    collect = gc.isenabled()
    gc.disable()  # ~1.5M objects made and dropped: no collection over them meanwhile
    try:
        data = orjson.loads(json)
        return _spec(data) if isinstance(data, dict) else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    finally:
        if collect:
            gc.enable()


def _spec(data: dict) -> str | None:
    import base64
    from operator import add

    from packer.errors import ConfigError
    from packer.models.shared.tokenizer import RANKS

    model, normalizer, pre = data.get("model") or {}, data.get("normalizer"), data.get("pre_tokenizer") or {}
    if (model.get("type") != "BPE" or model.get("ignore_merges") is not True or model.get("byte_fallback")
            or model.get("dropout") is not None or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix") or data.get("truncation") or data.get("padding")):
        return None
    if normalizer is not None and normalizer != {"type": "NFC"}:
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not isinstance(steps, list) or len(steps) != 2:
        return None
    split, level = steps
    pattern = (split.get("pattern") or {}).get("Regex")
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or pattern not in {r.pattern for r in RANKS.values()}):
        return None
    if level.get("type") != "ByteLevel" or level.get("add_prefix_space") or level.get("use_regex"):
        return None
    vocab: dict[str, int] = model["vocab"]
    n = len(vocab)
    tokens = data.get("added_tokens") or []
    added = {t["content"]: t["id"] for t in tokens}
    if (len(added) != len(tokens) or any(type(i) is not int or i < n for i in added.values())
            or any(t["normalized"] or t["lstrip"] or t["rstrip"] or t["single_word"] for t in tokens)):
        return None
    # the ranks: those of a builtin's rank file (whose every token is its own BPE, ``Ranks.own_bpe``: what
    # from_tiktoken needs of a rank file), by the ids of the vocabulary's byte-level tokens
    ranks = next((r for r in RANKS.values() if r.pattern == pattern and r.size == n and r.own_bpe), None)
    if ranks is None or sorted(vocab.values()) != list(range(n)):
        return None
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    # GPT-2's byte alphabet, as ByteLevel writes a token's bytes
    to_bytes = {ord(u): b for b, u in bytes_to_unicode().items()}
    if any(ord(c) not in to_bytes for c in set().union(*vocab)):
        return None
    body = "".join(f"{base64.b64encode(tok.translate(to_bytes).encode('latin-1')).decode()} {r}\n"
                   for tok, r in sorted(vocab.items(), key=lambda kv: kv[1]))
    try:
        if body.encode("ascii") != ranks.path().read_bytes():
            return None
    except (OSError, ConfigError):  # its package is not installed here
        return None
    # the merges: each a split of a token into two tokens, strictly increasing in (rank(l + r), rank(l), rank(r)),
    # and as many as such splits there are (``RANK_SPLITS``): all of them, in TikTokenConverter's order
    merges = model["merges"]
    if len(merges) != RANK_SPLITS.get(ranks.relative):
        return None
    if merges and isinstance(merges[0], str):
        merges = [m.split(" ") for m in merges]
    if any(len(m) != 2 for m in merges):
        return None
    lefts, rights = [m[0] for m in merges], [m[1] for m in merges]
    made = list(map(vocab.get, map(add, lefts, rights)))
    ls, rs = list(map(vocab.get, lefts)), list(map(vocab.get, rights))
    if None in made or None in ls or None in rs:
        return None
    t, a, b = (np.diff(np.asarray(x, dtype=np.int64)) for x in (made, ls, rs))
    if not np.all((t > 0) | ((t == 0) & ((a > 0) | ((a == 0) & (b > 0))))):
        return None
    head = _json.dumps({"pattern": pattern, "special_tokens": added, "nfc": normalizer is not None})
    return f"{TIKTOKEN_MAGIC}{head}\n{body}"


RANK_SPLITS = {"resources/qwen.tiktoken": 294166, "llama4/tokenizer.model": 439802}
"""How many ways each builtin rank file's tokens split into two of its tokens (``Ranks.relative`` -> the count):
the number of merges transformers' ``TikTokenConverter`` derives from it (tests/encode/test_fastokens_bpe.py
counts them)."""


