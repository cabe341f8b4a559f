"""Best fit under per-pack budgets at bulk memory: ``plan()``'s budgeted plan in ~4 bytes per example.

``plan(lengths, capacity, costs=..., limits=..., max_examples=..., refine=...)`` (algorithm ``bfd``) runs
``kernels.bfd_general`` and, with ``refine``, ``balance.refine_packs``; between them and ``plan()``'s own
copies it holds ~40-80 bytes per example (int64 lengths, the (n, 1 + b) ``needs`` matrix, the decreasing
order, the sizes/wants copies, the assignment, the shuffled ids), and a build adds ``argsort(pack_ids)``.
``plan_budgeted`` makes the same plan, pack ids and the writers' order included (tests/packing/
test_bulk_budgets.py), reading the compact columns as given, one value per cache row (uint16 lengths and
counts), and the planned examples as each row's copies (``counts``, ``mixing.Sampled``'s byte per row: a row
left out or up-sampled makes no (n,) row index or planned lengths; the kernels walk the rows with their
copies, and each block of the decreasing order carries its rows), holding per planned example only:

- the pack of each example (int32, 4 bytes), which becomes ``order`` in place (below);
- the decreasing order in blocks of ``n // 64`` examples (one scan of the lengths per block, a counting sort
  of the lengths in it) instead of the whole (n,) int64 order: ~0.2 bytes;
- one bit per example while the packs are grouped.

Per pack: the keyed index of ``kernels`` (``ix_*``: remaining tokens, the budgets left and their subtree maxima,
three treap links) in int32, ~(4 + 2 x budgets) x 4 bytes.

Grouping in place. The kernel writes each example's pack (opening order) into ``slot[i]``. Its packs are then
grouped in write order in the same array: each pack's first slot is known from the pack sizes, and the examples
are moved along permutation cycles (an example is read before its slot is overwritten; a bitmap marks the slots
read), then each pack's slots are sorted by example index. ``refine`` first groups by opening pack, sorts each
pack's members by decreasing length (``refine_packs``' member order), runs refine's moves
(``kernels.refine_next``/``refine_try``, as ``balance._refine``) over those lists (recording where each member of
an emptied pack went), and then regroups the same array in write order.

First fit and next fit (``plan_first_fit``, ``plan_next_fit``) write the same ``slot`` and pack state and end in
the same refine and grouping (``_finish``): ``plan(algorithm="ffd" | "next-fit", refine=...)``'s plans.

Quality and speed against ``plan()``: docs/benchmarks.md ("Budgets in bulk"); memory: docs/scale.md ("Budgets
in bulk", "ffd and next-fit with refine in bulk").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from packer.errors import ConfigError
from packer.packing import kernels
from packer.packing.bulk import PackOrder, ShuffledPrefix, _raise_misfit, write_order
from packer.packing.kernels import class_column, ffd_take, ix_new, ix_open_all, refine_next, refine_try
from packer.packing.mixing import MARK, Sampled

# The decreasing order is made this many examples at a time at least (n // BLOCKS from 16M): one scan of the
# lengths each. Its buffers take 10 + 2 x budgets bytes per example of a block: n // 16 with at least 1M held
# ~1-3 bytes per example at 5M-20M (docs/scale.md, "Budgets in bulk").
BLOCK_MIN = 1 << 18
BLOCKS = 64
# refine collects the members of at most this many candidate packs at a time (int64 each, ~5 MB at 10 examples
# per pack); each window is one scan of the slots.
WINDOW_MAX = 1 << 16


def _copies(counts: np.ndarray | None) -> np.ndarray:
    """The kernels' ``copies``: ``counts`` as given, or an empty array for "every row once"."""
    return np.zeros(0, dtype=np.uint8) if counts is None else np.ascontiguousarray(counts)


def _planned(values: np.ndarray, copies: np.ndarray) -> np.ndarray:
    """(n,) ``values`` (one per row) of each planned example (``copies`` empty: every row once). Errors only."""
    return values if copies.shape[0] == 0 else np.repeat(values, copies)


def _checked(
    lens: np.ndarray, capacity: int, copies: np.ndarray, costs: Sequence[np.ndarray | None], limits: Sequence[int],
    names: Sequence[str],
) -> tuple[int, np.ndarray, list[np.ndarray], list[int], BudgetColumns]:
    """``plan``'s checks of the planned examples (a length outside [1, capacity], an example over a limit, or
    with more of a budget than tokens, is a ConfigError naming it, as ``plan`` names it), then (planned
    examples, the histogram of their lengths, the columns that bind, their limits, those columns as the
    kernels read them: ``_columns``)."""
    from packer.packing.budgets import counts_tokens, noun

    if copies.shape[0] and copies.shape[0] != lens.shape[0]:
        raise ValueError(f"counts has {copies.shape[0]} rows, lengths {lens.shape[0]}")
    hist = np.zeros(capacity + 1, dtype=np.int64)
    n, bad = _count_rows(lens, copies, capacity, hist)  # not np.bincount: it casts the lengths to int64
    if bad >= 0:
        _raise_misfit(_planned(lens, copies), capacity)
    names = list(names) if names else [f"costs[:, {j}]" for j in range(len(limits))]
    kept, kept_limits = [], []
    for col, limit, name in zip(costs, limits, names, strict=True):
        if col is None:
            continue  # costs nothing: never binds, and bfd_general's choices do not depend on it
        col = np.ascontiguousarray(col)
        bad = _first_over(lens, copies, col, int(limit), counts_tokens(name))
        if bad >= 0:
            planned = _planned(col, copies)
            if int(planned.max()) > limit:
                i = int(np.argmax(planned))
                raise ConfigError(f"example {i} has {int(planned[i])} {noun(name)} > {name} {limit}; raise "
                                  f"'{name}' or drop/truncate the example")
            raise ConfigError(f"example {bad} has {int(planned[bad])} {noun(name)} but only "
                              f"{int(_planned(lens, copies)[bad])} tokens in all")
        kept.append(col)
        kept_limits.append(int(limit))
    return n, hist, kept, kept_limits, _columns(kept)


BudgetColumns = tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], np.ndarray, int]


