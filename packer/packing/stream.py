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


def pack_stream(
    examples: Iterable[T],
    *,
    capacity: int,
    pool_size: int = 1000,
    length: Callable[[T], int] = len,
    vision: Callable[[T], int] | None = None,
    vision_budget: int | None = None,
    max_examples: int | None = None,
    algorithm: str = "bfd",
    seed: int = 0,
    min_fill: float = 0.99,
    max_wait: int = 8,
) -> Iterator[list[T]]:
    """Yield packs (lists of examples, in arrival order) whose lengths sum to at most ``capacity``.

    Args:
        examples: any iterable; read lazily, at most ``pool_size`` examples held at once.
        capacity: tokens per pack.
        pool_size: examples planned together; larger packs tighter and holds more in memory.
        length: tokens of an example (default ``len``).
        vision: vision tokens of an example; with ``vision_budget``, at most that many per pack.
        vision_budget: vision-token budget per pack (needs ``vision``).
        max_examples: at most this many examples per pack.
        algorithm: planner used on the pool (see ``packing.plan``).
        seed: seed of round r's plan is ``seed + r``; the output is deterministic for a given input.
        min_fill: a planned pack at least this full is emitted; fuller-first, emptier ones wait for the next
            round, as long as the waiting examples fit in half the pool.
        max_wait: an example held back this many rounds is emitted with its pack however full, so no
            example waits for the end of the input.

    Every example is emitted exactly once. Raises ``ConfigError`` for an example longer than ``capacity``
    (or over the vision budget) when it is read.
    """
    if pool_size < 1:
        raise ConfigError(f"'pool_size' must be a positive integer, got {pool_size}")
    if vision_budget is not None and vision is None:
        raise ConfigError("'vision_budget' is set but no `vision` function gives the vision tokens")
    if not 0.0 <= min_fill <= 1.0:
        raise ConfigError(f"'min_fill' must be in [0, 1], got {min_fill}")
    keep_at_most = pool_size // 2  # leftovers never crowd out new examples
    pool: list[T] = []
    lens: list[int] = []
    vis: list[int] = []
    age: list[int] = []  # rounds each pooled example has already been held back
    rnd = 0
    seen = 0
    for example in examples:
        n = int(length(example))
        v = int(vision(example)) if vision is not None else 0
        if not 1 <= n <= capacity:
            raise ConfigError(
                f"example {seen} of the stream has {n} tokens; each needs 1..capacity ({capacity}) tokens: "
                "raise 'max_length' or drop/truncate it"
            )
        if vision_budget is not None and v > vision_budget:
            raise ConfigError(
                f"example {seen} of the stream has {v} vision tokens > vision budget {vision_budget}: "
                "raise 'max_vision_tokens' or drop it"
            )
        seen += 1
        pool.append(example)
        lens.append(n)
        vis.append(v)
        age.append(0)
        if len(pool) < pool_size:
            continue
        packs, kept = _round(lens, vis, age, capacity, vision_budget, max_examples, algorithm, seed + rnd,
                             min_fill, max_wait, keep_at_most)  # fmt: skip
        rnd += 1
        for members in packs:
            yield [pool[i] for i in members]
        pool = [pool[i] for i in kept]
        lens = [lens[i] for i in kept]
        vis = [vis[i] for i in kept]
        age = [age[i] + 1 for i in kept]
    if pool:  # end of input: everything goes
        packs, _ = _round(lens, vis, age, capacity, vision_budget, max_examples, algorithm, seed + rnd,
                          0.0, 0, len(pool))  # fmt: skip
        for members in packs:
            yield [pool[i] for i in members]


def _round(
    lens: list[int],
    vis: list[int],
    age: list[int],
    capacity: int,
    vision_budget: int | None,
    max_examples: int | None,
    algorithm: str,
    seed: int,
    min_fill: float,
    max_wait: int,
    keep_at_most: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Plan the pool; return (packs to emit, each as pool indices ascending; pool indices kept)."""
    lengths = np.asarray(lens, dtype=np.int64)
    vision = np.asarray(vis, dtype=np.int64) if vision_budget is not None else None
    ids = plan(lengths, capacity, algorithm=algorithm, vision=vision, vision_budget=vision_budget,
               max_examples=max_examples, seed=seed)  # fmt: skip
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
