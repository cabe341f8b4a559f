"""Best-fit decreasing over length classes: the tokens-only plan for 10^8..10^9 examples (the bulk planner).

``plan(lengths, capacity)`` places one example at a time and holds ~25 bytes per example above the lengths
at its peak (int64 copy of the lengths, slot table, assignment, shuffled ids): ~25 GB for 1B examples, and
the build's ``argsort(pack_ids)`` adds 8-16 more. ``plan_bulk`` makes the same plan from the length
histogram and returns it as compact arrays grouped the way the writers read them: 4.6 bytes per example
above uint16 lengths on lognormal lengths (7.5 on the Wikipedia histogram, 2 examples per pack).

Why it is the same plan. BFD takes lengths in decreasing order and puts each example into the open pack
with the smallest remaining capacity r >= s. Examples of one length s are interchangeable, so their choices
can be made in bulk: if pack b (remaining r, the tightest fit) takes one example of length s, it has r - s
left; when r - s >= s that is now the tightest fit, and the next example of length s goes to b again. So b
takes q = min(left, r // s) examples at once, and only then does best fit move on. When no open pack fits
s, every new pack takes C // s examples (the last one the rest). Open packs sit in LIFO lists by remaining
capacity (``head[r]``, ``nxt[b]``) with a 64-ary bitset over r for "smallest r >= s", as ``plan``'s
tokens-only kernel keeps them (``_bfd_fast``), so the packs are chosen in the same sequence and numbered
in the same opening order, and ``plan_bulk(...).pack_ids()`` equals ``plan(lengths, capacity, seed=seed)``
element for element (tests/packing/test_bulk.py checks it on random inputs; scripts/bench_scale.py on
10M and 100M lengths).

Cost. The loop runs once per (pack, length) visit, not per example: 0.06 visits per example on lognormal
lengths at 8192, 0.25 on the Wikipedia histogram at 512; the packs opened when nothing fits are one record
per length. Then the seeded shuffle of the packs (``plan``'s, on an int32 array), two passes over the packs
(sizes, first slots), one over the examples (each written into its pack's next slot: ~20 ns, the scattered
write) and a bitmap of the pack ends. Measured (docs/benchmarks.md, 2 shared cores): 100M lognormal
lengths in 2.5-3.3 s CPU, 1B in 40 s CPU / 96 s wall with a 6.3 GiB peak including the 2 GiB of lengths.

Output (``PackOrder``): the example indices grouped pack by pack in write order (``order``), with pack p's
examples at ``order[bounds[p]:bounds[p+1]]`` in increasing index. That is what a shard writer reads: shard k
holds packs [k*R, (k+1)*R), one contiguous slice of ``order``; ``build.py`` today gets the same two arrays
from ``argsort(pack_ids, kind="stable")`` and ``bincount``. ``pack_ids()`` gives ``plan()``'s per-example
view.

Memory (n examples, P packs, V visits; int32 indices while n < 2**31). The lengths are read as given
(2n bytes as uint16, which any capacity < 65536 allows). Peak, during the pass over the examples: ``order``
4n, one cursor per pack 4P, the visit records 6V (int32 pack + uint16 count), O(capacity) tables. The
boundaries (4P) are only built after it, from an n-bit map of the pack ends, so they are never held beside
the cursors.

Example (capacity 10; the same plan and numbering as ``plan(np.array([6, 5, 4, 3, 2]), 10)``)::

    >>> p = plan_bulk(np.array([6, 5, 4, 3, 2], dtype=np.uint16), 10)
    >>> p.order, p.bounds          # pack 0 = examples 0, 2 (6 + 4); pack 1 = examples 1, 3, 4 (5 + 3 + 2)
    (array([0, 2, 1, 3, 4], dtype=int32), array([0, 2, 5], dtype=int32))
    >>> p.pack_ids()
    array([0, 1, 0, 1, 1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from packer.errors import ConfigError

# plan()'s 64-ary bitset over remaining capacities 0..C: "smallest open pack with r >= x" in O(log64 C)
from packer.packing.kernels import (
    _DEBRUIJN,
    _DEBRUIJN_TABLE,
    WIDE,
    _available,
    _bits_clear,
    _bits_set,
    _bits_succ,
    _bitset_levels,
    class_column,
    ix_new,
    ix_open_all,
    refine_next,
    refine_try,
)

# int32 indices and pack ids while they fit: 4 bytes per example instead of 8.
_INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class PackOrder:
    """A plan as the shard writers read it: examples grouped pack by pack, packs in write order."""

    order: np.ndarray
    """(n,) example indices, pack 0's first; inside a pack in increasing index. int32 if n < 2**31."""
    bounds: np.ndarray
    """(P + 1,) pack p holds ``order[bounds[p]:bounds[p + 1]]``; ``bounds[0] == 0``, ``bounds[-1] == n``."""

    @property
    def num_packs(self) -> int:
        return self.bounds.shape[0] - 1

    def sizes(self) -> np.ndarray:
        """(P,) examples per pack, int64 (``build.write_shards``'s ``pack_sizes``)."""
        return np.diff(self.bounds.astype(np.int64))

    def pack(self, p: int) -> np.ndarray:
        """Example indices of pack ``p``."""
        return self.order[self.bounds[p] : self.bounds[p + 1]]

    def pack_ids(self) -> np.ndarray:
        """(n,) int64 pack id per example: ``plan()``'s return value (8n bytes: for small n and tests)."""
        ids = np.empty(self.order.shape[0], dtype=np.int64)
        _scatter_ids(self.order, self.bounds, ids)
        return ids


