"""``balance_vision`` at bulk memory: ``plan(..., balance=...)``'s plan as a ``PackOrder`` (the driver: 15 bytes
per example with budgets, against ~143 through ``plan()``; docs/scale.md).

``plan()`` balances with ``balance.balanced`` over (n,) int64 arrays (lengths, the ``needs`` matrix, the
decreasing order, each candidate's assignment and its ``bincount``): ~100 bytes per example. ``plan_balanced``
makes the same candidates, in the same sequence, with the same choice, from the compact columns (one value per
cache row, each row planned ``counts[r]`` times, as ``bulk_budgets.plan_budgeted`` reads them), holding one
int32 pack per planned example (the candidate being measured) beside a best fit's keyed index, and under LPT's
index only the vision examples' LPT order and their packs (the slot array made again after it):

- the base plan (``plan()``'s ``algorithm``, ``refine``'s exact completion included, before refine): its pack of
  each example in ``plan()``'s numbering (best fit's opening order; tokens-only from ``bulk._bfd_runs``' runs),
  measured by its per-pack vision std, then let go;
- best fit under a self-imposed vision cap (``_bfd_budgeted`` with the cap as one more limit, or the vision
  limit lowered), for ``balance._CAP_FACTORS`` until one keeps the pack count;
- LPT: the vision examples by (vision desc, length desc, index) to the least-loaded feasible pack (the keyed
  index keyed by vision load, ``_least_loaded``), then best fit of the text examples around them over the same
  decreasing order the other candidates read (vision examples skipped), the empty packs dropped, and
  ``refine`` under the largest balanced load where it costs packs;
- each candidate's std over its per-pack vision sums in its own numbering (the same float64 array as
  ``np.bincount(assign, weights=vis)``, so the same std bits and the same choice).

The chosen candidate is made again where it is not the last one made (the base plan is the plain bulk planner's
plan: ``plan()`` keeps it then), and ends in ``plan_budgeted``'s refine and grouping (``_finish``) under the
build's own budgets. The same plans as ``plan()``: tests/packing/test_bulk_balance.py. Memory and CPU:
docs/scale.md ("balance_vision in bulk").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from packer.packing import kernels
from packer.packing.balance import _CAP_FACTORS, BALANCE_TOLERANCE
from packer.packing.bulk import PackOrder, _bfd_runs, plan_bulk
from packer.packing.bulk_budgets import (
    BLOCK_MIN,
    BLOCKS,
    WINDOW_MAX,
    _best_fit,
    _bfd_budgeted,
    _column,
    _columns,
    _costs,
    _ffd_budgeted,
    _finish,
    _least_filled,
    _next_block,
    _next_fit,
    _order_start,
    _pack_state,
    _planned,
    _planned_sum,
    _prepared,
    _refine_slots,
    _row_of,
    plan_budgeted,
    plan_first_fit,
    plan_next_fit,
)
from packer.packing.kernels import class_column, ix_new
from packer.packing.mixing import Sampled

_UNBOUNDED = np.int64(1) << np.int64(60)  # plan()'s stand-in for "no examples-per-pack limit" (class column)


def plan_balanced(
    lengths: np.ndarray,
    capacity: int,
    *,
    vision: np.ndarray | None,
    costs: Sequence[np.ndarray | None] = (),
    limits: Sequence[int] = (),
    names: Sequence[str] = (),
    vision_at: int = -1,
    counts: np.ndarray | None = None,
    max_examples: int | None = None,
    algorithm: str = "bfd",
    refine: bool = False,
    seed: int = 0,
) -> PackOrder:
    """``plan(lengths, capacity, costs=..., limits=..., algorithm=..., balance=<vision>, max_examples=...,
    refine=..., seed=...)``'s plan as a ``PackOrder`` (``algorithm`` ``bfd``, ``ffd`` or ``next-fit``).

    Args:
        vision: (rows,) vision tokens per row (the balanced column), None where no row has any.
        costs / limits / names: the bounded budgets as ``plan_budgeted`` takes them (int limits only).
        vision_at: the index of ``vision`` among ``costs`` where the vision tokens are bounded too, else -1.
        counts, max_examples, refine, seed: as ``plan_budgeted``.
    """
    args = dict(costs=costs, limits=limits, names=names, counts=counts, max_examples=max_examples, refine=refine,
                seed=seed)
    constrained = bool(limits) or max_examples is not None
    copies = np.zeros(0, dtype=np.uint8) if counts is None else np.ascontiguousarray(counts)
    vis = None if vision is None else np.ascontiguousarray(vision)
    if vis is None or _planned_sum(vis, copies) == 0:
        return _plain(lengths, capacity, algorithm, constrained, args)
    got = _prepared(lengths, capacity, counts, costs, limits, names, max_examples, "plan_balanced")
    if isinstance(got, PackOrder):
        return got
    lens, copies, n, hist, ncols, cols, budgets, cls, classes, state = got
    _release_heap()  # the sampling's freed temporaries, kept by glibc's heap, back before the candidates
    kept = [np.ascontiguousarray(c) for c in costs if c is not None]
    kept_limits = [int(lim) for c, lim in zip(costs, limits, strict=True) if c is not None]
    if vision_at >= 0 and costs[vision_at] is None:
        vision_at = -1
    elif vision_at >= 0:
        vision_at = sum(1 for c in costs[:vision_at] if c is not None)
    block = max(BLOCK_MIN, n // BLOCKS)
    slot = np.empty(n, dtype=np.int32)

    # 1. the base plan, in plan()'s numbering: its pack count and vision std
    base_packs = _base(slot, lens, copies, n, hist, ncols, cols, budgets, cls, classes, state, capacity, algorithm,
                       constrained, refine, block)
    allowed = base_packs + int(base_packs * BALANCE_TOLERANCE)
    best, best_std = ("base",), _std(slot, vis, copies, base_packs)
    last = ("base",)

    def consider(made: tuple, packs: int) -> None:
        nonlocal best, best_std
        std = _std(slot, vis, copies, packs)
        if packs <= allowed and std < best_std:
            best, best_std = made, std

    mean = float(_planned_sum(vis, copies)) / base_packs
    vmax = _planned_max(vis, copies)
    # 2. best fit under a vision cap, the smallest cap that keeps the pack count
    for factor in _CAP_FACTORS:
        cap = max(int(np.ceil(mean * factor)), vmax)
        if vision_at >= 0 and cap >= kept_limits[vision_at]:
            break
        packs = _capped_bfd(slot, lens, copies, hist, capacity, kept, kept_limits, vis, vision_at, cap,
                            max_examples, block)
        last = ("capped", cap)
        if packs <= allowed:
            consider(last, packs)
            break
    # 3. LPT on vision, best fit of the text around it (``slot`` handed over: LPT holds no pack per example)
    held = [slot]
    del slot
    slot, packs = _lpt(held, lens, copies, hist, capacity, cols, ncols, budgets, cls, classes, state, vis, kept,
                       kept_limits, vision_at, max_examples, base_packs, block)
    last = ("lpt",)
    consider(last, packs)
    _release_heap()  # the candidates' freed temporaries back before the chosen plan is made again
    if best == ("base",):  # plan() keeps the base plan: the plain bulk planner's plan, refine included
        del slot
        return _plain(lengths, capacity, algorithm, constrained, args)
    if best != last:
        packs = _capped_bfd(slot, lens, copies, hist, capacity, kept, kept_limits, vis, vision_at, best[1],
                            max_examples, block)
    # 4. refine under the build's budgets, the write order, grouped in place
    ix = ix_new(capacity + 1, packs, budgets.shape[0], cls, classes, state)
    _pack_state(slot, lens, copies, cols, ncols, capacity, budgets, ix[4], ix[5])
    packed = [packs, ix]
    del ix
    return _finish(slot, packed, lens, copies, cols, ncols, hist, capacity, budgets, refine, seed)


def _release_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere a no-op). glibc keeps
    freed arrays below its mmap threshold, which rises to 32 MiB as large arrays are freed: at 20M rows the
    candidates' per-pack temporaries stayed resident under the next plan's slot array (issue 32)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _plain(lengths: np.ndarray, capacity: int, algorithm: str, constrained: bool, args: dict) -> PackOrder:
    """``plan()``'s plan without balancing, by the bulk planner that makes it."""
    if algorithm == "next-fit":
        return plan_next_fit(lengths, capacity, **args)
    if algorithm == "ffd":
        return plan_first_fit(lengths, capacity, **args)
    if constrained:
        return plan_budgeted(lengths, capacity, **args)
    lens = lengths if args["counts"] is None else np.repeat(lengths, args["counts"])
    return plan_bulk(lens, capacity, seed=args["seed"], refine=args["refine"])


