"""1-D tree positions: worked cases, a deep chain and random trees against a plain loop, bad layouts."""

from __future__ import annotations

import numpy as np
import pytest

from packer.core.tree import tree_position_ids

# ---- 1-D tree positions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "offsets", "parents", "expected"),
    [
        (1, [0], [-1], [0]),
        (4, [0], [-1], [0, 1, 2, 3]),
        # root, two branches from the root
        (7, [0, 3, 5], [-1, 0, 0], [0, 1, 2, 3, 4, 3, 4]),
        # nested: 0 -> 1 -> 2, 0 -> 3; single-token nodes
        (8, [0, 3, 5, 6], [-1, 0, 1, 0], [0, 1, 2, 3, 4, 5, 3, 4]),
        # a chain of single-token nodes and siblings of one token
        (5, [0, 1, 2, 3, 4], [-1, 0, 1, 1, 0], [0, 1, 2, 2, 1]),
        # deep and wide: 0 -> 1 -> 2 -> 3, 2 -> 4, 1 -> 5, 0 -> 6
        (
            14,
            [0, 2, 4, 5, 7, 9, 12],
            [-1, 0, 1, 2, 2, 1, 0],
            [0, 1, 2, 3, 4, 5, 6, 5, 6, 4, 5, 6, 2, 3],
        ),
        # an empty node is transparent: its child continues from the grandparent
        (5, [0, 2, 2, 4], [-1, 0, 1, 0], [0, 1, 2, 3, 2]),
        # a packed row: two roots, each example restarts at 0
        (7, [0, 2, 4, 5], [-1, 0, -1, 2], [0, 1, 2, 3, 0, 1, 2]),
    ],
)
def test_tree_position_ids(length, offsets, parents, expected) -> None:
    got = tree_position_ids(length, np.array(offsets, np.int32), np.array(parents, np.int32))
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_tree_position_ids_deep_chain_matches_loop() -> None:
    # 1000 nested single-token nodes (pointer jumping over 10 levels) and a random tree vs a plain loop.
    n = 1000
    assert tree_position_ids(n, np.arange(n), np.arange(n) - 1).tolist() == list(range(n))
    rng = np.random.default_rng(0)
    for _ in range(20):
        nodes = int(rng.integers(1, 60))
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, nodes)])
        lengths = rng.integers(0, 5, nodes)
        lengths[0] = max(1, lengths[0])
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        expected, end = [], {}
        for i in range(nodes):
            start = 0 if parents[i] < 0 else end[parents[i]]
            expected += list(range(start, start + lengths[i]))
            end[i] = start + lengths[i]
        assert tree_position_ids(int(lengths.sum()), offsets, parents).tolist() == expected


def test_tree_position_ids_rejects_bad_layout() -> None:
    with pytest.raises(ValueError, match="start at 0"):
        tree_position_ids(4, np.array([1]), np.array([-1]))
    with pytest.raises(ValueError, match="non-decreasing"):
        tree_position_ids(4, np.array([0, 3, 2]), np.array([-1, 0, 0]))
    with pytest.raises(ValueError, match="earlier node"):
        tree_position_ids(4, np.array([0, 2]), np.array([-1, 1]))
