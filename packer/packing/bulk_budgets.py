"""Best fit under per-pack budgets at bulk memory: ``plan()``'s budgeted plan in ~4 bytes per example.

``plan(lengths, capacity, costs=..., limits=..., max_examples=..., refine=...)`` (algorithm ``bfd``) runs
``kernels.bfd_general`` and, with ``refine``, ``balance.refine_packs``; between them and ``plan()``'s own
copies it holds ~40-80 bytes per example (int64 lengths, the (n, 1 + b) ``needs`` matrix, the decreasing
order, the sizes/wants copies, the assignment, the shuffled ids), and a build adds ``argsort(pack_ids)``.
``plan_budgeted`` makes the same plan, pack ids and the writers' order included (tests/packing/
test_bulk_budgets.py), reading the compact columns as given (uint16 lengths and counts; a cost column is
read through ``index`` where the planned examples are a subset of the rows) and holding per example only:

- the pack of each example (int32, 4 bytes), which becomes ``order`` in place (below);
- the decreasing order in blocks of ``n // 16`` examples (one scan of the lengths per block, a counting sort
  of the lengths in it) instead of the whole (n,) int64 order: 0.25 bytes;
- one bit per example while the packs are grouped.

Per pack: the keyed index of ``kernels`` (``ix_*``: remaining tokens, the budgets left, list links) in int32,
~(3 + budgets) x 4 bytes.

Grouping in place. The kernel writes each example's pack (opening order) into ``slot[i]``. Its packs are then
grouped in write order in the same array: each pack's first slot is known from the pack sizes, and the
examples are moved along permutation cycles (an example is read before its slot is overwritten; a bitmap
marks the slots read), then each pack's slots are sorted by example index. ``refine`` first groups by
opening pack, sorts each pack's members by decreasing length (``refine_packs``' member order), runs
``balance._refine``'s moves over those lists (recording where each member of an emptied pack went), and then
regroups the same array in write order.

Quality and speed against ``plan()``: docs/benchmarks.md ("Budgets in bulk"); memory: docs/scale.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from packer.errors import ConfigError
from packer.packing.bulk import PackOrder, _raise_misfit, write_order
from packer.packing.kernels import class_column, ix_find, ix_insert, ix_remove

# The decreasing order is made this many examples at a time at least (n // 16 from 16M): one scan each.
BLOCK_MIN = 1 << 20
# "No examples-per-pack limit" in int32 pack state: above any pack's examples (<= capacity < 2**31).
_UNBOUNDED32 = np.int64(2**31 - 1)


def plan_budgeted(
    lengths: np.ndarray,
    capacity: int,
    *,
    costs: Sequence[np.ndarray | None] = (),
    limits: Sequence[int] = (),
    names: Sequence[str] = (),
    index: np.ndarray | None = None,
    max_examples: int | None = None,
    refine: bool = False,
    seed: int = 0,
) -> PackOrder:
    """``plan(lengths, capacity, costs=..., limits=..., max_examples=..., refine=..., seed=...)``'s plan (``bfd``,
    no ``balance``) as a ``PackOrder``.

    Args:
        lengths: (n,) tokens per planned example, each in [1, capacity]; any integer dtype, read as given.
        costs: one (rows,) column per bounded budget (uint16: 2 bytes per row), None where every row costs 0;
            read as ``costs[j][index[i]]`` for planned example i when ``index`` is given, else ``costs[j][i]``.
        limits: (k,) each column's limit (an int: unbounded columns change no plan and are left out).
        names: (k,) the knob of each limit (``max_vision_tokens``), named by errors as ``plan`` names them.
        index: (n,) the row of each planned example in ``costs``' columns, or None (row i).
        max_examples: at most this many examples per pack.
        refine: then empty the least-filled packs into the others' free space (``balance.refine_packs``).
        seed: the pack shuffle's seed (``plan``'s write order).
    """
    from packer.packing.budgets import counts_tokens, noun

    lens = np.ascontiguousarray(lengths)
    n = lens.shape[0]
    if n == 0:
        return PackOrder(order=np.zeros(0, dtype=np.int32), bounds=np.zeros(1, dtype=np.int32))
    if n > 2**31 - 1:
        raise ConfigError(f"plan_budgeted plans at most 2**31 - 1 examples, got {n}")
    if int(lens.min()) < 1 or int(lens.max()) > capacity:
        _raise_misfit(lens, capacity)
    names = list(names) if names else [f"costs[:, {j}]" for j in range(len(limits))]
    rows = np.zeros(0, dtype=np.int32) if index is None else np.ascontiguousarray(index)
    kept, kept_limits = [], []
    for col, limit, name in zip(costs, limits, names, strict=True):
        if col is None:
            continue  # costs nothing: never binds, and bfd_general's choices do not depend on it
        col = np.ascontiguousarray(col)
        bad = _first_over(lens, rows, col, int(limit), counts_tokens(name))
        if bad >= 0:
            planned = col if index is None else col[index]
            if int(planned.max()) > limit:
                i = int(np.argmax(planned))
                raise ConfigError(f"example {i} has {int(planned[i])} {noun(name)} > {name} {limit}; raise "
                                  f"'{name}' or drop/truncate the example")
            raise ConfigError(f"example {bad} has {int(planned[bad])} {noun(name)} but only {int(lens[bad])} tokens "
                              "in all")
        kept.append(col)
        kept_limits.append(int(limit))
    wide = np.result_type(*[c.dtype for c in kept]) if kept else np.dtype(np.uint16)
    cols = tuple(c.astype(wide, copy=False) for c in kept) or (np.zeros(1, dtype=wide),)
    budgets = np.array([_UNBOUNDED32 if max_examples is None else max_examples, *kept_limits], dtype=np.int64)
    # plan()'s class column is chosen on its int64 stand-in for "unbounded" (1 << 60), never a class: the same
    cls, classes = class_column(np.where(budgets == _UNBOUNDED32, np.int64(1) << 60, budgets), budgets.shape[0])

    slot = np.empty(n, dtype=np.int32)
    counts = np.bincount(lens, minlength=capacity + 1).astype(np.int64)
    block = max(BLOCK_MIN, n // 16)
    num_packs, rem, rem2, order_ix = _bfd_budgeted(lens, rows, cols, len(kept), counts, capacity, budgets, cls,
                                                   classes, block, slot)
    sizes = budgets[0] - rem2[:num_packs, 0].astype(np.int64)  # examples per pack, opening order
    target = -(-int((counts * np.arange(capacity + 1)).sum()) // capacity)
    if not refine or num_packs <= target:
        del order_ix, rem, rem2
        where = write_order(num_packs, seed, np.int32)
        bounds = _bounds(sizes, where)
        _group(slot, where, bounds[:-1].copy(), np.zeros(n // 64 + 1, dtype=np.uint64))
        _sort_segments(slot, bounds)
        return PackOrder(order=slot, bounds=bounds)

    # refine: members per opening pack, longest first (refine_packs' lexsort((index, -lens, assign)))
    ptr = np.zeros(num_packs + 1, dtype=np.int64)
    np.cumsum(sizes, out=ptr[1:])
    _group(slot, np.arange(num_packs, dtype=np.int32), ptr[:-1].astype(np.int32),
           np.zeros(n // 64 + 1, dtype=np.uint64))
    _sort_members(slot, ptr, lens)
    loads = capacity - rem[:num_packs].astype(np.int64)
    candidates = np.argsort(loads, kind="stable").astype(np.int64)  # least filled first, ties by pack
    del loads, order_ix
    alive, move_first, move_to = _refine_members(slot, ptr, lens, rows, cols, len(kept), rem, rem2, num_packs,
                                                 capacity, budgets, cls, classes, candidates, target, 256)
    del rem, rem2, candidates
    kept_packs = int(alive.sum())
    where = np.full(num_packs, -1, dtype=np.int32)
    where[alive] = write_order(kept_packs, seed, np.int32)
    final = np.zeros(kept_packs + 1, dtype=np.int64)
    _final_sizes(ptr, alive, move_first, move_to, where, final)
    bounds = np.cumsum(final).astype(np.int32)
    _regroup(slot, ptr, alive, move_first, move_to, where, bounds[:-1].copy(), np.zeros(n // 64 + 1, np.uint64))
    _sort_segments(slot, bounds)
    return PackOrder(order=slot, bounds=bounds)


def _bounds(sizes: np.ndarray, where: np.ndarray) -> np.ndarray:
    """(P + 1,) int32 boundaries of the packs in write order (pack b is the where[b]-th)."""
    ordered = np.zeros(where.shape[0] + 1, dtype=np.int64)
    ordered[where.astype(np.int64) + 1] = sizes
    return np.cumsum(ordered).astype(np.int32)


# ----------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _first_over(lens, rows, col, limit, tokens):
    """The first planned example whose cost is over ``limit`` (or over its length, for a token budget), or -1."""
    for i in range(lens.shape[0]):
        c = np.int64(col[rows[i]] if rows.shape[0] else col[i])
        if c > limit or (tokens and c > lens[i]):
            return i
    return -1


@njit(cache=True)
def _ix_new32(universe, max_packs, dims, cls, classes):
    """``kernels.ix_new`` with int32 pack state (key, links, budgets left): 4 bytes a field per pack. The
    pages past the packs opened are never touched."""
    half = 1
    while half < universe:
        half *= 2
    tree = np.full((2 * half, classes, dims), -1, dtype=np.int64)
    head = np.full(universe, -1, dtype=np.int32)
    nxt = np.empty(max_packs, dtype=np.int32)
    prv = np.empty(max_packs, dtype=np.int32)
    key = np.empty(max_packs, dtype=np.int32)
    rem2 = np.empty((max_packs, dims), dtype=np.int32)
    scratch = np.empty((classes, dims), dtype=np.int64)
    meta = np.array([half, cls, classes], dtype=np.int64)
    return tree, head, nxt, prv, key, rem2, scratch, meta


@njit(cache=True, inline="always")
def _needs(i, lens, rows, cols, ncols, need):
    for c in range(ncols):
        need[1 + c] = cols[c][rows[i]] if rows.shape[0] else cols[c][i]


@njit(cache=True)
def _next_block(lens, counts, capacity, s, left, i0, buf):
    """The next examples of the decreasing order (length desc, index asc) from (length s, index >= i0, ``left``
    of length s still to come), at most ``buf.shape[0]``, into ``buf``. One scan of the lengths. Returns
    (taken, s, left, i0) of the position after them."""
    m = buf.shape[0]
    n = lens.shape[0]
    if left >= m:  # this length alone fills the block: its next m examples in index order
        k = 0
        i = i0
        while k < m:
            if lens[i] == s:
                buf[k] = i
                k += 1
            i += 1
        left -= m
        i0 = i
        if left > 0:
            return m, s, left, i0
        s -= 1
        while s >= 1 and counts[s] == 0:
            s -= 1
        return m, s, counts[s] if s >= 1 else 0, 0
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
    for i in range(n):
        x = np.int64(lens[i])
        if x < lo or x > s or (x == s and i < i0):
            continue
        buf[offset[x]] = i
        offset[x] += 1
    s = lo - 1
    while s >= 1 and counts[s] == 0:
        s -= 1
    return total, s, counts[s] if s >= 1 else 0, 0


@njit(cache=True)
def _bfd_budgeted(lens, rows, cols, ncols, counts, capacity, budgets, cls, classes, block, slot):
    """``kernels.bfd_general`` over the examples in decreasing order (made a block at a time), with no packs
    before: slot[i] = pack of example i (opening order). Returns (packs, remaining tokens, budgets left, ix)."""
    n = lens.shape[0]
    dims = budgets.shape[0]
    ix = _ix_new32(capacity + 1, n, dims, cls, classes)
    rem, rem2 = ix[4], ix[5]
    need = np.zeros(dims, dtype=np.int64)
    need[0] = 1
    buf = np.empty(min(block, n), dtype=np.int32)
    num_packs = 0
    s = capacity
    while s >= 1 and counts[s] == 0:
        s -= 1
    left = counts[s]
    i0 = 0
    while s >= 1:
        taken, s, left, i0 = _next_block(lens, counts, capacity, s, left, i0, buf)
        for k in range(taken):
            i = buf[k]
            size = np.int64(lens[i])
            _needs(i, lens, rows, cols, ncols, need)
            b = ix_find(ix, size, need)
            if b < 0:
                b = num_packs
                num_packs += 1
                rem[b] = capacity
                for d in range(dims):
                    rem2[b, d] = budgets[d]
            else:
                ix_remove(ix, b)
            rem[b] -= size
            for d in range(dims):
                rem2[b, d] -= need[d]
            slot[i] = b
            if rem[b] > 0 and rem2[b, 0] > 0:  # a pack out of tokens or example slots is closed for good
                ix_insert(ix, b)
    return num_packs, rem, rem2, ix


@njit(cache=True)
def _group(slot, where, cursor, seen):
    """In place: ``slot`` (pack of each example) becomes the examples grouped by pack, pack b's at
    cursor[where[b]]... (cursor: each group's first position, advanced). Follows permutation cycles: the
    pack of the example whose slot is about to be written is read first (``seen`` marks slots read)."""
    n = slot.shape[0]
    for i in range(n):
        if seen[i >> 6] & (np.uint64(1) << np.uint64(i & 63)):
            continue
        seen[i >> 6] |= np.uint64(1) << np.uint64(i & 63)
        cur = i
        pack = slot[i]
        while True:
            g = where[pack]
            d = cursor[g]
            cursor[g] = d + 1
            bit = np.uint64(1) << np.uint64(d & 63)
            if seen[d >> 6] & bit:
                slot[d] = cur
                break
            seen[d >> 6] |= bit
            pack = slot[d]
            slot[d] = cur
            cur = d


@njit(cache=True)
def _sort_segments(order, bounds):
    """Each pack's examples in increasing index (insertion sort: packs hold few examples)."""
    for p in range(bounds.shape[0] - 1):
        lo, hi = bounds[p], bounds[p + 1]
        if hi - lo > 64:
            order[lo:hi] = np.sort(order[lo:hi])
            continue
        for k in range(lo + 1, hi):
            x = order[k]
            j = k - 1
            while j >= lo and order[j] > x:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = x


@njit(cache=True)
def _sort_members(members, ptr, lens):
    """Each pack's members by decreasing length, ties by increasing index (``refine_packs``' order)."""
    for p in range(ptr.shape[0] - 1):
        lo, hi = ptr[p], ptr[p + 1]
        for k in range(lo + 1, hi):
            x = members[k]
            sx = lens[x]
            j = k - 1
            while j >= lo and (lens[members[j]] < sx or (lens[members[j]] == sx and members[j] > x)):
                members[j + 1] = members[j]
                j -= 1
            members[j + 1] = x


@njit(cache=True)
def _refine_members(members, ptr, lens, rows, cols, ncols, rem, rem2, num_packs, capacity, budgets, cls, classes,
                    candidates, target, patience):
    """``balance._refine`` on member lists: a fresh keyed index of every open pack (inserted in pack order,
    as ``_refine`` inserts them), candidates least filled first, each member moved to its best fit, kept
    only if the whole pack empties. Returns (alive, move_first, move_to): member ``ptr[p] + j`` of an
    emptied pack p went to pack ``move_to[move_first[p] + j]``."""
    dims = budgets.shape[0]
    ix = _ix_new32(capacity + 1, num_packs, dims, cls, classes)
    key, left = ix[4], ix[5]
    for b in range(num_packs):
        key[b] = rem[b]
        for d in range(dims):
            left[b, d] = rem2[b, d]
    inside = np.zeros(num_packs, dtype=np.bool_)
    alive = np.ones(num_packs, dtype=np.bool_)
    touched = np.zeros(num_packs, dtype=np.bool_)
    for b in range(num_packs):
        if key[b] > 0 and left[b, 0] > 0:
            ix_insert(ix, b)
            inside[b] = True
    need = np.zeros(dims, dtype=np.int64)
    need[0] = 1
    move_first = np.full(num_packs, -1, dtype=np.int64)
    move_to = np.empty(1024, dtype=np.int32)
    moved = 0
    scratch = np.empty(1024, dtype=np.int32)
    packs = num_packs
    failures = 0
    for c in range(candidates.shape[0]):
        if packs <= target or failures >= patience:
            break
        p = candidates[c]
        if touched[p]:
            continue
        if inside[p]:
            ix_remove(ix, p)
            inside[p] = False
        nmoved = 0
        ok = True
        if ptr[p + 1] - ptr[p] > scratch.shape[0]:
            scratch = np.empty(ptr[p + 1] - ptr[p], dtype=np.int32)
        for k in range(ptr[p], ptr[p + 1]):
            i = members[k]
            _needs(i, lens, rows, cols, ncols, need)
            b = ix_find(ix, np.int64(lens[i]), need)
            if b < 0:
                ok = False
                break
            ix_remove(ix, b)
            key[b] -= lens[i]
            for d in range(dims):
                left[b, d] -= need[d]
            inside[b] = key[b] > 0 and left[b, 0] > 0
            if inside[b]:
                ix_insert(ix, b)
            scratch[nmoved] = b
            nmoved += 1
        if ok:
            if moved + nmoved > move_to.shape[0]:
                grown = np.empty(2 * (moved + nmoved), dtype=np.int32)
                grown[:moved] = move_to[:moved]
                move_to = grown
            move_first[p] = moved
            for m in range(nmoved):
                move_to[moved + m] = scratch[m]
                touched[scratch[m]] = True
            moved += nmoved
            alive[p] = False
            packs -= 1
            failures = 0
            continue
        for m in range(nmoved - 1, -1, -1):  # undo, newest first
            i = members[ptr[p] + m]
            b = scratch[m]
            if inside[b]:
                ix_remove(ix, b)
            _needs(i, lens, rows, cols, ncols, need)
            key[b] += lens[i]
            for d in range(dims):
                left[b, d] += need[d]
            inside[b] = True
            ix_insert(ix, b)
        if key[p] > 0 and left[p, 0] > 0:
            ix_insert(ix, p)
            inside[p] = True
        failures += 1
    return alive, move_first, move_to[:moved].copy()


@njit(cache=True, inline="always")
def _final_pack(k, ptr, alive, move_first, move_to):
    """The pack member slot ``k`` ends in: its own, or where refine moved it."""
    p = np.searchsorted(ptr, k, side="right") - 1
    if alive[p]:
        return p
    return move_to[move_first[p] + k - ptr[p]]


@njit(cache=True)
def _final_sizes(ptr, alive, move_first, move_to, where, sizes):
    """sizes[where[b] + 1] = examples that end in pack b."""
    for p in range(ptr.shape[0] - 1):
        if alive[p]:
            sizes[where[p] + 1] += ptr[p + 1] - ptr[p]
        else:
            for j in range(ptr[p + 1] - ptr[p]):
                sizes[where[move_to[move_first[p] + j]] + 1] += 1


@njit(cache=True)
def _regroup(members, ptr, alive, move_first, move_to, where, cursor, seen):
    """``_group`` for member lists: slot k's example goes to its final pack's group in write order."""
    n = members.shape[0]
    for i in range(n):
        if seen[i >> 6] & (np.uint64(1) << np.uint64(i & 63)):
            continue
        seen[i >> 6] |= np.uint64(1) << np.uint64(i & 63)
        cur = members[i]
        g = where[_final_pack(i, ptr, alive, move_first, move_to)]
        while True:
            d = cursor[g]
            cursor[g] = d + 1
            bit = np.uint64(1) << np.uint64(d & 63)
            if seen[d >> 6] & bit:
                members[d] = cur
                break
            seen[d >> 6] |= bit
            nxt_g = where[_final_pack(d, ptr, alive, move_first, move_to)]
            nxt_cur = members[d]
            members[d] = cur
            cur = nxt_cur
            g = nxt_g
