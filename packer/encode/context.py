"""What the encode stages (draft.py, media.py, lengths.py) read from the tokenizer and the encoder: two small
objects the ``Encoder`` builds once and hands them, so each stage names what it uses and none reaches into the
Encoder (they never import it: encoder.py imports the stages, not the other way round).

    TokenizerView   the Rust tokenizer: ids of a text or a token, the special-token mask, token byte lengths
    EncodeContext   the view, the profile and its tokens' ids, the length policy's numbers, the runs' ids,
                    and the counter of which path each step took (``Encoder.path_counts``)

Both pickle with the encoder (a worker's copy): the view holds the Rust tokenizer (pickled as its tokenizer.json,
rebuilt where a text first needs it), never the transformers one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packer.encode.tokenize import cached_token_byte_lengths, normalizes_nfc, special_token_mask, tokenize
from packer.errors import ConfigError, RecordError
from packer.models.base import MediaRun, ModelProfile


@dataclass(frozen=True, kw_only=True, eq=False)  # eq=False: arrays have no truth value to compare by
class TokenizerView:
    """The tokenizer as the encode stages use it: ``of(tokenizer)`` reads what they need from a transformers
    fast tokenizer; the methods run its Rust tokenizer (``backend``), which is all a worker process holds (and
    only once a text needs it: fastokens encodes the rest, ``__getstate__``)."""

    backend: Any
    """The ``tokenizers.Tokenizer`` (the transformers tokenizer's ``backend_tokenizer``)."""
    is_special: np.ndarray
    """(V,) bool: id -> special (control) token? An end-of-turn marker is the first after a message's content."""
    token_bytes: np.ndarray | None
    """(V,) int32 UTF-8 bytes per token id (the ``byte-lengths`` fast path), or None: boundaries come from
    character offsets (the general path)."""
    nfc: bool
    """The tokenizer normalizes to NFC: ``token_bytes`` then hold for texts already in NFC only."""
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None

    @classmethod
    def of(cls, tokenizer: Any, *, byte_lengths: bool) -> TokenizerView:
        """The view of a transformers fast tokenizer; ``byte_lengths``: compute ``token_bytes`` (where they
        apply; cached per tokenizer)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError("packer needs a fast (Rust-backed) tokenizer: it reads character offsets")
        is_special = special_token_mask(tokenizer)
        return cls(backend=backend, is_special=is_special,
                   token_bytes=cached_token_byte_lengths(backend, size=is_special.shape[0]) if byte_lengths else None,
                   nfc=normalizes_nfc(backend), bos_id=tokenizer.bos_token_id, eos_id=tokenizer.eos_token_id,
                   unk_id=tokenizer.unk_token_id)

    def __getstate__(self) -> dict[str, Any]:
        """The Rust tokenizer as its tokenizer.json (what its own pickle holds): a worker rebuilds it only when
        a text needs it (``backend``), and builds fastokens' tokenizer from the same string (``json``)."""
        state = dict(self.__dict__)
        state["_json"] = self.json()
        state.pop("backend", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __getattr__(self, name: str) -> Any:
        # only for what __dict__ lacks: ``backend`` of an unpickled view, built from its JSON on first use
        # (~0.5 CPU-s for a 151k vocabulary, which a worker whose every text fastokens encodes never pays)
        if name != "backend" or "_json" not in self.__dict__:
            raise AttributeError(name)
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(self.__dict__["_json"])
        object.__setattr__(self, "backend", backend)
        return backend

    def json(self) -> str:
        """The Rust tokenizer's tokenizer.json (made once per view)."""
        if "_json" not in self.__dict__:
            object.__setattr__(self, "_json", self.backend.to_str())
        return self.__dict__["_json"]

    def tokenize(self, texts: list[str], *, offsets: bool) -> list:
        """Each text's tokenizers.Encoding, no special tokens added (``tokenize.tokenize``)."""
        return tokenize(self.backend, texts, offsets=offsets)

    def encoding(self, text: str) -> Any:
        """One text's tokenizers.Encoding with its character offsets, no special tokens added."""
        return self.backend.encode(text, add_special_tokens=False)

    def ids(self, text: str) -> np.ndarray:
        """(L,) int32 ids of ``text`` tokenized alone, no special tokens added."""
        return np.asarray(self.backend.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids: np.ndarray) -> str:
        """The text of ``ids``, special tokens written out."""
        return self.backend.decode(ids.tolist(), skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` as one token of the vocabulary, None where the tokenizer has no such token (as
        transformers' ``convert_tokens_to_ids``, which gives the unknown token's id)."""
        tid = self.backend.token_to_id(token)
        if tid is None or tid == self.unk_id or self.backend.id_to_token(tid) != token:
            return None
        return int(tid)


class RunIds:
    """The token ids of ``MediaRun``s laid out in tokens of their own (``MediaRun.tokens`` or ``.text``),
    cached per run: a dataset has few distinct grids and runs."""

    def __init__(self, tokens: TokenizerView, profile: ModelProfile):
        self._tokens, self._profile = tokens, profile
        self._names: dict[tuple[str, ...], np.ndarray] = {}
        self._texts: dict[str, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_tokens": self._tokens, "_profile": self._profile, "_names": {}, "_texts": {}}

    def ids(self, run: MediaRun, ids: np.ndarray, p: int) -> np.ndarray | None:
        """The run's ids where it is not the placeholder repeated (None), its placeholder at ``p`` of ``ids``."""
        if run.tokens is not None:
            out = self._names.get(run.tokens)
            if out is None:
                lookup = {name: self._token_id(name) for name in set(run.tokens)}
                out = self._names[run.tokens] = np.array([lookup[n] for n in run.tokens], dtype=np.int32)
            return out
        if run.text is not None:
            out = self._texts.get(run.text)
            if out is None:
                out = self._texts[run.text] = self._tokens.ids(run.text)
            self.check_edges(run.text, out, ids, p)
            return out
        return None

    def _token_id(self, name: str) -> int:
        tid = self._tokens.token_id(name)
        if tid is None:
            raise ConfigError(f"profile {self._profile.name!r} uses token {name!r}, which the tokenizer does not have")
        return tid

    def check_edges(self, text: str, run: np.ndarray, ids: np.ndarray, p: int) -> None:
        """RecordError unless tokenizing ``text`` in place of the placeholder at ``p`` gives ``run``: at each
        edge either side is a special token, or the text between the edge's nearest special token and the run,
        tokenized with it, splits at the edge."""
        special, tokens = self._tokens.is_special, self._tokens
        if p > 0 and not special[ids[p - 1]] and not special[run[0]]:
            q = p - 1
            while q > 0 and not special[ids[q - 1]]:
                q -= 1
            before = ids[q:p]
            joined = tokens.ids(tokens.decode(before) + text)
            if joined.shape[0] < before.shape[0] or not np.array_equal(joined[: before.shape[0]], before):
                raise self._error()
        if p + 1 < ids.shape[0] and not special[ids[p + 1]] and not special[run[-1]]:
            q = p + 2
            while q < ids.shape[0] and not special[ids[q]]:
                q += 1
            after = ids[p + 1 : q]
            joined = tokens.ids(text + tokens.decode(after))
            if joined.shape[0] < after.shape[0] or not np.array_equal(joined[-after.shape[0] :], after):
                raise self._error()

    def _error(self) -> RecordError:
        profile = self._profile
        return RecordError(
            "template_error",
            f"profile {profile.name!r} writes a video as text that would merge with the text around its "
            f"placeholder; the chat template must put a special token (e.g. {profile.image.start if profile.image else None!r}) next to it",
        )


@dataclass(kw_only=True, eq=False)
class EncodeContext:
    """What the stages after tokenization read from the encoder: one per ``Encoder``, built by it."""

    tokens: TokenizerView
    profile: ModelProfile
    image_token_id: int | None
    video_token_id: int | None
    audio_token_id: int | None
    vision_start_id: int | None
    is_placeholder: np.ndarray
    """(V,) bool: id -> an image, video or audio placeholder token?"""
    max_length: int | None
    """The length policy's limit (None: unlimited)."""
    long_docs_overlap: int
    """Tokens consecutive chunks of a split text share (``lengths.split``)."""
    runs: RunIds
    """The ids of runs laid out in tokens of their own (``media.expand``)."""
    paths: Counter[str] = field(default_factory=Counter)
    """Steps by the path they took (``Encoder.path_counts``): the stages count into it."""
