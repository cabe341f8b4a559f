"""What the packing achieved: efficiency, distance to the lower bound, and what padding would have cost.

``compute_stats`` runs at the end of a build on lengths and the plan only (no token data) and its result is
``stats.json``; ``format_stats`` turns it into the table ``packer stats`` prints; ``packer.report.plots`` draws it.

For a mixed build, ``sources[name]`` also says how well the mixture holds inside packs: ``share`` is the
source's fraction of all packed examples, ``pack_share_mean`` / ``pack_share_std`` the mean and spread over
packs of its fraction of each pack's examples (equal means: no pack-level skew on average; the spread is
what a single pack deviates by, large when packs hold few examples); ``token_share``, ``loss_token_share``
(weighted where the build has loss weights) and ``pack_share`` its fraction of the tokens, of the loss tokens
and of the packs that hold any of its examples.

A build with loss weights (``"loss": 0.5`` on a message) adds ``weighted_loss_tokens``: the loss tokens' summed
weight, what the token-mean loss divides by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NAIVE_BATCH_SIZES = (8, 32)  # per-batch padding is reported for these batch sizes
HIST_BINS = 20


def padded_tokens_per_batch(lengths: np.ndarray, batch_size: int) -> int:
    """Tokens a padded batch costs when every batch of ``batch_size`` consecutive examples pads to its longest."""
    n = len(lengths)
    if n == 0:
        return 0
    full = n // batch_size * batch_size  # the full batches as a view (no per-example copy), then the rest
    total = batch_size * int(np.asarray(lengths[:full]).reshape(-1, batch_size).max(axis=1).sum(dtype=np.int64))
    if full < n:
        total += (n - full) * int(np.max(lengths[full:]))
    return total


@dataclass(frozen=True)
class LossSums:
    """The loss tokens of the planned examples as ``compute_stats`` reads them, as sums: in all and per source
    code (``of``). A build makes them once its sampling is drawn and lets the per-row column go before the
    planner runs (2 bytes per cache row off the driver's peak, issue 32); the same stats as the column (integer
    sums, any order)."""

    total: int
    by_source: dict[int, int]  # source code (index into the build's source names) -> its loss tokens

    @classmethod
    def of(cls, loss_tokens: np.ndarray, counts: np.ndarray | None, rows: Sequence[int],
           codes: Sequence[int]) -> LossSums:
        """``loss_tokens`` (one per cache row) each planned ``counts`` times (None: once); ``rows`` and ``codes``:
        each chunk's rows and source code, in row order (a chunk's rows are one source's)."""
        spans: list[list[int]] = []  # [code, first row, end] per run of chunks of one source
        a = 0
        for k, code in zip(rows, codes, strict=True):
            if spans and spans[-1][0] == code:
                spans[-1][2] += k
            else:
                spans.append([code, a, a + k])
            a += k
        by_source: dict[int, int] = {}
        for code, a0, a1 in spans:
            for b in range(a0, a1, _BLOCK):
                part = loss_tokens[b : min(a1, b + _BLOCK)].astype(np.int64)
                s = int(part.sum()) if counts is None else int(np.dot(part, counts[b : b + len(part)].astype(np.int64)))
                by_source[code] = by_source.get(code, 0) + s
        return cls(total=sum(by_source.values()), by_source=by_source)


_BLOCK = 1 << 18  # examples per block of ``_per_pack``: its float64 copy is 2 MB, not 8 bytes per example


