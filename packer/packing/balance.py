"""Post-passes over a plan: even out the vision load per pack (``balance_vision``) and empty the
least-filled packs into the others' free space (``refine``). Both keep every budget; neither adds more than
``BALANCE_TOLERANCE`` packs (balance) or any pack at all (refine).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.packing.kernels import (
    WIDE,
    bfd_general,
    class_column,
    ix_find,
    ix_insert,
    ix_new,
    ix_open_all,
    ix_remove,
    no_packs,
    order_decreasing,
    refine_next,
    refine_try,
)

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
    ix = ix_new(capacity + 1, maxp, dims + 1, cls, classes, WIDE)
    load, rem2 = ix[4], ix[5]
    need = np.empty(dims + 1, dtype=np.int64)
    for b in range(num_packs):
        load[b] = 0
        rem2[b, :dims] = budgets
        rem2[b, dims] = capacity
        ix_insert(ix, b)
    assign = np.full(n, -1, dtype=np.int64)
    for k in range(m):
        i = order[k]
        need[:dims] = needs[i]
        need[dims] = lens[i]
        b = ix_find(ix, 0, need)
        if b < 0:
            b = num_packs
            num_packs += 1
            load[b] = 0
            rem2[b, :dims] = budgets
            rem2[b, dims] = capacity
        else:
            ix_remove(ix, b)
        load[b] += vis[i]
        for d in range(dims + 1):
            rem2[b, d] -= need[d]
        assign[i] = b
        if rem2[b, dims] > 0 and rem2[b, 0] > 0:
            ix_insert(ix, b)
    return assign, rem2[:num_packs, dims].copy(), rem2[:num_packs, :dims].copy(), num_packs


# Balancing may cost at most this fraction of extra packs over the plain plan ("same-ish pack count").
BALANCE_TOLERANCE = 0.001
# Vision caps tried, as multiples of the mean vision load per pack, smallest (most even) first.
_CAP_FACTORS = (1.01, 1.02, 1.03, 1.05, 1.08, 1.12, 1.2, 1.35, 1.6)


def balanced(
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
    best_std = float(np.bincount(base, weights=vis).std())  # vision tokens per pack

    def consider(assign: np.ndarray, packs: int) -> None:
        nonlocal best, best_packs, best_std
        std = float(np.bincount(assign, weights=vis).std())
        if packs <= allowed and std < best_std:
            best, best_packs, best_std = assign, packs, std

    order = order_decreasing(lens, capacity)
    mean = float(vis.sum()) / base_packs
    for factor in _CAP_FACTORS:
        cap = max(int(np.ceil(mean * factor)), int(vis.max()))
        if vision_col >= 0 and cap >= budgets[vision_col]:
            break
        capped_needs, capped = _vision_capped(needs, budgets, vis, vision_col, cap)
        cls, classes = class_column(capped, capped_needs.shape[1])
        assign, packs = bfd_general(
            order, lens, capped_needs, capacity, capped, cls, classes, *no_packs(capped_needs.shape[1])
        )
        if packs <= allowed:
            consider(assign, packs)
            break

    with_vision = np.flatnonzero(vis > 0)
    # Decreasing vision tokens, ties by decreasing length, then index: LPT wants the big loads first.
    by_vision = with_vision[np.lexsort((with_vision, -lens[with_vision], -vis[with_vision]))]
    cls, classes = class_column(np.append(budgets, capacity), needs.shape[1] + 1)
    assign, rem, rem2, packs = _least_loaded(
        by_vision, lens, vis, needs, capacity, budgets, cls, classes, base_packs
    )
    text = order[vis[order] == 0]
    cls, classes = class_column(budgets, needs.shape[1])
    rest, packs = bfd_general(text, lens, needs, capacity, budgets, cls, classes, rem, rem2)
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
            needs, budgets, vis, vision_col, int(np.bincount(assign, weights=vis).max())
        )
        assign, packs = refine_packs(assign, packs, lens, capped_needs, capacity, capped)
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
    ix = ix_new(capacity + 1, num_packs, dims, cls, classes, WIDE)
    rem, rem2 = ix[4], ix[5]
    rem[:num_packs] = capacity
    for b in range(num_packs):
        for d in range(dims):
            rem2[b, d] = budgets[d]
    for i in range(lens.shape[0]):
        rem[assign[i]] -= lens[i]
        for d in range(dims):
            rem2[assign[i], d] -= needs[i, d]
    inside = np.zeros(num_packs, dtype=np.bool_)
    alive = np.ones(num_packs, dtype=np.bool_)
    touched = np.zeros(num_packs, dtype=np.bool_)  # received examples: its member list is stale, skip it
    ix_open_all(ix, num_packs, inside)
    most = 1
    for p in range(num_packs):
        most = max(most, ptr[p + 1] - ptr[p])
    sizes = np.empty(most, dtype=np.int64)
    wants = np.empty((most, dims), dtype=np.int64)
    dest = np.empty(most, dtype=np.int64)
    progress = np.array([num_packs, 0, target, patience], dtype=np.int64)
    c = refine_next(candidates, np.int64(0), touched, progress)
    while c >= 0:
        p = candidates[c]
        k = ptr[p + 1] - ptr[p]
        for m in range(k):
            sizes[m] = lens[members[ptr[p] + m]]
            for d in range(dims):
                wants[m, d] = needs[members[ptr[p] + m], d]
        if refine_try(ix, inside, touched, alive, progress, p, sizes, wants, k, dest):
            for m in range(k):
                assign[members[ptr[p] + m]] = dest[m]
        c = refine_next(candidates, c + 1, touched, progress)
    return assign, alive


def refine_packs(
    assign: np.ndarray,
    num_packs: int,
    lens: np.ndarray,
    needs: np.ndarray,
    capacity: int,
    budgets: np.ndarray,
    *,
    patience: int = 256,
) -> tuple[np.ndarray, int]:
    """Run ``_refine`` on every pack, least-filled first, members largest first; renumber the surviving
    packs in their old order."""
    target = -(-int(lens.sum()) // capacity)  # the lower bound: no plan has fewer packs
    if num_packs <= target:
        return assign, num_packs
    candidates = np.arange(num_packs)
    loads = np.bincount(assign, weights=lens, minlength=num_packs)
    candidates = candidates[np.lexsort((candidates, loads))].astype(np.int64)
    members = np.lexsort((np.arange(lens.shape[0]), -lens, assign)).astype(np.int64)
    ptr = np.zeros(num_packs + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(assign, minlength=num_packs))
    cls, classes = class_column(budgets, needs.shape[1])
    assign, alive = _refine(
        assign.copy(), num_packs, lens, needs, capacity, budgets, cls, classes,
        candidates, ptr, members, target, patience,
    )  # fmt: skip
    renumber = np.cumsum(alive) - 1
    return renumber[assign], int(alive.sum())
