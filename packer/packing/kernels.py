"""The planner's compiled kernels (numba): counting sort, bitset best-fit, the keyed pack index, FFD, next-fit.

Every kernel takes lengths (int64), a capacity and optional budget columns, and returns
``(pack per example in opening order, number of packs)``; ``planner.plan`` validates the inputs, picks the
kernel and numbers the packs. Imported only when a plan is made: numba costs ~0.3 s to import.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packer.packing.kernel_cache import drop_stale_kernels

drop_stale_kernels()  # before any kernel of the package loads from numba's cache (kernel_cache says why)

# What a kernel costs to compile (a first build compiles every signature its options use: docs/benchmarks.md "A
# first build"): the package's kernels copy an array into another's slice or row element by element, never
# ``a[i:j] = b`` / ``rows[k] = other[r]`` (for those numba compiles its shape-mismatch raise, string formatting
# included, seconds per dimension count), and hand a kernel they call int64 positions and counts, not a literal
# ``0`` nor an int32 element (each is a signature of its own, the callee compiled again: ``np.int64(x)``).

# ----------------------------------------------------------------------------------------------------------
# Counting sort and a 64-ary bitset
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def order_decreasing(lens: np.ndarray, capacity: int) -> np.ndarray:
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
def _available(counts, offs, words, capacity, complete_min):
    """Exact completion's bitset of the lengths s with examples left, at key capacity - s (empty without it)."""
    avail = np.zeros(words, dtype=np.int64)
    if complete_min > 0:
        for s in range(1, capacity + 1):
            if counts[s] > 0:
                _bits_set(avail, offs, capacity - s)
    return avail


@njit(cache=True)
def bfd_fast(lens: np.ndarray, capacity: int, complete_min: int) -> tuple[np.ndarray, int]:
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
    avail = _available(left_count, offs, bits.shape[0], capacity, complete_min)
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
# Packs are bucketed by an integer key in 0..U-1 (remaining tokens for best fit, vision load for balancing).
# ``ix_find``'s rule: the smallest key >= lo that holds a pack where every budget fits; within that key, the
# pack inserted last (a pack that changed is removed and inserted again, so it counts as new). A segment
# tree over the keys (leaf of key r = tree[half + r]) stores upper bounds of the packs' remaining budgets, so
# a depth-first search finds the key.
#
# Per-budget maxima alone can lie: a bucket may hold one pack with vision room but no image slot and another
# with the reverse; the search then scans it for nothing, again and again (measured: 60 bucket scans and
# 1000 packs looked at per example on a vision + image budget). So one small count budget (images, or
# examples) is the "class" dimension: tree[node, j, d] = the largest remaining budget d among packs with at
# least j of the class budget left. A node fits need (.., k, ..) iff tree[node, k, :] >= need, which is exact
# for two budgets. Bounds are raised exactly on insert and left stale on removal (recomputing them would
# cost a scan of the bucket); a search that finds nothing in a bucket tightens that leaf to the exact
# values, so a stale bound costs at most one wasted scan.
#
# Within a key the packs form a treap in insertion order (in order: oldest to newest; head[r] = its root and
# its newest pack, -1 when empty) whose priorities are a hash of the pack id (nothing stored) and whose
# nodes hold their subtree's largest budgets left (``smax``). The newest pack is tried first (it fits most
# often: the lists' O(1)); else the newest that fits is a descent, newest side first, past every subtree
# with a budget too small: O(log) where a LIFO list walked past each newer pack that did not fit (with
# budgets that bind, a walk that grew with n: docs/scale.md, "Time"). Insertion is at the newest end (down
# the right spine, no rotations); removal zips the pack's two subtrees together.


@njit(cache=True)
def ix_new(universe, max_packs, dims, cls, classes, state):
    """(tree, head, links, smax, key, rem2, scratch, meta); meta = [half, class column or -1, classes].

    ``head[r]`` = key r's treap root and newest pack; ``links[b]`` = pack b's treap children (older, newer)
    and parent, int32 (one row: one cache line, and one array less that every call passes). The key, the
    budgets left (``rem2``) and their subtree maxima (``smax``) of ``state``'s dtype: int64 for ``plan()``'s
    kernels, uint16 where every value fits for the bulk planner (numba compiles one version per dtype).
    Setting every ``head`` to -1 empties the index.
    Pages past the packs opened are never touched."""
    half = 1
    while half < universe:
        half *= 2
    tree = np.full((2 * half, classes, dims), -1, dtype=np.int64)
    head = np.full((universe, 2), -1, dtype=np.int32)
    links = np.empty((max_packs, 3), dtype=np.int32)
    key = np.empty(max_packs, dtype=state.dtype)
    rem2 = np.empty((max_packs, dims), dtype=state.dtype)
    scratch = np.empty((classes, dims), dtype=np.int64)
    meta = np.array([half, cls, classes], dtype=np.int64)
    smax = np.empty((max_packs, dims), dtype=state.dtype)
    return tree, head, links, smax, key, rem2, scratch, meta