def _per_pack(values: np.ndarray, order: np.ndarray, bounds: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
    """(P,) float64 sum of ``values`` over each pack's examples ``order[bounds[p]:bounds[p + 1]]``, in order.
    Computed a block of whole packs at a time (reduceat casts its whole input to float64: 8 bytes per example at
    once); each pack's sum is the same sequence of additions either way, so the same bits. ``dtype`` integer
    (integer ``values`` only): the same sums summed as int64 and kept as ``dtype`` (no float64 per pack)."""
    num_packs = len(bounds) - 1
    if np.dtype(dtype).kind in "iu" and values.dtype.kind not in "iub":
        dtype = np.float64
    wide = np.int64 if np.dtype(dtype).kind in "iu" else np.float64
    out = np.zeros(num_packs, dtype=dtype)
    p0 = 0
    while p0 < num_packs:
        b0 = int(bounds[p0])
        p1 = max(p0 + 1, int(np.searchsorted(bounds, b0 + _BLOCK, side="right")) - 1)
        p1 = min(p1, num_packs)
        starts = np.asarray(bounds[p0:p1], dtype=np.int64) - b0
        out[p0:p1] = _fitting(np.add.reduceat(values[order[b0 : int(bounds[p1])]], starts, dtype=wide), out.dtype)
        p0 = p1
    return out


def _narrowest(values: np.ndarray) -> np.ndarray:
    """Non-negative integer ``values`` in the narrowest unsigned dtype that holds their maximum (a copy)."""
    top = int(values.max(initial=0))
    return values.astype(np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.uint32 if top < 2**32
                         else np.uint64)


def _fitting(sums: np.ndarray, dtype: Any) -> np.ndarray:
    """``sums`` (int64 or float64) to be stored as ``dtype``: a ValueError where an integer dtype cannot hold one
    (a pack over the capacity), never a wrapped value."""
    if np.dtype(dtype).kind in "iu" and len(sums) and int(sums.max()) > np.iinfo(dtype).max:
        raise ValueError(f"compute_stats: a pack holds {int(sums.max())}, over its per-pack dtype {np.dtype(dtype)}")
    return sums


def _everyone_mass(loss_mass: np.ndarray) -> Any:
    """The loss mass of every example: an int for integer counts, a float64 sum for weights."""
    return int(loss_mass.sum(dtype=np.int64)) if loss_mass.dtype.kind in "iu" else loss_mass.sum(dtype=np.float64)


def _source_sums(sources: np.ndarray, code: Any, lengths: np.ndarray, loss_tokens: np.ndarray | None,
                 loss_mass: np.ndarray | None, counts: np.ndarray | None = None) -> tuple[int, int, int, int]:
    """(examples, tokens, loss tokens, integer loss mass) of the rows whose source is ``code``, a block of rows
    at a time (a mask of ``_BLOCK`` rows, not of all n); ``counts``: each row's copies (weights)."""
    sums = [0, 0, 0, 0]
    for a in range(0, len(sources), _BLOCK):
        sel = sources[a : a + _BLOCK] == code
        weight = None if counts is None else counts[a : a + _BLOCK].astype(np.int64)
        sums[0] += int(np.count_nonzero(sel)) if weight is None else int(np.add.reduce(weight, where=sel))
        for j, values in enumerate((lengths, loss_tokens, loss_mass), start=1):
            if values is not None:
                block = values[a : a + _BLOCK] if weight is None else values[a : a + _BLOCK] * weight
                sums[j] += int(np.add.reduce(block, where=sel, dtype=np.int64))
    return sums[0], sums[1], sums[2], sums[3]


def _per_pack_located(columns: list[Callable[[np.ndarray], np.ndarray]], order: np.ndarray, bounds: np.ndarray,
                      dtype: Any, sampled: Any) -> list[np.ndarray]:
    """``_per_pack`` (integer sums) of several per-row columns in one pass over the packs: each block's rows
    located once (``Sampled.locate``: a search in its marks and up to 64 steps per planned example, the
    cost of a pass), then each column's values at those rows (``columns``: rows -> values) summed per pack."""
    num_packs = len(bounds) - 1
    outs = [np.zeros(num_packs, dtype=dtype) for _ in columns]
    p0 = 0
    while p0 < num_packs:
        b0 = int(bounds[p0])
        p1 = min(max(p0 + 1, int(np.searchsorted(bounds, b0 + _BLOCK, side="right")) - 1), num_packs)
        starts = np.asarray(bounds[p0:p1], dtype=np.int64) - b0
        rows = sampled.locate(order[b0 : int(bounds[p1])])[0]
        for out, column in zip(outs, columns, strict=True):
            out[p0:p1] = _fitting(np.add.reduceat(column(rows), starts, dtype=np.int64), dtype)
        p0 = p1
    return outs


def _source_per_pack(sources: np.ndarray, code: Any, order: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """(P,) float64 examples of source ``code`` in each pack (whole numbers), a block of whole packs at a time."""
    num_packs = len(bounds) - 1
    out = np.zeros(num_packs, dtype=np.float64)
    p0 = 0
    while p0 < num_packs:
        b0 = int(bounds[p0])
        p1 = min(max(p0 + 1, int(np.searchsorted(bounds, b0 + _BLOCK, side="right")) - 1), num_packs)
        starts = np.asarray(bounds[p0:p1], dtype=np.int64) - b0
        out[p0:p1] = np.add.reduceat(sources[order[b0 : int(bounds[p1])]] == code, starts, dtype=np.int32)
        p0 = p1
    return out


def _std_in_place(values: np.ndarray) -> float:
    """float(values.std()) computed as numpy's ``_var`` computes it (the same operations, so the same bits), with
    the deviations written over ``values`` instead of a float64 copy of it."""
    mean = np.add.reduce(values, keepdims=True)
    np.true_divide(mean, values.shape[0], out=mean)
    np.subtract(values, mean, out=values)
    np.square(values, out=values)
    return float(np.sqrt(np.add.reduce(values) / values.shape[0]))


def _present(sources: np.ndarray, counts: np.ndarray | None = None) -> list[Any]:
    """``np.unique(sources).tolist()`` a block at a time: np.unique sorts a copy and marks it (2 bytes per
    example); ``counts``: only the rows with a copy."""
    present: set[Any] = set()
    for a in range(0, len(sources), _BLOCK):
        block = sources[a : a + _BLOCK]
        present.update(np.unique(block if counts is None else block[counts[a : a + _BLOCK] > 0]).tolist())
    return sorted(present)


def _planned_blocks(values: np.ndarray, counts: np.ndarray | None) -> Iterator[np.ndarray]:
    """The planned examples' ``values`` in input order, ``_BLOCK`` rows at a time (each row ``counts`` times)."""
    for a in range(0, len(values), _BLOCK):
        yield values[a : a + _BLOCK] if counts is None else np.repeat(values[a : a + _BLOCK], counts[a : a + _BLOCK])


def _total(values: np.ndarray, counts: np.ndarray | None) -> int:
    """The integer sum of ``values`` over the planned examples (``int(values.sum())``: integer sums, any order)."""
    if counts is None:
        return int(np.asarray(values).sum())
    return sum(int(np.dot(values[a : a + _BLOCK].astype(np.int64), counts[a : a + _BLOCK].astype(np.int64)))
               for a in range(0, len(values), _BLOCK))


def _summary_rows(values: np.ndarray, counts: np.ndarray, n: int) -> dict[str, float]:
    """``_summary`` of the planned examples' integer ``values``: the min and max of the rows with a copy, the
    mean as numpy's (a float64 sum of whole numbers below 2**53 is exact: the integer total over n)."""
    if n == 0:
        return {"min": 0, "mean": 0.0, "max": 0}
    lo, hi = None, None
    for a in range(0, len(values), _BLOCK):
        block = values[a : a + _BLOCK][counts[a : a + _BLOCK] > 0]
        if len(block):
            lo = int(block.min()) if lo is None else min(lo, int(block.min()))
            hi = int(block.max()) if hi is None else max(hi, int(block.max()))
    return {"min": lo, "mean": float(np.float64(_total(values, counts)) / n), "max": hi}


def _hist_rows(values: np.ndarray, counts: np.ndarray, lo: float, hi: float) -> dict[str, list]:
    """``_hist`` of the planned examples' ``values`` (each row ``counts`` times) over a fixed range: each row's
    bin is its value's, weighted by its copies, a block of rows at a time."""
    out = _hist(values[:0], lo, hi)
    for a in range(0, len(values), _BLOCK):
        block, _ = np.histogram(values[a : a + _BLOCK], bins=HIST_BINS, range=(lo, hi if hi > lo else lo + 1),
                                weights=counts[a : a + _BLOCK].astype(np.int64))
        out["counts"] = [int(c) + int(d) for c, d in zip(out["counts"], block, strict=True)]
    return out


def _padded_rows(values: np.ndarray, counts: np.ndarray, batch_size: int) -> int:
    """``padded_tokens_per_batch`` of the planned examples, made a block of rows at a time (a batch that
    straddles two blocks carried over)."""
    total, carry = 0, values[:0]
    for block in _planned_blocks(values, counts):
        block = np.concatenate([carry, block]) if len(carry) else block
        full = len(block) // batch_size * batch_size
        total += padded_tokens_per_batch(block[:full], batch_size)
        carry = block[full:]
    return total + padded_tokens_per_batch(carry, batch_size)


def _hist_blocks(pack_tokens: np.ndarray, capacity: int) -> dict[str, list]:
    """``_hist(pack_tokens / capacity, 0.0, 1.0)`` a block of packs at a time (a fixed range: the same edges, and
    counts add up), not a float64 copy of every pack's fill."""
    out = _hist(pack_tokens[:_BLOCK] / capacity, 0.0, 1.0)
    for a in range(_BLOCK, len(pack_tokens), _BLOCK):
        counts, _ = np.histogram(pack_tokens[a : a + _BLOCK] / capacity, bins=HIST_BINS, range=(0.0, 1.0))
        out["counts"] = [int(c) + int(d) for c, d in zip(out["counts"], counts, strict=True)]
    return out


def _summary(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": int(values.min()), "mean": float(values.mean()), "max": int(values.max())}


def _hist(values: np.ndarray, lo: float, hi: float, bins: int = HIST_BINS) -> dict[str, list]:
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi if hi > lo else lo + 1))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def compute_stats(
    *,
    lengths: np.ndarray,
    vision: np.ndarray | None,
    pack_ids: np.ndarray | None = None,
    capacity: int,
    packs: tuple[np.ndarray, np.ndarray] | None = None,
    loss_tokens: np.ndarray | LossSums,
    loss_weight: np.ndarray | None = None,
    sources: np.ndarray | None = None,
    source_names: list[str] | None = None,
    input_records: int = 0,
    rejects: list[dict[str, Any]] | None = None,
    image_units: tuple[str, np.ndarray, np.ndarray] | None = None,
    video: np.ndarray | None = None,
    videos: np.ndarray | None = None,
    audio: np.ndarray | None = None,
    audio_seconds: np.ndarray | None = None,
    audios: np.ndarray | None = None,
    sampled: Any = None,
) -> dict[str, Any]:
    """Statistics of one plan; every array is per packed example, in input order.

    ``loss_weight``: each example's summed loss weight (None or equal to ``loss_tokens``: unweighted).
    ``image_units``: (name, units per example, units per image) where the family counts its images in units
    the vision tower runs on (``ImageRule.units``: InternVL's tiles); stats then hold
    ``image_units`` = {"name", "total", "per_pack", "per_image"} (min/mean/max). ``video``: the video tokens
    among ``vision``; a build with any adds ``video_tokens`` / ``image_tokens`` and their per-pack spreads
    (a build without video keeps the keys it always had). ``videos``: videos per example, given by a build
    with a video budget (``max_videos``): stats then hold ``videos`` and ``videos_per_pack`` (min/mean/max).
    ``audio``, ``audio_seconds``, ``audios``: audio tokens, seconds (what the loader yields) and clips per
    example; a build with any clip adds ``audio_tokens``, ``audio_seconds``, ``audio_clips``, their per-pack
    spreads (``audio_tokens_per_pack`` with its std, ``audio_seconds_per_pack``, ``audio_clips_per_pack``) and
    ``hist_audio_per_pack`` (audio tokens per pack); a build without audio keeps the keys it always had.

    The plan comes as ``pack_ids`` (n,) or as ``packs`` = (order, bounds) (``packing.bulk.PackOrder``: pack p
    holds examples ``order[bounds[p]:bounds[p + 1]]``, 4 bytes per example, what a build passes). ``vision``
    None: no vision token. ``source_names``: ``sources`` are indices into it (one byte per example), not names;
    with ``sources`` None, one name: every example is that source's.

    ``sampled`` (``packing.mixing.Sampled``, with ``packs``): ``lengths``, ``vision``, ``loss_tokens``,
    ``loss_weight`` and ``sources`` are per cache row, each planned ``sampled.counts`` times (what a build with
    up-sampled copies holds: no per-planned-example copy of them, issue 32); the same stats as their
    ``sampled.planned`` arrays. The other arrays stay per planned example.

    ``loss_tokens`` as ``LossSums`` (no loss weights; ``sources`` as codes into ``source_names``): the same stats
    from the sums a build made before its plan.
    """
    rejects = rejects or []
    sums = loss_tokens if isinstance(loss_tokens, LossSums) else None
    if sums is not None and loss_weight is not None:
        raise ValueError("compute_stats: LossSums stand for unweighted loss tokens only")
    if sampled is not None and loss_weight is not None:  # a float sum's bits depend on its order: as planned
        lengths, vision, loss_tokens, loss_weight, sources = (
            None if v is None else sampled.planned(np.asarray(v))
            for v in (lengths, vision, loss_tokens, loss_weight, sources))
        sampled = None
    counts = None if sampled is None else sampled.counts  # (rows,) copies per row, or None: one each
    lengths = np.asarray(lengths)  # any integer dtype: a build passes uint16 (2 bytes per example)
    n = len(lengths) if sampled is None else sampled.num_planned  # planned examples
    if packs is not None:
        order, bounds = packs
        num_packs = len(bounds) - 1
        # examples per pack in the narrowest unsigned dtype that holds the largest (1 byte per pack in a build
        # of short examples, not int32's 4: the same summaries, histograms and shares, issue 32)
        pack_examples = _narrowest(np.diff(np.asarray(bounds)))

        def per_pack(values: np.ndarray, dtype: Any = np.float64) -> np.ndarray:  # float64: as bincount's
            return _per_pack(np.asarray(values), order, bounds, dtype)
    else:
        num_packs = int(pack_ids.max()) + 1 if len(pack_ids) else 0
        pack_examples = np.bincount(pack_ids, minlength=num_packs)

        def per_pack(values: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
            return np.bincount(pack_ids, weights=values, minlength=num_packs)
        if sampled is not None:
            raise ValueError("compute_stats: sampled needs packs=(order, bounds), not pack_ids")
    # per-pack totals (<= capacity) as uint16 where the capacity fits, else int32: a build of short examples has
    # a pack per ~10 examples, and each int64 per-pack array cost ~1 byte per example at the driver's peak (the
    # same summaries and histograms; a pack over the capacity is an error, not a wrapped sum)
    per_pack_dtype = np.uint16 if capacity < 2**16 else np.int32 if capacity < 2**31 else np.int64
    if sampled is not None:  # tokens and vision tokens per pack in one pass: each planned example located once
        located = _per_pack_located([lambda rows: lengths[rows]] + ([] if vision is None else [lambda rows: vision[rows]]),
                                    order, bounds, per_pack_dtype, sampled)
        pack_tokens = located.pop(0)
    else:
        pack_tokens = per_pack(lengths, per_pack_dtype).astype(per_pack_dtype, copy=False)
    tokens_per_pack, hist_fill = _summary(pack_tokens), _hist_blocks(pack_tokens, capacity)
    del pack_tokens  # not held beside the vision tokens' per-pack arrays
    if sampled is not None:
        pack_vision = located.pop() if located else np.zeros(num_packs, dtype=per_pack_dtype)
    else:
        pack_vision = (np.zeros(num_packs, dtype=per_pack_dtype) if vision is None
                       else per_pack(vision, per_pack_dtype).astype(per_pack_dtype, copy=False))
    tokens = _total(lengths, counts)
    lower_bound = -(-tokens // capacity)
    slots = num_packs * capacity
    stats: dict[str, Any] = {
        "capacity": capacity,
        "input_records": int(input_records),
        "rejected": len(rejects),
        "rejects_by_reason": dict(sorted(Counter(r["reason"] for r in rejects).items())),
        "examples": int(n),
        "packs": num_packs,
        "tokens": tokens,
        "loss_tokens": sums.total if sums is not None else _total(np.asarray(loss_tokens), counts),
        "vision_tokens": 0 if vision is None else _total(np.asarray(vision), counts),
        "efficiency": tokens / slots if slots else 0.0,
        "lower_bound_packs": int(lower_bound),
        "packs_over_lower_bound": int(num_packs - lower_bound),
        "examples_per_pack": _summary(pack_examples),
        "tokens_per_pack": tokens_per_pack,
        # the std of a float64 copy, in place: numpy's own float64 deviations would be one more (the same bits)
        "vision_tokens_per_pack": {**_summary(pack_vision),
                                   "std": _std_in_place(pack_vision.astype(np.float64)) if num_packs else 0.0},
        "example_length": _summary(lengths) if counts is None else _summary_rows(lengths, counts, n),
        "hist_fill": hist_fill,
        "hist_examples_per_pack": _hist(pack_examples, 0.5, float(pack_examples.max(initial=1)) + 0.5,
                                         bins=int(pack_examples.max(initial=1))),
        "hist_vision_per_pack": _hist(pack_vision, 0.0, float(pack_vision.max(initial=1))),
        "hist_example_length": (_hist(lengths, 0.0, float(capacity)) if counts is None
                                else _hist_rows(lengths, counts, 0.0, float(capacity))),
        "padding": {
            "packed_slots": slots,
            "fixed_length_slots": int(n) * capacity,
            **{
                f"naive_batch{b}_slots": (padded_tokens_per_batch(lengths, b) if counts is None
                                          else _padded_rows(lengths, counts, b))
                for b in NAIVE_BATCH_SIZES
            },
        },
    }
    weighted = (loss_weight is not None and len(loss_weight)
                and not np.array_equal(np.asarray(loss_weight, dtype=np.float64), np.asarray(loss_tokens, np.float64)))
    loss_mass = None if sums is not None else np.asarray(loss_weight if weighted else loss_tokens)  # (n,) what the loss counts
    if weighted:
        stats["weighted_loss_tokens"] = float(loss_mass.sum())
    if image_units is not None:
        name, per_example, per_image = image_units
        pack_units = per_pack(per_example).astype(np.int64)
        stats["image_units"] = {"name": name, "total": int(np.asarray(per_example).sum()),
                                "per_pack": _summary(pack_units), "per_image": _summary(np.asarray(per_image))}
    if video is not None and np.asarray(video).sum():
        video = np.asarray(video, dtype=np.int64)
        pack_video = per_pack(video).astype(np.int64)
        pack_image = pack_vision - pack_video
        stats["video_tokens"] = int(video.sum())
        stats["image_tokens"] = stats["vision_tokens"] - stats["video_tokens"]
        stats["video_tokens_per_pack"] = {**_summary(pack_video), "std": float(pack_video.std()) if num_packs else 0.0}
        stats["image_tokens_per_pack"] = {**_summary(pack_image), "std": float(pack_image.std()) if num_packs else 0.0}
    if videos is not None:
        pack_videos = per_pack(videos).astype(np.int64)
        stats["videos"] = int(np.asarray(videos).sum())
        stats["videos_per_pack"] = _summary(pack_videos)
    if audios is not None and np.asarray(audios).sum():
        audio_pp = {name: per_pack(np.asarray(values, dtype=np.float64))
                    for name, values in (("tokens", audio), ("seconds", audio_seconds), ("clips", audios))}
        stats["audio_tokens"] = int(np.asarray(audio).sum())
        stats["audio_seconds"] = float(np.asarray(audio_seconds, dtype=np.float64).sum())
        stats["audio_clips"] = int(np.asarray(audios).sum())
        tokens_pp = audio_pp["tokens"].astype(np.int64)
        stats["audio_tokens_per_pack"] = {**_summary(tokens_pp), "std": float(tokens_pp.std())}
        seconds_pp = audio_pp["seconds"]
        stats["audio_seconds_per_pack"] = {"min": float(seconds_pp.min()), "mean": float(seconds_pp.mean()),
                                           "max": float(seconds_pp.max()), "std": float(seconds_pp.std())}
        stats["audio_clips_per_pack"] = _summary(audio_pp["clips"].astype(np.int64))
        stats["hist_audio_per_pack"] = _hist(tokens_pp, 0.0, float(tokens_pp.max(initial=1)))
    if source_names is not None and sources is None:  # every example is source_names[0]'s (no array)
        codes: dict[str, Any] = {source_names[0]: None} if len(source_names) == 1 and n else {}
    elif source_names is not None:
        codes = {source_names[c]: c for c in _present(sources, counts)}
    else:
        codes = {} if sources is None else {name: name for name in set(sources[counts > 0].tolist()
                                                                          if counts is not None else sources.tolist())}
    if n and any(codes):
        del pack_vision  # in the stats already: not held beside the per-source pass
        per_source: dict[str, dict[str, Any]] = {}
        denominator = pack_examples if pack_examples.min(initial=1) >= 1 else np.maximum(pack_examples, 1)
        # every example's loss mass and its float64 total (integer counts per row: the weighted integer sum)
        # (a float64 sum of whole numbers below 2**53 is exact: the integer total, as LossSums hold it)
        exact = counts is not None or sums is not None
        everyone_mass = stats["loss_tokens"] if exact else _everyone_mass(loss_mass)
        mass_total = np.float64(stats["loss_tokens"]) if exact else loss_mass.sum(dtype=np.float64)
        ordered = sorted(codes)
        pending: dict[str, np.ndarray] = {}  # sampled: per-pack counts of up to 4 sources located in one pass
        for k, name in enumerate(ordered):
            everyone = codes[name] is None or len(codes) == 1
            # The rows' sums and the per-pack counts a block at a time: no (n,) mask of the source (1 byte per
            # example) nor float64 per-pack sums beside the shares; integer sums, so the same numbers.
            if everyone:
                examples, source_tokens, source_loss = (n, tokens, stats["loss_tokens"])
                in_pack = pack_examples.astype(np.float64)
            elif sums is not None:
                examples, source_tokens, _, _ = _source_sums(sources, codes[name], lengths, None, None, counts)
                source_loss = source_mass = sums.by_source.get(codes[name], 0)
            else:
                integer_mass = loss_mass.dtype.kind in "iu"
                examples, source_tokens, source_loss, source_mass = _source_sums(
                    sources, codes[name], lengths, np.asarray(loss_tokens), loss_mass if integer_mass else None, counts)
            if not everyone:
                if sums is None and not integer_mass:  # a float sum's bits depend on its order: the selected copy, as ever
                    source_mass = loss_mass[sources == codes[name]].sum(dtype=np.float64)
                if sampled is not None:
                    if name not in pending:  # pack_examples' dtype per pack each (a source's share of a pack)
                        group = ordered[k : k + 4]
                        pending = dict(zip(group, _per_pack_located(
                            [lambda rows, c=codes[g]: sources[rows] == c for g in group], order, bounds,
                            pack_examples.dtype, sampled), strict=True))
                    in_pack = pending.pop(name).astype(np.float64)
                else:
                    in_pack = (_source_per_pack(sources, codes[name], order, bounds) if packs is not None
                               else np.bincount(pack_ids[sources == codes[name]], minlength=num_packs).astype(np.float64))
            packs_with = int(np.count_nonzero(in_pack))
            np.divide(in_pack, denominator, out=in_pack)  # this source's share of each pack's examples
            mean = float(in_pack.mean()) if num_packs else 0.0
            per_source[name] = {
                "examples": examples,
                "tokens": source_tokens,
                "loss_tokens": source_loss,
                "token_share": float(source_tokens / max(tokens, 1)),
                "loss_token_share": (float((everyone_mass if everyone else source_mass) / mass_total)
                                     if mass_total else 0.0),
                "packs": packs_with,
                "pack_share": packs_with / num_packs if num_packs else 0.0,
                "rejected": sum(1 for r in rejects if r.get("source") == name),
                "share": 1.0 if everyone else float(np.float64(examples) / np.float64(n)),
                "pack_share_mean": mean,
                "pack_share_std": _std_in_place(in_pack) if num_packs else 0.0,
            }
            del in_pack  # not held beside the next source's
        stats["sources"] = per_source
    return stats


def naive_batches(padding: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, batch size) of the naive-padding entries, by batch size (stats.json sorts keys as strings)."""
    keys = [k for k in padding if k.startswith("naive_batch")]
    return [(k, k.removeprefix("naive_batch").removesuffix("_slots"))
            for k in sorted(keys, key=lambda k: int(k.removeprefix("naive_batch").removesuffix("_slots")))]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def format_stats(stats: dict[str, Any]) -> str:
    """The human-readable table of ``packer stats``."""
    cap = stats["capacity"]
    tokens = stats["tokens"]
    pad = stats["padding"]
    epp, tpp = stats["examples_per_pack"], stats["tokens_per_pack"]
    rows: list[tuple[str, str]] = [
        ("input records", f"{stats['input_records']:,}"),
        ("rejected", f"{stats['rejected']:,}" + (
            "  (" + ", ".join(f"{k}: {v}" for k, v in stats["rejects_by_reason"].items()) + ")"
            if stats["rejects_by_reason"] else "")),
        ("packed examples", f"{stats['examples']:,}"),
        ("packs", f"{stats['packs']:,}  (capacity {cap:,} tokens)"),
        ("tokens", f"{tokens:,}"),
        ("loss tokens", f"{stats['loss_tokens']:,}  ({_pct(stats['loss_tokens'] / tokens) if tokens else '-'})"
         + (f", weighted {stats['weighted_loss_tokens']:,.1f}" if "weighted_loss_tokens" in stats else "")),
        ("vision tokens", f"{stats['vision_tokens']:,}" + (
            f"  (images {stats['image_tokens']:,}, videos {stats['video_tokens']:,})" if "video_tokens" in stats else "")),
        ("packing efficiency", _pct(stats["efficiency"])),
        ("lower bound", f"{stats['lower_bound_packs']:,} packs  (+{stats['packs_over_lower_bound']:,} over it)"),
        ("examples / pack", f"min {epp['min']}  mean {epp['mean']:.2f}  max {epp['max']}"),
        ("tokens / pack", f"min {tpp['min']:,}  mean {tpp['mean']:,.0f}  max {tpp['max']:,}"),
    ]
    if "image_units" in stats:
        u = stats["image_units"]
        for label, s in ((f"{u['name']} / pack", u["per_pack"]), (f"{u['name']} / image", u["per_image"])):
            rows.append((label, f"min {s['min']}  mean {s['mean']:.2f}  max {s['max']}"))
    for kind in ("image", "video"):
        if f"{kind}_tokens_per_pack" in stats:
            per = stats[f"{kind}_tokens_per_pack"]
            rows.append((f"{kind} tokens / pack", f"min {per['min']:,}  mean {per['mean']:,.0f}  max {per['max']:,}"
                         f"  std {per['std']:,.0f}"))
    if "videos_per_pack" in stats:
        s = stats["videos_per_pack"]
        rows.append(("videos / pack", f"min {s['min']}  mean {s['mean']:.2f}  max {s['max']}"))
    if "audio_tokens" in stats:
        rows.append(("audio", f"{stats['audio_clips']:,} clips, {stats['audio_seconds']:,.1f} s, "
                              f"{stats['audio_tokens']:,} tokens"))
        per = stats["audio_tokens_per_pack"]
        rows.append(("audio tokens / pack", f"min {per['min']:,}  mean {per['mean']:,.0f}  max {per['max']:,}"
                     f"  std {per['std']:,.0f}"))
        sec = stats["audio_seconds_per_pack"]
        rows.append(("audio seconds / pack", f"min {sec['min']:.1f}  mean {sec['mean']:.1f}  max {sec['max']:.1f}"))
        s = stats["audio_clips_per_pack"]
        rows.append(("audio clips / pack", f"min {s['min']}  mean {s['mean']:.2f}  max {s['max']}"))
    for key, label in naive_batches(pad):
        slots = pad[key]
        rows.append((f"naive padding, batch {label}", f"{slots:,} slots, {_pct(1 - tokens / slots) if slots else '-'} padding"
                     f"  ({slots / pad['packed_slots']:.2f}x packer's)" if pad["packed_slots"] else ""))
    fixed = pad["fixed_length_slots"]
    if fixed:
        rows.append(("fixed-length padding", f"{fixed:,} slots, {_pct(1 - tokens / fixed)} padding"
                     f"  ({fixed / max(pad['packed_slots'], 1):.2f}x packer's)"))
    for name, s in stats.get("sources", {}).items():
        mix = (f"; {_pct(s['share'])} of examples, per pack {_pct(s['pack_share_mean'])} +- {_pct(s['pack_share_std'])}"
               if "share" in s else "")  # stats.json of builds before the mixture keys existed
        rows.append((f"source {name}", f"{s['examples']:,} examples, {s['tokens']:,} tokens, {s['rejected']:,} rejected{mix}"))
        if "token_share" in s:  # stats.json of builds before the share keys existed lack them
            rows.append(("", f"{_pct(s['token_share'])} of tokens, {_pct(s['loss_token_share'])} of loss tokens"
                             f"{' (weighted)' if 'weighted_loss_tokens' in stats else ''}, in {s['packs']:,} packs "
                             f"({_pct(s['pack_share'])})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
