"""The compiled copy loop of ``assemble.take_rows`` (numba): imported by the write stage only, so ``import
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
def gather_fixed(mapped: np.ndarray, at: np.ndarray, size: np.ndarray, column: np.ndarray, rows: np.ndarray,
                 dest: np.ndarray, out: np.ndarray) -> None:
    """out[column[j], dest[k]*size[j]:...] = the ``size[j]`` bytes of row rows[k] of the fixed-width column whose
    values start at byte at[j] of the ``mapped`` file, for every column j and row k: one call per file visit for
    every fixed-width column."""
    for j in range(at.shape[0]):
        w = size[j]
        a = at[j]
        c = column[j]
        for k in range(rows.shape[0]):
            s = a + rows[k] * w
            d = dest[k] * w
            for b in range(w):
                out[c, d + b] = mapped[s + b]


@njit(cache=True)
def gather_lengths(mapped32: np.ndarray, at: np.ndarray, column: np.ndarray, rows: np.ndarray, dest: np.ndarray,
                   out: np.ndarray) -> None:
    """out[column[j], dest[k]] = the length of row rows[k] of the list (or string) column whose int32 offsets
    start at int32 index at[j] of the mapped file, for every column j and row k."""
    for j in range(at.shape[0]):
        a = at[j]
        c = column[j]
        for k in range(rows.shape[0]):
            r = a + rows[k]
            out[c, dest[k]] = mapped32[r + 1] - mapped32[r]


@njit(cache=True)
def copy_columns(mapped: np.ndarray, mapped32: np.ndarray, offsets_at: np.ndarray, values_at: np.ndarray,
                 size: np.ndarray, column: np.ndarray, rows: np.ndarray, out: np.ndarray, out32: np.ndarray,
                 out_at: np.ndarray, out_offsets: np.ndarray, dest: np.ndarray) -> None:
    """``copy_ranges`` for every flat column j of one file visit at once (values of 1 or 4 bytes)."""
    for j in range(offsets_at.shape[0]):
        o = offsets_at[j]
        v = values_at[j]
        c = column[j]
        base = out_at[c]
        for k in range(rows.shape[0]):
            a = mapped32[o + rows[k]]
            b = mapped32[o + rows[k] + 1]
            d = base + out_offsets[c, dest[k]]
            if size[j] == 4:
                for t in range(b - a):
                    out32[d + t] = mapped32[v + a + t]
            else:
                for t in range(b - a):
                    out[d + t] = mapped[v + a + t]