WIDE = np.zeros(1, dtype=np.int64)  # ``ix_new``'s state for int64 keys and budgets


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


@njit(cache=True, inline="always")
def _tp_prio(b):
    """The treap priority of pack b: murmur3's finalizer of b times a golden-ratio constant, a bijection on
    32 bits (so no two packs tie)."""
    x = (np.int64(b) * np.int64(0x9E3779B1)) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * np.int64(0x85EBCA6B)) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * np.int64(0xC2B2AE35)) & 0xFFFFFFFF
    return x ^ (x >> 16)


@njit(cache=True, inline="always")
def _tp_fits(rows, x, need):
    for d in range(need.shape[0]):
        if rows[x, d] < need[d]:
            return False
    return True


@njit(cache=True, inline="always")
def _tp_fix(links, rem2, smax, x):
    """smax[x] from x's budgets and its children's maxima; True if it changed."""
    changed = False
    a, c = links[x, 0], links[x, 1]
    for d in range(rem2.shape[1]):
        v = rem2[x, d]
        if a >= 0 and smax[a, d] > v:
            v = smax[a, d]
        if c >= 0 and smax[c, d] > v:
            v = smax[c, d]
        if smax[x, d] != v:
            smax[x, d] = v
            changed = True
    return changed


@njit(cache=True, inline="always")
def _tp_hang(head, links, r, up, left, x):
    """Make x (or nothing, -1) the left or right child of ``up``, or the root of key r when up < 0."""
    if up < 0:
        head[r, 0] = x
    elif left:
        links[up, 0] = x
    else:
        links[up, 1] = x
    if x >= 0:
        links[x, 2] = up


@njit(cache=True)
def ix_insert(ix, b):
    tree, head, links, smax, key, rem2, _, meta = ix
    r = key[b]
    dims = rem2.shape[1]
    for d in range(dims):
        smax[b, d] = rem2[b, d]
    pr = _tp_prio(b)
    x = head[r, 0]
    up = -1
    while x >= 0 and _tp_prio(x) > pr:  # down the right spine: b becomes the newest of x's subtree
        for d in range(dims):
            if smax[x, d] < rem2[b, d]:
                smax[x, d] = rem2[b, d]
        up = x
        x = links[x, 1]
    links[b, 0] = x  # the rest of the spine is older than b and of lower priority: b's left subtree
    links[b, 1] = -1
    if x >= 0:
        links[x, 2] = b
        for d in range(dims):
            if smax[b, d] < smax[x, d]:
                smax[b, d] = smax[x, d]
    _tp_hang(head, links, r, up, False, b)
    head[r, 1] = b
    top = _ix_class(meta, rem2[b])
    node = meta[0] + r
    while node >= 1:  # raise the bounds on the path; stop where they already cover b
        raised = False
        for j in range(top + 1):
            for d in range(dims):
                if tree[node, j, d] < rem2[b, d]:
                    tree[node, j, d] = rem2[b, d]
                    raised = True
        if not raised:
            return
        node >>= 1


@njit(cache=True)
def ix_remove(ix, b):
    tree, head, links, smax, key, rem2, _, meta = ix
    r = key[b]
    up = links[b, 2]
    if head[r, 1] == b:  # the newest goes (it has no newer side): the next newest is the newest of its older
        x = links[b, 0]  # side, else its parent
        if x >= 0:
            while links[x, 1] >= 0:
                x = links[x, 1]
        else:
            x = up
        head[r, 1] = x
    low, left = up, up >= 0 and links[up, 0] == b  # where the next node of the zip hangs
    a, c = links[b, 0], links[b, 1]
    while a >= 0 and c >= 0:  # zip a's right spine (older) and c's left spine (newer) by priority
        if _tp_prio(a) > _tp_prio(c):
            x, a, next_left = a, links[a, 1], False
        else:
            x, c, next_left = c, links[c, 0], True
        _tp_hang(head, links, r, low, left, x)
        low, left = x, next_left
    _tp_hang(head, links, r, low, left, a if a >= 0 else c)
    x = low
    while x != up:  # the zipped nodes have new children
        _tp_fix(links, rem2, smax, x)
        x = links[x, 2]
    while x >= 0 and _tp_fix(links, rem2, smax, x):  # above: only while the maxima change
        x = links[x, 2]
    if head[r, 0] < 0:  # an empty bucket is cheap to make exact
        node = meta[0] + r
        tree[node] = -1
        _ix_pull(tree, node)


