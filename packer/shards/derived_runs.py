"""The compiled passes of ``derived`` (numba): the encode's (``split_derived``: what each example must store) and
the write's (``fill_derived``: the dense columns back); imported at their first use only, so readers do not pay
numba's import, as ``shards/gather.py``."""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.core.types import IGNORE_INDEX


@njit(cache=True)
def split_derived(offsets: np.ndarray, ids: np.ndarray, labels: np.ndarray, positions: np.ndarray,
                  pos_kept: np.ndarray, lab_kept: np.ndarray, runs: np.ndarray, runs_per_example: np.ndarray) -> int:
    """One pass over n examples' tokens (``offsets``: (n+1,)): whether each must keep its positions (they are not
    0 .. L-1) and its labels (one is neither -100 nor its token), and the (start, length) of the loss spans of
    those that need not; returns the values written to ``runs`` (2 per span)."""
    w = 0
    for i in range(offsets.shape[0] - 1):
        a = offsets[i]
        n = offsets[i + 1] - a
        keep = False
        for k in range(n):
            if positions[a + k] != k:
                keep = True
                break
        pos_kept[i] = keep
        keep = False
        for k in range(n):
            lab = labels[a + k]
            if lab != IGNORE_INDEX and lab != ids[a + k]:
                keep = True
                break
        lab_kept[i] = keep
        w0 = w
        if not keep:
            start = -1
            for k in range(n):
                if labels[a + k] != IGNORE_INDEX:
                    if start < 0:
                        start = k
                elif start >= 0:
                    runs[w] = start
                    runs[w + 1] = k - start
                    w += 2
                    start = -1
            if start >= 0:
                runs[w] = start
                runs[w + 1] = n - start
                w += 2
        runs_per_example[i] = w - w0
    return w


FILL = (np.int64, np.int32) * 4  # fill_derived's inputs: (offsets, values) of the tokens and three columns
SPLIT = (np.int64, np.int32, np.int32, np.int32)  # split_derived's: offsets, ids, labels, positions


def readonly(*arrays: np.ndarray, dtypes: tuple[type, ...] = FILL) -> list[np.ndarray]:
    """A pass's inputs as one signature (each its dtype, contiguous, read-only: Arrow's buffers are), so numba
    compiles and caches it once and ``warm`` loads that one."""
    out = []
    for a, dtype in zip(arrays, dtypes, strict=True):
        view = np.ascontiguousarray(a, dtype=dtype).view()
        view.flags.writeable = False
        out.append(view)
    return out


@njit(cache=True)
def fill_derived(tok_off: np.ndarray, ids: np.ndarray, lab_off: np.ndarray, lab: np.ndarray, run_off: np.ndarray,
                 runs: np.ndarray, pos_off: np.ndarray, pos: np.ndarray, out_labels: np.ndarray,
                 out_positions: np.ndarray) -> int:
    """``derived.expand``'s pass: each example's labels (its own, or -100 but ``ids`` on its runs) and positions
    (its own, or 0 .. L-1) into the (T,) outputs at its tokens; returns the first example whose columns do not
    fit its tokens (a count, a run outside them or out of order), else -1."""
    for i in range(tok_off.shape[0] - 1):
        a = tok_off[i]
        n = tok_off[i + 1] - a
        p = pos_off[i]
        kept = pos_off[i + 1] - p
        if kept == 0:
            for k in range(n):
                out_positions[a + k] = k
        elif kept == n:
            for k in range(n):
                out_positions[a + k] = pos[p + k]
        else:
            return i
        q = lab_off[i]
        kept = lab_off[i + 1] - q
        r0 = run_off[i]
        r1 = run_off[i + 1]
        if kept == n and r1 == r0:
            for k in range(n):
                out_labels[a + k] = lab[q + k]
            continue
        if kept != 0 or (r1 - r0) % 2:
            return i
        for k in range(n):
            out_labels[a + k] = -100
        end = 0
        for r in range(r0, r1, 2):
            s = runs[r]
            c = runs[r + 1]
            if s < end or c < 1 or s + c > n:
                return i
            for k in range(s, s + c):
                out_labels[a + k] = ids[a + k]
            end = s + c
    return -1


def warm() -> None:
    """Both passes loaded from numba's cache (``gather.warm``, before a pool forks), for the signatures the build
    calls them with."""
    one, none, i32 = np.array([0, 1], np.int64), np.zeros(2, np.int64), np.zeros(1, np.int32)
    fill_derived(*readonly(one, i32, none, i32, none, i32, none, i32), np.empty(1, np.int32), np.empty(1, np.int32))
    split_derived(*readonly(one, i32, i32, i32, dtypes=SPLIT), np.empty(1, np.bool_), np.empty(1, np.bool_),
                  np.empty(2, np.int32), np.empty(1, np.int64))
