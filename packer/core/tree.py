"""Position ids for trees of nodes: 1-D positions and Qwen2-VL's 3-D mRoPE positions.

A token's position is the one it would have if its root-to-leaf path ran alone: a branch continues from
the end of its parent, so positions go backwards at each branch start.

    nodes:     0 (parent -1)   1 (parent 0)   2 (parent 1)   3 (parent 0)
    tokens:    a b c           d e            f              g h
    positions: 0 1 2           3 4            5              3 4

Both functions also accept a whole packed row: every node with parent -1 starts a new example at 0, and
``image_grids`` then lists the row's images in token order.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from packer.errors import RecordError


def _node_spans(
    length: int, node_offsets: np.ndarray, node_parents: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) as int64 after checking the layout: node 0 at 0, increasing, parents first."""
    offsets = np.asarray(node_offsets, dtype=np.int64)
    parents = np.asarray(node_parents, dtype=np.int64)
    n = offsets.shape[0]
    if n == 1 and parents.shape == (1,) and offsets[0] == 0 and parents[0] == -1:
        return offsets, np.array([length], dtype=np.int64)  # one node (a linear example): nothing else to check
    if n == 0 or parents.shape != (n,):
        raise ValueError(
            f"need >= 1 node and as many parents as offsets, got {n} offsets, {parents.shape[0]} parents"
        )
    lengths = np.diff(np.append(offsets, length))
    if offsets[0] != 0 or (lengths < 0).any():
        raise ValueError(
            f"node_offsets must start at 0 and be non-decreasing up to {length}, got {offsets.tolist()}"
        )
    if parents[0] != -1 or (parents >= np.arange(n)).any() or (parents < -1).any():
        raise ValueError(
            f"node_parents must be -1 for node 0 and point to an earlier node, got {parents.tolist()}"
        )
    return offsets, lengths


