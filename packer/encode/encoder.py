"""Example -> Encoded: token ids, labels, tree nodes, media and positions, for one tokenizer, chat template and
model profile. The Encoder orchestrates four stages, each in its own module:

    render   every root-to-node path rendered, content located, images the processor rewrites rewritten (render.py)
    tokens   ONE tokenizer call for all the batch's texts (tokenize.py), labels for all of them, trees joined
             from their paths' tokens (draft.py)
    media    each placeholder becomes its family's run (``ModelProfile.media_runs``) (media.py)
    lengths  the length policy of an example longer than max_length (lengths.py)

then positions: a token's position on its root-to-leaf path, and the profile's own (``positions.extra``: mRoPE).

Fast paths, each beside the general path it replaces, selected by one argument: ``Encoder(..., fast=True)`` (the
default) takes them where they apply, ``fast=False`` never does, ``fast={"byte-lengths", ...}`` takes those named
(``FAST_PATHS``); tests/encode/test_encoder.py compares them on random records, and ``Encoder.path_counts()``
says which path each step took (a test proves the general one ran):

- ``python-template``: a registered ChatML template (the builtins' Qwen2-VL, Qwen2.5, Qwen3-VL, LLaVA-OneVision,
  InternVL3, Qwen2.5-Omni, Qwen3-Omni, Qwen2-Audio, Molmo2) or Gemma 3's, the gemma4 stand-in's, Llama 4's, Mistral 3's
  or SmolVLM's in pure Python (templates.py), where Jinja is the general path;
- ``byte-lengths``: the loss rule for all texts at once from token byte lengths (labels.batch_loss_labels), where
  character offsets per text are the general path;
- ``fastokens``: the batch's ids, flat, from fastokens on the tokenizer's own tokenizer.json (fastokens_bpe.py),
  where the HF tokenizer is the general path; only where it is checked exact and with ``byte-lengths`` (its
  tokens' boundaries come from their byte lengths). A text it leaves (not valid Unicode) goes to the HF tokenizer.
  (It replaced issue 25's ``tiktoken`` engine, removed in issue 33: every vocabulary tiktoken was exact on,
  fastokens is too, at ~10x its speed.)
- ``batch-finish``: the batch's common records (a conversation or tree whose images are the placeholder
  repeated, or none; a text record that fits) finished together as columns (finish.py), where ``_finish`` per
  record is the general path; anything it cannot prove identical goes there.
- ``plain-columns`` (with ``batch-finish``): a build's plain records from their JSONL lines' columns to rows,
  chats whose every message is one text, linear or with one level of branches (``encode_chats``, with
  ``python-template``'s ChatML renderer), and ``text`` records (``encode_texts``); ``formats.read.text_chats``
  reads them, ``pipeline.stages`` merges their rows with the others'. The general path: an Example (its
  Messages) and a Staged per record through ``encode_batch``; tests/encode/test_plain_columns.py compares them,
  chunk file for chunk file.

Not a switch: one tokenizer call per batch (the build passes a 512-line chunk) serves both paths.

Their measured gains: docs/benchmarks.md, "Fast paths".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from packer.core.ids import chunk_id
from packer.core.tree import tree_position_ids
from packer.core.types import IGNORE_INDEX, Encoded, Example
from packer.encode import LONG_DOCS_POLICIES, OVERLONG_POLICIES, lengths, media
from packer.encode.context import EncodeContext, RunIds, TokenizerView
from packer.encode.draft import Draft, Tokens, batch_tokens, column_tokens, text_draft, tree_draft
from packer.encode.fastokens_bpe import FastokensBPE, Flat
from packer.encode.finish import BatchFinish, Row, Rows
from packer.encode.render import Staged, stage, stage_batch
from packer.encode.templates import ChatTemplate
from packer.encode.tokenize import flat_ids
from packer.errors import ConfigError, RecordError
from packer.models.base import ModelProfile

FAST_PATHS = ("python-template", "byte-lengths", "fastokens", "batch-finish", "plain-columns")
"""The encoder's fast paths by name (module docstring); ``Encoder(fast=...)`` picks them."""


