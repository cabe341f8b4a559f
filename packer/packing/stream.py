"""On-the-fly packing: pack an (endless) iterable of examples with a bounded pool, no global plan.

The offline planner (``packing.plan``) sees every length at once; a streaming loader only sees what it has
read. ``pack_stream`` keeps a pool of at most ``pool_size`` examples; when the pool is full it plans the
pool with the same planner, emits the packs that are full enough and keeps the examples of the partial
packs for the next round, where newly read examples can fill the gaps (the buffer-and-repack scheme of
Molmo2 and nanoVLM). At the end of the input everything left is planned once more and emitted.

How close it gets to the offline plan for each pool size is measured in docs/benchmarks.md ("On-the-fly
packing"): a pool of 10,000 is within a few packs per million examples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np

from packer.errors import ConfigError
from packer.packing.planner import plan

T = TypeVar("T")


# Per-example counts a pack may budget: (pack_stream's and the planner's count keyword, budget keyword, what
# the count is, what its budget is called, the config knob to raise). Counts and budgets are named as in
# ``packing.plan``.
_BUDGETS = (
    ("vision", "vision_budget", "vision tokens", "vision budget", "max_vision_tokens"),
    ("images", "max_images", "images", "image budget", "max_images"),
    ("videos", "max_videos", "videos", "video budget", "max_videos"),
    ("audio", "max_audio_tokens", "audio tokens", "audio-token budget", "max_audio_tokens"),
    ("audios", "max_audios", "audio clips", "audio-clip budget", "max_audios"),
)


def pack_stream(
    examples: Iterable[T],
    *,
    capacity: int,
    pool_size: int = 1000,
    length: Callable[[T], int] = len,
    vision: Callable[[T], int] | None = None,
    vision_budget: int | None = None,
    images: Callable[[T], int] | None = None,
    max_images: int | None = None,
    videos: Callable[[T], int] | None = None,
    max_videos: int | None = None,
    audio: Callable[[T], int] | None = None,
    max_audio_tokens: int | None = None,
    audios: Callable[[T], int] | None = None,
    max_audios: int | None = None,
    max_examples: int | None = None,
    algorithm: str = "bfd",
    refine: bool = False,
    seed: int = 0,
    min_fill: float = 0.99,
    max_wait: int = 8,
    on_round: Callable[[int, list[T], list[int]], None] | None = None,
    resume: tuple[int, list[T], list[int]] | None = None,
) -> Iterator[list[T]]:
    """Yield packs (lists of examples, in arrival order) whose lengths sum to at most ``capacity``.

    Args:
        examples: any iterable; read lazily, at most ``pool_size`` examples held at once.
        capacity: tokens per pack.
        pool_size: examples planned together; larger packs tighter and holds more in memory.
        length: tokens of an example (default ``len``).
        vision: vision tokens of an example; with ``vision_budget``, at most that many per pack.
        vision_budget: vision-token budget per pack (needs ``vision``).
        images: images of an example; with ``max_images``, at most that many per pack.
        max_images: image budget per pack (needs ``images``).
        videos: videos of an example; with ``max_videos``, at most that many per pack.
        max_videos: video budget per pack (needs ``videos``).
        audio: audio tokens of an example; with ``max_audio_tokens``, at most that many per pack.
        max_audio_tokens: audio-token budget per pack (needs ``audio``).
        audios: audio clips of an example; with ``max_audios``, at most that many per pack.
        max_audios: audio-clip budget per pack (needs ``audios``).
        max_examples: at most this many examples per pack.
        algorithm: planner used on the pool (see ``packing.plan``).
        refine: the planner's ``refine`` (see ``packing.plan``).
        seed: seed of round r's plan is ``seed + r``; the output is deterministic for a given input.
        min_fill: a planned pack at least this full is emitted; fuller-first, emptier ones wait for the next
            round, as long as the waiting examples fit in half the pool.
        max_wait: an example held back this many rounds is emitted with its pack however full, so no
            example waits for the end of the input.
        on_round: called as ``on_round(r, pool, ages)`` just before round r plans its pool (the last round
            too): with ``resume`` this is everything needed to continue exactly (``train/online.py``).
        resume: ``(r, pool, ages)`` as ``on_round`` saw them: start at round r with that pool;
            ``examples`` are then the examples read after the pool's. The packs are those the
            uninterrupted stream yields from round r on.

    Every example is emitted exactly once. Raises ``ConfigError`` for an example longer than ``capacity``
    (or over any budget) when it is read.
    """
    if pool_size < 1:
        raise ConfigError(f"'pool_size' must be a positive integer, got {pool_size}")
    given = {"vision": (vision, vision_budget), "images": (images, max_images), "videos": (videos, max_videos),
             "audio": (audio, max_audio_tokens), "audios": (audios, max_audios)}
    active = []  # (count function, budget, its _BUDGETS entry) of each budget set
    for spec in _BUDGETS:
        count, budget = given[spec[0]]
        if budget is not None:
            if count is None:
                raise ConfigError(f"'{spec[1]}' is set but no `{spec[0]}` function gives the {spec[2]}")
            active.append((count, budget, spec))
    if not 0.0 <= min_fill <= 1.0:
        raise ConfigError(f"'min_fill' must be in [0, 1], got {min_fill}")
    keep_at_most = pool_size // 2  # leftovers never crowd out new examples
    options = {"max_examples": max_examples, "algorithm": algorithm, "refine": refine}
    names = [(spec[0], spec[1], budget) for _, budget, spec in active]

    def counts(example: T) -> tuple[int, ...]:  # (tokens, then each budgeted count)
        return (int(length(example)), *(int(count(example)) for count, _, _ in active))

    pool: list[T] = list(resume[1]) if resume else []
    rows: list[tuple[int, ...]] = [counts(e) for e in pool]
    age: list[int] = list(resume[2]) if resume else []  # rounds each pooled example has already been held back
    rnd = resume[0] if resume else 0
    seen = 0

    def full_rounds():  # a resumed full pool is planned first, as it was when it filled up
        nonlocal pool, rows, age, rnd
        while len(pool) >= pool_size:
            if on_round is not None:
                on_round(rnd, pool, age)
            packs, kept = _round(rows, age, capacity, names, options, seed + rnd, min_fill, max_wait, keep_at_most)
            rnd += 1
            for members in packs:
                yield [pool[i] for i in members]
            pool = [pool[i] for i in kept]
            rows = [rows[i] for i in kept]
            age = [age[i] + 1 for i in kept]

    yield from full_rounds()
    for example in examples:
        row = counts(example)
        if not 1 <= row[0] <= capacity:
            raise ConfigError(
                f"example {seen} of the stream has {row[0]} tokens; each needs 1..capacity ({capacity}) tokens: "
                "raise 'max_length' or drop/truncate it"
            )
        for value, (_, budget, (_, _, what, called, knob)) in zip(row[1:], active, strict=True):
            if value > budget:
                raise ConfigError(f"example {seen} of the stream has {value} {what} > {called} {budget}: "
                                  f"raise '{knob}' or drop it")
        seen += 1
        pool.append(example)
        rows.append(row)
        age.append(0)
        yield from full_rounds()
    if pool:  # end of input: everything goes
        if on_round is not None:
            on_round(rnd, pool, age)
        packs, _ = _round(rows, age, capacity, names, options, seed + rnd, 0.0, 0, len(pool))
        for members in packs:
            yield [pool[i] for i in members]


def _round(
    rows: list[tuple[int, ...]],
    age: list[int],
    capacity: int,
    names: list[tuple[str, str, int]],
    options: dict,
    seed: int,
    min_fill: float,
    max_wait: int,
    keep_at_most: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Plan the pool (``rows``: tokens then the budgeted counts of each example; ``names``: each count's and
    budget's planner keyword and the budget); return (packs to emit, each as pool indices ascending; pool
    indices kept)."""
    table = np.asarray(rows, dtype=np.int64).reshape(len(rows), 1 + len(names))
    lengths = table[:, 0]
    budgets = {}
    for j, (count, budget_name, budget) in enumerate(names, start=1):
        budgets[count], budgets[budget_name] = table[:, j], budget
    ids = plan(lengths, capacity, seed=seed, **budgets, **options)
    num_packs = int(ids.max()) + 1
    fill = np.bincount(ids, weights=lengths, minlength=num_packs) / capacity
    count = np.bincount(ids, minlength=num_packs)
    overdue = np.zeros(num_packs, dtype=bool)
    if max_wait > 0:
        overdue[ids[np.asarray(age) >= max_wait]] = True
    # Fullest first (ties: planned order); hold back the emptiest packs while their examples fit the budget.
    by_fill = np.lexsort((np.arange(num_packs), -fill))
    hold = np.zeros(num_packs, dtype=bool)
    held = 0
    for p in by_fill[::-1]:  # emptiest first
        if fill[p] >= min_fill or overdue[p] or held + count[p] > keep_at_most:
            break
        hold[p] = True
        held += int(count[p])
    order = np.argsort(ids, kind="stable")  # pool indices grouped by pack, ascending inside a pack
    members = np.split(order, np.cumsum(count)[:-1])
    emitted = [members[p] for p in range(num_packs) if not hold[p]]
    kept = np.flatnonzero(hold[ids])
    return emitted, kept