def node_start_positions(
    node_offsets: np.ndarray, node_parents: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """First 1-D position of each node: the summed lengths of its strict ancestors.

    Pointer jumping: each step adds the partial sum held by a node's current ancestor pointer and doubles the
    pointer's reach, so depth D takes log2(D) vectorized steps.
    """
    parents = np.asarray(node_parents, dtype=np.int64)
    has_parent = parents >= 0
    start = np.where(has_parent, lengths[np.maximum(parents, 0)], 0)  # length of the parent alone
    ptr = parents.copy()
    while (ptr >= 0).any():
        live = ptr >= 0
        start = start + np.where(live, start[np.maximum(ptr, 0)], 0)
        ptr = np.where(live, ptr[np.maximum(ptr, 0)], -1)
    return start


def tree_position_ids(length: int, node_offsets: np.ndarray, node_parents: np.ndarray) -> np.ndarray:
    """1-D positions (int32, (length,)): 0 at a root, a child's first position is its parent's last + 1.

    Node n spans ``[node_offsets[n], node_offsets[n+1] or length)``; nodes are depth-first, parents first.
    An empty node is allowed and is transparent (its children continue from its parent).
    """
    offsets, lengths = _node_spans(length, node_offsets, node_parents)
    start = node_start_positions(offsets, node_parents, lengths)
    shift = np.repeat(offsets - start, lengths)  # (length,) row offset minus path position, per token
    return (np.arange(length, dtype=np.int64) - shift).astype(np.int32)


def mrope_position_ids(
    input_ids: np.ndarray,
    node_offsets: np.ndarray,
    node_parents: np.ndarray,
    image_grids: list[tuple[int, int, int]],
    *,
    image_token_id: int,
    vision_start_token_id: int | None = None,
    spatial_merge_size: int = 2,
) -> np.ndarray:
    """Qwen2-VL 3-D mRoPE positions (int32, (3, L): t, h, w rows) of a tree, per root-to-leaf path.

    Each path gets exactly what transformers 5.23.0's ``Qwen2VLModel.get_rope_index`` returns for that path
    run alone (also Qwen2.5-VL's for images). In that code an image is a maximal run of ``image_token_id``
    tokens (``mm_token_type_ids == 1``) and:

    - text continues 1-D: all three rows equal ``current_pos + i``;
    - an image with grid (t, h, w) has llm grid (t, h // m, w // m) and positions
      ``current_pos + (ti, hi, wi)`` in t-major, then h, then w order;
    - after an image ``current_pos += max(h, w) // m`` (for a still image, t = 1, this is its max + 1).

    A node starts from its parent's final ``current_pos``. ``image_grids`` are the images in token order.
    ``vision_start_token_id`` is accepted for older callers: since transformers 5 get_rope_index no longer
    reads it. Every image run must be one whole image inside one node; otherwise a RecordError
    ("image_count_mismatch"), which also catches a text containing a literal image token.
    """
    ids = np.asarray(input_ids)
    length = ids.shape[0]
    offsets, lengths = _node_spans(length, node_offsets, node_parents)
    parents = np.asarray(node_parents, dtype=np.int64)
    ends = offsets + lengths

    is_image = np.concatenate([[False], ids == image_token_id, [False]]).astype(np.int8)
    edges = np.diff(is_image)
    run_starts = np.flatnonzero(edges == 1)
    run_ends = np.flatnonzero(edges == -1)
    grids = np.asarray(image_grids, dtype=np.int64).reshape(-1, 3)
    llm_h = grids[:, 1] // spatial_merge_size
    llm_w = grids[:, 2] // spatial_merge_size
    counts = grids[:, 0] * llm_h * llm_w
    if run_starts.shape[0] != grids.shape[0] or (run_ends - run_starts != counts).any():
        raise RecordError(
            "image_count_mismatch",
            f"{run_starts.shape[0]} runs of image tokens of lengths {(run_ends - run_starts).tolist()} "
            f"do not match {grids.shape[0]} images of {counts.tolist()} tokens",
        )
    run_node = np.searchsorted(offsets, run_starts, side="right") - 1
    # Zero-length nodes share an offset with the next node; searchsorted picks the last of them, which
    # is the one holding tokens.
    if (run_ends > ends[run_node]).any():
        raise RecordError("image_count_mismatch", "an image's tokens are split across two tree nodes")

    # int32 throughout (the result's dtype): positions stay below the length, and lengths fit int32
    out = np.empty((3, length), dtype=np.int32)
    next_pos = [0] * offsets.shape[0]  # current_pos after each node's path
    k = 0  # next image, in token order
    run_starts_l, run_ends_l, run_node_l = run_starts.tolist(), run_ends.tolist(), run_node.tolist()
    grid_l, llm_h_l, llm_w_l = grids.tolist(), llm_h.tolist(), llm_w.tolist()
    for n, (s, e, parent) in enumerate(zip(offsets.tolist(), ends.tolist(), parents.tolist(), strict=True)):
        cur = 0 if parent < 0 else next_pos[parent]
        while k < len(run_starts_l) and run_node_l[k] == n:
            rs, re_ = run_starts_l[k], run_ends_l[k]
            out[:, s:rs] = np.arange(cur, cur + rs - s)  # text before the image, broadcast to 3 rows
            cur += rs - s
            out[:, rs:re_] = _grid_positions(grid_l[k][0], llm_h_l[k], llm_w_l[k])
            out[:, rs:re_] += cur
            cur += max(grid_l[k][1], grid_l[k][2]) // spatial_merge_size
            s = re_
            k += 1
        out[:, s:e] = np.arange(cur, cur + e - s)
        next_pos[n] = cur + e - s
    return out


@lru_cache(maxsize=256)  # a dataset has few distinct grids; <= 256 * 15 KB (1280-token images) cached
def _grid_positions(t: int, h: int, w: int) -> np.ndarray:
    """(t, h, w) rows of one image's llm grid in t-major, then h, then w order: (3, t*h*w) int32, read-only."""
    tt, rest = np.divmod(np.arange(t * h * w, dtype=np.int32), h * w)
    hh, ww = np.divmod(rest, w)
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
    offsets, lengths = _node_spans(length, node_offsets, node_parents)
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
