"""Global bin-packing of example lengths into packs (the planner).

Only lengths travel here: ``plan`` takes one int per example (tokens, and optionally vision tokens and image
counts) and returns one pack id per example. Pack ids are numbered in the seeded, shuffled order the writer
emits them, so ``pack 0`` is the first row of the first shard. Pure: no I/O, no torch, no global RNG.

Algorithms (``algorithm=``):

- ``bfd`` (default) best-fit decreasing. Lengths are counting-sorted (O(n + C)), then each example goes to the
  open pack with the *smallest* remaining capacity that still fits it. Open packs sit in per-capacity bucket
  lists indexed by a 64-ary bitset over capacities 0..C, so "smallest capacity >= s" is one or two word
  operations: O(n log64 C) overall, compiled with numba.
- ``ffd`` first-fit decreasing (a max segment tree over packs; O(n log n)).
- ``next-fit`` keeps input order and opens a new pack whenever the next example does not fit (a streaming
  baseline, like ``DataCollatorWithFlattening`` fed in order).
- ``binpacking`` the PyPI ``binpacking.to_constant_volume`` (quadratic; a reference, not for real builds).

Extra per-pack budgets (vision tokens, image count, examples per pack) are feasibility constraints: the planner
still best-fits on tokens but only among packs where every budget holds. That path keeps per-capacity maxima of
each remaining budget in a segment tree and searches it depth-first (still compiled, near O(n log C)).

``refine=True`` tries harder: on the tokens-only BFD path it also runs BFD with exact completion (a fresh pack
is closed exactly instead of stranding a gap nothing short enough will fill) and keeps the plan with fewer
packs; then, for any algorithm, it tries to empty the least-filled packs into the others' free space.
``balance_vision=True`` evens out the vision tokens per pack for at most 0.1% more packs.

Measured (scripts/bench_packing.py, docs/benchmarks.md, 2-core AMD EPYC): 1M lognormal lengths at 8192 in
~0.05 s CPU, LB + 1 pack (LB + 0 with refine); 10M in ~0.6 s CPU with a 157 MiB peak; the 16.3M-sequence
Wikipedia histogram at 512: 99.949% (99.973% with refine).
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import njit

from packer.errors import ConfigError

ALGORITHMS = ("bfd", "ffd", "next-fit", "binpacking")

# Stand-in budget for an unset constraint: larger than any real total, small enough that sums never overflow.
_UNBOUNDED = np.int64(1) << np.int64(60)


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------


def plan(
    lengths: np.ndarray,
    capacity: int,
    *,
    algorithm: str = "bfd",
    vision: np.ndarray | None = None,
    vision_budget: int | None = None,
    images: np.ndarray | None = None,
    max_images: int | None = None,
    max_examples: int | None = None,
    balance_vision: bool = False,
    refine: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Assign every example to a pack; return int64 pack ids numbered in the seeded shuffled write order.

    Args:
        lengths: (n,) tokens per example, each in [1, capacity].
        capacity: tokens per pack (the build's ``max_length``).
        algorithm: ``bfd`` (default), ``ffd``, ``next-fit`` or ``binpacking``.
        vision: (n,) vision tokens per example (part of ``lengths``); needed for ``vision_budget`` and
            ``balance_vision``.
        vision_budget: at most this many vision tokens per pack (``max_vision_tokens``).
        images: (n,) images per example; needed for ``max_images``.
        max_images: at most this many images per pack.
        max_examples: at most this many examples per pack (``max_examples_per_pack``).
        balance_vision: spread vision tokens evenly over the packs (same-ish pack count, lower spread of
            vision tokens per pack, so no rank gets all the image-heavy rows). A no-op without ``vision``.
        refine: also try BFD with exact completion (tokens-only ``bfd``) and keep the better plan, then try
            to empty the least-filled packs into the others' free space. Never more packs; costs ~2x.
        seed: seed of the pack shuffle (``np.random.default_rng(seed)``).

    Returns:
        (n,) int64 pack id per example, numbered 0..P-1 in write order.

    Example (capacity 10; BFD puts 6+4 and 5+3+2 together, then the seeded shuffle numbers the packs)::

        >>> plan(np.array([6, 5, 4, 3, 2]), 10, seed=0)
        array([0, 1, 0, 1, 1])

    Measured fill (sum of lengths / (packs * capacity), ``scripts/bench_packing.py``): 99.998% on 1M
    lognormal lengths at capacity 8192 (LB + 1 pack; LB with refine), 99.949% on the 16.3M-sequence
    Wikipedia BERT histogram at 512 (99.973% with refine; the paper's best was 99.81%), 97.74% on SQuAD at
    384 (L2 bound + 2.2%: 30% of its sequences are longer than 192, 77% longer than 128). See
    docs/benchmarks.md.
    """
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"'algorithm' must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    lens = _int_array(lengths, "lengths")
    n = lens.shape[0]
    capacity = _positive_int(capacity, "capacity (max_length)")
    vis = None if vision is None else _int_array(vision, "vision", n)
    imgs = None if images is None else _int_array(images, "images", n)
    for value, knob in ((vision_budget, "max_vision_tokens"), (max_images, "max_images"),
                        (max_examples, "max_examples_per_pack")):  # fmt: skip
        if value is not None:
            _positive_int(value, knob)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _check_fits(lens, capacity, "tokens", "capacity", "max_length", lower=1)
    if vis is not None:
        _check_fits(vis, None, "vision tokens", "", "", lower=0)
        if (vis > lens).any():  # vision tokens are part of the example's tokens
            i = int(np.argmax(vis > lens))
            raise ConfigError(f"example {i} has {vis[i]} vision tokens but only {lens[i]} tokens in all")
    if imgs is not None:
        _check_fits(imgs, None, "images", "", "", lower=0)

    constrained = vision_budget is not None or max_images is not None or max_examples is not None
    fast = algorithm == "bfd" and not constrained and not refine and not (balance_vision and vis is not None)
    # The fast path needs no budget columns; skip building an (n, 1) array of ones for it.
    needs, budgets = _constraints(0 if fast else n, vis, vision_budget, imgs, max_images, max_examples)

    if algorithm == "bfd":
        if constrained:
            order = _order_decreasing(lens, capacity)
            cls, classes = _class_column(budgets, needs.shape[1])
            assign, num_packs = _bfd_general(
                order, lens, needs, capacity, budgets, cls, classes, _empty_rem(), _empty_rem2(needs)
            )
        elif refine:
            # Refine first tries BFD with exact completion and keeps whichever plan has fewer packs.
            assign, num_packs = _bfd_fast(lens, capacity, 0)
            other, other_packs = _bfd_fast(lens, capacity, _completion_threshold(lens))
            if other_packs < num_packs:
                assign, num_packs = other, other_packs
        else:
            assign, num_packs = _bfd_fast(lens, capacity, 0)
    elif algorithm == "ffd":
        assign, num_packs = _ffd(_order_decreasing(lens, capacity), lens, needs, capacity, budgets)
    elif algorithm == "next-fit":
        assign, num_packs = _next_fit(lens, needs, capacity, budgets)
    else:
        if constrained:
            raise ConfigError(
                "algorithm 'binpacking' only knows the token budget; unset max_vision_tokens, max_images and "
                "max_examples_per_pack, or use algorithm 'bfd'"
            )
        assign, num_packs = _binpacking_library(lens, capacity)

    if balance_vision and vis is not None and vis.any():
        vision_col = 1 if vision_budget is not None else -1  # budget columns: examples, vision, images
        assign, num_packs = _balanced(lens, vis, needs, capacity, budgets, assign, num_packs, vision_col)
    if refine:
        assign, num_packs = _refine_packs(assign, num_packs, lens, needs, capacity, budgets)

    # The numbering is the write order: a seeded permutation of the packs.
    perm = np.random.default_rng(seed).permutation(num_packs).astype(np.int64)
    return perm[assign]


