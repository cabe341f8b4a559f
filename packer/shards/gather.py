"""The compiled copy loop of ``assemble.take_rows`` (numba): imported by the write stage only, so ``import
packer.shards`` (verify, the training loaders) does not pay numba's import."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def copy_ranges(src: np.ndarray, offsets: np.ndarray, rows: np.ndarray, out: np.ndarray, out_offsets: np.ndarray,
                dest: np.ndarray) -> None:
    """out[out_offsets[dest[k]]:...] = src[offsets[rows[k]]:offsets[rows[k] + 1]] for every k: one list (or
    string) per row of a list column, ~10 ns per row against ~1 us for a Python slice assignment.

    The indices are unsigned: a signed one makes numba check each access for a negative (wrap-around) index,
    a branch per element that keeps the loop from being vectorized (~9x the time of a row's copy in cache,
    docs/benchmarks.md, "Repack")."""
    for k in range(rows.shape[0]):
        a = np.uint64(offsets[rows[k]])
        n = np.uint64(offsets[rows[k] + 1]) - a
        d = np.uint64(out_offsets[dest[k]])
        for j in range(n):
            out[d + j] = src[a + j]
