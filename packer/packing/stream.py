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

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from packer.errors import ConfigError
from packer.packing.budgets import from_named, noun
from packer.packing.planner import plan

T = TypeVar("T")


def pack_stream(
    examples: Iterable[T],
    *,
    capacity: int,
    pool_size: int = 1000,
    length: Callable[[T], int] = len,
    costs: Callable[[T], Sequence[int]] | None = None,
    limits: Sequence[int | None] = (),
    names: Sequence[str] = (),
    max_examples: int | None = None,
    algorithm: str = "bfd",
    refine: bool = False,
    seed: int = 0,
    min_fill: float = 0.99,
    max_wait: int = 8,
    on_round: Callable[[int, list[T], list[int]], None] | None = None,
    resume: tuple[int, list[T], list[int]] | None = None,
    **named: Any,
) -> Iterator[list[T]]:
    """Yield packs (lists of examples, in arrival order) whose lengths sum to at most ``capacity``.

    Args:
        examples: any iterable; read lazily, at most ``pool_size`` examples held at once.
        capacity: tokens per pack.
        pool_size: examples planned together; larger packs tighter and holds more in memory.
        length: tokens of an example (default ``len``).
        costs: an example's k costs against the per-pack budgets (``packing.plan``'s cost matrix, one row).
        limits: (k,) at most ``limits[j]`` of cost j per pack; None = unbounded (the column is dropped).
        names: (k,) the knob each limit comes from, named by errors (``max_vision_tokens``).
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
        named: ``plan``'s old named budgets with functions for counts (``vision=``/``vision_budget=``,
            ``images=``/``max_images=``, ...), still accepted.

    Every example is emitted exactly once. Raises ``ConfigError`` for an example longer than ``capacity``
    (or over any budget) when it is read.
    """
    if pool_size < 1:
        raise ConfigError(f"'pool_size' must be a positive integer, got {pool_size}")
    if named:
        if costs is not None or limits:
            raise ConfigError("give the budgets as costs=/limits= or as the named keywords, not both")
        functions, limits, names, _ = from_named(named, lambda function, keyword: function)

        def costs(example: T) -> tuple[int, ...]:
            return tuple(f(example) for f in functions)

    names = list(names) if names else [f"costs[{j}]" for j in range(len(limits))]
    if len(names) != len(limits):
        raise ConfigError(f"'names' has {len(names)} entries but there are {len(limits)} limits")
    if limits and costs is None:
        raise ConfigError("'limits' are set but no `costs` function gives an example's costs")
    active = [j for j, limit in enumerate(limits) if limit is not None]  # the budgets the pool is planned with
    bound = [limits[j] for j in active]
    if not 0.0 <= min_fill <= 1.0:
        raise ConfigError(f"'min_fill' must be in [0, 1], got {min_fill}")
    keep_at_most = pool_size // 2  # leftovers never crowd out new examples
    options = {"max_examples": max_examples, "algorithm": algorithm, "refine": refine, "limits": bound,
               "names": [names[j] for j in active]}

    def counts(example: T) -> tuple[int, ...]:  # (tokens, then each budgeted cost)
        if not active:
            return (int(length(example)),)
        row = costs(example)
        return (int(length(example)), *(int(row[j]) for j in active))

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
            packs, kept = _round(rows, age, capacity, options, seed + rnd, min_fill, max_wait, keep_at_most)
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
        for value, limit, name in zip(row[1:], bound, options["names"], strict=True):
            if value > limit:
                raise ConfigError(f"example {seen} of the stream has {value} {noun(name)} > {name} {limit}: "
                                  f"raise '{name}' or drop it")
        seen += 1
        pool.append(example)
        rows.append(row)
        age.append(0)
        yield from full_rounds()
    if pool:  # end of input: everything goes
        if on_round is not None:
            on_round(rnd, pool, age)
        packs, _ = _round(rows, age, capacity, options, seed + rnd, 0.0, 0, len(pool))
        for members in packs:
            yield [pool[i] for i in members]


def _round(
    rows: list[tuple[int, ...]],
    age: list[int],
    capacity: int,
    options: dict,
    seed: int,
    min_fill: float,
    max_wait: int,
    keep_at_most: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Plan the pool (``rows``: tokens then the budgeted costs of each example; ``options``: the planner's
    limits and names among them); return (packs to emit, each as pool indices ascending; pool indices kept)."""
    table = np.asarray(rows, dtype=np.int64).reshape(len(rows), 1 + len(options["limits"]))  # (n, 1 + k)
    lengths = table[:, 0]
    ids = plan(lengths, capacity, seed=seed, costs=table[:, 1:], **options)
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