def _setup(kept: list, kept_limits: list, capacity: int, max_examples: int | None) -> tuple:
    """(columns as the kernels read them, budgets with the examples first, class column, classes, state dtype),
    as ``bulk_budgets._prepared`` makes them."""
    unbounded = capacity + 1
    budgets = np.array([unbounded if max_examples is None else max_examples, *kept_limits], dtype=np.int64)
    cls, classes = class_column(np.where(budgets == unbounded, _UNBOUNDED, budgets) if max_examples is None
                                else budgets, budgets.shape[0])
    state = np.zeros(1, dtype=np.uint16 if max(int(budgets.max()), capacity) < 2**16 else np.int32)
    return _columns(kept), budgets, cls, classes, state


def _capped(kept: list, kept_limits: list, vis: np.ndarray, vision_at: int, cap: int) -> tuple[list, list]:
    """``balance._vision_capped``: the vision limit lowered to ``cap``, or the vision column added with it."""
    if vision_at < 0:
        return [*kept, vis], [*kept_limits, cap]
    limits = list(kept_limits)
    limits[vision_at] = min(limits[vision_at], cap)
    return kept, limits


def _capped_bfd(slot: np.ndarray, lens: np.ndarray, copies: np.ndarray, hist: np.ndarray, capacity: int,
                kept: list, kept_limits: list, vis: np.ndarray, vision_at: int, cap: int,
                max_examples: int | None, block: int) -> int:
    """Best fit from no packs under the vision cap (``bfd_general`` with the capped needs): slot, packs."""
    cols, budgets, cls, classes, state = _setup(*_capped(kept, kept_limits, vis, vision_at, cap), capacity,
                                                max_examples)
    packs, _ = _bfd_budgeted(lens, copies, cols, len(cols[2]), hist, capacity, budgets, cls, classes, block, slot,
                              state)
    return int(packs)


