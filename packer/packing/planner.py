"""Global bin-packing of example lengths into packs (the planner).

Only lengths travel here: ``plan`` takes one int per example (tokens, and optionally vision tokens and image
counts) and returns one pack id per example. Pack ids are numbered in the seeded, shuffled order the writer
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

Extra per-pack budgets (vision tokens, image, video and clip counts, audio tokens, examples per pack) are
feasibility constraints: the planner still best-fits on tokens but only among packs where every budget holds.
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

import numpy as np

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
    videos: np.ndarray | None = None,
    max_videos: int | None = None,
    audio: np.ndarray | None = None,
    max_audio_tokens: int | None = None,
    audios: np.ndarray | None = None,
    max_audios: int | None = None,
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
        videos: (n,) videos per example; needed for ``max_videos``.
        max_videos: at most this many videos per pack.
        audio: (n,) audio tokens per example (part of ``lengths``); needed for ``max_audio_tokens``.
        max_audio_tokens: at most this many audio tokens per pack (the audio encoder's work).
        audios: (n,) audio clips per example; needed for ``max_audios``.
        max_audios: at most this many clips per pack.
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

    Measured fill rate (``efficiency``), against ``lower_bound`` and ``lower_bound_l2``: docs/benchmarks.md
    (``scripts/bench_packing.py``).
    """
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"'algorithm' must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    lens = _int_array(lengths, "lengths")
    n = lens.shape[0]
    capacity = _positive_int(capacity, "capacity (max_length)")
    vis = None if vision is None else _int_array(vision, "vision", n)
    imgs = None if images is None else _int_array(images, "images", n)
    vids = None if videos is None else _int_array(videos, "videos", n)
    aud = None if audio is None else _int_array(audio, "audio", n)
    clips = None if audios is None else _int_array(audios, "audios", n)
    for value, knob in ((vision_budget, "max_vision_tokens"), (max_images, "max_images"),
                        (max_videos, "max_videos"), (max_audio_tokens, "max_audio_tokens"),
                        (max_audios, "max_audios"), (max_examples, "max_examples_per_pack")):  # fmt: skip
        if value is not None:
            _positive_int(value, knob)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # numba is imported here, at the first plan, not with this module: reading ALGORITHMS (config, cli)
    # must not cost its ~0.3 s import.
    from packer.packing import balance, kernels

    _check_fits(lens, capacity, "tokens", "capacity", "max_length", lower=1)
    if vis is not None:
        _check_fits(vis, None, "vision tokens", "", "", lower=0)
        if (vis > lens).any():  # vision tokens are part of the example's tokens
            i = int(np.argmax(vis > lens))
            raise ConfigError(f"example {i} has {vis[i]} vision tokens but only {lens[i]} tokens in all")
    if imgs is not None:
        _check_fits(imgs, None, "images", "", "", lower=0)
    if vids is not None:
        _check_fits(vids, None, "videos", "", "", lower=0)
    if aud is not None:
        _check_fits(aud, None, "audio tokens", "", "", lower=0)
        if (aud > lens).any():  # audio tokens are part of the example's tokens
            i = int(np.argmax(aud > lens))
            raise ConfigError(f"example {i} has {aud[i]} audio tokens but only {lens[i]} tokens in all")
    if clips is not None:
        _check_fits(clips, None, "audio clips", "", "", lower=0)

    constrained = any(b is not None for b in (vision_budget, max_images, max_videos, max_audio_tokens, max_audios,
                                              max_examples))
    fast = algorithm == "bfd" and not constrained and not refine and not (balance_vision and vis is not None)
    # The fast path needs no budget columns; skip building an (n, 1) array of ones for it.
    needs, budgets = _constraints(0 if fast else n, vis, vision_budget, imgs, max_images, max_examples,
                                  vids=vids, max_videos=max_videos, audio=aud, max_audio_tokens=max_audio_tokens,
                                  audios=clips, max_audios=max_audios)
    if fast:  # tokens-only BFD: the length-class planner makes the same plan, ids included, in less memory
        from packer.packing.bulk import plan_bulk

        return plan_bulk(lens, capacity, seed=seed).pack_ids()

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
            raise ConfigError(
                "algorithm 'binpacking' only knows the token budget; unset max_vision_tokens, max_images, "
                "max_videos, max_audio_tokens, max_audios and max_examples_per_pack, or use algorithm 'bfd'"
            )
        assign, num_packs = _binpacking_library(lens, capacity)

    if balance_vision and vis is not None and vis.any():
        vision_col = 1 if vision_budget is not None else -1  # budget columns: examples, vision, images
        assign, num_packs = balance.balanced(lens, vis, needs, capacity, budgets, assign, num_packs, vision_col)
    if refine:
        assign, num_packs = balance.refine_packs(assign, num_packs, lens, needs, capacity, budgets)

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
    *,
    vids: np.ndarray | None = None,
    max_videos: int | None = None,
    audio: np.ndarray | None = None,
    max_audio_tokens: int | None = None,
    audios: np.ndarray | None = None,
    max_audios: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Secondary per-pack budgets as columns: 0 = examples (always), then vision tokens, images, videos, audio
    tokens, audio clips (those set)."""
    cols = [np.ones(n, dtype=np.int64)]
    budgets = [_UNBOUNDED if max_examples is None else _positive_int(max_examples, "max_examples_per_pack")]
    for limit, values, key, noun, what, label in (
        (vision_budget, vis, "max_vision_tokens", "vision token", "vision tokens", "vision budget"),
        (max_images, imgs, "max_images", "image", "images", "max_images"),
        (max_videos, vids, "max_videos", "video", "videos", "max_videos"),
        (max_audio_tokens, audio, "max_audio_tokens", "audio token", "audio tokens", "audio budget"),
        (max_audios, audios, "max_audios", "audio clip", "audio clips", "max_audios"),
    ):
        if limit is None:
            continue
        budget = _positive_int(limit, key)
        if values is None:
            raise ConfigError(f"'{key}' is set but no per-example {noun} counts were given")
        _check_fits(values, budget, what, label, key, lower=0)
        cols.append(values[:n])
        budgets.append(budget)
    return np.ascontiguousarray(np.stack(cols, axis=1)), np.array(budgets, dtype=np.int64)


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
