"""Position ids for trees of nodes (the 3-D mRoPE positions of Qwen2-VL live in models/qwen_vl.py).

A token's position is the one it would have if its root-to-leaf path ran alone: a branch continues from
the end of its parent, so positions go backwards at each branch start.

    nodes:     0 (parent -1)   1 (parent 0)   2 (parent 1)   3 (parent 0)
    tokens:    a b c           d e            f              g h
    positions: 0 1 2           3 4            5              3 4

``tree_position_ids`` also accepts a whole packed row: every node with parent -1 starts a new example at 0.
"""

from __future__ import annotations

import numpy as np


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
