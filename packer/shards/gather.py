"""The compiled loops of ``assemble.take_rows`` and ``assemble_packs`` (numba): imported by the write stage only, so ``import
packer.shards`` (verify, the training loaders) does not pay numba's import."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def copy_ranges(src: np.ndarray, offsets: np.ndarray, rows: np.ndarray, out: np.ndarray, out_offsets: np.ndarray,
                dest: np.ndarray) -> None:
    """out[out_offsets[dest[k]]:...] = src[offsets[rows[k]]:offsets[rows[k] + 1]] for every k: one list (or
    string) per row of a list column, ~10 ns per row against ~1 us for a Python slice assignment."""
    for k in range(rows.shape[0]):
        a = offsets[rows[k]]
        b = offsets[rows[k] + 1]
        d = out_offsets[dest[k]]
        for j in range(b - a):
            out[d + j] = src[a + j]


@njit(cache=True)
def count_positions(lengths: np.ndarray, offsets: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    """Each example's positions into ``out``, back to back: 0 .. lengths[e] - 1 where it holds none (``offsets[e]
    == offsets[e + 1]``, the cache's rule for positions that count), else ``values[offsets[e]:offsets[e + 1]]``."""
    t = 0
    for e in range(lengths.shape[0]):
        a = offsets[e]
        b = offsets[e + 1]
        if a == b:
            for j in range(lengths[e]):
                out[t + j] = j
        else:
            for j in range(b - a):
                out[t + j] = values[a + j]
        t += lengths[e]
