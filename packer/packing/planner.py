"""Global bin-packing of example lengths into packs (the planner).

Only lengths travel here: ``plan`` takes one int per example (tokens) and optionally an (n, k) cost matrix of
per-pack budgets with their (k,) limits (``packing.budgets``), and returns one pack id per example. Pack ids are numbered in the seeded, shuffled order the writer
emits them, so ``pack 0`` is the first row of the first shard. Pure: no I/O, no torch, no global RNG.

Algorithms (``algorithm=``):

- ``bfd`` (default) best-fit decreasing. Lengths are counting-sorted (O(n + C)), then each example goes to the
  open pack with the *smallest* remaining capacity that still fits it. Open packs sit in per-capacity bucket
  lists indexed by a 64-ary bitset over capacities 0..C, so "smallest capacity >= s" is one or two word
  operations: O(n log64 C) overall, compiled with numba (``kernels.py``).
- ``ffd`` first-fit decreasing (a max segment tree over packs; O(n log n)).
- ``next-fit`` keeps input order and opens a new pack whenever the next example does not fit (a streaming
  baseline, like ``DataCollatorWithFlattening`` fed in order).
- ``binpacking`` the PyPI ``binpacking.to_constant_volume`` (quadratic; a reference, not for real builds).

Extra per-pack budgets (the columns of ``costs``: vision tokens, image, video and clip counts, audio tokens;
and examples per pack) are feasibility constraints: the planner still best-fits on tokens but only among packs where every budget holds.
That path keeps per-capacity maxima of each remaining budget in a segment tree and searches it depth-first
(still compiled, near O(n log C)).

``refine=True`` tries harder: on the tokens-only BFD path it also runs BFD with exact completion (a fresh pack
is closed exactly instead of stranding a gap nothing short enough will fill) and keeps the plan with fewer
packs; then, for any algorithm, it tries to empty the least-filled packs into the others' free space.
``balance_vision=True`` evens out the vision tokens per pack for at most 0.1% more packs (``balance.py``).

Speed, memory and fill rate against the lower bounds, on synthetic and real length histograms:
docs/benchmarks.md (``scripts/bench_packing.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from packer.errors import ConfigError
from packer.packing import ALGORITHMS
from packer.packing.budgets import check_costs, counts_tokens, from_named, noun

# Stand-in budget for an unset constraint: larger than any real total, small enough that sums never overflow.
_UNBOUNDED = np.int64(1) << np.int64(60)


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------


def plan(
    lengths: np.ndarray,
    capacity: int,
    *,
    costs: np.ndarray | None = None,
    limits: Sequence[int | None] = (),
    names: Sequence[str] = (),
    algorithm: str = "bfd",
    max_examples: int | None = None,
    balance: int | None = None,
    refine: bool = False,
    seed: int = 0,
    **named: Any,
) -> np.ndarray:
    """Assign every example to a pack; return int64 pack ids numbered in the seeded shuffled write order.

    Args:
        lengths: (n,) tokens per example, each in [1, capacity].
        capacity: tokens per pack (the build's ``max_length``).
        costs: (n, k) what each example costs of k per-pack budgets besides tokens (vision tokens, images,
            videos, audio tokens, clips: ``core.media.BUDGETS``, ``packing.budgets``); each >= 0.
        limits: (k,) at most ``limits[j]`` of column j per pack; None = unbounded (a column kept for
            ``balance`` or for its checks only).
        names: (k,) the knob each column's limit comes from (``max_vision_tokens``), named by errors; a name in
            ``BUDGETS`` that counts tokens must stay within the example's length.
        algorithm: ``bfd`` (default), ``ffd``, ``next-fit`` or ``binpacking``.
        max_examples: at most this many examples per pack (``max_examples_per_pack``).
        balance: a column of ``costs`` to spread evenly over the packs (vision tokens: same-ish pack count,
            lower spread per pack, so no rank gets all the image-heavy rows).
        refine: also try BFD with exact completion (tokens-only ``bfd``) and keep the better plan, then try
            to empty the least-filled packs into the others' free space. Never more packs; costs ~2x.
        seed: seed of the pack shuffle (``np.random.default_rng(seed)``).
        named: the per-medium keywords ``plan`` took before the cost matrix, still accepted: a count array
            and its limit per budget (``vision``/``vision_budget``, ``images``/``max_images``, ...:
            ``packing.budgets.NAMED``) and ``balance_vision``.

    Returns:
        (n,) int64 pack id per example, numbered 0..P-1 in write order.

    Example (capacity 10; BFD puts 6+4 and 5+3+2 together, then the seeded shuffle numbers the packs)::

        >>> plan(np.array([6, 5, 4, 3, 2]), 10, seed=0)
        array([0, 1, 0, 1, 1])
        >>> plan(np.array([6, 5, 4, 3, 2]), 10, costs=np.array([[1], [1], [0], [0], [1]]), limits=[1],
        ...      names=["max_images"], seed=0)  # one image per pack: 6, 5 and 2 apart
        array([2, 0, 2, 0, 1])

    Measured fill rate (``efficiency``), against ``lower_bound`` and ``lower_bound_l2``: docs/benchmarks.md
    (``scripts/bench_packing.py``).
    """
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"'algorithm' must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    lens = _int_array(lengths, "lengths")
    n = lens.shape[0]
    if named:
        if costs is not None or limits or balance is not None:
            raise ConfigError("give the budgets as costs=/limits= or as the named keywords, not both")
        cols, limits, names, balance = from_named(named, lambda values, keyword: _int_array(values, keyword, n))
        costs = np.stack(cols, axis=1) if cols else None
    limits = list(limits)
    names = list(names) if names else [f"costs[:, {j}]" for j in range(len(limits))]
    capacity = _positive_int(capacity, "capacity (max_length)")
    cost = check_costs(costs, limits, names, n)
    for value, knob in (*zip(limits, names, strict=True), (max_examples, "max_examples_per_pack")):
        if value is not None:
            _positive_int(value, knob)
    if balance is not None and not 0 <= balance < len(limits):
        raise ConfigError(f"'balance' must be a column of costs (0..{len(limits) - 1}), got {balance}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # numba is imported here, at the first plan, not with this module: reading ALGORITHMS (config, cli)
    # must not cost its ~0.3 s import.
    from packer.packing import balance as balancing
    from packer.packing import kernels

    _check_fits(lens, capacity, "tokens", "capacity", "max_length", lower=1)
    for j, (limit, name) in enumerate(zip(limits, names, strict=True)):
        _check_fits(cost[:, j], limit, noun(name), name, name, lower=0)
        if counts_tokens(name) and (cost[:, j] > lens).any():  # vision/audio tokens are part of the example's
            i = int(np.argmax(cost[:, j] > lens))
            raise ConfigError(f"example {i} has {cost[i, j]} {noun(name)} but only {lens[i]} tokens in all")

    bounded = [j for j, limit in enumerate(limits) if limit is not None]
    constrained = bool(bounded) or max_examples is not None
    vis = None if balance is None else cost[:, balance]
    fast = algorithm == "bfd" and not constrained and not refine and vis is None
    if fast:  # tokens-only BFD: the length-class planner makes the same plan, ids included, in less memory
        from packer.packing.bulk import plan_bulk

        return plan_bulk(lens, capacity, seed=seed).pack_ids()
    # Budget columns for the kernels: 0 = examples (always), then the bounded cost columns in order.
    needs = np.ascontiguousarray(np.concatenate([np.ones((n, 1), dtype=np.int64), cost[:, bounded]], axis=1))
    budgets = np.array([_UNBOUNDED if max_examples is None else max_examples] + [limits[j] for j in bounded],
                       dtype=np.int64)

    if algorithm == "bfd":
        if constrained:
            order = kernels.order_decreasing(lens, capacity)
            cls, classes = kernels.class_column(budgets, needs.shape[1])
            assign, num_packs = kernels.bfd_general(
                order, lens, needs, capacity, budgets, cls, classes, *kernels.no_packs(needs.shape[1])
            )
        elif refine:
            # Refine first tries BFD with exact completion and keeps whichever plan has fewer packs.
            assign, num_packs = kernels.bfd_fast(lens, capacity, 0)
            other, other_packs = kernels.bfd_fast(lens, capacity, _completion_threshold(lens))
            if other_packs < num_packs:
                assign, num_packs = other, other_packs
        else:
            assign, num_packs = kernels.bfd_fast(lens, capacity, 0)
    elif algorithm == "ffd":
        assign, num_packs = kernels.ffd(kernels.order_decreasing(lens, capacity), lens, needs, capacity, budgets)
    elif algorithm == "next-fit":
        assign, num_packs = kernels.next_fit(lens, needs, capacity, budgets)
    else:
        if constrained:
            knobs = ", ".join([names[j] for j in bounded] + ["max_examples_per_pack"] * (max_examples is not None))
            raise ConfigError(f"algorithm 'binpacking' only knows the token budget; unset {knobs}, "
                              "or use algorithm 'bfd'")
        assign, num_packs = _binpacking_library(lens, capacity)

    if vis is not None and vis.any():
        vision_col = 1 + bounded.index(balance) if balance in bounded else -1
        assign, num_packs = balancing.balanced(lens, vis, needs, capacity, budgets, assign, num_packs, vision_col)
    if refine:
        assign, num_packs = balancing.refine_packs(assign, num_packs, lens, needs, capacity, budgets)

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


def _completion_threshold(lens: np.ndarray) -> int:
    """Gaps shorter than the 2nd percentile of the lengths rarely get filled (measured best on the Wikipedia
    histogram, 25-30 tokens, and harmless from 20 to 80 on the lognormal set)."""
    return max(1, int(np.percentile(lens, 2)))


# ----------------------------------------------------------------------------------------------------------
# The reference library
# ----------------------------------------------------------------------------------------------------------


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
