"""Stage two of encoding: a batch's tokens and labels, and each example's tree joined from its paths' tokens.

    Tokens   the batch's texts tokenized back to back, with the loss rule's labels (labels.py) for all of them
    Draft    one example: ids, labels, node offsets and parents, and its media references in token order, one
             placeholder each until media.py expands them

Trees: node n's tokens are the tokens of the path root..n minus those of the path root..parent(n); the parent's
tokens must be a token-level prefix (else ``template_error``). The system prompt a template inserts on its own
belongs to the root.

Fast path, beside the general one it must equal (``Encoder(fast=False)`` runs only the general one;
tests/encode/test_encoder.py compares them): the loss rule for all texts at once from token byte lengths
(``labels.batch_loss_labels``; the general path: ``loss_labels`` per text from character offsets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from packer.core import arrays
from packer.core.types import (
    IGNORE_INDEX,
    AudioRef,
    EncodedAudio,
    EncodedImage,
    EncodedVideo,
    ImageRef,
    VideoRef,
)
from packer.encode.context import EncodeContext
from packer.encode.labels import batch_loss_labels, carries_loss, loss_labels, loss_weight, merged_spans
from packer.encode.render import LossColumns, Staged
from packer.encode.templates import Span
from packer.encode.tokenize import ByteOffsets, flat_ids, offset_boundaries
from packer.errors import RecordError
from packer.models.base import ModelProfile, image_blocks
from packer.models.registry import no_medium


@dataclass(slots=True)
class Tokens:
    """A batch's tokens and labels, its texts back to back (``tokenize.flat_ids``): text k's are
    ``ids[starts[k]:starts[k + 1]]``. Labels are those of the loss rule (labels.py) for a conversation's
    path, IGNORE_INDEX for a text record (``text_draft`` gives its own)."""

    ids: np.ndarray  # (T,) int32
    labels: np.ndarray  # (T,) int32
    starts: list[int]  # (texts + 1,)
    weights: np.ndarray | None = None  # (T,) float32 loss weight of each token; None: every weight is 1

    def text(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Text k's ids and labels (views: the batch's texts do not overlap)."""
        a, b = self.starts[k], self.starts[k + 1]
        return self.ids[a:b], self.labels[a:b]

    def text_weights(self, k: int) -> np.ndarray | None:
        """Text k's token weights (a view), None when the batch has none."""
        return None if self.weights is None else self.weights[self.starts[k] : self.starts[k + 1]]


@dataclass(slots=True)
class Draft:
    """One example between tokenization and its Encoded form; the later steps update it in place."""

    ids: np.ndarray  # (L,) int32
    labels: np.ndarray  # (L,) int32, IGNORE_INDEX where no loss
    node_offsets: np.ndarray  # (N,) int32, first token of each node
    node_parents: np.ndarray  # (N,) int32, -1 for the root
    refs: list[ImageRef | VideoRef | AudioRef]  # the media named, in token order: one token each until expanded
    # (a video's sound track, AudioRef.video, follows its video and has no token of its own)
    images: list[EncodedImage] = field(default_factory=list)  # set by media.expand (and cut by lengths.truncate)
    image_runs: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each image entry's run
    blocks: list[int] = field(default_factory=list)  # entries of `images` per image named (ImageBlocks), in order
    videos: list[EncodedVideo] = field(default_factory=list)  # likewise
    video_runs: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each video's run
    audios: list[EncodedAudio] = field(default_factory=list)  # likewise
    audio_runs: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each clip's run (a sound
    # track's: its video's)
    weights: np.ndarray | None = None  # (L,) float32 loss weight of each token, None when all are 1