def _columns(kept: Sequence[np.ndarray]) -> BudgetColumns:
    """The kernels' budget columns as ``_costs`` reads them: (the wide ones in one dtype, the one-byte ones,
    the budget of each, wide ones first, the number of wide ones). A count column whose values fit a byte
    (``columns.read_chunk``'s images per example) stays uint8 beside uint16 token columns: widened to their
    dtype, it cost a copy of 2 bytes per row under the planners (issue 32). Each tuple is read in a loop of
    its own: one index into a tuple of one dtype per cost, as the kernels read one tuple before."""
    others = [c.dtype for c in kept if c.dtype != np.uint8]
    wide = np.result_type(*others) if others else np.dtype(np.uint8)
    narrow = [j for j, c in enumerate(kept) if c.dtype == np.uint8 and wide != np.uint8]
    wides = [j for j in range(len(kept)) if j not in narrow]
    return (tuple(kept[j].astype(wide, copy=False) for j in wides) or (np.zeros(1, dtype=wide),),
            tuple(kept[j] for j in narrow) or (np.zeros(1, dtype=np.uint8),),
            np.array(wides + narrow, dtype=np.int64), len(wides))


def _column(cols: BudgetColumns, j: int) -> np.ndarray:
    """Budget ``j``'s column of ``_columns``' triple."""
    q = int(np.flatnonzero(cols[2] == j)[0])
    return cols[0][q] if q < cols[3] else cols[1][q - cols[3]]