def _base(slot, lens, copies, n, hist, ncols, cols, budgets, cls, classes, state, capacity, algorithm, constrained,
          refine, block) -> int:
    """``plan()``'s plan before balancing and refine into ``slot`` (its numbering); returns its packs."""
    if algorithm == "next-fit":
        return int(_next_fit(lens, copies, cols, ncols, capacity, budgets, slot[:0], slot))
    if algorithm == "ffd":
        # sized as plan_first_fit sizes it (any size makes the same plan: the tree doubles as the packs outgrow it)
        bound = max(-(-int((hist * np.arange(capacity + 1)).sum()) // capacity), -(-n // int(budgets[0])),
                    *[-(-_planned_sum(_column(cols, j), copies) // int(budgets[1 + j])) for j in range(ncols)])
        half = 1024
        while half <= bound + bound // 8:
            half *= 2
        packs, _, _ = _ffd_budgeted(lens, copies, cols, ncols, hist, capacity, budgets, block, slot, state, half)
        return int(packs)
    if constrained:
        packs, _ = _bfd_budgeted(lens, copies, cols, ncols, hist, capacity, budgets, cls, classes, block, slot,
                                 state)
        return int(packs)
    runs = _bfd_runs(hist, capacity, 0)  # kernels.bfd_fast as runs, its packs numbered as it opens them
    if refine:
        other = _bfd_runs(hist, capacity, max(1, int(np.percentile(_planned(lens, copies), 2))))
        if other[3] < runs[3]:
            runs = other
    run_s, run_b, run_q, packs = runs
    by_len = np.argsort(run_s, kind="stable")  # runs of one length in the order best fit hands out their slots
    first = np.zeros(capacity + 2, dtype=np.int64)
    np.cumsum(np.bincount(run_s, minlength=capacity + 1), out=first[1:])
    _slots_of_runs(lens, copies, run_b, run_q, by_len, first, slot)
    return int(packs)


def _std(slot: np.ndarray, vis: np.ndarray, copies: np.ndarray, packs: int) -> float:
    """``np.bincount(assign, weights=vis).std()``: per-pack sums in float64 (exact integers), the same bits:
    numpy's ``_var`` steps (pairwise sums, the mean, the squared deviations) in place in the sums, where
    ``std()`` made one more float64 per pack (an array that glibc's heap kept after it, issue 32)."""
    sums = np.zeros(packs, dtype=np.float64)
    _vision_sums(slot, vis, copies, sums)
    mean = np.add.reduce(sums, keepdims=True)
    np.true_divide(mean, packs, out=mean)
    np.subtract(sums, mean, out=sums)
    np.square(sums, out=sums)
    return float(np.sqrt(np.add.reduce(sums) / packs))


def _planned_max(col: np.ndarray, copies: np.ndarray) -> int:
    return int(col.max(initial=0)) if copies.shape[0] == 0 else int(_max_planned(col, copies))


def _lpt(held, lens, copies, hist, capacity, cols, ncols, budgets, cls, classes, state, vis, kept, kept_limits,
         vision_at, max_examples, base_packs, block) -> tuple[np.ndarray, int]:
    """``balance.balanced``'s LPT candidate: (the pack of each planned example, its packs). ``held`` holds the
    previous candidate's ``slot`` and is emptied: LPT keeps its vision examples' packs in LPT order (int32
    each, ~30% of the examples) beside its keyed index, and the slot array is made again once that index is
    gone (the slot array under LPT's index was ``plan_balanced``'s peak with copies, issue 32)."""
    n = held[0].shape[0]
    held.clear()
    m = _count_vision(vis, copies)
    ids = np.empty(m, dtype=np.int32)
    # with copies, each vision example's row is found from the counts (a search in an int64 per 64 rows and <= 64
    # steps) where it is read, not held: 4 bytes per vision example less at the LPT's peak
    marks = Sampled.of(copies).marks if copies.shape[0] else np.zeros(0, dtype=np.int64)
    _by_vision(lens, vis, copies, marks, capacity, ids)
    dims = budgets.shape[0]
    wide = np.append(np.where(budgets == capacity + 1, _UNBOUNDED, budgets) if max_examples is None else budgets,
                     capacity)
    lcls, lclasses = class_column(wide, dims + 1)
    ix = ix_new(capacity + 1, base_packs + m, dims + 1, lcls, lclasses, state)
    pk = np.empty(m, dtype=np.int32)  # the pack of each vision example, in LPT order
    packs = _least_loaded(ix, ids, copies, marks, lens, vis, cols, ncols, capacity, budgets, base_packs, pk)
    del ix, marks
    _release_heap()  # LPT's index (arrays under glibc's raised mmap threshold) back before the slots are made
    slot = np.full(n, -1, dtype=np.int32)
    _scatter(slot, ids, pk)
    del ids, pk
    # the text's best fit from the LPT packs: their tokens and budgets left made again from ``slot``
    ix = ix_new(capacity + 1, packs + n, dims, cls, classes, state)
    _pack_state(slot, lens, copies, cols, ncols, capacity, budgets, ix[4][:packs], ix[5][:packs])
    packs = _bfd_text(ix, packs, lens, copies, cols, ncols, vis, hist, capacity, budgets, block, slot)
    del ix
    used = np.zeros(packs, dtype=np.bool_)
    _mark_used(slot, used)
    if not used.all():
        _renumber(slot, (np.cumsum(used) - 1).astype(np.int32))
        packs = int(used.sum())
    del used
    allowed = base_packs + int(base_packs * BALANCE_TOLERANCE)
    if packs > allowed:  # refine under the largest balanced vision load (balance.balanced's)
        sums = np.zeros(packs, dtype=np.float64)
        _vision_sums(slot, vis, copies, sums)
        top = int(sums.max())
        del sums
        ccols, cbudgets, ccls, cclasses, cstate = _setup(*_capped(kept, kept_limits, vis, vision_at, top), capacity,
                                                         max_examples)
        cn = len(ccols[2])
        ix = ix_new(capacity + 1, packs, cbudgets.shape[0], ccls, cclasses, cstate)
        _pack_state(slot, lens, copies, ccols, cn, capacity, cbudgets, ix[4], ix[5])
        target = -(-int((hist * np.arange(capacity + 1)).sum()) // capacity)
        if packs > target:
            alive = np.ones(packs, dtype=np.bool_)
            candidates = _least_filled(ix[4], packs, capacity)
            _refine_slots(slot, lens, copies, ccols, cn, ix, packs, cbudgets, candidates, target, 256, alive,
                          WINDOW_MAX)
            del candidates, ix
            _renumber(slot, (np.cumsum(alive) - 1).astype(np.int32))
            packs = int(alive.sum())
    return slot, packs


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _slots_of_runs(lens, copies, run_b, run_q, by_len, first, slot):
    """slot[i] := the pack of planned example i: the examples of each length take that length's runs in
    order (``bulk._fill_runs``' rule), the i-th such example the i-th slot."""
    capacity = first.shape[0] - 2
    cur = first[:capacity + 1].copy()  # the run each length is at
    used = np.zeros(capacity + 1, dtype=np.int64)  # slots of that run taken
    every = copies.shape[0] == 0
    i = 0
    for r in range(lens.shape[0]):
        s = np.int64(lens[r])
        for _ in range(1 if every else copies[r]):
            k = by_len[cur[s]]
            slot[i] = run_b[k]
            used[s] += 1
            if used[s] == run_q[k]:
                cur[s] += 1
                used[s] = 0
            i += 1


@njit(cache=True)
def _vision_sums(slot, vis, copies, sums):
    every = copies.shape[0] == 0
    i = 0
    for r in range(vis.shape[0]):
        c = 1 if every else np.int64(copies[r])
        for _ in range(c):
            sums[slot[i]] += vis[r]
            i += 1


@njit(cache=True)
def _max_planned(col, copies):
    top = 0
    for r in range(col.shape[0]):
        if copies[r] > 0 and col[r] > top:
            top = np.int64(col[r])
    return top


@njit(cache=True)
def _count_vision(vis, copies):
    every = copies.shape[0] == 0
    m = 0
    for r in range(vis.shape[0]):
        if vis[r] > 0:
            m += 1 if every else np.int64(copies[r])
    return m


@njit(cache=True)
def _by_vision(lens, vis, copies, marks, capacity, ids):
    """The planned examples with vision tokens by decreasing vision tokens, then decreasing length, then
    index (``balance.balanced``'s LPT order): a counting sort on the vision tokens (index order kept), then
    each run of one vision value sorted stably by decreasing length (a row from ``marks`` where copies)."""
    every = copies.shape[0] == 0
    start = np.zeros(capacity + 2, dtype=np.int64)
    for r in range(vis.shape[0]):
        if vis[r] > 0:
            start[capacity - np.int64(vis[r]) + 1] += 1 if every else np.int64(copies[r])
    for v in range(1, capacity + 2):
        start[v] += start[v - 1]
    pos = start.copy()
    i = 0
    for r in range(vis.shape[0]):
        c = 1 if every else np.int64(copies[r])
        if vis[r] > 0:
            k = capacity - np.int64(vis[r])
            for j in range(c):
                ids[pos[k]] = i + j
                pos[k] += 1
        i += c
    for v in range(capacity + 1):
        a, b = start[v], start[v + 1]
        if b - a < 2:
            continue
        key = np.empty(b - a, dtype=np.int64)
        for k in range(a, b):
            key[k - a] = -np.int64(lens[ids[k] if every else _row_of(ids[k], copies, marks)])
        perm = np.argsort(key, kind="mergesort")
        tid = ids[a:b].copy()
        for k in range(b - a):
            ids[a + k] = tid[perm[k]]


@njit(cache=True)
def _least_loaded(ix, ids, copies, marks, lens, vis, cols, ncols, capacity, budgets, num_packs, pk):
    """``balance._least_loaded`` over the compact columns: each vision example (``ids`` in LPT order) to the
    feasible pack with the least vision load, out of ``num_packs`` empty packs first; pk[k] := the pack of
    ``ids[k]``. Returns the packs."""
    load, rem2 = ix[4], ix[5]
    dims = budgets.shape[0]
    need = np.zeros(dims + 1, dtype=np.int64)
    row = np.zeros(max(ncols, 1), dtype=np.int64)
    every = copies.shape[0] == 0
    for b in range(num_packs):
        load[b] = 0
        for d in range(dims):
            rem2[b, d] = budgets[d]
        rem2[b, dims] = capacity
        kernels.ix_insert(ix, b)
    for k in range(ids.shape[0]):
        r = np.int64(ids[k]) if every else np.int64(_row_of(ids[k], copies, marks))
        need[0] = 1
        _costs(cols, r, row)
        for c in range(ncols):
            need[1 + c] = row[c]
        need[dims] = lens[r]
        b = kernels.ix_find(ix, 0, need)
        if b < 0:
            b = num_packs
            num_packs += 1
            load[b] = 0
            for d in range(dims):
                rem2[b, d] = budgets[d]
            rem2[b, dims] = capacity
        else:
            kernels.ix_remove(ix, b)
        load[b] += vis[r]
        for d in range(dims + 1):
            rem2[b, d] -= need[d]
        pk[k] = b
        if rem2[b, dims] > 0 and rem2[b, 0] > 0:
            kernels.ix_insert(ix, b)
    return num_packs


@njit(cache=True)
def _bfd_text(ix, npre, lens, copies, cols, ncols, vis, counts, capacity, budgets, block, slot):
    """``bfd_general`` over the text examples (no vision tokens) in decreasing order, from the ``npre`` LPT
    packs (their tokens and budgets left in ``ix[4]``, ``ix[5]``; inserted in pack order where open), new packs
    after them. Returns the packs."""
    n = slot.shape[0]
    dims = budgets.shape[0]
    rem, rem2 = ix[4], ix[5]
    for b in range(npre):
        if rem[b] > 0 and rem2[b, 0] > 0:
            kernels.ix_insert(ix, b)
    num_packs = npre
    need = np.zeros(dims, dtype=np.int64)
    need[0] = 1
    row = np.zeros(max(ncols, 1), dtype=np.int64)
    buf, brow, s, left, r0, p0, i0 = _order_start(counts, capacity, block, n)
    every = copies.shape[0] == 0
    while s >= 1:
        taken, s, left, r0, p0, i0 = _next_block(lens, copies, counts, s, left, r0, p0, i0, buf, brow)
        for k in range(taken):
            r = np.int64(buf[k]) if every else np.int64(brow[k])
            if vis[r] > 0:
                continue
            size = np.int64(lens[r])
            _costs(cols, r, row)
            for c in range(ncols):
                need[1 + c] = row[c]
            slot[buf[k]], num_packs = _best_fit(ix, size, need, rem, rem2, budgets, dims, num_packs, capacity)
    return num_packs


@njit(cache=True)
def _scatter(slot, ids, pk):
    for k in range(ids.shape[0]):
        slot[ids[k]] = pk[k]


@njit(cache=True)
def _mark_used(slot, used):
    for i in range(slot.shape[0]):
        used[slot[i]] = True


@njit(cache=True)
def _renumber(slot, new):
    for i in range(slot.shape[0]):
        slot[i] = new[slot[i]]