@njit(cache=True)
def _tp_newest(root, links, rem2, smax, need):
    """The newest pack of the treap at ``root`` where every budget fits ``need``, or -1."""
    if root < 0 or not _tp_fits(smax, root, need):
        return -1
    x = root
    while True:  # x's subtree may hold a fit: its newer side first, then x, then its older side
        c = links[x, 1]
        if c >= 0 and _tp_fits(smax, c, need):
            x = c
            continue
        if _tp_fits(rem2, x, need):
            return x
        c = links[x, 0]
        if c >= 0 and _tp_fits(smax, c, need):
            x = c
            continue
        # no fit below x after all (its maxima came from different packs): back up to the nearest ancestor
        # reached from its newer side; it and its older side are still to look at
        while True:
            if x == root:
                return -1
            p = links[x, 2]
            if links[p, 1] == x:
                if _tp_fits(rem2, p, need):
                    return p
                c = links[p, 0]
                if c >= 0 and _tp_fits(smax, c, need):
                    x = c
                    break
            x = p


@njit(cache=True)
def _tp_exact(exact, root, links, rem2, meta):
    """exact[j, d] = the largest budget d left among the packs of the treap at ``root`` with at least j of the
    class budget left (-1 where none): an in-order walk by parent links."""
    exact[:] = -1
    x = root
    while links[x, 0] >= 0:
        x = links[x, 0]
    while x >= 0:
        for j in range(_ix_class(meta, rem2[x]) + 1):
            for d in range(rem2.shape[1]):
                exact[j, d] = max(exact[j, d], rem2[x, d])
        if links[x, 1] >= 0:
            x = links[x, 1]
            while links[x, 0] >= 0:
                x = links[x, 0]
        else:
            p = links[x, 2]
            while p >= 0 and links[p, 1] == x:
                x = p
                p = links[x, 2]
            x = p


@njit(cache=True)
def ix_find(ix, lo, need):
    """The pack with the smallest key >= lo where every budget fits ``need`` (the newest such pack of that
    key), or -1."""
    tree, head, links, smax, _, rem2, exact, meta = ix
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
            root = head[node - half, 0]
            b = head[node - half, 1]  # the key's newest pack: the one that fits, most often (a text example's)
            if b < 0 or not _tp_fits(rem2, b, need):
                b = _tp_newest(root, links, rem2, smax, need)
            if b >= 0:
                return b
            if root >= 0:
                _tp_exact(exact, root, links, rem2, meta)
            else:
                exact[:] = -1
            for c in range(exact.shape[0]):  # nothing fits here: the bucket's bounds become exact
                for d in range(dims):
                    tree[node, c, d] = exact[c, d]
            _ix_pull(tree, node)
        while node & 1:  # next subtree to the right: climb while we are a right child
            node >>= 1
        if node == 0:
            return -1
        node += 1


# ----------------------------------------------------------------------------------------------------------
# refine's move: one home for balance.refine_packs, bulk's refine over runs and plan_budgeted's
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def ix_open_all(ix, num_packs, inside):
    """Insert every pack with tokens and example slots left, in pack order (``inside`` marks them)."""
    key, rem2 = ix[4], ix[5]
    for b in range(num_packs):
        if key[b] > 0 and rem2[b, 0] > 0:
            ix_insert(ix, b)
            inside[b] = True


@njit(cache=True)
def refine_next(candidates, c, touched, progress):
    """The first position >= c of ``candidates`` whose pack refine tries (none received a move: their member
    lists are stale), or -1 once refine stops: ``progress`` = [packs, failures in a row, target, patience]."""
    while c < candidates.shape[0]:
        if progress[0] <= progress[2] or progress[1] >= progress[3]:
            return -1
        if not touched[candidates[c]]:
            return c
        c += 1
    return -1