def lower_bound(lengths: np.ndarray, capacity: int) -> int:
    """ceil(sum(lengths) / capacity): no packing can use fewer packs."""
    total = int(np.asarray(lengths, dtype=np.int64).sum())
    return -(-total // int(capacity))


def lower_bound_l2(lengths: np.ndarray, capacity: int) -> int:
    """Martello-Toth L2 bound, >= ``lower_bound``: two examples longer than capacity/2 never share a pack.

    For each k <= capacity/2: examples longer than capacity - k (J1) and those in (capacity/2, capacity - k]
    (J2) need a pack each, and examples in [k, capacity/2] (J3) can only use J2's free space or new packs.
    O(n + capacity).
    """
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.size == 0:
        return 0
    counts = np.bincount(lens, minlength=capacity + 1)[: capacity + 1]
    num = np.cumsum(counts)  # num[x] = examples of length <= x
    vol = np.cumsum(counts * np.arange(capacity + 1))  # vol[x] = their tokens
    half = capacity // 2  # length <= half <=> length <= capacity / 2, for odd capacities too
    k = np.arange(half + 1)
    j1 = lens.size - num[capacity - k]
    j2 = num[capacity - k] - num[half]
    j2_free = j2 * capacity - (vol[capacity - k] - vol[half])
    j3 = vol[half] - np.where(k > 0, vol[np.maximum(k - 1, 0)], 0)
    extra = np.maximum(0, -(-(j3 - j2_free) // capacity))
    return int(max((j1 + j2 + extra).max(), lower_bound(lens, capacity)))


def groups(pack_ids: np.ndarray) -> list[np.ndarray]:
    """Example indices of each pack, pack 0 first; within a pack in ascending example index."""
    ids = np.asarray(pack_ids, dtype=np.int64)
    if ids.size == 0:
        return []
    order = np.argsort(ids, kind="stable")  # stable keeps example indices ascending inside a pack
    bounds = np.cumsum(np.bincount(ids))[:-1]
    return np.split(order, bounds)


def pack_totals(values: np.ndarray, pack_ids: np.ndarray) -> np.ndarray:
    """Per-pack sums of ``values`` (e.g. tokens or vision tokens), int64, indexed by pack id."""
    ids = np.asarray(pack_ids, dtype=np.int64)
    num_packs = int(ids.max()) + 1 if ids.size else 0
    # bincount sums in float64: exact below 2**53 tokens per pack, and 20x faster than np.add.at
    return np.bincount(ids, weights=np.asarray(values, dtype=np.float64), minlength=num_packs).astype(
        np.int64
    )


def efficiency(lengths: np.ndarray, pack_ids: np.ndarray, capacity: int) -> float:
    """Fill rate: sum(lengths) / (packs * capacity); 1.0 means no padding at all."""
    ids = np.asarray(pack_ids)
    if ids.size == 0:
        return 1.0
    return float(np.asarray(lengths, dtype=np.int64).sum()) / ((int(ids.max()) + 1) * capacity)


# ----------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------


def _int_array(values: np.ndarray, name: str, n: int | None = None) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ConfigError(f"'{name}' must be a 1-D array, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ConfigError(f"'{name}' must hold integers, got dtype {arr.dtype}")
    if n is not None and arr.shape[0] != n:
        raise ConfigError(f"'{name}' has {arr.shape[0]} entries but there are {n} examples")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ConfigError(f"'{name}' must be a positive integer, got {value!r}")
    return int(value)


def _check_fits(
    values: np.ndarray, budget: int | None, what: str, param: str, knob: str, *, lower: int
) -> None:
    lo = int(values.min())
    if lo < lower:
        i = int(np.argmin(values))
        raise ConfigError(f"example {i} has {lo} {what}; every example needs at least {lower}")
    if budget is not None:
        hi = int(values.max())
        if hi > budget:
            i = int(np.argmax(values))
            raise ConfigError(
                f"example {i} has {hi} {what} > {param} {budget}; raise '{knob}' or drop/truncate the example"
            )


def _constraints(
    n: int,  # rows to build; 0 validates the budgets only
    vis: np.ndarray | None,
    vision_budget: int | None,
    imgs: np.ndarray | None,
    max_images: int | None,
    max_examples: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Secondary per-pack budgets as columns: 0 = examples (always), then vision tokens, then images."""
    cols = [np.ones(n, dtype=np.int64)]
    budgets = [_UNBOUNDED if max_examples is None else _positive_int(max_examples, "max_examples_per_pack")]
    if vision_budget is not None:
        budget = _positive_int(vision_budget, "max_vision_tokens")
        if vis is None:
            raise ConfigError("'max_vision_tokens' is set but no per-example vision token counts were given")
        _check_fits(vis, budget, "vision tokens", "vision budget", "max_vision_tokens", lower=0)
        cols.append(vis[:n])
        budgets.append(budget)
    if max_images is not None:
        budget = _positive_int(max_images, "max_images")
        if imgs is None:
            raise ConfigError("'max_images' is set but no per-example image counts were given")
        _check_fits(imgs, budget, "images", "max_images", "max_images", lower=0)
        cols.append(imgs[:n])
        budgets.append(budget)
    return np.ascontiguousarray(np.stack(cols, axis=1)), np.array(budgets, dtype=np.int64)


def _completion_threshold(lens: np.ndarray) -> int:
    """Gaps shorter than the 2nd percentile of the lengths rarely get filled (measured best on the Wikipedia
    histogram, 25-30 tokens, and harmless from 20 to 80 on the lognormal set)."""
    return max(1, int(np.percentile(lens, 2)))


def _empty_rem() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _empty_rem2(needs: np.ndarray) -> np.ndarray:
    return np.zeros((0, needs.shape[1]), dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------
# Shared kernels
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _order_decreasing(lens: np.ndarray, capacity: int) -> np.ndarray:
    """Counting sort: example indices by length descending, ties by ascending index. O(n + C)."""
    counts = np.zeros(capacity + 2, dtype=np.int64)
    for i in range(lens.shape[0]):
        counts[capacity - lens[i] + 1] += 1  # key = capacity - length, so the longest come first
    for k in range(1, capacity + 2):
        counts[k] += counts[k - 1]
    order = np.empty(lens.shape[0], dtype=np.int64)
    for i in range(lens.shape[0]):
        k = capacity - lens[i]
        order[counts[k]] = i
        counts[k] += 1
    return order


# De Bruijn table: index of the lowest set bit of a 64-bit word without a CPU intrinsic.
_DEBRUIJN = 0x03F79D71B4CA8B09
_DEBRUIJN_TABLE = np.zeros(64, dtype=np.int64)
for _i in range(64):
    _DEBRUIJN_TABLE[(((1 << _i) * _DEBRUIJN) % 2**64) >> 58] = _i
del _i


@njit(cache=True, inline="always")
def _ctz(word: np.int64, table: np.ndarray) -> np.int64:
    lowest = word & -word  # isolate the lowest set bit (two's complement, wraps for bit 63)
    return table[((lowest * np.int64(_DEBRUIJN)) >> 58) & 63]  # & 63 undoes the sign extension


@njit(cache=True)
def _bitset_levels(universe: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and word counts of a 64-ary bitset hierarchy over 0..universe-1 (top level = one word)."""
    sizes = []
    words = (universe + 63) // 64
    while True:
        sizes.append(words)
        if words == 1:
            break
        words = (words + 63) // 64
    nlev = len(sizes)
    offs = np.zeros(nlev, dtype=np.int64)
    nwords = np.zeros(nlev, dtype=np.int64)
    total = 0
    for k in range(nlev):
        offs[k] = total
        nwords[k] = sizes[k]
        total += sizes[k]
    return offs, nwords


@njit(cache=True, inline="always")
def _bits_succ(bits, offs, nwords, x, table):
    """Smallest set element >= x, or -1."""
    nlev = offs.shape[0]
    lvl = 0
    i = x
    while lvl < nlev:
        w = i >> 6
        if w >= nwords[lvl]:
            return -1
        word = bits[offs[lvl] + w] & -(np.int64(1) << (i & 63))  # keep bits >= i within the word
        if word != 0:
            i = (w << 6) + _ctz(word, table)
            while lvl > 0:  # descend: lowest set bit at each level below
                lvl -= 1
                i = (i << 6) + _ctz(bits[offs[lvl] + i], table)
            return i
        lvl += 1
        i = w + 1
    return -1


@njit(cache=True, inline="always")
def _bits_set(bits, offs, x):
    for lvl in range(offs.shape[0]):
        pos = offs[lvl] + (x >> 6)
        was_empty = bits[pos] == 0
        bits[pos] |= np.int64(1) << (x & 63)
        if not was_empty:
            return
        x >>= 6


@njit(cache=True, inline="always")
def _bits_clear(bits, offs, x):
    for lvl in range(offs.shape[0]):
        pos = offs[lvl] + (x >> 6)
        bits[pos] &= ~(np.int64(1) << (x & 63))
        if bits[pos] != 0:
            return
        x >>= 6


# ----------------------------------------------------------------------------------------------------------
# BFD, tokens only (the fast path)
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _bfd_fast(lens: np.ndarray, capacity: int, complete_min: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing on tokens alone. Returns (pack per example in opening order, number of packs).

    Open packs with remaining capacity r > 0 live in a LIFO list ``head[r]``/``nxt``; a bitset marks the
    non-empty lists, so best fit is the successor query "smallest r >= s". Examples of one length are
    interchangeable, so the loop runs over length counts and never touches example indices (random access
    into 1M-entry arrays cost more than the packing itself); a second, sequential pass hands the k-th pack
    chosen for length s to the k-th example of length s.

    ``complete_min > 0`` turns on exact completion (used by ``refine``): a pack that has to be opened is
    filled at once with the longest remaining examples, never leaving a gap below ``complete_min`` (few
    examples are that short, so such a gap usually stays empty) but closing it with an exact pair instead.
    Plain BFD stacks identical lengths (6 x 84 = 504 of 512) and strands such gaps by the hundred thousand
    on the Wikipedia histogram.
    """
    n = lens.shape[0]
    table = _DEBRUIJN_TABLE
    counts = np.zeros(capacity + 1, dtype=np.int64)
    for i in range(n):
        counts[lens[i]] += 1
    start = np.empty(capacity + 1, dtype=np.int64)  # slot of length s's next choice in `chosen`
    pos = 0
    for s in range(capacity, 0, -1):
        start[s] = pos
        pos += counts[s]
    slot = start.copy()
    offs, nwords = _bitset_levels(capacity + 1)
    bits = np.zeros(offs[-1] + nwords[-1], dtype=np.int64)  # gaps r with an open pack
    head = np.full(capacity + 1, -1, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)  # at most one pack per example
    chosen = np.empty(n, dtype=np.int64)  # the pack of each slot, slots grouped by decreasing length
    left_count = counts.copy()  # examples of each length not placed yet
    avail = np.zeros(bits.shape[0], dtype=np.int64)  # lengths s still available, stored at key capacity - s
    if complete_min > 0:
        for s in range(1, capacity + 1):
            if left_count[s] > 0:
                _bits_set(avail, offs, capacity - s)
    num_packs = 0
    for s in range(capacity, 0, -1):
        while left_count[s] > 0:
            r = _bits_succ(bits, offs, nwords, s, table)
            if r < 0:
                b = num_packs
                num_packs += 1
                left = capacity - s
            else:
                b = head[r]
                head[r] = nxt[b]
                if head[r] < 0:
                    _bits_clear(bits, offs, r)
                left = r - s
            _take(s, b, left_count, chosen, slot, avail, offs, capacity, complete_min)
            if r < 0 and complete_min > 0:
                left = _complete(
                    b, left, left_count, chosen, slot, avail, offs, nwords, capacity, complete_min
                )
            if left > 0:  # a full pack leaves the index for good
                if head[left] < 0:
                    _bits_set(bits, offs, left)
                nxt[b] = head[left]
                head[left] = b
    assign = np.empty(n, dtype=np.int64)
    for i in range(n):  # ties: examples of one length take that length's packs in index order
        s = lens[i]
        assign[i] = chosen[start[s]]
        start[s] += 1
    return assign, num_packs


@njit(cache=True, inline="always")
def _take(s, b, left_count, chosen, slot, avail, offs, capacity, complete_min):
    """Record one example of length s in pack b."""
    chosen[slot[s]] = b
    slot[s] += 1
    left_count[s] -= 1
    if left_count[s] == 0 and complete_min > 0:
        _bits_clear(avail, offs, capacity - s)


@njit(cache=True)
def _complete(b, left, left_count, chosen, slot, avail, offs, nwords, capacity, complete_min):
    """Fill a fresh pack's gap ``left`` with the longest available examples; returns the gap left over."""
    table = _DEBRUIJN_TABLE
    while left > 0:
        key = _bits_succ(avail, offs, nwords, capacity - left, table)
        if key < 0:
            return left
        x = capacity - key  # the longest available example that fits
        if x == left or left - x >= complete_min:
            _take(x, b, left_count, chosen, slot, avail, offs, capacity, complete_min)
            left -= x
            continue
        # x would strand a gap below complete_min: close the pack with a pair u + v == left instead
        u = min(x, left - complete_min)
        for _ in range(64):  # a bounded search; failing it leaves the gap to best fit
            v = left - u
            if u < v:
                break
            if left_count[u] > 0 and left_count[v] > (1 if u == v else 0):
                _take(u, b, left_count, chosen, slot, avail, offs, capacity, complete_min)
                _take(v, b, left_count, chosen, slot, avail, offs, capacity, complete_min)
                return 0
            u -= 1
        return left
    return 0


# ----------------------------------------------------------------------------------------------------------
# Keyed pack index with secondary budgets (constrained BFD, balance, refine)
# ----------------------------------------------------------------------------------------------------------
#
# Packs are bucketed by an integer key in 0..U-1 (remaining tokens for best fit, vision load for balancing)
# in doubly linked lists head/nxt/prv. A segment tree over the keys (leaf of key r = tree[half + r]) stores
# upper bounds of the packs' remaining budgets, so a depth-first search finds the smallest key >= lo that
# holds a pack where every budget fits.
#
# Per-budget maxima alone can lie: a bucket may hold one pack with vision room but no image slot and another
# with the reverse; the search then scans it for nothing, again and again (measured: 60 bucket scans and
# 1000 packs looked at per example on a vision + image budget). So one small count budget (images, or
# examples) is the "class" dimension: tree[node, j, d] = the largest remaining budget d among packs with at
# least j of the class budget left. A node fits need (.., k, ..) iff tree[node, k, :] >= need, which is exact
# for two budgets. Bounds are raised exactly on insert and left stale on removal (recomputing them would
# cost a scan of the bucket); a search that finds nothing in a bucket tightens that leaf to the exact
# values, so a stale bound costs at most one wasted scan.


@njit(cache=True)
def _ix_new(universe, max_packs, dims, cls, classes):
    """(tree, head, nxt, prv, key, rem2, scratch, meta); meta = [half, class column or -1, classes]."""
    half = 1
    while half < universe:
        half *= 2
    tree = np.full((2 * half, classes, dims), -1, dtype=np.int64)
    head = np.full(universe, -1, dtype=np.int64)
    nxt = np.empty(max_packs, dtype=np.int64)
    prv = np.empty(max_packs, dtype=np.int64)
    key = np.empty(max_packs, dtype=np.int64)
    rem2 = np.empty((max_packs, dims), dtype=np.int64)
    scratch = np.empty((classes, dims), dtype=np.int64)
    meta = np.array([half, cls, classes], dtype=np.int64)
    return tree, head, nxt, prv, key, rem2, scratch, meta


@njit(cache=True, inline="always")
def _ix_class(meta, row):
    if meta[1] < 0:
        return 0
    return min(row[meta[1]], meta[2] - 1)


@njit(cache=True)
def _ix_pull(tree, node):
    """Recompute the ancestors of ``node`` as maxima of their children; stop once nothing changes."""
    node >>= 1
    while node >= 1:
        changed = False
        for j in range(tree.shape[1]):
            for d in range(tree.shape[2]):
                v = max(tree[2 * node, j, d], tree[2 * node + 1, j, d])
                if tree[node, j, d] != v:
                    tree[node, j, d] = v
                    changed = True
        if not changed:
            return
        node >>= 1


@njit(cache=True)
def _ix_insert(ix, b):
    tree, head, nxt, prv, key, rem2, _, meta = ix
    r = key[b]
    prv[b] = -1
    nxt[b] = head[r]
    if head[r] >= 0:
        prv[head[r]] = b
    head[r] = b
    top = _ix_class(meta, rem2[b])
    node = meta[0] + r
    while node >= 1:  # raise the bounds on the path; stop where they already cover b
        raised = False
        for j in range(top + 1):
            for d in range(rem2.shape[1]):
                if tree[node, j, d] < rem2[b, d]:
                    tree[node, j, d] = rem2[b, d]
                    raised = True
        if not raised:
            return
        node >>= 1


@njit(cache=True)
def _ix_remove(ix, b):
    tree, head, nxt, prv, key, _, _, meta = ix
    r = key[b]
    if prv[b] >= 0:
        nxt[prv[b]] = nxt[b]
    else:
        head[r] = nxt[b]
    if nxt[b] >= 0:
        prv[nxt[b]] = prv[b]
    if head[r] < 0:  # an empty bucket is cheap to make exact
        node = meta[0] + r
        tree[node] = -1
        _ix_pull(tree, node)


@njit(cache=True)
def _ix_find(ix, lo, need):
    """The pack with the smallest key >= lo where every budget fits ``need``, or -1."""
    tree, head, nxt, _, _, rem2, exact, meta = ix
    half = meta[0]
    dims = rem2.shape[1]
    k = _ix_class(meta, need)
    node = half + lo
    while True:
        fits = True
        for d in range(dims):
            if tree[node, k, d] < need[d]:
                fits = False
                break
        if fits:
            if node < half:
                node = 2 * node  # descend, left (smaller keys) first
                continue
            b = head[node - half]
            exact[:] = -1
            while b >= 0:
                ok = True
                for d in range(dims):
                    if rem2[b, d] < need[d]:
                        ok = False
                        break
                if ok:
                    return b
                for j in range(_ix_class(meta, rem2[b]) + 1):
                    for d in range(dims):
                        exact[j, d] = max(exact[j, d], rem2[b, d])
                b = nxt[b]
            tree[node] = exact  # nothing fits here: the bucket's bounds become exact
            _ix_pull(tree, node)
        while node & 1:  # next subtree to the right: climb while we are a right child
            node >>= 1
        if node == 0:
            return -1
        node += 1


def _class_column(budgets: np.ndarray, cols: int) -> tuple[int, int]:
    """(column, classes) of the class dimension: the last budget column that is a small count (images come
    last, examples first), or (-1, 1) when there is nothing to split on."""
    if cols < 2:
        return -1, 1  # one budget: per-budget maxima are already exact
    for c in range(cols - 1, -1, -1):
        if budgets[c] <= 64:  # classes x budgets values per tree node stay cheap to update
            return c, int(budgets[c]) + 1
    return -1, 1


@njit(cache=True)
def _bfd_general(order, lens, needs, capacity, budgets, cls, classes, init_rem, init_rem2):
    """Best fit on tokens, feasibility on every budget, examples in ``order``.

    ``init_rem``/``init_rem2`` are packs that already exist (used by the balanced planner); new packs are
    numbered after them. Returns (pack per example, -1 for examples not in ``order``; number of packs).
    """
    n = lens.shape[0]
    m = order.shape[0]
    dims = needs.shape[1]
    # Work on copies in processing order: the gather is one pass of independent loads, whereas looking
    # lens[order[k]] up inside the dependent packing loop measured 2.5x slower on 1M examples.
    sizes = np.empty(m, dtype=np.int64)
    wants = np.empty((m, dims), dtype=np.int64)
    for k in range(m):
        sizes[k] = lens[order[k]]
        wants[k] = needs[order[k]]
    npre = init_rem.shape[0]
    ix = _ix_new(capacity + 1, npre + m, dims, cls, classes)
    rem, rem2 = ix[4], ix[5]  # the key is the remaining token count
    chosen = np.empty(m, dtype=np.int64)
    for b in range(npre):
        rem[b] = init_rem[b]
        rem2[b] = init_rem2[b]
        if rem[b] > 0 and rem2[b, 0] > 0:
            _ix_insert(ix, b)
    num_packs = npre
    for k in range(m):
        s = sizes[k]
        need = wants[k]
        b = _ix_find(ix, s, need)
        if b < 0:
            b = num_packs
            num_packs += 1
            rem[b] = capacity
            rem2[b] = budgets
        else:
            _ix_remove(ix, b)
        rem[b] -= s
        for d in range(dims):
            rem2[b, d] -= need[d]
        chosen[k] = b
        if rem[b] > 0 and rem2[b, 0] > 0:  # a pack out of tokens or example slots is closed for good
            _ix_insert(ix, b)
    assign = np.full(n, -1, dtype=np.int64)
    for k in range(m):
        assign[order[k]] = chosen[k]
    return assign, num_packs


# ----------------------------------------------------------------------------------------------------------
# FFD and next-fit
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _ffd(order, lens, needs, capacity, budgets):
    """First-fit decreasing: a max segment tree over packs 0..n-1, all initially empty; the leftmost pack
    where tokens and every budget fit is the first fit, so a fresh pack is simply the next unused leaf."""
    n = lens.shape[0]
    dims = needs.shape[1] + 1  # column 0 = tokens
    half = 1
    while half < n:
        half *= 2
    tree = np.full((2 * half, dims), -1, dtype=np.int64)
    need = np.empty(dims, dtype=np.int64)
    for b in range(n):
        tree[half + b, 0] = capacity
        tree[half + b, 1:] = budgets
    for node in range(half - 1, 0, -1):
        for d in range(dims):
            tree[node, d] = max(tree[2 * node, d], tree[2 * node + 1, d])
    assign = np.empty(n, dtype=np.int64)
    num_packs = 0
    for k in range(n):
        i = order[k]
        need[0] = lens[i]
        need[1:] = needs[i]
        node = 1
        while True:  # depth-first, left first; maxima of different budgets may come from different packs
            fits = True
            for d in range(dims):
                if tree[node, d] < need[d]:
                    fits = False
                    break
            if fits:
                if node >= half:
                    break
                node = 2 * node
                continue
            while node & 1:
                node >>= 1
            node += 1  # the root always fits (an unused pack), so this never climbs past it
        b = node - half
        for d in range(dims):
            tree[node, d] -= need[d]
        node >>= 1
        while node >= 1:
            for d in range(dims):
                tree[node, d] = max(tree[2 * node, d], tree[2 * node + 1, d])
            node >>= 1
        assign[i] = b
        num_packs = max(num_packs, b + 1)
    return assign, num_packs


@njit(cache=True)
def _next_fit(lens, needs, capacity, budgets):
    n = lens.shape[0]
    dims = needs.shape[1]
    assign = np.empty(n, dtype=np.int64)
    used = np.zeros(dims, dtype=np.int64)
    tokens = 0
    b = -1
    for i in range(n):
        fits = b >= 0 and tokens + lens[i] <= capacity
        for d in range(dims):
            fits = fits and used[d] + needs[i, d] <= budgets[d]
        if not fits:
            b += 1
            tokens = 0
            used[:] = 0
        tokens += lens[i]
        for d in range(dims):
            used[d] += needs[i, d]
        assign[i] = b
    return assign, b + 1


def _binpacking_library(lens: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    try:
        import binpacking
    except ImportError as e:
        raise ConfigError(
            "algorithm 'binpacking' needs the binpacking package: pip install binpacking"
        ) from e
    warnings.warn(
        "algorithm 'binpacking' (binpacking.to_constant_volume) is quadratic in the number of packs and slow "
        "beyond ~50k examples; use algorithm 'bfd' for real builds",
        stacklevel=3,
    )
    bins = binpacking.to_constant_volume(dict(enumerate(lens.tolist())), capacity)
    assign = np.empty(lens.shape[0], dtype=np.int64)
    for b, members in enumerate(bins):
        assign[list(members.keys())] = b
    return assign, len(bins)


# ----------------------------------------------------------------------------------------------------------
# Balanced vision load
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _least_loaded(order, lens, vis, needs, capacity, budgets, cls, classes, num_packs):
    """LPT on vision tokens: each example of ``order`` (decreasing vision) goes to the feasible pack with the
    least vision load so far, out of ``num_packs`` empty packs (more only when none fits). The same keyed
    index as best fit, keyed by vision load (<= capacity) with tokens as one more budget column.
    Returns (assign, remaining tokens, remaining budgets, packs)."""
    n = lens.shape[0]
    m = order.shape[0]
    dims = needs.shape[1]
    maxp = num_packs + m
    ix = _ix_new(capacity + 1, maxp, dims + 1, cls, classes)
    load, rem2 = ix[4], ix[5]
    need = np.empty(dims + 1, dtype=np.int64)
    for b in range(num_packs):
        load[b] = 0
        rem2[b, :dims] = budgets
        rem2[b, dims] = capacity
        _ix_insert(ix, b)
    assign = np.full(n, -1, dtype=np.int64)
    for k in range(m):
        i = order[k]
        need[:dims] = needs[i]
        need[dims] = lens[i]
        b = _ix_find(ix, 0, need)
        if b < 0:
            b = num_packs
            num_packs += 1
            load[b] = 0
            rem2[b, :dims] = budgets
            rem2[b, dims] = capacity
        else:
            _ix_remove(ix, b)
        load[b] += vis[i]
        for d in range(dims + 1):
            rem2[b, d] -= need[d]
        assign[i] = b
        if rem2[b, dims] > 0 and rem2[b, 0] > 0:
            _ix_insert(ix, b)
    return assign, rem2[:num_packs, dims].copy(), rem2[:num_packs, :dims].copy(), num_packs


# Balancing may cost at most this fraction of extra packs over the plain plan ("same-ish pack count").
BALANCE_TOLERANCE = 0.001
# Vision caps tried, as multiples of the mean vision load per pack, smallest (most even) first.
_CAP_FACTORS = (1.01, 1.02, 1.03, 1.05, 1.08, 1.12, 1.2, 1.35, 1.6)


def _balanced(
    lens: np.ndarray,
    vis: np.ndarray,
    needs: np.ndarray,
    capacity: int,
    budgets: np.ndarray,
    base: np.ndarray,
    base_packs: int,
    vision_col: int,
) -> tuple[np.ndarray, int]:
    """The most even vision load among a few balanced plans that cost at most ``BALANCE_TOLERANCE`` extra
    packs over ``base`` (else ``base`` itself):

    - BFD under a self-imposed vision cap a little above the mean vision per pack (smallest cap that keeps
      the pack count); best when the vision budget is loose or unset.
    - LPT: vision examples by decreasing vision to the least-loaded pack, then text by BFD (the
      balanced-knapsack idea of Eagle 2 / nanoVLM); best when a vision budget binds.
    """
    allowed = base_packs + int(base_packs * BALANCE_TOLERANCE)
    best, best_packs = base, base_packs
    best_std = float(pack_totals(vis, base).std())

    def consider(assign: np.ndarray, packs: int) -> None:
        nonlocal best, best_packs, best_std
        std = float(pack_totals(vis, assign).std())
        if packs <= allowed and std < best_std:
            best, best_packs, best_std = assign, packs, std

    order = _order_decreasing(lens, capacity)
    mean = float(vis.sum()) / base_packs
    limit = budgets[vision_col] if vision_col >= 0 else _UNBOUNDED
    for factor in _CAP_FACTORS:
        cap = max(int(np.ceil(mean * factor)), int(vis.max()))
        if cap >= limit:
            break
        capped_needs, capped = _vision_capped(needs, budgets, vis, vision_col, cap)
        cls, classes = _class_column(capped, capped_needs.shape[1])
        empty = np.zeros((0, capped_needs.shape[1]), dtype=np.int64)
        assign, packs = _bfd_general(
            order, lens, capped_needs, capacity, capped, cls, classes, _empty_rem(), empty
        )
        if packs <= allowed:
            consider(assign, packs)
            break

    with_vision = np.flatnonzero(vis > 0)
    # Decreasing vision tokens, ties by decreasing length, then index: LPT wants the big loads first.
    by_vision = with_vision[np.lexsort((with_vision, -lens[with_vision], -vis[with_vision]))]
    cls, classes = _class_column(np.append(budgets, capacity), needs.shape[1] + 1)
    assign, rem, rem2, packs = _least_loaded(
        by_vision, lens, vis, needs, capacity, budgets, cls, classes, base_packs
    )
    text = order[vis[order] == 0]
    cls, classes = _class_column(budgets, needs.shape[1])
    rest, packs = _bfd_general(text, lens, needs, capacity, budgets, cls, classes, rem, rem2)
    assign[text] = rest[text]
    used = np.zeros(packs, dtype=bool)  # packs that got nothing (more packs than examples) are dropped
    used[assign] = True
    if not used.all():
        assign = (np.cumsum(used) - 1)[assign]
        packs = int(used.sum())
    if packs > allowed:
        # LPT ignores token fit and fragments (measured +1.7% packs on the synthetic VLM set); empty the
        # least-filled packs into the others' free space, capped at the largest balanced vision load.
        capped_needs, capped = _vision_capped(
            needs, budgets, vis, vision_col, int(pack_totals(vis, assign).max())
        )
        assign, packs = _refine_packs(assign, packs, lens, capped_needs, capacity, capped)
    consider(assign, packs)
    return best, best_packs


def _vision_capped(
    needs: np.ndarray, budgets: np.ndarray, vis: np.ndarray, vision_col: int, cap: int
) -> tuple[np.ndarray, np.ndarray]:
    """Budget columns with the vision budget lowered to ``cap`` (added as a column if there was none)."""
    if vision_col < 0:
        return np.ascontiguousarray(np.concatenate([needs, vis[:, None]], axis=1)), np.append(budgets, cap)
    capped = budgets.copy()
    capped[vision_col] = min(capped[vision_col], cap)
    return needs, capped


# ----------------------------------------------------------------------------------------------------------
# Refinement: empty the least-filled packs into the others' free space
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _refine(
    assign,
    num_packs,
    lens,
    needs,
    capacity,
    budgets,
    cls,
    classes,
    candidates,
    ptr,
    members,
    target,
    patience,
):
    """Try candidates (least-filled packs first): move each member, largest first, to the best-fitting other
    pack; keep the moves only if the whole pack empties. Stops after ``patience`` failures in a row or once
    ``target`` packs remain. Returns (assign, alive mask)."""
    dims = needs.shape[1]
    ix = _ix_new(capacity + 1, num_packs, dims, cls, classes)
    rem, rem2 = ix[4], ix[5]
    rem[:num_packs] = capacity
    for b in range(num_packs):
        rem2[b] = budgets
    for i in range(lens.shape[0]):
        rem[assign[i]] -= lens[i]
        for d in range(dims):
            rem2[assign[i], d] -= needs[i, d]
    inside = np.zeros(num_packs, dtype=np.bool_)
    alive = np.ones(num_packs, dtype=np.bool_)
    touched = np.zeros(num_packs, dtype=np.bool_)  # received examples: its member list is stale, skip it
    for b in range(num_packs):
        if rem[b] > 0 and rem2[b, 0] > 0:
            _ix_insert(ix, b)
            inside[b] = True
    moved_item = np.empty(members.shape[0], dtype=np.int64)
    moved_to = np.empty(members.shape[0], dtype=np.int64)
    packs = num_packs
    failures = 0
    for c in range(candidates.shape[0]):
        if packs <= target or failures >= patience:
            break
        p = candidates[c]
        if touched[p]:
            continue
        if inside[p]:
            _ix_remove(ix, p)
            inside[p] = False
        nmoved = 0
        ok = True
        for k in range(ptr[p], ptr[p + 1]):
            i = members[k]
            b = _ix_find(ix, lens[i], needs[i])
            if b < 0:
                ok = False
                break
            _ix_remove(ix, b)
            rem[b] -= lens[i]
            for d in range(dims):
                rem2[b, d] -= needs[i, d]
            inside[b] = rem[b] > 0 and rem2[b, 0] > 0
            if inside[b]:
                _ix_insert(ix, b)
            moved_item[nmoved] = i
            moved_to[nmoved] = b
            nmoved += 1
        if ok:
            for m in range(nmoved):
                assign[moved_item[m]] = moved_to[m]
                touched[moved_to[m]] = True
            alive[p] = False
            packs -= 1
            failures = 0
            continue
        for m in range(nmoved - 1, -1, -1):  # undo, newest first
            i = moved_item[m]
            b = moved_to[m]
            if inside[b]:
                _ix_remove(ix, b)
            rem[b] += lens[i]
            for d in range(dims):
                rem2[b, d] += needs[i, d]
            inside[b] = True
            _ix_insert(ix, b)
        if rem[p] > 0 and rem2[p, 0] > 0:
            _ix_insert(ix, p)
            inside[p] = True
        failures += 1
    return assign, alive


def _refine_packs(
    assign: np.ndarray,
    num_packs: int,
    lens: np.ndarray,
    needs: np.ndarray,
    capacity: int,
    budgets: np.ndarray,
    *,
    candidates: np.ndarray | None = None,
    patience: int = 256,
) -> tuple[np.ndarray, int]:
    """Run ``_refine`` on ``candidates`` (default: every pack), least-filled first, members largest first;
    renumber the surviving packs in their old order."""
    target = lower_bound(lens, capacity)
    if num_packs <= target:
        return assign, num_packs
    if candidates is None:
        candidates = np.arange(num_packs)
    loads = np.bincount(assign, weights=lens, minlength=num_packs)[candidates]
    candidates = candidates[np.lexsort((candidates, loads))].astype(np.int64)
    members = np.lexsort((np.arange(lens.shape[0]), -lens, assign)).astype(np.int64)
    ptr = np.zeros(num_packs + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(assign, minlength=num_packs))
    cls, classes = _class_column(budgets, needs.shape[1])
    assign, alive = _refine(
        assign.copy(), num_packs, lens, needs, capacity, budgets, cls, classes,
        candidates, ptr, members, target, patience,
    )  # fmt: skip
    renumber = np.cumsum(alive) - 1
    return renumber[assign], int(alive.sum())
