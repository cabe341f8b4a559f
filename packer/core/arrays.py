"""Index arrays written once (numpy): the ranges of many segments, back to back, without a Python loop.

    ranges([2, 0, 3])            == [0, 1, 0, 1, 2]     each segment's own indices
    spans([5, 9, 20], [2, 0, 3]) == [5, 6, 20, 21, 22]  segment i's ``starts[i] .. starts[i] + counts[i] - 1``
"""

from __future__ import annotations

import numpy as np


def _firsts(counts: np.ndarray) -> np.ndarray:
    """(S,) where each segment starts in the back-to-back result (an exclusive cumulative sum)."""
    firsts = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=firsts[1:])
    return firsts


def ranges(counts: np.ndarray) -> np.ndarray:
    """(sum(counts),) int64: ``0 .. counts[i] - 1`` of every segment i, back to back."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(_firsts(counts), counts)


def spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(sum(counts),) int64: ``starts[i] .. starts[i] + counts[i] - 1`` of every segment i, back to back."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.repeat(np.asarray(starts, dtype=np.int64) - _firsts(counts), counts) + np.arange(
        int(counts.sum()), dtype=np.int64)
