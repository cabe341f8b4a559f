"""Mixing weighted sources into one plan: which examples (and how many copies of each) the planner sees,
and keeping an example's copies out of one pack.

Weight w keeps floor(w) copies of every example of its source plus a seeded (w - floor(w)) fraction once
more: sources ``[("chat", 2.0), ("captions", 0.5)]`` plan every chat twice and a seeded half of the captions.
Deterministic in the seed; the counts over an epoch are exact (tests/packing/test_mixing.py).

The planned examples are held as ``Sampled``: a repeat count per cache row (one byte) and a mark per 64 rows,
not a cache row and a copy number per planned example (5 bytes each, docs/scale.md "Budgets in bulk").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit


def sample_counts(sources: np.ndarray, weights: Sequence[tuple[str, float]], *, seed: int) -> np.ndarray:
    """(n,) how many times each example is planned (the narrowest unsigned dtype: one byte per example up to
    weight 255), ``sample_sources``' draws: ``np.repeat(np.arange(n), counts)`` is its ``index``."""
    rng = np.random.default_rng([seed, 1])
    n = len(sources)
    most = max((int(np.floor(w)) + (w > np.floor(w)) for _, w in weights), default=0)
    counts = np.zeros(n, dtype=np.min_scalar_type(most))
    for name, weight in weights:
        mask = sources == name
        whole, frac = int(np.floor(weight)), weight - np.floor(weight)
        if whole:
            counts[mask] = whole
        if frac > 0:
            size = int(np.count_nonzero(mask))
            if size:
                # the draws of rng.choice(rows, ...) on the source's rows: they depend on the count, not the rows
                drawn = rng.choice(size, size=int(round(frac * size)), replace=False)
                counts[np.flatnonzero(mask)[drawn]] += 1
        del mask
    return counts