def plan_budgeted(
    lengths: np.ndarray,
    capacity: int,
    *,
    costs: Sequence[np.ndarray | None] = (),
    limits: Sequence[int] = (),
    names: Sequence[str] = (),
    counts: np.ndarray | None = None,
    max_examples: int | None = None,
    refine: bool = False,
    seed: int = 0,
) -> PackOrder:
    """``plan(lengths, capacity, costs=..., limits=..., max_examples=..., refine=..., seed=...)``'s plan (``bfd``,
    no ``balance``) as a ``PackOrder``, over the planned examples ``counts`` makes of the rows.

    Args:
        lengths: (rows,) tokens per row, each planned one in [1, capacity]; any integer dtype, read as given.
        costs: one (rows,) column per bounded budget (uint16: 2 bytes per row), None where every row costs 0.
        limits: (k,) each column's limit (an int: unbounded columns change no plan and are left out).
        names: (k,) the knob of each limit (``max_vision_tokens``), named by errors as ``plan`` names them.
        counts: (rows,) copies of each row in the plan (``mixing.Sampled.counts``; 0: left out): planned
            example i is the i-th of ``np.repeat(np.arange(rows), counts)``, never made (the kernels walk the
            counts). None: every row once.
        max_examples: at most this many examples per pack.
        refine: then empty the least-filled packs into the others' free space (``balance.refine_packs``).
        seed: the pack shuffle's seed (``plan``'s write order).
    """
    got = _prepared(lengths, capacity, counts, costs, limits, names, max_examples, "plan_budgeted")
    if isinstance(got, PackOrder):
        return got
    lens, copies, n, hist, ncols, cols, budgets, cls, classes, state = got
    slot = np.empty(n, dtype=np.int32)
    block = max(BLOCK_MIN, n // BLOCKS)
    packed = list(_bfd_budgeted(lens, copies, cols, ncols, hist, capacity, budgets, cls, classes, block, slot, state))
    return _finish(slot, packed, lens, copies, cols, ncols, hist, capacity, budgets, refine, seed)


def _prepared(lengths: np.ndarray, capacity: int, counts: np.ndarray | None, costs: Sequence[np.ndarray | None],
              limits: Sequence[int], names: Sequence[str], max_examples: int | None, who: str) -> tuple | PackOrder:
    """The checked inputs of a planner that ends in ``_finish`` (an empty ``PackOrder`` where nothing is
    planned): (lengths, copies, planned examples, their length histogram, bound columns, those columns,
    budgets with the examples first, the keyed index's class column and classes, its state dtype)."""
    lens = np.ascontiguousarray(lengths)
    copies = _copies(counts)
    if lens.shape[0] >= 2**32:  # refine's member lists pack (planned example, row) into one int64
        raise ConfigError(f"{who} reads at most 2**32 - 1 rows, got {lens.shape[0]}")
    n, hist, kept, kept_limits, cols = _checked(lens, capacity, copies, costs, limits, names)
    if n == 0:
        return PackOrder(order=np.zeros(0, dtype=np.int32), bounds=np.zeros(1, dtype=np.int32))
    if n > 2**31 - 1:
        raise ConfigError(f"{who} plans at most 2**31 - 1 examples, got {n}")
    # Examples per pack never exceed the capacity (each has a token), so capacity + 1 stands in for "no limit"
    # as plan()'s 1 << 60 does: it never binds. Pack state (tokens and budgets left) in uint16 where every
    # value fits, else int32. plan()'s class column is chosen on its own stand-in (never a class): the same.
    unbounded = capacity + 1
    budgets = np.array([unbounded if max_examples is None else max_examples, *kept_limits], dtype=np.int64)
    cls, classes = class_column(np.where(budgets == unbounded, np.int64(1) << 60, budgets) if max_examples is None
                                else budgets, budgets.shape[0])
    # the state holds the tokens left too: the capacity bounds them (with max_examples set, budgets may not)
    state = np.zeros(1, dtype=np.uint16 if max(int(budgets.max()), capacity) < 2**16 else np.int32)
    return lens, copies, n, hist, len(kept), cols, budgets, cls, classes, state


def plan_first_fit(
    lengths: np.ndarray,
    capacity: int,
    *,
    costs: Sequence[np.ndarray | None] = (),
    limits: Sequence[int] = (),
    names: Sequence[str] = (),
    counts: np.ndarray | None = None,
    max_examples: int | None = None,
    refine: bool = False,
    seed: int = 0,
) -> PackOrder:
    """``plan(lengths, capacity, algorithm="ffd", costs=..., limits=..., max_examples=..., refine=..., seed=...)``'s
    plan (no ``balance``) as a ``PackOrder``; the arguments as ``plan_budgeted`` takes them.

    ``kernels.ffd``'s max segment tree over packs, leftmost fit, over the decreasing order made a block at a
    time (``_next_block``), holding the pack of each planned example (int32) and the tree in the pack state's
    dtype (uint16 where every budget fits) over the packs opened so far (doubled as they fill: at most
    4 x (2 + budgets) values per pack), where ``kernels.ffd`` holds an int64 tree over n packs and ``plan()``
    its int64 lengths, ``needs`` and decreasing order (~100 bytes per example)."""
    got = _prepared(lengths, capacity, counts, costs, limits, names, max_examples, "plan_first_fit")
    if isinstance(got, PackOrder):
        return got
    lens, copies, n, hist, ncols, cols, budgets, cls, classes, state = got
    # The tree is sized once for the packs no plan goes below (tokens, each budget, examples per pack) with 1/8
    # to spare, so it rarely doubles (a doubling holds the old tree and the new one at once).
    bound = max(-(-int((hist * np.arange(capacity + 1)).sum()) // capacity), -(-n // int(budgets[0])),
                *[-(-_planned_sum(_column(cols, j), copies) // int(budgets[1 + j])) for j in range(ncols)])
    half = 1024
    while half <= bound + bound // 8:
        half *= 2
    slot = np.empty(n, dtype=np.int32)
    block = max(BLOCK_MIN, n // BLOCKS)
    num_packs, tree, half = _ffd_budgeted(lens, copies, cols, ncols, hist, capacity, budgets, block, slot, state,
                                          half)
    leaves = tree[half:half + num_packs].copy()  # each pack's tokens left, then its budgets left
    del tree
    ix = ix_new(capacity + 1, num_packs, budgets.shape[0], cls, classes, state)
    ix[4][:] = leaves[:, 0]
    ix[5][:] = leaves[:, 1:]
    del leaves
    packed = [num_packs, ix]
    del ix
    return _finish(slot, packed, lens, copies, cols, ncols, hist, capacity, budgets, refine, seed)


def _finish(slot: np.ndarray, packed: list, lens: np.ndarray, copies: np.ndarray, cols: BudgetColumns,
            ncols: int, hist: np.ndarray, capacity: int, budgets: np.ndarray, refine: bool, seed: int) -> PackOrder:
    """``slot`` (pack of each planned example, opening order; consumed: it becomes ``order``) and ``packed``,
    ``[packs, their keyed index]`` (tokens and budgets left; emptied here, so the index is freed before the
    grouping), as ``plan()``'s ``PackOrder``: ``refine`` (``balance.refine_packs``' moves), then the surviving
    packs in ``plan()``'s seeded write order, grouped in place. Best fit, first fit and next fit end here."""
    num_packs, ix = packed
    packed.clear()
    n = slot.shape[0]
    target = -(-int((hist * np.arange(capacity + 1)).sum()) // capacity)
    alive = np.ones(num_packs, dtype=np.bool_)
    if refine and num_packs > target:
        candidates = _least_filled(ix[4], num_packs, capacity)
        _refine_slots(slot, lens, copies, cols, ncols, ix, num_packs, budgets, candidates, target, 256, alive,
                      WINDOW_MAX)
        del candidates
    # examples per pack (opening order) from the examples budget left, which refine's moves keep: made once
    # refine's per-pack arrays are gone, not held beside them (4 bytes per pack off the peak, issue 32)
    sizes = _sizes(ix[5], budgets[0], num_packs)
    del ix
    where = np.full(num_packs, -1, dtype=np.int32)
    where[alive] = write_order(int(alive.sum()), seed, np.int32)  # plan()'s shuffle of the packs left
    bounds = np.zeros(int(alive.sum()) + 1, dtype=np.int32)
    _bounds(sizes, where, bounds)
    del sizes
    _group(slot, where, bounds[:-1].copy(), np.zeros(n // 64 + 1, dtype=np.uint64))
    _sort_segments(slot, bounds)
    return PackOrder(order=slot, bounds=bounds)


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _sizes(left, limit, num_packs):
    """(P,) int32 examples per pack: the examples budget ``limit`` less what is left of it."""
    out = np.empty(num_packs, dtype=np.int32)
    for b in range(num_packs):
        out[b] = limit - left[b, 0]
    return out


@njit(cache=True)
def _bounds(sizes, where, bounds):
    """bounds (int32, P + 1): the boundaries of the live packs in write order (pack b is the where[b]-th)."""
    for b in range(sizes.shape[0]):
        if where[b] >= 0:
            bounds[where[b] + 1] = sizes[b]
    for p in range(1, bounds.shape[0]):
        bounds[p] += bounds[p - 1]


@njit(cache=True)
def _least_filled(key, num_packs, capacity):
    """Packs by tokens used, ascending, ties by pack (refine_packs' candidates: ``lexsort((packs, loads))``):
    a counting sort on the tokens left, int32."""
    counts = np.zeros(capacity + 2, dtype=np.int64)
    for b in range(num_packs):
        counts[capacity - key[b] + 1] += 1
    for k in range(1, capacity + 2):
        counts[k] += counts[k - 1]
    out = np.empty(num_packs, dtype=np.int32)
    for b in range(num_packs):
        k = capacity - key[b]
        out[counts[k]] = b
        counts[k] += 1
    return out


@njit(cache=True)
def _count_rows(lens, copies, capacity, hist):
    """hist[s] += the planned examples of length s; returns (planned examples, the first planned example
    whose length is outside [1, capacity], else -1). Rows with no copy are not read as lengths."""
    every = copies.shape[0] == 0
    i = np.int64(0)
    for r in range(lens.shape[0]):
        c = np.int64(1) if every else np.int64(copies[r])
        if c == 0:
            continue
        s = np.int64(lens[r])
        if s < 1 or s > capacity:
            return i, i
        hist[s] += c
        i += c
    return i, np.int64(-1)


@njit(cache=True)
def _first_over(lens, copies, col, limit, tokens):
    """The first planned example whose cost is over ``limit`` (or over its length, for a token budget), or -1."""
    every = copies.shape[0] == 0
    i = np.int64(0)
    for r in range(lens.shape[0]):
        c = np.int64(1) if every else np.int64(copies[r])
        if c == 0:
            continue
        x = np.int64(col[r])
        if x > limit or (tokens and x > lens[r]):
            return i
        i += c
    return -1


@njit(cache=True, inline="always")
def _order_start(counts, capacity, block, n):
    """``_next_block``'s buffers, a block of planned examples and their rows (a row, not a planned example,
    indexes the columns; < 2**32), and its first position (the longest length's first example):
    (buf, rows, s, left, r0, p0, i0)."""
    m = min(block, n)
    s = capacity
    while s >= 1 and counts[s] == 0:
        s -= 1
    zero = np.int64(0)  # int64, not literal 0s: _next_block compiled once, not for Literal[int](0) too
    return np.empty(m, dtype=np.int32), np.empty(m, dtype=np.uint32), s, counts[s], zero, zero, zero


@njit(cache=True)
def _next_block(lens, copies, counts, s, left, r0, p0, i0, buf, rows):
    """The next planned examples of the decreasing order (length desc, index asc) from (length s, index >= i0,
    ``left`` of length s still to come), at most ``buf.shape[0]``, into ``buf`` (planned example) and ``rows``
    (its row). One scan of the rows, each planned ``copies[r]`` times (empty: once), from row r0 (whose first
    planned example is p0) when the block is of length s alone. Returns (taken, s, left, r0, p0, i0) of the
    position after them."""
    m = buf.shape[0]
    every = copies.shape[0] == 0
    if left >= m:  # this length alone fills the block: its next m examples in index order
        k = 0
        r, p = r0, p0
        while True:
            c = np.int64(1) if every else np.int64(copies[r])
            if lens[r] == s and c > 0:
                j = i0 - p if i0 > p else 0
                while j < c and k < m:
                    buf[k] = p + j
                    rows[k] = r  # (written each row once too: this branch is a small share of the scans)
                    k += 1
                    j += 1
                if k == m:
                    if j < c:  # the next one is a later copy of this row
                        r0, p0, i0 = r, p, p + j
                    else:
                        r0, p0, i0 = r + 1, p + c, p + c
                    break
            p += c
            r += 1
        left -= m
        if left > 0:
            return m, s, left, r0, p0, i0
        s -= 1
        while s >= 1 and counts[s] == 0:
            s -= 1
        return m, s, counts[s] if s >= 1 else 0, 0, 0, 0
    total = left
    lo = s
    while lo > 1 and total + counts[lo - 1] <= m:
        lo -= 1
        total += counts[lo]
    offset = np.zeros(s + 1, dtype=np.int64)  # first position of each length lo..s in the block
    pos = left
    for x in range(s - 1, lo - 1, -1):
        offset[x] = pos
        pos += counts[x]
    if every:  # each row once: the row is the planned example (the scan without the copies' bookkeeping)
        for r in range(lens.shape[0]):
            x = np.int64(lens[r])
            if x < lo or x > s or (x == s and r < i0):
                continue
            buf[offset[x]] = r  # ``rows`` is not read: the row is the planned example
            offset[x] += 1
        s = lo - 1
        while s >= 1 and counts[s] == 0:
            s -= 1
        return total, s, counts[s] if s >= 1 else 0, 0, 0, 0
    p = np.int64(0)
    for r in range(lens.shape[0]):
        c = np.int64(copies[r])
        x = np.int64(lens[r])
        if x < lo or x > s:
            p += c
            continue
        j = i0 - p if x == s and i0 > p else 0
        while j < c:
            buf[offset[x]] = p + j
            rows[offset[x]] = r
            offset[x] += 1
            j += 1
        p += c
    s = lo - 1
    while s >= 1 and counts[s] == 0:
        s -= 1
    return total, s, counts[s] if s >= 1 else 0, 0, 0, 0


@njit(cache=True, inline="always")
def _best_fit(ix, size, need, rem, rem2, budgets, dims, num_packs, capacity):
    """Best fit's step on the keyed index: the pack ``need`` (tokens ``size``) fits best, a new one where none
    does, charged with it; (that pack, the packs now)."""
    b = kernels.ix_find(ix, size, need)
    if b < 0:
        b = num_packs
        num_packs += 1
        rem[b] = capacity
        for d in range(dims):
            rem2[b, d] = budgets[d]
    else:
        kernels.ix_remove(ix, b)
    rem[b] -= size
    for d in range(dims):
        rem2[b, d] -= need[d]
    if rem[b] > 0 and rem2[b, 0] > 0:  # a pack out of tokens or example slots is closed for good
        kernels.ix_insert(ix, b)
    return b, num_packs


@njit(cache=True)
def _bfd_budgeted(lens, copies, cols, ncols, counts, capacity, budgets, cls, classes, block, slot, state):
    """``kernels.bfd_general`` over the planned examples in decreasing order (made a block at a time), with no
    packs before: slot[i] = pack of planned example i (opening order). Returns (packs, the keyed index: tokens
    left ix[4], budgets left ix[5])."""
    n = slot.shape[0]
    dims = budgets.shape[0]
    ix = ix_new(capacity + 1, n, dims, cls, classes, state)
    rem, rem2 = ix[4], ix[5]
    need = np.zeros(dims, dtype=np.int64)
    need[0] = 1
    buf, brow, s, left, r0, p0, i0 = _order_start(counts, capacity, block, n)
    m = buf.shape[0]
    # the block's sizes, costs and packs in processing order: gathered (and scattered) in loops of independent
    # loads, not looked up inside the dependent packing loop (kernels.bfd_general measured that 2.5x slower)
    bsize = np.empty(m, dtype=lens.dtype)
    bneed = np.empty((m, max(ncols, 1)), dtype=cols[0][0].dtype)
    bpack = np.empty(m, dtype=np.int32)
    num_packs = 0
    while s >= 1:
        taken, s, left, r0, p0, i0 = _next_block(lens, copies, counts, s, left, r0, p0, i0, buf, brow)
        every = copies.shape[0] == 0
        for k in range(taken):
            r = np.int64(buf[k]) if every else np.int64(brow[k])
            bsize[k] = lens[r]
            _costs(cols, r, bneed[k])
        for k in range(taken):
            size = np.int64(bsize[k])
            for c in range(ncols):
                need[1 + c] = bneed[k, c]
            bpack[k], num_packs = _best_fit(ix, size, need, rem, rem2, budgets, dims, num_packs, capacity)
        for k in range(taken):
            slot[buf[k]] = bpack[k]
    return num_packs, ix


@njit(cache=True)
def _ff_tree(half, budgets, capacity, old, old_half):
    """A max tree over ``half`` packs (row 1 the root, leaves from ``half``; columns: tokens, then ``budgets``):
    the leaves of ``old`` (over ``old_half`` packs) first, every other pack empty."""
    dims = 1 + budgets.shape[0]
    tree = np.empty((2 * half, dims), dtype=old.dtype)
    for b in range(half):
        if b < old_half:
            for d in range(dims):
                tree[half + b, d] = old[old_half + b, d]
        else:
            tree[half + b, 0] = capacity
            for d in range(1, dims):
                tree[half + b, d] = budgets[d - 1]
    for node in range(half - 1, 0, -1):
        for d in range(dims):
            tree[node, d] = max(tree[2 * node, d], tree[2 * node + 1, d])
    return tree


@njit(cache=True, inline="always")
def _costs(cols, r, out):
    """``out[j]`` := budget j's cost of row ``r`` (``_columns``' columns), each tuple in its own loop."""
    wides, narrows, pos, nw = cols
    for q in range(nw):
        out[pos[q]] = wides[q][r]
    for q in range(pos.shape[0] - nw):
        out[pos[nw + q]] = narrows[q][r]


@njit(cache=True)
def _planned_sum(col, copies):
    """The sum of ``col`` over the planned examples (each row ``copies[r]`` times; empty: once)."""
    total = 0
    every = copies.shape[0] == 0
    for r in range(col.shape[0]):
        total += np.int64(col[r]) * (1 if every else np.int64(copies[r]))
    return total


@njit(cache=True)
def _ffd_budgeted(lens, copies, cols, ncols, counts, capacity, budgets, block, slot, state, half):
    """``kernels.ffd`` over the planned examples in decreasing order (made a block at a time): slot[i] = pack
    of planned example i (opening order = leftmost first). The tree holds ``half`` packs, those opened so far
    and at least one empty one (doubled when they run out), so its leftmost fit is ``kernels.ffd``'s over n
    empty packs. Returns (packs, the tree, its leaves' offset)."""
    n = slot.shape[0]
    dims = 1 + budgets.shape[0]  # tokens, examples, the bound columns
    tree = _ff_tree(half, budgets, capacity, np.zeros((0, dims), dtype=state.dtype), 0)
    need = np.zeros(dims, dtype=np.int64)
    need[1] = 1
    buf, brow, s, left, r0, p0, i0 = _order_start(counts, capacity, block, n)
    m = buf.shape[0]
    bsize = np.empty(m, dtype=lens.dtype)
    bneed = np.empty((m, max(ncols, 1)), dtype=cols[0][0].dtype)
    bpack = np.empty(m, dtype=np.int32)
    num_packs = 0
    every = copies.shape[0] == 0
    while s >= 1:
        taken, s, left, r0, p0, i0 = _next_block(lens, copies, counts, s, left, r0, p0, i0, buf, brow)
        for k in range(taken):
            r = np.int64(buf[k]) if every else np.int64(brow[k])
            bsize[k] = lens[r]
            _costs(cols, r, bneed[k])
        for k in range(taken):
            need[0] = bsize[k]
            for c in range(ncols):
                need[2 + c] = bneed[k, c]
            b = ffd_take(tree, need, half)  # kernels.ffd's leftmost fit
            bpack[k] = b
            if b == num_packs:
                num_packs += 1
                if num_packs == half:
                    tree = _ff_tree(2 * half, budgets, capacity, tree, half)
                    half *= 2
        for k in range(taken):
            slot[buf[k]] = bpack[k]
    return num_packs, tree, half


@njit(cache=True)
def _group(slot, where, cursor, seen):
    """In place: ``slot`` (pack of each example) becomes the examples grouped by pack, pack b's from
    cursor[where[b]] on (cursor: each group's first position, advanced). Follows permutation cycles: the pack
    of the example whose slot is about to be written is read first (``seen`` marks the slots read). 16 chains
    run interleaved: one chain's steps wait on each other's memory reads, independent chains' do not (one
    chain alone measured ~2x slower). A chain reaching a slot another chain has read writes it and ends."""
    n = slot.shape[0]
    lanes = 16
    cur = np.zeros(lanes, dtype=np.int64)
    pack = np.zeros(lanes, dtype=np.int64)
    live = np.zeros(lanes, dtype=np.bool_)
    start = 0
    running = 0
    while True:
        for lane in range(lanes):
            if not live[lane]:
                while start < n and seen[start >> 6] & (np.uint64(1) << np.uint64(start & 63)):
                    start += 1
                if start == n:
                    continue
                seen[start >> 6] |= np.uint64(1) << np.uint64(start & 63)
                cur[lane] = start
                pack[lane] = slot[start]
                live[lane] = True
                running += 1
            g = where[pack[lane]]
            d = cursor[g]
            cursor[g] = d + 1
            bit = np.uint64(1) << np.uint64(d & 63)
            if seen[d >> 6] & bit:
                slot[d] = cur[lane]
                live[lane] = False
                running -= 1
                continue
            seen[d >> 6] |= bit
            pack[lane] = slot[d]
            slot[d] = cur[lane]
            cur[lane] = d
        if running == 0 and start == n:
            return


@njit(cache=True)
def _sort_segments(order, bounds):
    """Each pack's examples in increasing index (insertion sort: packs hold few examples)."""
    for p in range(bounds.shape[0] - 1):
        lo, hi = bounds[p], bounds[p + 1]
        if hi - lo > 64:
            sorted_ = np.sort(order[lo:hi])
            for k in range(hi - lo):
                order[lo + k] = sorted_[k]
            continue
        for k in range(lo + 1, hi):
            x = order[k]
            j = k - 1
            while j >= lo and order[j] > x:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = x


@njit(cache=True)
def _window_members(slot, lens, copies, candidates, c0, c1, touched, num_packs):
    """Members of the untouched packs ``candidates[c0:c1]``, pack by pack, each pack's by decreasing length,
    ties by increasing index (``refine_packs``' order). One scan of ``slot`` (with the rows, through
    ``copies``). Returns (members, ptr, window): the window's packs ascending, and pack ``window[w]``'s members
    members[ptr[w]:ptr[w + 1]] (``_window_slot``), each a planned example i and its row r as ``i << 32 | r``.
    A bit per pack marks the window, its packs found by a search in ``window`` (an int32 per pack measured 10
    MiB of the planner's peak at 20M, issue 32)."""
    inside = np.zeros(num_packs // 64 + 1, dtype=np.uint64)
    k = 0
    for c in range(c0, c1):
        if not touched[candidates[c]]:
            k += 1
    window = np.empty(k, dtype=np.int32)
    k = 0
    for c in range(c0, c1):
        p = candidates[c]
        if not touched[p]:
            window[k] = p
            inside[p >> 6] |= np.uint64(1) << np.uint64(p & 63)
            k += 1
    window.sort()
    ptr = np.zeros(k + 1, dtype=np.int64)
    for i in range(slot.shape[0]):
        p = slot[i]
        if inside[p >> 6] & (np.uint64(1) << np.uint64(p & 63)):
            ptr[np.searchsorted(window, p) + 1] += 1
    every = copies.shape[0] == 0
    for w in range(k):
        ptr[w + 1] += ptr[w]
    fill = ptr[:-1].copy()
    members = np.empty(ptr[k], dtype=np.int64)
    i = np.int64(0)
    for r in range(lens.shape[0]):
        for _ in range(1 if every else copies[r]):
            p = slot[i]
            if inside[p >> 6] & (np.uint64(1) << np.uint64(p & 63)):
                w = np.searchsorted(window, p)
                members[fill[w]] = (i << 32) | r
                fill[w] += 1
            i += 1
    low = np.int64(0xFFFFFFFF)
    for w in range(k):  # stable insertion sort on decreasing length: indices are ascending already
        for m in range(ptr[w] + 1, ptr[w + 1]):
            x = members[m]
            sx = lens[x & low]
            j = m - 1
            while j >= ptr[w] and lens[members[j] & low] < sx:
                members[j + 1] = members[j]
                j -= 1
            members[j + 1] = x
    return members, ptr, window


@njit(cache=True)
def _refine_slots(slot, lens, copies, cols, ncols, ix, num_packs, budgets, candidates, target, patience, alive,
                  window_max):
    """``balance._refine``: a fresh keyed index of every open pack (inserted in pack order, as ``_refine``
    inserts them), candidates least filled first, each member (longest first) moved to its best fit, kept
    only if the whole pack empties; stops after ``patience`` failures in a row or at ``target`` packs.
    A kept move is written into ``slot`` (and ``alive``; the examples budget left in ``ix`` counts the moves). ``ix``: best fit's keyed index (its
    tokens and budgets left), reused. The candidates' members are collected
    a window of candidates at a time (one scan of ``slot`` each; 4096 candidates, then twice as many up to
    ``window_max``: a refine that runs through most packs, as after next fit, held int64 per member of half
    the packs in its last window): the
    untouched packs' members are still their own, so no per-pack member list of every pack is held."""
    dims = budgets.shape[0]
    tree, head = ix[0], ix[1]
    tree[:] = -1  # best fit's index, emptied: every open pack goes in again in pack order, as _refine's does
    head[:] = -1
    inside = np.zeros(num_packs, dtype=np.bool_)
    touched = np.zeros(num_packs, dtype=np.bool_)
    ix_open_all(ix, num_packs, inside)
    sizes = np.empty(1024, dtype=np.int64)  # the candidate's members' tokens and budgets
    wants = np.zeros((1024, dims), dtype=np.int64)
    dest = np.empty(1024, dtype=np.int64)
    progress = np.array([num_packs, 0, target, patience], dtype=np.int64)
    c0 = np.int64(0)  # not a literal 0: _window_members and refine_next would compile for Literal[int](0) too
    window = min(4096, window_max)
    while refine_next(candidates, c0, touched, progress) >= 0:
        c1 = min(c0 + window, candidates.shape[0])
        members, ptr, held = _window_members(slot, lens, copies, candidates, c0, c1, touched, num_packs)
        c = refine_next(candidates[:c1], c0, touched, progress)
        while c >= 0:
            p = candidates[c]
            w = np.searchsorted(held, p)
            lo, hi = ptr[w], ptr[w + 1]
            if hi - lo > sizes.shape[0]:
                sizes, dest, wants = np.empty(hi - lo, np.int64), np.empty(hi - lo, np.int64), np.zeros((hi - lo, dims),
                                                                                                         np.int64)
            for m in range(hi - lo):
                r = members[lo + m] & np.int64(0xFFFFFFFF)
                sizes[m] = lens[r]
                wants[m, 0] = 1
                _costs(cols, r, wants[m, 1:])
            if refine_try(ix, inside, touched, alive, progress, p, sizes, wants, hi - lo, dest):
                for m in range(hi - lo):
                    slot[members[lo + m] >> 32] = dest[m]
            c = refine_next(candidates[:c1], c + 1, touched, progress)
        c0 = c1
        window = min(2 * window, window_max)


# ----------------------------------------------------------------------------------------------------------
# Up-sampled copies kept apart: mixing.separate_copies on a PackOrder
# ----------------------------------------------------------------------------------------------------------


def separate_copies_bulk(
    packs: PackOrder,
    sampled: Sampled,
    lengths: np.ndarray,
    *,
    capacity: int,
    seed: int,
    costs: Sequence[np.ndarray | None] = (),
    limits: Sequence[int] = (),
    max_tries: int = 4096,
) -> PackOrder:
    """``mixing.separate_copies`` on a ``PackOrder``: the same swaps, so the same packs, holding per planned
    example the pack of each (in place of ``packs.order``, which is consumed), and the candidates'
    permutation a block at a time (``_swaps``): ~5 bytes, where separate_copies' Python rows and dicts take ~400.

    ``sampled``: each cache row's copies (``mixing.Sampled``; planned example i is the i-th of
    ``np.repeat(rows, counts)``: separate_copies' ``index``, never made); ``lengths``: (rows,) the tokens of
    each cache row and ``costs`` one column per bounded budget (None: every row costs 0), both per row,
    ``limits`` their limits. A planned example's row is located from the counts (``Sampled.locate``'s search)
    where a swap tries it.
    """
    order, bounds = packs.order, packs.bounds
    n = order.shape[0]
    num_packs = bounds.shape[0] - 1
    if n == 0:
        return packs
    seen = np.zeros(n // 64 + 1, dtype=np.uint64)
    _ungroup(order, bounds, seen)  # order[i] := pack of planned example i
    del seen  # not held under the swaps (n / 8 bytes)
    pack_of = order
    counts, marks = sampled.counts, sampled.marks
    dup = _duplicates(counts, pack_of)
    if len(dup):
        kept = [np.ascontiguousarray(c) for c in costs if c is not None]
        caps = np.array([capacity] + [int(v) for c, v in zip(costs, limits, strict=True) if c is not None], np.int64)
        cols = _columns(kept)
        lens = np.ascontiguousarray(lengths)
        # per-pack loads stay within their caps (the plan keeps every budget): uint16 or int32 where they fit
        top = int(caps.max())
        wide_load = np.uint16 if top < 2**16 else np.int32 if top < 2**31 else np.int64
        load = np.zeros((1 + len(kept), num_packs), dtype=wide_load)
        _loads(pack_of, lens, counts, cols, len(kept), load)
        _swaps(dup, pack_of, counts, marks, lens, cols, len(kept), load, caps, seed, min(max_tries, n))
        del load
    del dup
    seen = np.zeros(n // 64 + 1, dtype=np.uint64)
    _group(pack_of, np.arange(num_packs, dtype=np.int32), bounds[:-1].copy(), seen)  # swaps keep every size
    _sort_segments(pack_of, bounds)
    return PackOrder(order=pack_of, bounds=bounds)


@njit(cache=True)
def _ungroup(order, bounds, seen):
    """In place: order[k] (the example in slot k) becomes order[i] = the pack of example i (``_group``
    undone: the cycles followed the other way; a slot's pack by binary search in ``bounds``)."""
    n = order.shape[0]
    for k0 in range(n):
        if seen[k0 >> 6] & (np.uint64(1) << np.uint64(k0 & 63)):
            continue
        seen[k0 >> 6] |= np.uint64(1) << np.uint64(k0 & 63)
        e = np.int64(order[k0])
        pack = np.searchsorted(bounds, k0, side="right") - 1
        while True:
            bit = np.uint64(1) << np.uint64(e & 63)
            if seen[e >> 6] & bit:
                order[e] = pack
                break
            seen[e >> 6] |= bit
            nxt_e = np.int64(order[e])
            nxt_pack = np.searchsorted(bounds, e, side="right") - 1
            order[e] = pack
            e = nxt_e
            pack = nxt_pack


@njit(cache=True)
def _duplicates(counts, pack_of):
    """separate_copies' ``dup``: the planned examples whose example already has a copy in their pack, in the
    order of (example, pack, position) (an example's copies are consecutive: ``counts[r]`` from its first)."""
    out = np.empty(1024, dtype=pack_of.dtype)  # order's dtype holds every planned example
    k = 0
    g0 = 0
    for r in range(counts.shape[0]):
        g1 = g0 + np.int64(counts[r])
        if g1 - g0 > 1:
            group = np.arange(g0, g1)
            for a in range(1, group.shape[0]):  # by (pack, position): insertion sort, positions ascending
                x = group[a]
                j = a - 1
                while j >= 0 and pack_of[group[j]] > pack_of[x]:
                    group[j + 1] = group[j]
                    j -= 1
                group[j + 1] = x
            for a in range(1, group.shape[0]):
                if pack_of[group[a]] == pack_of[group[a - 1]]:
                    if k == out.shape[0]:
                        grown = np.empty(2 * k, dtype=out.dtype)
                        for q in range(k):
                            grown[q] = out[q]
                        out = grown
                    out[k] = group[a]
                    k += 1
        g0 = g1
    return out[:k].copy()


@njit(cache=True)
def _loads(pack_of, lens, counts, cols, ncols, load):
    """``load`` (1 + ncols, P) := tokens and each budget's total per pack (``lens`` per row, like ``cols``)."""
    row = np.zeros(max(ncols, 1), dtype=np.int64)  # a row's costs (``_costs``)
    i = 0
    for r in range(counts.shape[0]):
        for _ in range(counts[r]):
            p = pack_of[i]
            load[0, p] += lens[r]
            _costs(cols, r, row)
            for c in range(ncols):
                load[1 + c, p] += row[c]
            i += 1


@njit(cache=True, inline="always")
def _row_of(i, counts, marks):
    """The row of planned example i (``mixing.Sampled.locate`` for one)."""
    b = np.searchsorted(marks, i, side="right") - 1
    r = b * MARK
    pos = marks[b]
    while pos + counts[r] <= i:
        pos += counts[r]
        r += 1
    return r


@njit(cache=True, inline="always")
def _holds(pack, e, counts, marks, pack_of):
    """Does ``pack`` hold a copy of example (row) ``e``?"""
    b = e // MARK
    k = marks[b]
    for r in range(b * MARK, e):
        k += counts[r]
    for c in range(counts[e]):
        if pack_of[k + c] == pack:
            return True
    return False


def _swaps(dup: np.ndarray, pack_of: np.ndarray, counts: np.ndarray, marks: np.ndarray, lens: np.ndarray,
           cols: BudgetColumns, ncols: int, load: np.ndarray, caps: np.ndarray, seed: int,
           tries: int) -> None:
    """``_swap`` over the candidates ``np.random.default_rng([seed, 2]).permutation(n)`` read from its start,
    a block at a time (``bulk.ShuffledPrefix``: the swaps read a prefix, 0.32 of it at 1M, where the array
    took int32 per planned example). Past half the permutation (a build whose duplicates find few partners)
    the whole array is made once, so the blocks' replays cost at most 8-13 passes over the draws."""
    n = pack_of.shape[0]
    shuffled = ShuffledPrefix(n, [seed, 2])
    block = max(16, shuffled.block_size)
    whole = None
    t, tried, c0, read = 0, 0, 0, 0
    while t < dup.shape[0]:
        if whole is None and read >= n // 2:
            whole = write_order(n, [seed, 2], np.int32)
        c1 = n if whole is not None else min(n, c0 + block)
        candidates = whole[c0:] if whole is not None else shuffled.block(c0, c1)
        t, tried = _swap(dup, pack_of, counts, marks, lens, cols, ncols, load, caps, candidates, tries, t, tried)
        read += c1 - c0
        c0 = 0 if c1 == n else c1


@njit(cache=True)
def _swap(dup, pack_of, counts, marks, lens, cols, ncols, load, caps, candidates, tries, t, tried):
    """separate_copies' loop: each duplicate p swaps packs with the next candidate q whose pack holds no copy
    of p's example (and p's none of q's) where tokens and every budget still fit. From duplicate ``t``, of
    which ``tried`` candidates were read; returns (t, tried) where ``candidates`` (the next block of the
    permutation) runs out, (len(dup), 0) when done."""
    row_a = np.zeros(max(ncols, 1), dtype=np.int64)  # the two examples' costs (``_costs``)
    row_b = np.zeros(max(ncols, 1), dtype=np.int64)
    dims = 1 + ncols
    delta = np.zeros(dims, dtype=np.int64)
    k = 0
    while t < dup.shape[0]:
        p = dup[t]
        a = pack_of[p]
        ea = _row_of(np.int64(p), counts, marks)
        while tried < tries:
            if k == candidates.shape[0]:
                return t, tried
            q = candidates[k]
            k += 1
            tried += 1
            b = pack_of[q]
            eb = _row_of(np.int64(q), counts, marks)
            if a == b or _holds(a, eb, counts, marks, pack_of) or _holds(b, ea, counts, marks, pack_of):
                continue
            delta[0] = np.int64(lens[eb]) - np.int64(lens[ea])
            _costs(cols, eb, row_b)
            _costs(cols, ea, row_a)
            for c in range(ncols):
                delta[1 + c] = row_b[c] - row_a[c]
            fits = True
            for c in range(dims):
                if load[c, a] + delta[c] > caps[c] or load[c, b] - delta[c] > caps[c]:
                    fits = False
                    break
            if not fits:
                continue
            for c in range(dims):
                load[c, a] += delta[c]
                load[c, b] -= delta[c]
            pack_of[p] = b
            pack_of[q] = a
            break
        t += 1
        tried = 0
    return t, tried


# ----------------------------------------------------------------------------------------------------------
# Next fit at bulk memory: plan(algorithm="next-fit")'s plan as a PackOrder
# ----------------------------------------------------------------------------------------------------------


def plan_next_fit(
    lengths: np.ndarray,
    capacity: int,
    *,
    costs: Sequence[np.ndarray | None] = (),
    limits: Sequence[int] = (),
    names: Sequence[str] = (),
    counts: np.ndarray | None = None,
    max_examples: int | None = None,
    refine: bool = False,
    seed: int = 0,
) -> PackOrder:
    """``plan(lengths, capacity, algorithm="next-fit", costs=..., limits=..., max_examples=..., refine=...,
    seed=...)``'s plan (no ``balance``) as a ``PackOrder``: ``kernels.next_fit``'s packs (runs of consecutive
    examples) and ``plan``'s seeded write order, holding ``order`` (int32) and three int32 per pack, where
    ``plan`` holds int64 lengths, the (n, 1 + b) ``needs`` and the assignment (~40 bytes per example).
    ``lengths``/``costs``/``limits``/``names``/``counts`` (per row) as ``plan_budgeted`` takes them.
    With ``refine``: the pack of each planned example (int32) and the packs' keyed index, then
    ``plan_budgeted``'s refine and grouping (``_finish``: ``balance.refine_packs``' moves)."""
    if refine:
        got = _prepared(lengths, capacity, counts, costs, limits, names, max_examples, "plan_next_fit")
        if isinstance(got, PackOrder):
            return got
        lens, copies, n, hist, ncols, cols, budgets, cls, classes, state = got
        slot = np.empty(n, dtype=np.int32)
        num_packs = _next_fit(lens, copies, cols, ncols, capacity, budgets, slot[:0], slot)
        ix = ix_new(capacity + 1, num_packs, budgets.shape[0], cls, classes, state)
        _pack_state(slot, lens, copies, cols, ncols, capacity, budgets, ix[4], ix[5])
        packed = [num_packs, ix]
        del ix
        return _finish(slot, packed, lens, copies, cols, ncols, hist, capacity, budgets, True, seed)
    lens = np.ascontiguousarray(lengths)
    copies = _copies(counts)
    n, _, kept, kept_limits, cols = _checked(lens, capacity, copies, costs, limits, names)
    if n == 0:
        return PackOrder(order=np.zeros(0, dtype=np.int32), bounds=np.zeros(1, dtype=np.int32))
    budgets = np.array([np.int64(1) << 60 if max_examples is None else max_examples, *kept_limits], dtype=np.int64)
    dtype = np.int32 if n < 2**31 else np.int64
    none = np.zeros(0, dtype=dtype)
    num_packs = _next_fit(lens, copies, cols, len(kept), capacity, budgets, none, none)
    starts = np.empty(num_packs + 1, dtype=dtype)  # the first example of each pack, opening order
    _next_fit(lens, copies, cols, len(kept), capacity, budgets, starts, none)
    starts[num_packs] = n
    where = write_order(num_packs, seed, dtype)  # pack b is written as pack where[b] (plan()'s shuffle)
    bounds = np.zeros(num_packs + 1, dtype=dtype)
    bounds[where + 1] = np.diff(starts)
    np.cumsum(bounds, out=bounds)
    order = np.empty(n, dtype=dtype)
    _runs(starts, where, bounds, order)
    return PackOrder(order=order, bounds=bounds)


@njit(cache=True)
def _next_fit(lens, copies, cols, ncols, capacity, budgets, starts, slot):
    """``kernels.next_fit`` over the compact columns, each row planned ``copies[r]`` times (empty: once): the
    number of packs; the first planned example of each written to ``starts`` where it has room, the pack of
    each to ``slot`` where it has room."""
    row = np.zeros(max(ncols, 1), dtype=np.int64)  # a row's costs (``_costs``)
    used = np.zeros(1 + ncols, dtype=np.int64)
    tokens = np.int64(0)
    b = -1
    every = copies.shape[0] == 0
    i = np.int64(0)
    for r in range(lens.shape[0]):
        for _ in range(1 if every else copies[r]):
            fits = b >= 0 and tokens + lens[r] <= capacity and used[0] + 1 <= budgets[0]
            _costs(cols, r, row)
            if fits:
                for c in range(ncols):
                    if used[1 + c] + row[c] > budgets[1 + c]:
                        fits = False
                        break
            if not fits:
                b += 1
                tokens = 0
                used[:] = 0
                if b < starts.shape[0]:
                    starts[b] = i
            tokens += lens[r]
            used[0] += 1
            for c in range(ncols):
                used[1 + c] += row[c]
            if i < slot.shape[0]:
                slot[i] = b
            i += 1
    return b + 1


@njit(cache=True)
def _pack_state(slot, lens, copies, cols, ncols, capacity, budgets, key, rem2):
    """The keyed index's state of the packs ``slot`` makes: key[b] = tokens left, rem2[b] = budgets left
    (examples first). An example with no pack yet (-1: the text around ``bulk_balance``'s LPT) is skipped."""
    row = np.zeros(max(ncols, 1), dtype=np.int64)  # a row's costs (``_costs``)
    key[:] = capacity
    for b in range(rem2.shape[0]):
        for d in range(budgets.shape[0]):
            rem2[b, d] = budgets[d]
    every = copies.shape[0] == 0
    i = np.int64(0)
    for r in range(lens.shape[0]):
        for _ in range(1 if every else copies[r]):
            b = slot[i]
            if b < 0:
                i += 1
                continue
            key[b] -= lens[r]
            rem2[b, 0] -= 1
            _costs(cols, r, row)
            for c in range(ncols):
                rem2[b, 1 + c] -= row[c]
            i += 1


@njit(cache=True)
def _runs(starts, where, bounds, order):
    """order := each pack's run of examples at its write position."""
    for b in range(where.shape[0]):
        k = bounds[where[b]]
        for i in range(starts[b], starts[b + 1]):
            order[k] = i
            k += 1