def batch_tokens(ctx: EncodeContext, staged: list[Staged], texts: list[str], encodings: list) -> Tokens:
    """The batch's tokens (``encodings`` of ``texts``) with every conversation path's labels: the loss rule for
    all texts at once from byte lengths (``batch_loss_labels``), one text at a time from character offsets
    where those do not apply (the general path, ``loss_labels``). Messages with a loss weight other than 1
    (``"loss": 0.5``) give the batch per-token weights: the rule run again on each weight's messages alone."""
    ids, starts = flat_ids(encodings)
    spans: list[list[Span]] = [[] for _ in texts]  # per text, its loss messages' spans
    weights: dict[int, list[float]] = {}  # their weights, for the texts with a message's own ``loss`` (else all 1)
    cols: LossColumns | None = None  # the loss messages ``stage_batch`` gave as columns (one batch's)
    firsts: list[int] = []  # per staged example taken from them: its first text, its first path there, its paths
    ats: list[int] = []
    sizes: list[int] = []
    for stage in staged:
        if stage.loss is not None and (cols is None or stage.loss is cols):
            cols = stage.loss
            firsts.append(stage.first)
            ats.append(stage.loss_at)
            sizes.append(len(stage.texts))
            continue
        for i, node in enumerate(stage.nodes):  # a text record has none
            msgs = node.messages
            own = stage.spans[i][-len(msgs) :]  # the node's own messages, the last on its path
            if all(m.loss is None for m in msgs):  # the common node: the assistant turns carry loss, weight 1
                spans[stage.first + i] = [s for s, m in zip(own, msgs, strict=True) if m.role == "assistant"]
                continue
            loss = [(s, m) for s, m in zip(own, msgs, strict=True) if carries_loss(m)]
            spans[stage.first + i] = [s for s, _ in loss]
            weights[stage.first + i] = [loss_weight(m) for _, m in loss]
    flat = None
    if cols is not None:  # each column path's text: those examples' paths are their texts, in order
        text_of = np.full(int(cols.path.max()) + 1 if cols.path.shape[0] else 0, -1, dtype=np.int64)
        a, n = np.asarray(ats, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
        within = arrays.ranges(n)
        at = np.repeat(a, n) + within
        keep = at < text_of.shape[0]  # a path past the last loss message's holds none
        text_of[at[keep]] = (np.repeat(np.asarray(firsts, dtype=np.int64), n) + within)[keep]
        text = text_of[cols.path]
        taken = text >= 0
        flat = (text[taken], cols.chars[taken])
    labels = _labels(ctx, ids, starts, texts, spans, encodings, flat=flat)
    token_weights = None
    for w in sorted({w for ws in weights.values() for w in ws} - {1.0}):
        only = [[s for s, x in zip(ss, weights[k], strict=True) if x == w] if k in weights else []
                for k, ss in enumerate(spans)]
        if token_weights is None:
            token_weights = np.ones(ids.shape[0], dtype=np.float32)
        token_weights[_labels(ctx, ids, starts, texts, only, encodings, count=False) != IGNORE_INDEX] = w
    return Tokens(ids, labels, starts, token_weights)


def column_tokens(ctx: EncodeContext, texts: list[str], encodings: list, loss: tuple[np.ndarray, np.ndarray]
                  ) -> Tokens:
    """``batch_tokens`` of texts whose loss messages are all given as columns (``Encoder.encode_chats``: linear
    chats, no message with a ``loss`` of its own): ``loss`` is each one's text and its Span as an (L, 3) row, as
    ``batch_tokens`` reads a ``LossColumns``."""
    ids, starts = flat_ids(encodings)
    return Tokens(ids, _labels(ctx, ids, starts, texts, [[] for _ in texts], encodings, flat=loss), starts)


def _labels(ctx: EncodeContext, ids: np.ndarray, starts: list[int], texts: list[str], spans: list[list[Span]],
            encodings: list, *, count: bool = True, flat: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(T,) labels of the loss messages ``spans`` of every text, and those of ``flat`` (each one's text, its
    Span as an (L, 3) row) beside them (see ``batch_tokens``)."""
    view = ctx.tokens
    if flat is not None and (view.token_bytes is None or not flat[0].shape[0]):  # per text, as ``spans``
        spans = merged_spans(spans, flat)
        flat = None
    if view.token_bytes is None:  # the batch was tokenized with offsets
        labels, rest = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int32), [k for k, s in enumerate(spans) if s]
    else:
        labels, rest = batch_loss_labels(ids, starts, texts, spans, is_special=view.is_special,
                                         offsets=ByteOffsets(ids, starts, view.token_bytes, nfc=view.nfc), flat=flat)
        if rest and flat is not None:
            spans = merged_spans(spans, flat, only=rest)
        if count:
            ctx.paths["labels:byte-lengths"] += len(texts) - len(rest)
    if count:
        ctx.paths["labels:offsets"] += len(rest)
    for k in rest:
        a, b = starts[k], starts[k + 1]
        encoding = encodings[k] if view.token_bytes is None else _hf_encoding(encodings, k)
        if encoding is None:
            encoding = view.encoding(texts[k])
        labels[a:b] = loss_labels(ids[a:b], spans[k], is_special=view.is_special,
                                  boundaries=offset_boundaries(ids[a:b], encoding, texts[k]))
    return labels


def _hf_encoding(encodings: Any, k: int) -> Any:
    """Text ``k``'s Encoding where the HF tokenizer gave one with offsets in a fastokens batch (``Flat.hf``), else
    None (the text is encoded again for its offsets)."""
    return encodings.hf.get(k) if isinstance(encodings, tuple) and encodings.hf else None


def text_draft(ctx: EncodeContext, tokens: Tokens, k: int) -> Draft:
    """A ``text`` record (text ``k`` of ``tokens``): [bos] + tokens + eos, loss on every token (the first is
    cleared later)."""
    parts = [tokens.text(k)[0]]
    bos, eos = ctx.tokens.bos_id, ctx.tokens.eos_id
    if bos is not None:
        parts.insert(0, np.array([bos], dtype=np.int32))
    if eos is not None:
        parts.append(np.array([eos], dtype=np.int32))
    arr = np.concatenate(parts)  # a copy: the batch's ids stay as they are
    for token_id, what in ((ctx.image_token_id, "image"), (ctx.video_token_id, "video"), (ctx.audio_token_id, "audio")):
        if token_id is not None and (arr == token_id).any():
            raise RecordError("image_count_mismatch", f"the text holds the {what} token literally but names no {what}")
    return Draft(arr, arr.copy(), np.zeros(1, dtype=np.int32), np.full(1, -1, dtype=np.int32), refs=[])


def tree_draft(ctx: EncodeContext, stage: Staged, tokens: Tokens) -> Draft:
    """Nodes are path deltas: node n's tokens are its path's minus its parent's path's."""
    ids, labels, node_offsets, refs = join_nodes(stage, tokens)
    check_media_tokens(ctx, ids, node_offsets, refs)
    node_parents = np.array(stage.parents, dtype=np.int32)
    weights = None
    if tokens.weights is not None:  # each node's weights are its path's past its parent's path, as its labels
        parts = [tokens.text_weights(stage.first + i)[int(a):] for i, a in
                 enumerate(_path_starts(stage, tokens))]
        weights = np.concatenate(parts)
        if (weights == 1).all():
            weights = None
    return Draft(ids, labels, node_offsets, node_parents, refs=[im for r in refs for im in r], weights=weights)


def _path_starts(stage: Staged, tokens: Tokens) -> list[int]:
    """Where each node's own tokens start in its path's tokens: its parent path's length (0 for the root)."""
    lengths = [tokens.starts[stage.first + i + 1] - tokens.starts[stage.first + i] for i in range(len(stage.nodes))]
    return [0 if p < 0 else lengths[p] for p in stage.parents]


def join_nodes(stage: Staged, tokens: Tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[ImageRef | VideoRef | AudioRef]]]:
    """A tree's ids, labels, node offsets and each node's media, from its paths' tokens."""
    texts = stage.texts
    node_ids, node_labels, refs, path_ids = [], [], [], []
    for i, (node, parent) in enumerate(zip(stage.nodes, stage.parents, strict=True)):
        ids, labels = tokens.text(stage.first + i)
        path_ids.append(ids)
        start = 0
        if parent >= 0:
            start = path_ids[parent].shape[0]
            # bytes compared: np.array_equal's checks cost more than the compare on a few hundred tokens
            if not texts[i].startswith(texts[parent]) or ids[:start].tobytes() != path_ids[parent].tobytes():
                raise RecordError(
                    "template_error",
                    f"tree node {i}: the rendering of its parent's path is not a token-level prefix of its "
                    "own path (the template or tokenizer is not prefix-stable at this branch)",
                )
        node_ids.append(ids[start:])
        node_labels.append(labels[start:])
        refs.append([p for m in node.messages for p in m.parts if not isinstance(p, str)])
    sizes = [a.shape[0] for a in node_ids]
    if 0 in sizes[1:]:
        raise RecordError("template_error", f"tree node {sizes.index(0, 1)} renders to no tokens")
    offsets = np.array([0, *accumulate(sizes[:-1])], dtype=np.int32)
    return np.concatenate(node_ids), np.concatenate(node_labels), offsets, refs


def check_media_tokens(ctx: EncodeContext, ids: np.ndarray, node_offsets: np.ndarray,
                       refs: list[list[ImageRef | VideoRef | AudioRef]]) -> None:
    """Each node must hold exactly one image token per image its messages name (one per block of an image the
    processor writes as blocks), one video token per video and one audio token per audio clip (a video's sound
    track has none)."""
    profile = ctx.profile
    audios = [[r for r in node if isinstance(r, AudioRef)] for node in refs]
    if any(audios) and ctx.audio_token_id is None:
        raise no_medium(profile.name, "audio")
    if ctx.audio_token_id is not None and (any(audios) or (ids == ctx.audio_token_id).any()):
        placed = [[r for r in node if r.placeholder] for node in audios]
        _check_token_counts(ids, node_offsets, placed, ctx.audio_token_id, profile.audio_token, "audio")
    videos = [[r for r in node if isinstance(r, VideoRef)] for node in refs]
    if any(videos) and ctx.video_token_id is None:
        raise no_medium(profile.name, "video")
    if ctx.video_token_id is not None and (any(videos) or (ids == ctx.video_token_id).any()):
        _check_token_counts(ids, node_offsets, videos, ctx.video_token_id, profile.video_token, "video")
    images = [[r for r in node if isinstance(r, ImageRef)] for node in refs]
    if not any(images) and (ctx.image_token_id is None or not (ids == ctx.image_token_id).any()):
        return  # the common text-only case: nothing to count
    want = np.array([len(r) for r in images], dtype=np.int64)
    if ctx.image_token_id is None:
        if want.any():
            raise RecordError(
                "image_count_mismatch",
                f"profile {profile.name!r} takes no images, but the record names {int(want.sum())}; "
                "use a vision profile (qwen2-vl, qwen2.5-vl, llava)",
            )
        return
    blocks = [[b for r in node for b in blocks_of(profile, r)] for node in images]
    _check_token_counts(ids, node_offsets, blocks, ctx.image_token_id, profile.image_token, "image")


def blocks_of(profile: ModelProfile, ref: ImageRef) -> list[ImageRef]:
    """``ref`` once per block the profile writes it as (``ModelProfile.image_blocks``): once by default."""
    blocks = image_blocks(profile, ref)
    return [ref] if blocks is None else [ref] * len(blocks.runs)


def _check_token_counts(ids: np.ndarray, node_offsets: np.ndarray, refs: list[list], token_id: int, token: str,
                        what: str) -> None:
    want = np.array([len(r) for r in refs], dtype=np.int64)
    pos = np.flatnonzero(ids == token_id)
    got = np.bincount(np.searchsorted(node_offsets, pos, side="right") - 1, minlength=want.shape[0])
    if (got != want).any():
        node = int(np.flatnonzero(got != want)[0])
        if got[node] > want[node]:
            raise RecordError(
                "image_count_mismatch",
                f"{int(got.sum())} {what} tokens for {int(want.sum())} {what}s: the text holds {token!r} literally",
            )
        raise RecordError(
            "template_error",
            f"the chat template emitted {int(got.sum())} {what} tokens for {int(want.sum())} {what}s; "
            f'it must emit one per {{"type": "{what}"}} part',
        )