def sample_sources(
    sources: np.ndarray, weights: Sequence[tuple[str, float]], *, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, copy number) of every planned example, in input order, copies of one example together.

    Args:
        sources: (n,) source name (or code) of each example.
        weights: (name, weight) per source; the seeded draws run in this order.
        seed: the build's seed (its own stream, independent of the pack shuffle).

    Returns ``index`` int32 (int64 from 2**31 examples) and ``copies`` of the narrowest unsigned dtype: each
    example's copies counted first (one byte per example), then expanded, so the peak is ~the output, not
    the int64 parts, their concatenation and a lexsort (~60 bytes per planned example before).
    """
    counts = sample_counts(sources, weights, seed=seed)
    n, most = len(sources), int(counts.max(initial=0))
    index = np.repeat(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), counts)
    copies = np.zeros(index.shape[0], dtype=counts.dtype)
    if most > 1:
        starts = np.cumsum(counts, dtype=index.dtype)  # each example's copies end here...
        starts -= counts  # ...and start here; copy k sits at starts + k
        for k in range(1, most):
            copies[starts[counts > k] + k] = k
    return index, copies


MARK = 64  # rows per mark of ``Sampled``: a planned example's row is found by a search and <= 64 steps


@dataclass(frozen=True)
class Sampled:
    """The planned examples of a sampled build as a repeat count per cache row: planned example i is the
    i-th of ``np.repeat(np.arange(rows), counts)`` (input order, an example's copies together, copy k the
    k-th), as ``sample_sources`` orders them. One byte per row and an int64 per ``MARK`` rows, where the
    (n,) ``index`` and ``copies`` took 5 bytes per planned example; those are made per slice (``locate``).

    Example: ``Sampled.of(np.array([2, 0, 1], np.uint8)).locate(np.array([2, 1]))`` -> rows [2, 0],
    copies [0, 1]."""

    counts: np.ndarray  # (rows,) copies of each row in the plan (0: left out)
    marks: np.ndarray  # (rows // MARK + 2,) int64: planned examples before row MARK * b; the last: all

    @classmethod
    def of(cls, counts: np.ndarray) -> Sampled:
        counts = np.ascontiguousarray(counts)
        marks = np.zeros(counts.shape[0] // MARK + 2, dtype=np.int64)
        _marks(counts, marks)
        return cls(counts=counts, marks=marks)

    @property
    def num_planned(self) -> int:
        return int(self.marks[-1])

    @property
    def index_dtype(self) -> type:
        return np.int32 if self.counts.shape[0] < 2**31 else np.int64

    def planned(self, values: np.ndarray) -> np.ndarray:
        """(n,) ``values`` (one per row) of each planned example: ``np.repeat(values, counts)`` without its
        intp copy of the counts."""
        out = np.empty(self.num_planned, dtype=np.asarray(values).dtype)
        _repeat(np.ascontiguousarray(values), self.counts, out)
        return out

    def index(self) -> np.ndarray:
        """(n,) the row of each planned example (``sample_sources``' ``index``)."""
        out = np.empty(self.num_planned, dtype=self.index_dtype)
        _repeat_rows(self.counts, out)
        return out

    def index_part(self, r0: int, r1: int) -> np.ndarray:
        """The rows of the planned examples of rows r0..r1 - 1, less r0 (``index[first(r0):first(r1)] - r0``)."""
        out = np.empty(self.first(r1) - self.first(r0), dtype=self.index_dtype)
        _repeat_rows(self.counts[r0:r1], out)
        return out

    def first(self, row: int) -> int:
        """The planned examples before ``row`` (the position of its first copy)."""
        b = row // MARK
        return int(self.marks[b]) + int(self.counts[b * MARK : row].sum(dtype=np.int64))

    def locate(self, planned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, copy number) of each of the ``planned`` examples (any order)."""
        planned = np.ascontiguousarray(planned)
        rows = np.empty(planned.shape[0], dtype=self.index_dtype)
        copies = np.empty(planned.shape[0], dtype=self.counts.dtype)
        _locate(planned, self.counts, self.marks, rows, copies)
        return rows, copies


@njit(cache=True)
def _marks(counts, marks):
    total = np.int64(0)
    for r in range(counts.shape[0]):
        if r % MARK == 0:
            marks[r // MARK] = total
        total += counts[r]
    for b in range((counts.shape[0] + MARK - 1) // MARK, marks.shape[0]):
        marks[b] = total


@njit(cache=True)
def _repeat(values, counts, out):
    k = 0
    for r in range(counts.shape[0]):
        for _ in range(counts[r]):
            out[k] = values[r]
            k += 1


@njit(cache=True)
def _repeat_rows(counts, out):
    k = 0
    for r in range(counts.shape[0]):
        for _ in range(counts[r]):
            out[k] = r
            k += 1


@njit(cache=True)
def _locate(planned, counts, marks, rows, copies):
    for j in range(planned.shape[0]):
        p = np.int64(planned[j])
        b = np.searchsorted(marks, p, side="right") - 1  # the last block starting at or before p
        r = b * MARK
        pos = marks[b]
        while pos + counts[r] <= p:
            pos += counts[r]
            r += 1
        rows[j] = r
        copies[j] = p - pos


def separate_copies(
    index: np.ndarray,
    pack_ids: np.ndarray,
    lengths: np.ndarray,
    *,
    capacity: int,
    seed: int,
    costs: np.ndarray | None = None,
    limits: Sequence[int | None] = (),
    max_tries: int = 4096,
) -> np.ndarray:
    """Move up-sampled copies out of their original's pack by swapping with another pack's example.

    Best-fit stacks equal lengths into one bin, so an example's copies (same length) land together: the
    same sequence twice in one row. Each swap keeps both packs within ``capacity`` and the budgets
    (``costs`` (n, k) and ``limits`` (k,) as ``packing.plan`` takes them), so the pack count and every budget
    hold; a conflict with no feasible partner within ``max_tries`` stays. ``index`` is each planned example's
    input index (copies share it), as ``sample_sources`` returns it.
    """
    pack_ids = pack_ids.copy()
    num_packs = int(pack_ids.max()) + 1
    key = index * num_packs + pack_ids  # (n,) equal keys: the same example twice in one pack
    by_key = np.argsort(key, kind="stable")
    dup = by_key[1:][key[by_key[1:]] == key[by_key[:-1]]]
    if not len(dup):
        return pack_ids
    bounded = [j for j, limit in enumerate(limits) if limit is not None]
    # column 0 = tokens, then each bounded budget: per example (rows), per pack (load) and the cap
    table = np.column_stack([lengths] + [np.asarray(costs)[:, j] for j in bounded]).astype(np.int64)  # (n, 1+b)
    rows = table.tolist()
    load = [[int(v) for v in np.bincount(pack_ids, weights=table[:, c], minlength=num_packs)]
            for c in range(table.shape[1])]  # (1+b, P)
    caps = [capacity] + [int(limits[j]) for j in bounded]
    members: dict[int, dict[int, int]] = {}  # pack -> example index -> copies in it
    for pk, ex in zip(pack_ids.tolist(), index.tolist(), strict=True):
        m = members.setdefault(pk, {})
        m[ex] = m.get(ex, 0) + 1
    candidates = np.random.default_rng([seed, 2]).permutation(len(index)).tolist()
    cursor = 0
    for p in dup.tolist():
        a, ea = int(pack_ids[p]), int(index[p])
        for _ in range(min(max_tries, len(candidates))):
            q = candidates[cursor]
            cursor = (cursor + 1) % len(candidates)
            b, eb = int(pack_ids[q]), int(index[q])
            if a == b or eb in members[a] or ea in members[b]:
                continue
            delta = [x - y for x, y in zip(rows[q], rows[p], strict=True)]  # what pack a gains, b loses
            if any(col[a] + d > cap or col[b] - d > cap for col, d, cap in zip(load, delta, caps, strict=True)):
                continue
            for col, d in zip(load, delta, strict=True):
                col[a] += d
                col[b] -= d
            pack_ids[p], pack_ids[q] = b, a
            for pk, old_ex, new_ex in ((a, ea, eb), (b, eb, ea)):
                m = members[pk]
                m[old_ex] -= 1
                if not m[old_ex]:
                    del m[old_ex]
                m[new_ex] = m.get(new_ex, 0) + 1
            break
    return pack_ids