@njit(cache=True)
def refine_try(ix, inside, touched, alive, progress, p, sizes, wants, k, dest):
    """refine's move: take pack ``p`` out of the index and move its k members (tokens ``sizes[:k]``, budgets
    ``wants[:k]``, in that order) each to its best fit among the others. True if every one fits (``dest[:k]``:
    where each went, those packs touched, p dead); else every move is undone, newest first, and p goes back
    in. ``progress`` (``refine_next``) counts either way."""
    key, rem2 = ix[4], ix[5]
    dims = rem2.shape[1]
    p = np.int64(p)  # an int32 candidate: ix_remove/ix_insert compiled for int64 packs only
    if inside[p]:
        ix_remove(ix, p)
        inside[p] = False
    nmoved = 0
    while nmoved < k:
        b = ix_find(ix, sizes[nmoved], wants[nmoved])
        if b < 0:
            break
        ix_remove(ix, b)
        key[b] -= sizes[nmoved]
        for d in range(dims):
            rem2[b, d] -= wants[nmoved, d]
        inside[b] = key[b] > 0 and rem2[b, 0] > 0
        if inside[b]:
            ix_insert(ix, b)
        dest[nmoved] = b
        nmoved += 1
    if nmoved == k:
        for m in range(k):
            touched[dest[m]] = True
        alive[p] = False
        progress[0] -= 1
        progress[1] = 0
        return True
    for m in range(nmoved - 1, -1, -1):
        b = dest[m]
        if inside[b]:
            ix_remove(ix, b)
        key[b] += sizes[m]
        for d in range(dims):
            rem2[b, d] += wants[m, d]
        inside[b] = True
        ix_insert(ix, b)
    if key[p] > 0 and rem2[p, 0] > 0:
        ix_insert(ix, p)
        inside[p] = True
    progress[1] += 1
    return False


def class_column(budgets: np.ndarray, cols: int) -> tuple[int, int]:
    """(column, classes) of the class dimension: the last budget column that is a small count (images come
    last, examples first), or (-1, 1) when there is nothing to split on."""
    if cols < 2:
        return -1, 1  # one budget: per-budget maxima are already exact
    for c in range(cols - 1, -1, -1):
        if budgets[c] <= 64:  # classes x budgets values per tree node stay cheap to update
            return c, int(budgets[c]) + 1
    return -1, 1


@njit(cache=True)
def bfd_general(order, lens, needs, capacity, budgets, cls, classes, init_rem, init_rem2):
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
        for d in range(dims):
            wants[k, d] = needs[order[k], d]
    npre = init_rem.shape[0]
    ix = ix_new(capacity + 1, npre + m, dims, cls, classes, WIDE)
    rem, rem2 = ix[4], ix[5]  # the key is the remaining token count
    chosen = np.empty(m, dtype=np.int64)
    for b in range(npre):
        rem[b] = init_rem[b]
        for d in range(dims):
            rem2[b, d] = init_rem2[b, d]
        if rem[b] > 0 and rem2[b, 0] > 0:
            ix_insert(ix, b)
    num_packs = npre
    for k in range(m):
        s = sizes[k]
        need = wants[k]
        b = ix_find(ix, s, need)
        if b < 0:
            b = num_packs
            num_packs += 1
            rem[b] = capacity
            for d in range(dims):
                rem2[b, d] = budgets[d]
        else:
            ix_remove(ix, b)
        rem[b] -= s
        for d in range(dims):
            rem2[b, d] -= need[d]
        chosen[k] = b
        if rem[b] > 0 and rem2[b, 0] > 0:  # a pack out of tokens or example slots is closed for good
            ix_insert(ix, b)
    assign = np.full(n, -1, dtype=np.int64)
    for k in range(m):
        assign[order[k]] = chosen[k]
    return assign, num_packs


def no_packs(dims: int) -> tuple[np.ndarray, np.ndarray]:
    """``(init_rem, init_rem2)`` for ``bfd_general`` when no pack exists yet."""
    return np.zeros(0, dtype=np.int64), np.zeros((0, dims), dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------
# FFD and next-fit
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def ffd_take(tree, need, half):
    """The first fit in a max segment tree over packs (leaves from ``half``; one row of maxima per node: tokens
    left, then each budget left): the leftmost pack where every entry of ``need`` fits, taken (``need``
    subtracted from its leaf, the maxima above refreshed). Returns the pack. The root must fit (an unused pack)."""
    dims = need.shape[0]
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
        node += 1  # the root always fits, so this never climbs past it
    for d in range(dims):
        tree[node, d] -= need[d]
    b = node - half
    node >>= 1
    while node >= 1:
        for d in range(dims):
            tree[node, d] = max(tree[2 * node, d], tree[2 * node + 1, d])
        node >>= 1
    return b


@njit(cache=True)
def ffd(order, lens, needs, capacity, budgets):
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
        for d in range(1, dims):
            tree[half + b, d] = budgets[d - 1]
    for node in range(half - 1, 0, -1):
        for d in range(dims):
            tree[node, d] = max(tree[2 * node, d], tree[2 * node + 1, d])
    assign = np.empty(n, dtype=np.int64)
    num_packs = 0
    for k in range(n):
        i = order[k]
        need[0] = lens[i]
        for d in range(1, dims):
            need[d] = needs[i, d - 1]
        b = ffd_take(tree, need, half)
        assign[i] = b
        num_packs = max(num_packs, b + 1)
    return assign, num_packs


@njit(cache=True)
def next_fit(lens, needs, capacity, budgets):
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
