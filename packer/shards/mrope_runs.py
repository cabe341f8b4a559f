"""The compiled pass of ``mrope.sparse`` (numba): imported by the writer only, so readers (``mrope.dense``) do not
pay numba's import, as ``shards/gather.py``."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def split_runs(values: np.ndarray, row_tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
               rest: np.ndarray, runs_per_row: np.ndarray, rest_per_row: np.ndarray) -> tuple[int, int]:
    """One pass over dense token-major positions (3·T float32): each row's runs (t = h = w, and a run's token k is
    exactly float32(float64(base) + k); two tokens at least) into ``starts``/``lengths`` (row-relative starts),
    every other token's (t, h, w) into ``rest``; returns (runs, rest values). -0.0 and NaN never join a run, so
    the rule gives back every bit."""
    s = 0
    q = 0
    for r in range(row_tokens.shape[0] - 1):
        a = row_tokens[r]
        end = row_tokens[r + 1]
        runs0 = s
        rest0 = q
        i = a
        while i < end:
            t = values[3 * i]
            j = i
            if t == values[3 * i + 1] and t == values[3 * i + 2] and not (t == 0 and np.signbit(t)):
                base = np.float64(t)
                j = i + 1
                while j < end:
                    v = values[3 * j]
                    if v != values[3 * j + 1] or v != values[3 * j + 2] or np.float32(base + (j - i)) != v \
                            or (v == 0 and np.signbit(v)):
                        break
                    j += 1
            if j - i >= 2:
                starts[s] = i - a
                lengths[s] = j - i
                s += 1
                i = j
            else:
                rest[q] = values[3 * i]
                rest[q + 1] = values[3 * i + 1]
                rest[q + 2] = values[3 * i + 2]
                q += 3
                i += 1
        runs_per_row[r] = s - runs0
        rest_per_row[r] = q - rest0
    return s, q