def plan_bulk(lengths: np.ndarray, capacity: int, *, seed: int = 0, refine: bool = False) -> PackOrder:
    """Tokens-only best-fit decreasing over length classes; the plan of ``plan(lengths, capacity, seed=seed)``.

    Args:
        lengths: (n,) tokens per example, each in [1, capacity]. Any integer dtype; pass uint16 when
            capacity < 65536 (2 bytes per example; it is read, never copied).
        capacity: tokens per pack (the build's ``max_length``).
        seed: seed of the pack shuffle (``np.random.default_rng(seed)``, the same write order as ``plan``).
        refine: ``plan(..., refine=True)``'s plan (exact completion, then emptying the least-filled packs), over
            runs of one length in one pack ("refine in bulk" below): ~2 bytes per example above ``order``.

    Returns:
        ``PackOrder``: examples grouped by pack in write order, and the pack boundaries.

    Tokens only: with budgets or ``max_examples_per_pack``, ``packing.bulk_budgets.plan_budgeted`` makes
    ``plan()``'s plan in the same layout. Measured at 10M, 100M and 1B lengths: docs/benchmarks.md "Planner at
    10M / 100M lengths".
    """
    lens = np.asarray(lengths)
    if lens.ndim != 1:
        raise ConfigError(f"'lengths' must be a 1-D array, got shape {lens.shape}")
    if lens.size and lens.dtype.kind not in "iu":
        raise ConfigError(f"'lengths' must hold integers, got dtype {lens.dtype}")
    if isinstance(capacity, bool) or int(capacity) != capacity or int(capacity) < 1:
        raise ConfigError(f"'capacity (max_length)' must be a positive integer, got {capacity!r}")
    capacity = int(capacity)
    n = lens.shape[0]
    index = np.int32 if n <= _INT32_LIMIT else np.int64
    if n == 0:
        return PackOrder(order=np.zeros(0, dtype=index), bounds=np.zeros(1, dtype=index))
    lens = np.ascontiguousarray(lens)

    counts = np.zeros(capacity + 1, dtype=np.int64)
    if _count(lens, capacity, counts) >= 0:
        _raise_misfit(lens, capacity)
    if refine:
        refined = _plan_refined(lens, counts, capacity, seed, index)
        if refined is not None:
            return refined

    # 1. BFD over the length classes: pop visits as (pack, count) records, new packs per length.
    visit_count = np.uint16 if capacity < 2**16 else np.int32  # q <= capacity // s
    nxt = np.empty(min(n, 2 * int((counts * np.arange(capacity + 1)).sum()) // capacity + 2), dtype=index)
    visit_pack, visit_q, visit_lo, new_first, num_packs = _bfd_classes(
        counts,
        capacity,
        nxt,
        np.empty(n // 16 + capacity, dtype=index),
        np.empty(n // 16 + capacity, visit_count),
    )
    del nxt

    # 2. Write order: plan()'s seeded shuffle, perm[b] = write position of pack b.
    perm = write_order(num_packs, seed, index)

    # 3. Pack sizes in write order -> each pack's first slot in ``order``, stored in place of its write id.
    starts = np.zeros(num_packs + 1, dtype=index)
    _sizes(counts, capacity, visit_pack, visit_q, visit_lo, new_first, perm, starts)
    np.cumsum(starts, out=starts)
    _cursors(perm, starts)
    del starts  # not held during the fill: 4 bytes per pack less at the peak (2 bytes/example on Wikipedia)

    # 4. One pass over the examples in index order: each takes the next slot of its length's sequence.
    order = np.empty(n, dtype=index)
    _fill(lens, capacity, visit_pack, visit_q, visit_lo, new_first, perm, order)
    del visit_pack, visit_q

    # 5. The cursors now hold every pack's end. Packs are contiguous, so the sorted ends are the boundaries:
    #    mark them in an n-bit map (n / 8 bytes) and read it in order, O(n / 64 + P) instead of a sort.
    marks = np.zeros(n // 64 + 1, dtype=np.uint64)
    _mark(perm, marks)
    del perm
    bounds = np.empty(num_packs + 1, dtype=index)
    _read_marks(marks, bounds)
    return PackOrder(order=order, bounds=bounds)


def write_order(num_packs: int, seed: int, dtype: type = np.int32) -> np.ndarray:
    """``np.random.default_rng(seed).permutation(num_packs)`` (``plan``'s write order) as ``dtype``.

    Generator.shuffle is Fisher-Yates from the last element down, each swap partner drawn by
    ``random_interval`` (masked rejection on 32-bit draws, the low half of each 64-bit output first), and the
    draws do not depend on the dtype. ``_fisher_yates`` replays it on the same PCG64 outputs, 2x faster than
    numpy's loop (50M packs: 1.9 vs 4.0 s CPU, the random swaps dominate both); an int32 arange halves the
    bytes. Checked against numpy once per process, else numpy's own shuffle runs.
    """
    perm = np.arange(num_packs, dtype=dtype)
    if num_packs > 2**32 or not _replay_matches_numpy():  # beyond 2**32 numpy draws 64-bit words
        np.random.default_rng(seed).shuffle(perm)
        return perm
    bits = np.random.default_rng(seed).bit_generator
    i, have, word = num_packs - 1, False, np.uint64(0)
    while i > 0:
        i, have, word = _fisher_yates(perm, bits.random_raw(1 << 20), i, have, np.uint64(word))  # 8 MB a call
    return perm


_REPLAY_OK: list[bool] = []


def _replay_matches_numpy() -> bool:
    if not _REPLAY_OK:
        _REPLAY_OK.append(
            all(
                np.array_equal(_replayed(p, seed), np.random.default_rng(seed).permutation(p))
                for p in (2, 3, 1000, 70_001)
                for seed in (0, 1)
            )
        )
    return _REPLAY_OK[0]


class ShuffledPrefix:
    """``write_order(n, seed)`` read a block at a time from its start, without its (n,) array (issue 32: the
    candidates of ``bulk_budgets.separate_copies_bulk``, int32 per planned example, of which the swaps read
    a prefix). Fisher-Yates fixes the first positions last, so a block is the shuffle replayed backwards: each
    of the block's positions traced through every swap from the last (i = 1) to the first (i = n - 1), the
    swaps' partners regenerated a buffer of PCG64 outputs at a time from the states saved by one forward
    pass. Per block of ``c`` positions: a bitmap of n bits (which positions are traced) and a hash table of
    ~2c slots; each block costs one pass over the n swaps' draws."""

    RAW = 1 << 18  # 64-bit outputs per saved state: 2 MB of draws, ~360k swaps

    def __init__(self, n: int, seed: int | list[int]) -> None:
        self.n, self.seed = n, seed
        self.whole: np.ndarray | None = None
        if n > 2**31 - 1 or not _replay_matches_numpy():
            self.whole = write_order(n, seed, np.int64)
            return
        bits = np.random.default_rng(seed).bit_generator
        js = np.empty(2 * self.RAW + 1, dtype=np.int64)
        self.saves: list[tuple[dict, int, bool, int]] = []  # (state, i, have, word) before each buffer
        i, have, word = n - 1, False, np.uint64(0)
        while i > 0:
            self.saves.append((bits.state, i, have, int(word)))
            i, have, word, _ = _partners(bits.random_raw(self.RAW), i, have, np.uint64(word), js)
        self.bitmap = np.zeros(n // 64 + 1, dtype=np.uint64)

    @property
    def block_size(self) -> int:
        """Positions per block: a table of the power of two >= n / 16 slots (int32 key + slot: <= n / 2
        bytes) at most 5/8 full; ~0.13 us per swap and ~0.25 us per position a block (25M: 1.6M positions
        in 0.9 s CPU, `write_order` 0.7 s)."""
        return (1 << max(4, (max(1, self.n // 16) - 1).bit_length())) * 5 // 8

    def block(self, c0: int, c1: int) -> np.ndarray:
        """``write_order(n, seed)[c0:c1]`` (int32)."""
        if self.whole is not None:
            return self.whole[c0:c1]
        size = 1 << max(4, (max(1, (c1 - c0) * 8 // 5) - 1).bit_length())  # at most 5/8 full
        keys = np.full(size, -1, dtype=np.int32)
        slots = np.empty(size, dtype=np.int32)
        _track(self.bitmap, keys, slots, c0, c1)
        bits = np.random.default_rng(self.seed).bit_generator
        js = np.empty(2 * self.RAW + 1, dtype=np.int64)
        for state, i, have, word in reversed(self.saves):  # the last swaps (i = 1 up) first
            bits.state = state
            _, _, _, k = _partners(bits.random_raw(self.RAW), i, have, np.uint64(word), js)
            _trace(js, k, i, self.bitmap, keys, slots)
        out = np.empty(c1 - c0, dtype=np.int32)
        _untrack(self.bitmap, keys, slots, out)
        return out


@njit(cache=True)
def _partners(raw, i, have, word, js):
    """``_fisher_yates``'s draws without its swaps: js[k] := the partner of position i - k. Returns (i, have,
    word, k) when ``raw`` runs out (or i == 0)."""
    k = 0
    r = 0
    while i > 0:
        mask = np.uint64(i)
        for shift in (1, 2, 4, 8, 16, 32):
            mask |= mask >> np.uint64(shift)
        while True:
            if have:
                v = word >> np.uint64(32)
                have = False
            else:
                if r == raw.shape[0]:
                    return i, have, word, k
                word = raw[r]
                r += 1
                v = word & np.uint64(0xFFFFFFFF)
                have = True
            v &= mask
            if v <= np.uint64(i):
                break
        js[k] = np.int64(v)
        k += 1
        i -= 1
    return i, have, word, k


@njit(cache=True, inline="always")
def _find(keys, key):
    m = keys.shape[0] - 1
    h = (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    s = np.int64(h) & m
    while keys[s] != key:
        s = (s + 1) & m
    return s


@njit(cache=True)
def _insert(keys, slots, key, value):
    m = keys.shape[0] - 1
    h = (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    s = np.int64(h) & m
    while keys[s] != -1:
        s = (s + 1) & m
    keys[s] = key
    slots[s] = value


@njit(cache=True)
def _delete(keys, slots, s):
    """Linear probing's deletion by backward shift: no tombstones."""
    m = keys.shape[0] - 1
    keys[s] = -1
    t = s
    while True:
        t = (t + 1) & m
        if keys[t] == -1:
            return
        h = np.int64((np.uint64(keys[t]) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & m
        if (t - h) & m >= (t - s) & m:  # its home is at or before the hole: it moves into it
            keys[s] = keys[t]
            slots[s] = slots[t]
            keys[t] = -1
            s = t


@njit(cache=True)
def _track(bitmap, keys, slots, c0, c1):
    for x in range(c0, c1):
        bitmap[x >> 6] |= np.uint64(1) << np.uint64(x & 63)
        _insert(keys, slots, x, x - c0)


@njit(cache=True)
def _trace(js, k, i_top, bitmap, keys, slots):
    """Apply the swaps (i_top - a, js[a]) for a = k - 1 down to 0 (i ascending) to the traced positions."""
    for a in range(k - 1, -1, -1):
        i = i_top - a
        j = js[a]
        if j == i:
            continue
        hi = (bitmap[i >> 6] >> np.uint64(i & 63)) & np.uint64(1)
        hj = (bitmap[j >> 6] >> np.uint64(j & 63)) & np.uint64(1)
        if hi and hj:
            si, sj = _find(keys, i), _find(keys, j)
            slots[si], slots[sj] = slots[sj], slots[si]
        elif hi or hj:
            src, dst = (i, j) if hi else (j, i)
            s = _find(keys, src)
            v = slots[s]
            _delete(keys, slots, s)
            _insert(keys, slots, dst, v)
            bitmap[src >> 6] &= ~(np.uint64(1) << np.uint64(src & 63))
            bitmap[dst >> 6] |= np.uint64(1) << np.uint64(dst & 63)


@njit(cache=True)
def _untrack(bitmap, keys, slots, out):
    """out[slot] := the position its trace ended at (the value there); the bitmap cleared for the next block."""
    for s in range(keys.shape[0]):
        x = keys[s]
        if x != -1:
            out[slots[s]] = x
            bitmap[x >> 6] &= ~(np.uint64(1) << np.uint64(x & 63))


def _replayed(num_packs: int, seed: int) -> np.ndarray:
    perm = np.arange(num_packs, dtype=np.int32)
    bits = np.random.default_rng(seed).bit_generator
    i, have, word = num_packs - 1, False, np.uint64(0)
    while i > 0:
        i, have, word = _fisher_yates(perm, bits.random_raw(64), i, have, np.uint64(word))  # several calls
    return perm


def _raise_misfit(lens: np.ndarray, capacity: int) -> None:
    """The error ``plan`` raises for the same input (same wording, same example index)."""
    lo = int(lens.min())
    if lo < 1:
        i = int(np.argmin(lens))
        raise ConfigError(f"example {i} has {lo} tokens; every example needs at least 1")
    i = int(np.argmax(lens))
    raise ConfigError(
        f"example {i} has {int(lens[i])} tokens > capacity {capacity}; raise 'max_length' or drop/truncate the "
        "example"
    )


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _count(lens, capacity, counts):
    """Histogram of the lengths; returns the index of the first length outside [1, capacity], else -1."""
    for i in range(lens.shape[0]):
        s = np.int64(lens[i])
        if s < 1 or s > capacity:
            return i
        counts[s] += 1
    return -1


@njit(cache=True)
def _grow(a, size):
    """``a`` copied into an array 1.5x larger (numba cannot resize in place)."""
    b = np.empty(size + size // 2, dtype=a.dtype)
    for i in range(a.shape[0]):  # not ``b[:n] = a``: that compiles numba's shape-error raise (see kernels.py)
        b[i] = a[i]
    return b


@njit(cache=True, inline="always")
def _push(b, r, head, nxt, bits, offs):
    if head[r] < 0:
        _bits_set(bits, offs, r)
    nxt[b] = head[r]
    head[r] = b


@njit(cache=True)
def _bfd_classes(counts, capacity, nxt, visit_pack, visit_q):
    """BFD over length classes. Returns (visit_pack, visit_q, visit_lo, new_first, num_packs).

    Length s's examples, in plan order, go first to the packs of its visits ``visit_lo[s]`` ..
    ``visit_lo[s - 1] - 1`` (``visit_q`` examples to pack ``visit_pack``), then to new packs numbered from
    ``new_first[s]``, ``capacity // s`` per pack (the last takes the rest). Packs are numbered in opening
    order, as ``plan``'s ``_bfd_fast`` numbers them.
    """
    table = _DEBRUIJN_TABLE
    offs, nwords = _bitset_levels(capacity + 1)
    bits = np.zeros(offs[-1] + nwords[-1], dtype=np.int64)  # remaining capacities with an open pack
    head = np.full(capacity + 1, -1, dtype=nxt.dtype)  # LIFO list of the open packs with r left
    visit_lo = np.zeros(capacity + 2, dtype=np.int64)
    new_first = np.zeros(capacity + 1, dtype=np.int64)
    v = 0
    num_packs = 0
    for s in range(capacity, 0, -1):
        visit_lo[s] = v
        left = counts[s]
        while left > 0:
            r = _bits_succ(bits, offs, nwords, s, table)
            if r < 0:  # nothing open fits s: new packs of capacity // s examples each, then one with the rest
                break
            b = head[r]
            head[r] = nxt[b]
            if head[r] < 0:
                _bits_clear(bits, offs, r)
            q = min(left, r // s)  # b stays the tightest fit while it has room for another s
            left -= q
            if v == visit_pack.shape[0]:
                visit_pack = _grow(visit_pack, np.int64(v))  # int64: not a signature for a literal 0 too
                visit_q = _grow(visit_q, np.int64(v))
            visit_pack[v] = b
            visit_q[v] = q
            v += 1
            if r - q * s > 0:
                _push(b, r - q * s, head, nxt, bits, offs)
        new_first[s] = num_packs
        if left > 0:
            per = capacity // s
            full, rest = left // per, left % per
            gap = capacity - per * s
            for b in range(num_packs, num_packs + full):  # pushed in opening order, as one at a time would
                if gap > 0:
                    _push(b, gap, head, nxt, bits, offs)
            num_packs += full
            if rest > 0:
                _push(num_packs, capacity - rest * s, head, nxt, bits, offs)
                num_packs += 1
    visit_lo[0] = v
    return visit_pack[:v], visit_q[:v], visit_lo, new_first, num_packs


@njit(cache=True)
def _sizes(counts, capacity, visit_pack, visit_q, visit_lo, new_first, perm, bounds):
    """bounds[perm[b] + 1] = examples in pack b (bounds is then cumsummed into write-order boundaries)."""
    for s in range(capacity, 0, -1):
        placed = 0
        for j in range(visit_lo[s], visit_lo[s - 1]):
            bounds[perm[visit_pack[j]] + 1] += visit_q[j]
            placed += visit_q[j]
        left = counts[s] - placed
        per = capacity // s
        b = new_first[s]
        while left > 0:
            bounds[perm[b] + 1] += min(per, left)
            left -= per
            b += 1


@njit(cache=True)
def _cursors(perm, bounds):
    """perm[b] (pack b's write position) becomes the first slot of pack b in ``order``."""
    for b in range(perm.shape[0]):
        perm[b] = bounds[perm[b]]


@njit(cache=True)
def _fill(lens, capacity, visit_pack, visit_q, visit_lo, new_first, cursor, order):
    """order[cursor[b]++] = i for each example i in index order, b its pack: the k-th example of length s
    takes the k-th slot of s's sequence (its visits, then its new packs), as ``_bfd_fast`` hands them out.
    Consumes ``visit_q``; leaves each pack's end in ``cursor``. ~16-20 ns CPU per example on 100M lognormal
    lengths, most of it the scattered write into ``order``."""
    # One row per length, so an example touches one cache line of state (measured 1.7x faster than five
    # separate arrays and a division): next visit, end of its visits, current new pack, room left in it.
    state = np.empty((capacity + 1, 4), dtype=np.int64)
    for s in range(1, capacity + 1):
        state[s, 0] = visit_lo[s]
        state[s, 1] = visit_lo[s - 1]
        state[s, 2] = new_first[s]
        state[s, 3] = capacity // s
    for i in range(lens.shape[0]):
        s = np.int64(lens[i])
        j = state[s, 0]
        if j < state[s, 1]:
            b = np.int64(visit_pack[j])
            q = visit_q[j] - 1
            visit_q[j] = q
            if q == 0:
                state[s, 0] = j + 1
        else:
            b = state[s, 2]
            state[s, 3] -= 1
            if state[s, 3] == 0:  # this new pack is full: the next one (packs opened for s are consecutive)
                state[s, 3] = capacity // s
                state[s, 2] = b + 1
        pos = cursor[b]
        cursor[b] = pos + 1
        order[pos] = i


@njit(cache=True)
def _fisher_yates(x, raw, i, have, word):
    """numpy's Generator.shuffle from position i down, on the 64-bit outputs ``raw``; ``have``/``word`` carry
    an unused high half across calls. Returns (i, have, word) when ``raw`` runs out, i == 0 when done."""
    k = 0
    while i > 0:
        mask = np.uint64(i)  # the smallest all-ones mask >= i
        for shift in (1, 2, 4, 8, 16, 32):
            mask |= mask >> np.uint64(shift)
        while True:  # a draw in [0, mask], rejected while > i
            if have:
                v = word >> np.uint64(32)
                have = False
            else:
                if k == raw.shape[0]:
                    return i, have, word
                word = raw[k]
                k += 1
                v = word & np.uint64(0xFFFFFFFF)
                have = True
            v &= mask
            if v <= np.uint64(i):
                break
        j = np.int64(v)
        x[i], x[j] = x[j], x[i]
        i -= 1
    return i, have, word


@njit(cache=True)
def _mark(ends, marks):
    for b in range(ends.shape[0]):
        e = np.uint64(ends[b])
        marks[e >> np.uint64(6)] |= np.uint64(1) << (e & np.uint64(63))


@njit(cache=True)
def _read_marks(marks, bounds):
    """bounds = [0] + the marked positions in increasing order."""
    bounds[0] = 0
    k = 1
    for w in range(marks.shape[0]):
        word = marks[w]
        while word != 0:
            low = word & (~word + np.uint64(1))  # the lowest set bit
            bounds[k] = w * 64 + _DEBRUIJN_TABLE[np.int64((low * np.uint64(_DEBRUIJN)) >> np.uint64(58))]
            k += 1
            word ^= low


@njit(cache=True)
def _scatter_ids(order, bounds, ids):
    for p in range(bounds.shape[0] - 1):
        for k in range(bounds[p], bounds[p + 1]):
            ids[order[k]] = p


# ----------------------------------------------------------------------------------------------------------
# refine in bulk: plan()'s tokens-only ``refine`` over runs of one length in one pack
# ----------------------------------------------------------------------------------------------------------
#
# ``plan(refine=True)`` runs plain BFD and BFD with exact completion (``kernels.bfd_fast``), keeps the one with
# fewer packs, then empties the least-filled packs into the others' free space (``balance.refine_packs``): 8 bytes
# per example in each of ~5 arrays (~44 bytes per example in a build). Examples of one length are interchangeable
# to both, and each hands the k-th slot of length s to the k-th example of length s in index order, so the same
# plan is a list of runs (length s, pack b, q examples) in the order the slots are handed out: one run per (pack,
# length) visit, not per example. Refine then moves whole packs' members (largest first, ties in slot order),
# recorded per moved slot; the final pass over the examples in index order gives each its pack as ``_fill`` does.
# The pack ids equal plan()'s (tests/packing/test_bulk.py); memory is ``order`` plus ~12 bytes per run and
# plan()'s per-pack arrays.

_UNBOUNDED = np.int64(1) << np.int64(60)  # planner's stand-in for "no examples-per-pack limit"


def _plan_refined(lens: np.ndarray, counts: np.ndarray, capacity: int, seed: int, index: type) -> PackOrder | None:
    """plan(lens, capacity, refine=True, seed=seed) as a ``PackOrder``, or None where plain BFD already reaches
    the lower bound (refine keeps that plan: ``plan_bulk``'s own path makes it)."""
    bound = -(-int((counts * np.arange(capacity + 1)).sum()) // capacity)
    plain = _bfd_runs(counts, capacity, 0)
    if plain[3] <= bound:
        return None
    complete_min = max(1, int(np.percentile(lens, 2)))  # planner._completion_threshold, on the lengths as given
    other = _bfd_runs(counts, capacity, complete_min)
    run_s, run_b, run_q, num_packs = other if other[3] < plain[3] else plain
    del plain, other
    # each pack's runs, longest first, ties in slot order (refine_packs' members: by -length, then index)
    by_len = np.argsort(-run_s.astype(np.int64), kind="stable")
    runs = by_len[np.argsort(run_b[by_len], kind="stable")]
    ptr = np.zeros(num_packs + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(run_b, minlength=num_packs))
    loads = np.bincount(run_b, weights=run_s.astype(np.float64) * run_q, minlength=num_packs)
    candidates = np.lexsort((np.arange(num_packs), loads)).astype(np.int64)  # least filled first, as refine_packs
    del loads, by_len
    budgets = np.array([_UNBOUNDED], dtype=np.int64)
    cls, classes = class_column(budgets, 1)
    ix = ix_new(capacity + 1, num_packs, 1, cls, classes, WIDE)
    alive, move_first, move_to = _refine_runs(ix, run_s, run_b, run_q, runs, ptr, candidates, capacity, budgets,
                                              bound, 256)
    del ix, runs, ptr, candidates
    # write order: plan()'s seeded shuffle of the surviving packs, numbered in their old order
    kept = int(alive.sum())
    where = write_order(kept, seed, index)[np.cumsum(alive) - 1]  # (num_packs,) write position of each old pack
    starts = np.zeros(kept + 1, dtype=index)
    _run_sizes(run_b, run_q, alive, move_first, move_to, where, starts)
    np.cumsum(starts, out=starts)
    bounds = starts.copy()
    first = np.zeros(capacity + 2, dtype=np.int64)  # runs of length s: slot_runs[first[s]:first[s + 1]]
    np.cumsum(np.bincount(run_s, minlength=capacity + 1), out=first[1:])
    slot_runs = np.argsort(run_s, kind="stable")  # in slot order within a length
    order = np.empty(lens.shape[0], dtype=index)
    _fill_runs(lens, run_b, run_q, slot_runs, first, alive, move_first, move_to, where, starts, order)
    return PackOrder(order=order, bounds=bounds)


@njit(cache=True)
def _record(run_s, run_b, run_q, r, s, b, q):
    """Append q examples of length s in pack b (merged into the last run when it is the same length and pack)."""
    if r > 0 and run_s[r - 1] == s and run_b[r - 1] == b:
        run_q[r - 1] += q
        return run_s, run_b, run_q, r
    if r == run_s.shape[0]:
        run_s, run_b, run_q = _grow(run_s, np.int64(r)), _grow(run_b, np.int64(r)), _grow(run_q, np.int64(r))
    run_s[r] = s
    run_b[r] = b
    run_q[r] = q
    return run_s, run_b, run_q, r + 1


@njit(cache=True)
def _bfd_runs(counts, capacity, complete_min):
    """``kernels.bfd_fast`` (exact completion when ``complete_min > 0``) over length classes: the same packs,
    chosen in the same sequence, as runs (run_s, run_b, run_q, num_packs) in the order bfd_fast hands out the
    slots. A pack found open takes min(left, r // s) at once (it stays the tightest fit, ``_bfd_classes``);
    a new pack takes one, then ``_complete``'s fill, one example at a time."""
    table = _DEBRUIJN_TABLE
    offs, nwords = _bitset_levels(capacity + 1)
    bits = np.zeros(offs[-1] + nwords[-1], dtype=np.int64)
    head = np.full(capacity + 1, -1, dtype=np.int64)
    nxt = np.empty(1024, dtype=np.int64)
    left_count = counts.copy()
    avail = _available(left_count, offs, bits.shape[0], capacity, complete_min)
    size = 1024
    run_s = np.empty(size, dtype=np.int32)
    run_b = np.empty(size, dtype=np.int32)
    run_q = np.empty(size, dtype=np.int32)
    r = np.int64(0)  # int64 from the start: _record and _grow compiled once, not for a literal 0 too
    num_packs = np.int64(0)
    for s in range(capacity, 0, -1):
        while left_count[s] > 0:
            g = _bits_succ(bits, offs, nwords, s, table)
            if g < 0:
                b = num_packs
                num_packs += 1
                if b == nxt.shape[0]:
                    nxt = _grow(nxt, np.int64(b))
                run_s, run_b, run_q, r = _record(run_s, run_b, run_q, r, s, b, np.int64(1))
                left_count[s] -= 1
                if left_count[s] == 0 and complete_min > 0:
                    _bits_clear(avail, offs, capacity - s)
                left = capacity - s
                while complete_min > 0 and left > 0:  # kernels._complete, recording runs
                    key = _bits_succ(avail, offs, nwords, capacity - left, table)
                    if key < 0:
                        break
                    x = capacity - key
                    if x == left or left - x >= complete_min:
                        run_s, run_b, run_q, r = _record(run_s, run_b, run_q, r, x, b, np.int64(1))
                        left_count[x] -= 1
                        if left_count[x] == 0:
                            _bits_clear(avail, offs, capacity - x)
                        left -= x
                        continue
                    u = min(x, left - complete_min)
                    for _ in range(64):
                        v = left - u
                        if u < v:
                            break
                        if left_count[u] > 0 and left_count[v] > (1 if u == v else 0):
                            for y in (u, v):
                                run_s, run_b, run_q, r = _record(run_s, run_b, run_q, r, y, b, np.int64(1))
                                left_count[y] -= 1
                                if left_count[y] == 0:
                                    _bits_clear(avail, offs, capacity - y)
                            left = 0
                            break
                        u -= 1
                    break
            else:
                b = head[g]
                head[g] = nxt[b]
                if head[g] < 0:
                    _bits_clear(bits, offs, g)
                q = min(left_count[s], g // s)
                run_s, run_b, run_q, r = _record(run_s, run_b, run_q, r, s, b, q)
                left_count[s] -= q
                if left_count[s] == 0 and complete_min > 0:
                    _bits_clear(avail, offs, capacity - s)
                left = g - q * s
            if left > 0:
                _push(b, left, head, nxt, bits, offs)
    return run_s[:r].copy(), run_b[:r].copy(), run_q[:r].copy(), num_packs


@njit(cache=True)
def _refine_runs(ix, run_s, run_b, run_q, runs, ptr, candidates, capacity, budgets, target, patience):
    """``balance._refine`` over runs: try the candidates, move each member (longest first) to the best-fitting
    other pack, keep the moves only if the whole pack empties. Returns (alive, move_first, move_to): a moved
    run's j-th slot goes to pack ``move_to[move_first[r] + j]`` (-1: not moved)."""
    num_packs = ptr.shape[0] - 1
    rem, rem2 = ix[4], ix[5]
    rem[:num_packs] = capacity
    for b in range(num_packs):
        rem2[b, 0] = budgets[0]
    for r in range(run_s.shape[0]):
        rem[run_b[r]] -= np.int64(run_s[r]) * run_q[r]
        rem2[run_b[r], 0] -= run_q[r]
    inside = np.zeros(num_packs, dtype=np.bool_)
    alive = np.ones(num_packs, dtype=np.bool_)
    touched = np.zeros(num_packs, dtype=np.bool_)
    ix_open_all(ix, num_packs, inside)
    move_first = np.full(run_s.shape[0], -1, dtype=np.int64)
    move_to = np.empty(1024, dtype=np.int64)
    moved = 0  # kept moves in move_to
    sizes = np.empty(1024, dtype=np.int64)  # this candidate's members, one per example
    wants = np.ones((1024, 1), dtype=np.int64)  # each takes one example slot
    dest = np.empty(1024, dtype=np.int64)
    progress = np.array([num_packs, 0, target, patience], dtype=np.int64)
    c = refine_next(candidates, np.int64(0), touched, progress)
    while c >= 0:
        p = candidates[c]
        k = 0
        for j in range(ptr[p], ptr[p + 1]):
            k += run_q[runs[j]]
        if k > sizes.shape[0]:
            sizes, dest, wants = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64), np.ones((k, 1), np.int64)
        k = 0
        for j in range(ptr[p], ptr[p + 1]):
            sizes[k:k + run_q[runs[j]]] = run_s[runs[j]]
            k += run_q[runs[j]]
        if refine_try(ix, inside, touched, alive, progress, p, sizes, wants, k, dest):
            m = 0
            for j in range(ptr[p], ptr[p + 1]):
                rr = runs[j]
                move_first[rr] = moved
                for _ in range(run_q[rr]):
                    if moved == move_to.shape[0]:
                        move_to = _grow(move_to, np.int64(moved))
                    move_to[moved] = dest[m]
                    moved += 1
                    m += 1
        c = refine_next(candidates, c + 1, touched, progress)
    return alive, move_first, move_to[:moved].copy()


@njit(cache=True)
def _run_sizes(run_b, run_q, alive, move_first, move_to, where, sizes):
    """sizes[where[b] + 1] += examples that end in pack b."""
    for r in range(run_b.shape[0]):
        b = run_b[r]
        if alive[b]:
            sizes[where[b] + 1] += run_q[r]
        else:
            for j in range(run_q[r]):
                sizes[where[move_to[move_first[r] + j]] + 1] += 1


@njit(cache=True)
def _fill_runs(lens, run_b, run_q, slot_runs, first, alive, move_first, move_to, where, cursor, order):
    """order[cursor[p]++] = i for each example i in index order: the k-th example of length s takes the k-th
    slot of s's runs (a moved run's slot: where refine sent it)."""
    capacity = first.shape[0] - 2
    at = first[:-1].copy()  # (capacity + 1,) the current run of each length
    used = np.zeros(capacity + 1, dtype=np.int64)  # slots of that run taken
    for i in range(lens.shape[0]):
        s = np.int64(lens[i])
        r = slot_runs[at[s]]
        b = run_b[r]
        if not alive[b]:
            b = move_to[move_first[r] + used[s]]
        used[s] += 1
        if used[s] == run_q[r]:
            at[s] += 1
            used[s] = 0
        p = where[b]
        pos = cursor[p]
        cursor[p] = pos + 1
        order[pos] = i
