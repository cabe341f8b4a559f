"""Mixing weighted sources into one plan: which examples (and how many copies of each) the planner sees,
and keeping an example's copies out of one pack.

Weight w keeps floor(w) copies of every example of its source plus a seeded (w - floor(w)) fraction once
more: sources ``[("chat", 2.0), ("captions", 0.5)]`` plan every chat twice and a seeded half of the captions.
Pure numpy, deterministic in the seed; the counts over an epoch are exact (tests/packing/test_mixing.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
    index = np.repeat(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), counts)
    copies = np.zeros(index.shape[0], dtype=counts.dtype)
    if most > 1:
        starts = np.cumsum(counts, dtype=index.dtype)  # each example's copies end here...
        starts -= counts  # ...and start here; copy k sits at starts + k
        for k in range(1, most):
            copies[starts[counts > k] + k] = k
    return index, copies


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
