"""The keyed pack index (``kernels.ix_*``: a treap per key) chooses exactly the packs the LIFO lists it replaced
chose: the smallest key >= lo with a pack where every budget fits, and within that key the pack inserted
last. The reference is the list index as it was (be4b449), copied here in plain Python."""

from __future__ import annotations

import numpy as np
import pytest

from packer.packing import kernels
from packer.packing.kernels import WIDE, bfd_general, class_column, ix_find, ix_insert, ix_new, ix_remove

# ----------------------------------------------------------------------------------------------------------
# The reference: be4b449's list index and bfd_general, unchanged but for plain Python
# ----------------------------------------------------------------------------------------------------------


def old_new(universe, max_packs, dims, cls, classes):
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


def old_class(meta, row):
    return 0 if meta[1] < 0 else min(row[meta[1]], meta[2] - 1)


def old_pull(tree, node):
    node >>= 1
    while node >= 1:
        v = np.maximum(tree[2 * node], tree[2 * node + 1])
        if np.array_equal(tree[node], v):
            return
        tree[node] = v
        node >>= 1


def old_insert(ix, b):
    tree, head, nxt, prv, key, rem2, _, meta = ix
    r = key[b]
    prv[b] = -1
    nxt[b] = head[r]
    if head[r] >= 0:
        prv[head[r]] = b
    head[r] = b
    top = old_class(meta, rem2[b])
    node = meta[0] + r
    while node >= 1:
        raised = False
        for j in range(top + 1):
            for d in range(rem2.shape[1]):
                if tree[node, j, d] < rem2[b, d]:
                    tree[node, j, d] = rem2[b, d]
                    raised = True
        if not raised:
            return
        node >>= 1


def old_remove(ix, b):
    tree, head, nxt, prv, key, _, _, meta = ix
    r = key[b]
    if prv[b] >= 0:
        nxt[prv[b]] = nxt[b]
    else:
        head[r] = nxt[b]
    if nxt[b] >= 0:
        prv[nxt[b]] = prv[b]
    if head[r] < 0:
        node = meta[0] + r
        tree[node] = -1
        old_pull(tree, node)


def old_find(ix, lo, need):
    tree, head, nxt, _, _, rem2, exact, meta = ix
    half = meta[0]
    k = old_class(meta, need)
    node = half + lo
    while True:
        if (tree[node, k] >= need).all():
            if node < half:
                node = 2 * node
                continue
            b = head[node - half]
            exact[:] = -1
            while b >= 0:
                if (rem2[b] >= need).all():
                    return b
                for j in range(old_class(meta, rem2[b]) + 1):
                    exact[j] = np.maximum(exact[j], rem2[b])
                b = nxt[b]
            tree[node] = exact
            old_pull(tree, node)
        while node & 1:
            node >>= 1
        if node == 0:
            return -1
        node += 1


def old_bfd_general(order, lens, needs, capacity, budgets, cls, classes, init_rem, init_rem2):
    n, m, dims = lens.shape[0], order.shape[0], needs.shape[1]
    npre = init_rem.shape[0]
    ix = old_new(capacity + 1, npre + m, dims, cls, classes)
    rem, rem2 = ix[4], ix[5]
    chosen = np.empty(m, dtype=np.int64)
    for b in range(npre):
        rem[b] = init_rem[b]
        rem2[b] = init_rem2[b]
        if rem[b] > 0 and rem2[b, 0] > 0:
            old_insert(ix, b)
    num_packs = npre
    for k in range(m):
        s, need = lens[order[k]], needs[order[k]]
        b = old_find(ix, s, need)
        if b < 0:
            b = num_packs
            num_packs += 1
            rem[b] = capacity
            rem2[b] = budgets
        else:
            old_remove(ix, b)
        rem[b] -= s
        rem2[b] -= need
        chosen[k] = b
        if rem[b] > 0 and rem2[b, 0] > 0:
            old_insert(ix, b)
    assign = np.full(n, -1, dtype=np.int64)
    assign[order] = chosen
    return assign, num_packs


# ----------------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [WIDE, np.zeros(1, dtype=np.uint16)], ids=["int64", "uint16"])
@pytest.mark.parametrize("seed", range(12))
def test_every_find_matches_the_lists(seed, state):
    """Random inserts, removals and finds on few keys (long buckets, many ties), budgets that rarely all fit
    one pack (the maxima lie) and a class column or none: every find answers the list index's pack."""
    rng = np.random.default_rng(seed)
    universe, dims, packs = int(rng.integers(1, 24)), int(rng.integers(1, 4)), int(rng.integers(20, 300))
    limits = rng.integers(1, 9, size=dims)
    cls, classes = class_column(limits, dims) if seed % 3 else (-1, 1)
    new = ix_new(universe, packs, dims, cls, classes, state)
    old = old_new(universe, packs, dims, cls, classes)
    inside = np.zeros(packs, dtype=bool)
    for _ in range(3000):
        op = rng.random()
        if op < 0.35 and not inside.all():
            b = int(rng.choice(np.flatnonzero(~inside)))
            k, left = int(rng.integers(0, universe)), rng.integers(0, limits + 1)
            new[4][b], new[5][b] = k, left
            old[4][b], old[5][b] = k, left
            ix_insert(new, b)
            old_insert(old, b)
            inside[b] = True
        elif op < 0.6 and inside.any():
            b = int(rng.choice(np.flatnonzero(inside)))
            ix_remove(new, b)
            old_remove(old, b)
            inside[b] = False
        else:
            lo, need = int(rng.integers(0, universe)), rng.integers(0, limits + 1).astype(np.int64)
            assert ix_find(new, lo, need) == old_find(old, lo, need)


def binding(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """bench_budgets_scale's mix, small: 30% with an image of most of the tokens; examples, vision tokens and
    images per pack all bind somewhere."""
    rng = np.random.default_rng(seed)
    capacity = int(rng.choice([64, 512, 4096]))
    images = (rng.random(n) < 0.3).astype(np.int64)
    vision = images * rng.integers(1, capacity // 3 + 1, size=n)
    lens = np.minimum(rng.integers(1, capacity // 40 + 3, size=n) + vision, capacity)
    vision = np.minimum(vision, lens)
    budgets = np.array([int(rng.choice([4, 32, 1 << 60])), int(rng.choice([capacity // 4, capacity // 2])),
                        int(rng.choice([1, 2, 4]))], dtype=np.int64)
    return lens, np.stack([np.ones(n, dtype=np.int64), vision, images], axis=1), capacity, budgets


@pytest.mark.parametrize("seed", range(8))
def test_bfd_general_same_plan(seed):
    """Best fit in decreasing order, from nothing and from packs that already exist (``balanced``'s text
    pass): the same pack for every example, the same number of packs."""
    lens, needs, capacity, budgets = binding(seed, 3000)
    order = kernels.order_decreasing(lens, capacity)
    cls, classes = class_column(budgets, 3)
    if seed % 2:
        pre = 40
        init_rem = np.random.default_rng(seed).integers(0, capacity + 1, size=pre)
        init_rem2 = np.random.default_rng(seed + 1).integers(0, budgets.clip(max=64) + 1, size=(pre, 3))
        order = order[: len(order) // 2]
    else:
        init_rem, init_rem2 = kernels.no_packs(3)
    got = bfd_general(order, lens, needs, capacity, budgets, cls, classes, init_rem, init_rem2)
    want = old_bfd_general(order, lens, needs, capacity, budgets, cls, classes, init_rem, init_rem2)
    assert got[1] == want[1]
    assert np.array_equal(got[0], want[0])
