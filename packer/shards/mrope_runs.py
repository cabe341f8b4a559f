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


@njit(cache=True)
def _starts_run(t: np.float32, h: np.float32, w: np.float32) -> bool:
    """Can a run start at a token (t, h, w)? ``split_runs``' rule: t = h = w, not -0.0 (NaN never equals)."""
    return t == h and t == w and not (t == 0 and np.signbit(t))


@njit(cache=True)
def merge_runs(ex_tokens: np.ndarray, run_off: np.ndarray, pairs: np.ndarray, bases: np.ndarray,
               rest_off: np.ndarray, rest: np.ndarray, pack_bounds: np.ndarray, out_pairs: np.ndarray,
               out_bases: np.ndarray, out_rest: np.ndarray, runs_per_row: np.ndarray, rest_per_row: np.ndarray,
               scratch: np.ndarray) -> tuple[int, int, int]:
    """The sparse columns of each pack's row from its examples' own (the encode cache's: example-relative
    ``split_runs`` of each example; ``run_off`` each example's first run, ``pairs`` (start, length) per run,
    ``rest_off`` each example's first rest value), exactly what ``split_runs`` gives for the row's dense
    positions: the examples' runs shifted by their start in the row, their rest values back to back, wherever no
    run of ``split_runs`` would cross from one example into the next (its last run, or its last token, continued
    by the next one's first: never for positions that start each example at 0). A row where one would (or
    where an example has no token) is decoded into ``scratch`` and split again. Returns (runs, rest values, -1),
    or (0, 0, e) for an example ``e`` whose runs and rest do not describe its tokens (checked before anything is
    read through them)."""
    s = 0
    q = 0
    for e in range(ex_tokens.shape[0]):  # the cache's own consistency: a damaged chunk is never packed
        covered = (rest_off[e + 1] - rest_off[e]) // 3
        end = 0
        for k in range(run_off[e], run_off[e + 1]):
            if pairs[2 * k] < end or pairs[2 * k + 1] < 1:  # runs increasing, not overlapping, not empty
                return 0, 0, e
            end = pairs[2 * k] + pairs[2 * k + 1]
            covered += pairs[2 * k + 1]
        if covered != ex_tokens[e] or end > ex_tokens[e] or (rest_off[e + 1] - rest_off[e]) % 3 != 0:
            return 0, 0, e
    for p in range(pack_bounds.shape[0] - 1):
        e0 = pack_bounds[p]
        e1 = pack_bounds[p + 1]
        runs0 = s
        rest0 = q
        merge = True
        for e in range(e0, e1):
            if ex_tokens[e] == 0:
                merge = False
                break
            if e == e0:
                continue
            a = e - 1  # does a run cross from example a into e?
            L = ex_tokens[a]
            k = run_off[a + 1] - 1
            if k >= run_off[a] and pairs[2 * k] + pairs[2 * k + 1] == L:  # a ends in a run
                want = np.float32(np.float64(bases[k]) + (L - pairs[2 * k]))
            else:  # a ends in a rest token
                r = rest_off[a + 1] - 3
                if not _starts_run(rest[r], rest[r + 1], rest[r + 2]):
                    continue
                want = np.float32(np.float64(rest[r]) + 1)
            k = run_off[e]
            if k < run_off[e + 1] and pairs[2 * k] == 0:  # e starts with a run
                if bases[k] == want:
                    merge = False
                    break
            else:
                r = rest_off[e]
                if _starts_run(rest[r], rest[r + 1], rest[r + 2]) and rest[r] == want:
                    merge = False
                    break
        if merge:
            shift = 0
            for e in range(e0, e1):
                for k in range(run_off[e], run_off[e + 1]):
                    out_pairs[2 * s] = pairs[2 * k] + shift
                    out_pairs[2 * s + 1] = pairs[2 * k + 1]
                    out_bases[s] = bases[k]
                    s += 1
                for r in range(rest_off[e], rest_off[e + 1]):
                    out_rest[q] = rest[r]
                    q += 1
                shift += ex_tokens[e]
        else:  # the row's dense positions (``mrope.dense``'s rule), then ``split_runs``' pass over them
            n = 0
            for e in range(e0, e1):
                r = rest_off[e]
                i = 0
                for k in range(run_off[e], run_off[e + 1]):
                    while i < pairs[2 * k]:
                        scratch[3 * (n + i)] = rest[r]
                        scratch[3 * (n + i) + 1] = rest[r + 1]
                        scratch[3 * (n + i) + 2] = rest[r + 2]
                        r += 3
                        i += 1
                    base = np.float64(bases[k])
                    for j in range(pairs[2 * k + 1]):
                        v = np.float32(base + j)
                        scratch[3 * (n + i)] = v
                        scratch[3 * (n + i) + 1] = v
                        scratch[3 * (n + i) + 2] = v
                        i += 1
                while i < ex_tokens[e]:
                    scratch[3 * (n + i)] = rest[r]
                    scratch[3 * (n + i) + 1] = rest[r + 1]
                    scratch[3 * (n + i) + 2] = rest[r + 2]
                    r += 3
                    i += 1
                n += ex_tokens[e]
            row_tokens = np.array([0, n], dtype=np.int64)
            starts = np.empty(n // 2 + 1, dtype=np.int32)
            lengths = np.empty(n // 2 + 1, dtype=np.int32)
            counts = np.empty(1, dtype=np.int64)
            rest_counts = np.empty(1, dtype=np.int64)
            S, Q = split_runs(scratch[: 3 * n], row_tokens, starts, lengths, out_rest[q:], counts, rest_counts)
            for k in range(S):
                out_pairs[2 * (s + k)] = starts[k]
                out_pairs[2 * (s + k) + 1] = lengths[k]
                out_bases[s + k] = scratch[3 * starts[k]]
            s += S
            q += Q
        runs_per_row[p] = s - runs0
        rest_per_row[p] = q - rest0
    return s, q, -1