class Encoder:
    """Turns Examples into Encoded examples for one tokenizer, chat template and model profile.

    ``max_length`` (None: unlimited) with ``overlong`` (``packer.encode.OVERLONG_POLICIES``): ``drop``
    rejects a longer example (``overlong``), ``truncate`` keeps its first ``max_length`` tokens in the
    depth-first layout, never inside an image; ``truncate_left`` / ``keep_last_turns`` keep the end (a text's
    last tokens, a conversation's last whole turns). ``long_docs="split"``: a longer ``text`` record becomes
    several examples (``lengths.split``; ``long_docs_overlap`` tokens of context shared), so ``encode_batch``
    gives a list for it. ``chat_template``: a template source that replaces the tokenizer's. ``fast``: take the
    fast paths (module docstring: True all, False none, or the ``FAST_PATHS`` named); False runs the general
    path only, for tests and for a suspected fast path.
    """

    def __init__(
        self,
        tokenizer: Any,
        profile: ModelProfile,
        *,
        max_length: int | None = None,
        overlong: str = "drop",
        long_docs: str = "off",
        long_docs_overlap: int = 0,
        chat_template: str | None = None,
        fast: bool | Iterable[str] = True,
    ):
        if overlong not in OVERLONG_POLICIES:
            raise ConfigError(f"'overlong' must be one of {', '.join(OVERLONG_POLICIES)}, got {overlong!r}")
        if max_length is not None and max_length < 1:
            raise ConfigError(f"'max_length' must be a positive integer, got {max_length}")
        if long_docs not in LONG_DOCS_POLICIES:
            raise ConfigError(f"'long_docs' must be one of {', '.join(LONG_DOCS_POLICIES)}, got {long_docs!r}")
        if long_docs_overlap < 0 or (max_length is not None and long_docs_overlap >= max_length):
            raise ConfigError(f"'long_docs_overlap' must be in [0, max_length), got {long_docs_overlap}")
        self.fast_paths = frozenset(FAST_PATHS if fast is True else () if fast is False else fast)
        if self.fast_paths - set(FAST_PATHS):
            raise ConfigError(f"unknown fast paths {sorted(self.fast_paths - set(FAST_PATHS))}; known: {', '.join(FAST_PATHS)}")
        view = TokenizerView.of(tokenizer, byte_lengths="byte-lengths" in self.fast_paths)
        self.tokenizer = tokenizer
        self.profile = profile
        self.max_length = max_length
        self.overlong = overlong
        self.long_docs = long_docs
        self.long_docs_overlap = long_docs_overlap
        self._chat_template = chat_template
        self._chat = ChatTemplate(
            chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None),
            special_tokens={k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
            images=profile.image is not None, fast="python-template" in self.fast_paths,
        )
        # the ids from fastokens where exact (None: the HF tokenizer); its boundaries need byte lengths
        bytes_ok = view.token_bytes is not None
        self._fastokens = (FastokensBPE.of(view.backend, source=view) if "fastokens" in self.fast_paths
                           and bytes_ok else None)
        self.image_token_id = self._token_id(view, profile.image_token)
        self.video_token_id = self._token_id(view, profile.video_token)
        self.audio_token_id = self._token_id(view, profile.audio_token)
        self.vision_start_id = self._token_id(view, profile.image.start if profile.image else None)
        self.bos_id = view.bos_id
        self.eos_id = view.eos_id
        is_placeholder = np.zeros_like(view.is_special)  # (V,) id -> an image, video or audio token?
        is_placeholder[[t for t in (self.image_token_id, self.video_token_id, self.audio_token_id)
                        if t is not None]] = True
        # what the profile's positions.extra may look tokens up by (mRoPE finds each image's run)
        self._token_ids = {
            "image_token": self.image_token_id,
            "video_token": self.video_token_id,
            "audio_token": self.audio_token_id,
            "vision_start": self.vision_start_id,
            "vision_end": self._token_id(view, profile.image.end if profile.image else None),
        }
        self.context = EncodeContext(
            tokens=view, profile=profile, image_token_id=self.image_token_id, video_token_id=self.video_token_id,
            audio_token_id=self.audio_token_id, vision_start_id=self.vision_start_id, is_placeholder=is_placeholder,
            max_length=max_length, long_docs_overlap=long_docs_overlap, runs=RunIds(view, profile),
        )
        """What the stages (draft.py, media.py, lengths.py) read from this encoder and its tokenizer."""
        self.paths = self.context.paths  # steps by the path they took (see the module docstring)
        self._batch_finish = BatchFinish.of(self.context) if "batch-finish" in self.fast_paths else None

    @property
    def template(self) -> str | None:
        """The chat template source in use: ``chat_template``'s, else the tokenizer's."""
        return self._chat.source

    def path_counts(self) -> Counter[str]:
        """Which path each step took since this encoder was made: rendering ("render:python", "render:jinja",
        "render:jinja+prefixes"), tokens ("tokens:fastokens", "tokens:hf", per text), labels
        ("labels:byte-lengths", "labels:offsets"), the records ``batch-finish`` finished ("finish:batch") and
        those of them ``plain-columns`` finished from columns ("plain-columns": chats and text records)."""
        return Counter({f"render:{k}": v for k, v in self._chat.paths.items()}) + self.paths

    def replace(self, **changes: Any) -> Encoder:
        """A new Encoder with these options changed (``fast=False``: the general path), the same tokenizer."""
        options = dict(max_length=self.max_length, overlong=self.overlong, long_docs=self.long_docs,
                       long_docs_overlap=self.long_docs_overlap, chat_template=self._chat_template,
                       fast=self.fast_paths)
        return Encoder(self.tokenizer, self.profile, **(options | changes))

    def prepare_fork(self, built: tuple[str, Any] | None = None) -> None:
        """Build now what a process builds on its first batch and can share with processes forked from it:
        fastokens' native tokenizer (``FastokensBPE.prepare``: nothing is encoded, no thread started;
        ``built``: one built already, from that tokenizer.json, taken where it is this encoder's)."""
        if self._fastokens is not None:
            self._fastokens.prepare(built)

    def prepare_here(self) -> None:
        """Build fastokens' native tokenizer now for this process's own batches, or take the one it built last for
        the same tokenizer.json (``FastokensBPE.prepare_here``: a process that encodes build after build)."""
        if self._fastokens is not None:
            self._fastokens.prepare_here()

    def engine_json(self) -> str | None:
        """What fastokens' native tokenizer is built from (``FastokensBPE.spec``: its ``tiktoken_spec``, else the
        tokenizer.json); None: this encoder has no fastokens."""
        return self._fastokens.spec() if self._fastokens is not None else None

    def __getstate__(self) -> dict:
        """What a worker process needs: the Rust tokenizer, the template source and the tables built from the
        tokenizer; not the transformers tokenizer around it, so unpickling imports no transformers (which
        imports torch through AutoTokenizer). After it ``tokenizer`` is None."""
        return {**self.__dict__, "tokenizer": None}

    def _token_id(self, view: TokenizerView, token: str | None) -> int | None:
        if token is None:
            return None
        tid = view.token_id(token)
        if tid is None:
            raise ConfigError(
                f"profile {self.profile.name!r} uses token {token!r}, which the tokenizer does not have"
            )
        return tid

    # ------------------------------------------------------------------ public

    def encode(self, example: Example) -> Encoded | list[Encoded]:
        """Render, tokenize and label one example; raise RecordError (with ``path:line``) if unusable. A text
        split by ``long_docs="split"`` gives its chunks, in order."""
        (result,) = self.encode_batch([example])
        if isinstance(result, RecordError):
            raise result
        return result

    def encode_batch(self, examples: Sequence[Example], *, rows: bool = False
                     ) -> list[Encoded | Row | list[Encoded] | RecordError]:
        """``encode`` for many examples with ONE tokenizer call: each example's Encoded (a split text: the
        list of its chunks) or its RecordError. ``rows``: a record ``batch-finish`` took stays a ``Row`` of
        its batch's columns (what ``shards.assemble.encoded_table`` reads without an Encoded per record).

        Errors are returned (located at ``path:line``), not raised, so one bad record does not cost the others
        their shared tokenizer call. The results equal ``encode`` one example at a time.
        """
        staged = stage_batch(examples, self._chat, self.profile)
        texts: list[str] = []
        for s in staged:
            if not isinstance(s, RecordError):
                s.first = len(texts)
                texts.extend(s.texts)
        encodings = self._tokenize(texts)
        tokens = batch_tokens(self.context, [s for s in staged if not isinstance(s, RecordError)], texts, encodings)
        return self.finish_batch(examples, staged, tokens, rows=rows)

    def takes_chats(self) -> bool:
        """Whether ``encode_chats`` finishes any chat (``plain-columns``: the ChatML renderer, ``batch-finish``)."""
        return self.takes_texts() and self._chat.renders_chats

    def takes_texts(self) -> bool:
        """Whether ``encode_texts`` finishes any text record (``plain-columns``, ``batch-finish``)."""
        return "plain-columns" in self.fast_paths and self._batch_finish is not None

    def encode_texts(self, docs: list[str]) -> tuple[Rows | None, np.ndarray]:
        """``encode_batch(rows=True)`` of ``text`` records given as their texts (``formats.read.text_chats``), no
        Example or Staged each: one tokenizer call, ``BatchFinish.texts``. Returns the Rows and the rows
        finished (record k's row is k); the others (over ``max_length``, fewer than 2 tokens, a placeholder token
        written literally) are the caller's to ``encode_batch``, which is the reference."""
        empty = np.zeros(0, dtype=np.int64)
        if not docs or not self.takes_texts():
            return None, empty
        ids, starts = flat_ids(self._tokenize(docs))
        block, ok = self._batch_finish.texts(ids, starts, self.max_length)  # type: ignore[union-attr]
        rows = np.flatnonzero(ok) if block is not None else empty
        self.paths["plain-columns"] += int(rows.shape[0])
        return block, rows

    def encode_chats(self, nodes: list[int], counts: list[int], roles: list[str], contents: list[str]
                     ) -> tuple[Rows | None, np.ndarray, np.ndarray]:
        """``encode_batch(rows=True)`` of chats whose every message is one text with no ``loss`` of its own, linear
        or with one level of branches, given as columns (``formats.read.text_chats``: record k has ``nodes[k]``
        nodes, its root then each branch, node n ``counts[n]`` messages, the next ones of ``roles``, canonical,
        and ``contents``), without an Example, Message or Staged object each: rendered from the columns
        (``ChatTemplate.render_chats``), one tokenizer call, the loss rule from the spans' columns, finished as
        columns (``BatchFinish.chats``). Returns the Rows and, per record finished, its index among the chats
        and its row there; the others (a role or text the renderer leaves, a branch that does not extend its
        root's tokens, no loss token, over ``max_length``, a placeholder token written literally) are the
        caller's to ``encode_batch``, which is the reference (tests/encode/test_plain_columns.py). A record it
        leaves was rendered and tokenized here and is again there (each path counted where it ran)."""
        empty = np.zeros(0, dtype=np.int64)
        rendered = self._chat.render_chats(nodes, counts, roles, contents) if self.takes_chats() else None
        if rendered is None or not rendered.texts:
            return None, empty, empty
        texts, loss = rendered.texts, rendered.assistant
        tokens = column_tokens(self.context, texts, self._tokenize(texts), (rendered.text[loss], rendered.chars[loss]))
        block, ok = self._batch_finish.chats(tokens, rendered.paths, self.max_length)  # type: ignore[union-attr]
        rows = np.flatnonzero(ok)
        self._chat.paths["python"] += int(np.diff(rendered.paths)[rows].sum())
        self.paths["plain-columns"] += int(rows.shape[0])
        return block, rendered.records[rows], rows

    def finish_batch(self, examples: Sequence[Example], staged: Sequence[Staged | RecordError],
                     tokens: Tokens, *, rows: bool = False) -> list[Encoded | Row | list[Encoded] | RecordError]:
        """``encode_batch`` after its tokenizer call: each staged example's Encoded (``batch-finish`` for the
        batch's common records, ``_finish`` for the rest; with ``rows`` the former stay Rows) or its
        RecordError."""
        good = [k for k, s in enumerate(staged) if not isinstance(s, RecordError)]
        done: list[Encoded | Row | None] = [None] * len(examples)
        if self._batch_finish is not None and good:
            whole = len(good) == len(staged)  # no error: the batch as it is, no copies
            finished = self._batch_finish.rows(examples if whole else [examples[k] for k in good],
                                               staged if whole else [staged[k] for k in good],  # type: ignore[arg-type]
                                               tokens, self.max_length)
            if whole and rows and None not in finished:  # every record the batch finish's (a text chat chunk)
                return finished  # type: ignore[return-value]
            for k, one in zip(good, finished, strict=True):
                done[k] = one if rows or one is None else one.encoded()
        out: list[Encoded | Row | RecordError] = []
        for example, s, one in zip(examples, staged, done, strict=True):
            if isinstance(s, RecordError):
                out.append(s)
                continue
            if one is not None:
                out.append(one)
                continue
            try:
                out.append(self._finish(example, s, tokens))
            except RecordError as e:
                out.append(e if e.path else e.located(example.path, example.line))
        return out

    def _tokenize(self, texts: list[str]) -> list | Flat:
        """Each text's tokens: all ids flat where fastokens applies (``Flat``: the texts it leaves to the HF tokenizer
        spliced in), else each text's tokenizers.Encoding from the HF tokenizer."""
        view = self.context.tokens
        if self._fastokens is None:
            self.paths["tokens:hf"] += len(texts)
            return view.tokenize(texts, offsets=view.token_bytes is None)
        flat, rest = self._fastokens.encode(texts)
        self.paths["tokens:fastokens"] += len(texts) - len(rest)
        if not rest:
            return flat
        self.paths["tokens:hf"] += len(rest)
        # where fastokens encodes, a text it leaves is one NFC rewrites (or not valid Unicode): its labels need the
        # offsets, kept in ``Flat.hf``; where it failed its probe it leaves every text, whose labels the byte
        # lengths give as before
        offsets = self._fastokens.native() is not None
        return flat.with_texts(rest, view.tokenize([texts[k] for k in rest], offsets=offsets), offsets=offsets)

    # ------------------------------------------------------------------ the stages after tokens

    def _finish(self, example: Example, staged: Staged, tokens: Tokens) -> Encoded | list[Encoded]:
        """Tokens of the staged texts -> the Encoded example (media, length policy, positions)."""
        draft = self._draft(example, staged, tokens)
        length = draft.ids.shape[0]
        if self.max_length is None or length <= self.max_length:
            return self._encoded(example, draft)
        text = example.kind == "text"
        if text and self.long_docs == "split":  # each chunk an example of its own, ``path:line@k``
            return [self._encoded(example, chunk, example_id=chunk_id(example.example_id, k))
                    for k, chunk in enumerate(lengths.split(self.context, draft))]
        if self.overlong == "drop":
            raise RecordError("overlong", f"{length} tokens > --max-length {self.max_length}")
        if self.overlong == "truncate" or (text and self.overlong == "keep_last_turns"):
            lengths.truncate(self.context, draft)
        elif text:  # truncate_left
            lengths.truncate_left(self.context, draft)
        else:  # keep_last_turns, or truncate_left on a conversation
            draft = lengths.keep_last_turns(self.context, example, length, redraft=self._draft_alone)
        return self._encoded(example, draft)

    def _draft(self, example: Example, staged: Staged, tokens: Tokens) -> Draft:
        """The whole example's tokens, labels and nodes, its media expanded (no length policy yet)."""
        ctx = self.context
        draft = text_draft(ctx, tokens, staged.first) if example.kind == "text" else tree_draft(ctx, staged, tokens)
        media.expand(ctx, draft)
        return draft

    def _draft_alone(self, example: Example) -> Draft:
        """``_draft`` of one example with a tokenizer call of its own (``lengths.keep_last_turns``)."""
        s = stage(example, self._chat, self.profile)
        encodings = self._tokenize(s.texts)
        return self._draft(example, s, batch_tokens(self.context, [s], s.texts, encodings))

    def _encoded(self, example: Example, draft: Draft, *, example_id: str | None = None) -> Encoded:
        """The Encoded form of a draft that fits: first label cleared, positions (1-D and the profile's)."""
        ids, labels, node_offsets, node_parents, images = (
            draft.ids, draft.labels, draft.node_offsets, draft.node_parents, draft.images
        )  # fmt: skip
        labels[0] = IGNORE_INDEX  # nothing predicts an example's first token
        if labels.max() == IGNORE_INDEX == labels.min():  # every label is IGNORE_INDEX; one reduction, no mask
            raise RecordError(
                "no_loss_tokens", 'no token carries loss (no assistant turn, or every turn has "loss": false)'
            )
        length = ids.shape[0]
        if node_offsets.shape[0] == 1:  # a linear example: positions are simply 0..L-1
            positions = np.arange(length, dtype=np.int32)
        else:
            positions = tree_position_ids(length, node_offsets, node_parents)
        extra = self.profile.positions.extra(
            ids, positions, node_offsets, node_parents, [im.grid_thw for im in images], token_ids=self._token_ids,
            videos=draft.videos, audios=draft.audios,
        )
        return Encoded(
            example_id=example.example_id if example_id is None else example_id,
            input_ids=ids,
            labels=labels,
            position_ids=positions,
            node_offsets=node_offsets,
            node_parents=node_parents,
            images=images,
            mrope_position_ids=extra,  # (3, L) for mRoPE families, else None
            source_name=example.source_name,
            videos=draft.videos,
            audios=draft.audios,
            loss_weights=_loss_weights(draft.weights, labels),
        )


def _loss_weights(weights: np.ndarray | None, labels: np.ndarray) -> np.ndarray | None:
    """(L,) float32 weight of each label (0 where the label is -100), None when every loss token's is 1."""
    if weights is None:
        return None
    out = np.where(labels != IGNORE_INDEX, weights, np.float32(0)).astype(np.float32)
    return None if (out[labels != IGNORE_INDEX] == 1).all() else out
