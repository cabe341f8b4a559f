"""3-D multimodal RoPE (mRoPE) over message trees, as Qwen2-VL's ``get_rope_index`` gives it for each
root-to-leaf path alone: ``mrope_position_ids`` per example at encode time (scalar work on a few runs),
``expected_mrope`` for a whole row group at verify time (vectorized), ``mrope_position_deltas`` for generation.

Shared by the families whose positions are Qwen2-VL's rule or build on it (Qwen2-VL, Qwen2.5-VL with its
temporal intervals, Qwen3-VL with its per-frame runs).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from packer.core import arrays
from packer.core.tree import check_layout, node_lengths, node_start_positions
from packer.core.types import EncodedAudio, EncodedVideo
from packer.errors import RecordError
from packer.models.rules import Entries, Positions, flat_mrope


def _runs(ids: np.ndarray, token_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the maximal runs of ``token_id`` in ``ids`` (none for a None id)."""
    if token_id is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    hits = ids == token_id
    if not hits.any():  # the usual case for the video token: one pass, no edges to find
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    edges = np.diff(np.concatenate([[False], hits, [False]]).astype(np.int8))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def mrope_position_ids(
    input_ids: np.ndarray,
    node_offsets: np.ndarray,
    node_parents: np.ndarray,
    image_grids: list[tuple[int, int, int]],
    *,
    image_token_id: int,
    spatial_merge_size: int = 2,
    video_token_id: int | None = None,
    video_grids: Sequence[tuple[int, int, int]] = (),
    video_intervals: Sequence[float] = (),
) -> np.ndarray:
    """Qwen2-VL 3-D mRoPE positions (int32, (3, L): t, h, w rows) of a tree, per root-to-leaf path.

    Each path gets exactly what transformers 5.23.0's ``Qwen2VLModel.get_rope_index`` (and Qwen2.5-VL's)
    returns for that path run alone. In that code an image is a maximal run of ``image_token_id`` tokens
    (``mm_token_type_ids == 1``), a video one of ``video_token_id`` (type 2), and:

    - text continues 1-D: all three rows equal ``current_pos + i``;
    - an image or video with grid (t, h, w) has llm grid (t, h // m, w // m) and positions
      ``current_pos + (T(ti), hi, wi)`` in t-major, then h, then w order, T(ti) = ti for an image and a
      Qwen2-VL video, ``int(float32(ti) * interval)`` for a Qwen2.5-VL video (``video_intervals``, float32
      tokens_per_second * second_per_grid_t);
    - after it ``current_pos += max(h, w) // m`` (for a still image, t = 1, this is its max + 1).

    A node starts from its parent's final ``current_pos`` (a whole packed row works too: every root starts
    at 0). ``image_grids`` / ``video_grids`` are the images / videos in token order. Every run must be one
    whole image or video inside one node; otherwise a RecordError ("image_count_mismatch"), which also
    catches a text containing a literal image or video token.
    """
    ids = np.asarray(input_ids)
    length = ids.shape[0]
    # the few nodes and runs as Python ints: scalar work instead of numpy calls on tiny arrays
    starts, parents = np.asarray(node_offsets).reshape(-1).tolist(), np.asarray(node_parents).reshape(-1).tolist()
    if starts != [0] or parents != [-1]:  # one node at 0 with no parent: a valid linear example, nothing to check
        check_layout(length, node_offsets, node_parents, empty_nodes=True)
    ends = [*starts[1:], length]
    spans = [  # (start, end, grid, interval) of each vision run, in token order
        *_vision_runs(ids, image_token_id, image_grids, None, spatial_merge_size, "image"),
        *_vision_runs(ids, video_token_id, video_grids, video_intervals, spatial_merge_size, "video"),
    ]
    spans.sort()
    # Zero-length nodes share an offset with the next node; bisect_right picks the last of them, which is the
    # one holding tokens.
    run_node = [bisect_right(starts, sp[0]) - 1 for sp in spans]
    if any(sp[1] > ends[n] for sp, n in zip(spans, run_node, strict=True)):
        raise RecordError("image_count_mismatch", "an image's or video's tokens are split across two tree nodes")

    # int32 throughout (the result's dtype): positions stay below the length, and lengths fit int32
    out = np.empty((3, length), dtype=np.int32)
    next_pos = [0] * len(starts)  # current_pos after each node's path
    k = 0  # next vision run, in token order
    m = spatial_merge_size
    for n, (s, e, parent) in enumerate(zip(starts, ends, parents, strict=True)):
        cur = 0 if parent < 0 else next_pos[parent]
        while k < len(spans) and run_node[k] == n:
            rs, re_, (t, h, w), interval = spans[k]
            out[:, s:rs] = np.arange(cur, cur + rs - s)  # text before the run, broadcast to 3 rows
            cur += rs - s
            np.add(_grid_positions(t, h // m, w // m, interval), cur, out=out[:, rs:re_])
            cur += max(h, w) // m
            s = re_
            k += 1
        out[:, s:e] = np.arange(cur, cur + e - s)
        next_pos[n] = cur + e - s
    return out


def _vision_runs(
    ids: np.ndarray,
    token_id: int | None,
    grids: Sequence[tuple[int, int, int]],
    intervals: Sequence[float] | None,
    merge: int,
    what: str,
) -> list[tuple[int, int, tuple[int, int, int], float]]:
    """(start, end, grid, interval) of each maximal run of ``token_id`` in ``ids``, the k-th run being the k-th
    of ``grids``: it must span exactly that grid's t * (h // merge) * (w // merge) tokens (RecordError
    "image_count_mismatch" otherwise). Scalar checks on the hits' indices instead of a pass for run edges:
    the k-th grid's tokens are the next ``count`` hits, and they form a maximal run when they are consecutive
    and the hit after them is not adjacent."""
    if len(grids) == 0 and (token_id is None or not (ids == token_id).any()):
        return []  # none named, none found (the video kind of an image example)
    hits = np.zeros(0, np.int64) if token_id is None else np.flatnonzero(ids == token_id)
    found, spans, j = hits.shape[0], [], 0
    for k, grid in enumerate(grids):
        t, h, w = (int(x) for x in grid)
        count = t * (h // merge) * (w // merge)
        if count <= 0 or j + count > found:
            break
        a, b = int(hits[j]), int(hits[j + count - 1])
        if b - a != count - 1 or (j + count < found and int(hits[j + count]) == b + 1):
            break
        spans.append((a, b + 1, (t, h, w), 1.0 if intervals is None else float(intervals[k])))
        j += count
    if len(spans) == len(grids) and j == found:
        return spans
    starts, ends = _runs(ids, token_id)
    sizes = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    counts = sizes[:, 0] * (sizes[:, 1] // merge) * (sizes[:, 2] // merge)
    raise RecordError(
        "image_count_mismatch",
        f"{starts.shape[0]} runs of {what} tokens of lengths {(ends - starts).tolist()} "
        f"do not match {sizes.shape[0]} {what}s of {counts.tolist()} tokens",
    )


@lru_cache(maxsize=256)  # a dataset has few distinct grids; <= 256 * 15 KB (1280-token images) cached
def _grid_positions(t: int, h: int, w: int, interval: float = 1.0) -> np.ndarray:
    """(t, h, w) rows of one llm grid in t-major, then h, then w order: (3, t*h*w) int32, read-only; the t
    row scaled by the float32 ``interval`` and truncated, as get_rope_index's ``(arange(t) * interval).long()``."""
    tt, rest = np.divmod(np.arange(t * h * w, dtype=np.int32), h * w)
    hh, ww = np.divmod(rest, w)
    if interval != 1.0:
        tt = (tt.astype(np.float32) * np.float32(interval)).astype(np.int32)
    block = np.stack([tt, hh, ww])
    block.flags.writeable = False
    return block


def mrope_position_deltas(
    mrope_ids: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray
) -> np.ndarray:
    """get_rope_index's ``mrope_position_deltas`` (max position + 1 - length) of each root-to-node path.

    int64 (N,). Only generation uses it (to continue positions after the prompt); entry n is for the path
    that ends with node n, so a leaf's entry is that branch's delta.
    """
    mrope_ids = np.asarray(mrope_ids)
    length = mrope_ids.shape[1]
    check_layout(length, node_offsets, node_parents, empty_nodes=True)
    offsets, lengths = np.asarray(node_offsets, dtype=np.int64), node_lengths(length, node_offsets)
    parents = np.asarray(node_parents, dtype=np.int64)
    n = offsets.shape[0]
    node_max = np.full(n, -1, dtype=np.int64)
    nonempty = lengths > 0
    if length:
        node_max[nonempty] = np.maximum.reduceat(mrope_ids.max(axis=0), offsets[nonempty])
    path_max = node_max.copy()
    path_len = lengths.copy()
    for i in range(n):  # parents come first, so one forward pass accumulates along each path
        if parents[i] >= 0:
            path_max[i] = max(path_max[i], path_max[parents[i]])
            path_len[i] += path_len[parents[i]]
    return path_max + 1 - path_len


def expected_mrope(
    length: int,
    node_offsets: np.ndarray,
    node_parents: np.ndarray,
    image_offsets: np.ndarray,
    image_grids: np.ndarray,
    *,
    spatial_merge_size: int,
    temporal_intervals: np.ndarray | None = None,
) -> np.ndarray:
    """``mrope_position_ids`` (as int64) of a node forest, without a Python loop over nodes: verify's check.

    Along a path, text advances the position by 1 per token and an image by max(h, w) // merge as a whole.
    So give every token a weight (1 for text; 0 inside an image except its last token, which carries the
    image's advance): a text token's position is the weighted prefix sum along its path (the ancestors'
    node sums from ``node_start_positions`` + the exclusive sum inside its node). An image token adds its
    (t, h, w) index in the merged grid to the position where its image starts. Images must be whole and
    inside one node (verify checks that first). Videos are spans like images (in offset order with them),
    their t index scaled by ``temporal_intervals`` (float32 per span, 1 for an image).
    """
    merge = spatial_merge_size
    grids = np.asarray(image_grids, dtype=np.int64).reshape(-1, 3)
    starts = np.asarray(image_offsets, dtype=np.int64)
    lh, lw = grids[:, 1] // merge, grids[:, 2] // merge  # (I,) the merged (llm) grid
    counts = grids[:, 0] * lh * lw
    g_off = np.asarray(node_offsets, dtype=np.int64)
    w = np.ones(length, dtype=np.int64)
    img_tok = np.repeat(np.arange(len(starts)), counts)  # (V,) image of each vision token
    k = arrays.ranges(counts)  # (V,) index inside its image
    tok = np.repeat(starts, counts) + k  # (V,) flat position of each vision token
    w[tok] = 0
    w[starts + counts - 1] = np.maximum(grids[:, 1], grids[:, 2]) // merge
    node_w = np.add.reduceat(w, g_off) if len(g_off) else np.zeros(0, np.int64)
    base = node_start_positions(node_parents, node_w)  # (N,) weighted sum over each node's ancestors
    node_of_tok = np.repeat(np.arange(len(g_off)), np.diff(np.append(g_off, length)))
    excl = np.cumsum(w) - w
    text_pos = base[node_of_tok] + excl - excl[g_off][node_of_tok]  # (L,)
    out = np.broadcast_to(text_pos, (3, length)).copy()
    origin = text_pos[starts][img_tok]
    t_index = k // (lh * lw)[img_tok]
    if temporal_intervals is not None:
        interval = np.asarray(temporal_intervals, dtype=np.float32)[img_tok]
        t_index = (t_index.astype(np.float32) * interval).astype(np.int64)
    out[0, tok] = origin + t_index
    out[1, tok] = origin + (k // lw[img_tok]) % lh[img_tok]
    out[2, tok] = origin + k % lw[img_tok]
    return out


@dataclass(frozen=True)
class MRoPE(Positions):
    """Qwen2-VL's ``get_rope_index`` as a positions rule: per example (``extra``: ``mrope_position_ids`` along each
    path) and vectorised for verify (``expected``: ``expected_mrope``), images and videos one list of vision spans.

    A video's temporal step is ``interval``: float32 ``tokens_per_second * second_per_grid_t`` (Qwen2.5-VL), 1
    where ``tokens_per_second`` is None (Qwen2-VL); an image's is 1 (its t index is always 0)."""

    merge_size: int = 2
    tokens_per_second: int | None = None
    mrope = True
    images_as_qwen2 = False
    """True where a subclass's own ``extra`` gives this class's answer for an example whose media are all images
    (GLM's differs with videos only): the encoder's batch finish (encode/finish.py) then lays such examples out."""

    def interval(self, second_per_grid_t: float) -> np.float32:
        if self.tokens_per_second is None:
            return np.float32(1.0)
        return np.float32(np.float32(self.tokens_per_second) * np.float32(second_per_grid_t))

    def video_spans(self, videos: Sequence[EncodedVideo]) -> tuple[list[tuple[int, int, int]], list[float]]:
        """The vision spans of an example's videos and their temporal steps: one per video here; Qwen3-VL's one
        per temporal patch."""
        return [v.grid_thw for v in videos], [self.interval(v.second_per_grid_t) for v in videos]

    def extra(self, ids: np.ndarray, positions: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray,
              images: Sequence[tuple[int, int, int]], *, token_ids: Mapping[str, int | None],
              videos: Sequence[EncodedVideo] = (), audios: Sequence[EncodedAudio] = ()) -> np.ndarray:
        if not images and not videos:  # get_rope_index on text alone: three rows equal to the 1-D positions
            return flat_mrope(positions)
        grids, intervals = self.video_spans(videos)
        return mrope_position_ids(
            ids, node_offsets, node_parents, list(images), image_token_id=token_ids["image_token"],
            spatial_merge_size=self.merge_size, video_token_id=token_ids.get("video_token"), video_grids=grids,
            video_intervals=intervals,
        )

    def expected(self, length: int, node_offsets: np.ndarray, node_parents: np.ndarray, *, images: Entries,
                 videos: Entries, audios: Entries) -> np.ndarray:
        offsets = np.asarray(images["offset"], dtype=np.int64)
        grids = np.asarray(images["grid"], dtype=np.int64).reshape(-1, 3)
        intervals = np.ones(len(offsets), dtype=np.float32)
        if len(videos["offset"]):
            seconds = np.asarray(videos["second_per_grid_t"], dtype=np.float64)
            offsets = np.concatenate([offsets, np.asarray(videos["offset"], dtype=np.int64)])
            grids = np.concatenate([grids, np.asarray(videos["grid"], dtype=np.int64).reshape(-1, 3)])
            intervals = np.concatenate([intervals, np.array([self.interval(x) for x in seconds.tolist()],
                                                            dtype=np.float32)])
            order = np.argsort(offsets, kind="stable")
            offsets, grids, intervals = offsets[order], grids[order], intervals[order]
        return expected_mrope(length, node_offsets, node_parents, offsets, grids, spatial_merge_size=self.merge_size,
                              temporal_intervals=intervals)
