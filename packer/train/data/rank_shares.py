"""Equal and balanced rank shares of an epoch: every rank the same number of rows, and at every step rows of
near-equal compute cost on every rank.

Why: under DDP/FSDP every step ends in an all-reduce. A rank with one batch more waits there for peers that
have finished the epoch (a hang), and at each step the rank with the costliest rows sets the pace.

1. ``pad_order``: the epoch order grows to a multiple of W with *filler* rows (copies of the epoch's first
   rows whose labels the reader sets to -100), or shrinks to one with ``drop_last``.
2. ``deal``: the padded order becomes a (W, N) matrix, rank r reading row r. Position p of every rank lands in
   the same step and batch slot, because every rank has N rows and the same DataLoader (workers, batch size)
   splits and interleaves N positions the same way. So balancing a step is balancing a column: within each
   window of ``W * window`` consecutive rows of the order, rows are sorted by cost and cut into groups of W
   neighbours (near-equal cost); the groups are shuffled (so the step order stays random) and each group is
   one column, its rows dealt to the ranks in a random order.

       window (W=2, window=3):  costs  9 1 5 8 2 6     sorted  1 2 | 5 6 | 8 9
       groups shuffled:  [8 9] [1 2] [5 6]  ->  rank 0: 9 1 6   rank 1: 8 2 5     (step costs 9/8, 1/2, 6/5)

   A window is a contiguous piece of the (row-group-ordered) epoch order, so a reader decodes each row group
   once per window, not once per row; what an epoch covers does not change (a permutation per window).

The cost model (``CostWeights``) is a training step's FLOPs in units of one token's linear layers:
``row + token * T + attention * sum(len^2) + vision * vision_tokens``, from the shards' ``num_tokens``,
``cu_seqlens`` and ``num_vision_tokens`` columns.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import numpy as np

from packer.shards.assemble import list_column
from packer.shards.io import ShardSet


@dataclass(frozen=True)
class CostWeights:
    """Weights of ``row_costs``: cost = row + token * tokens + attention * sum(len^2) + vision * vision_tokens.

    Defaults, for a decoder of L layers, width d and P parameters (training FLOPs: 6P per token for the
    linear layers, 6 L d len^2 for causal attention of one example of len tokens): attention = L d / P,
    ~1/32768 for 0.5B-7B models (Qwen2-1.5B: 28 * 1536 / 1.5e9 = 1 / 35000), i.e. an example of 32k tokens
    costs twice its linear cost. ``vision``: Qwen2-VL's 675M vision tower runs 4 patches per vision token, i.e.
    4 * 0.675 / 1.5 = 1.8 LLM tokens of a 2B model, 0.4 of a 7B one; 1.0 sits between. ``row``: a fixed
    per-row cost (kernel launches), 0.
    """

    row: float = 0.0
    token: float = 1.0
    attention: float = 1.0 / 32768
    vision: float = 1.0

    def as_list(self) -> list[float]:
        return [float(x) for x in astuple(self)]


@dataclass(frozen=True)
class RowStats:
    """Per-row cost inputs of a shard set, in global row order (shards, then rows)."""

    num_tokens: np.ndarray  # (n,) int64
    sum_len2: np.ndarray  # (n,) int64, sum over the row's examples of len^2
    vision_tokens: np.ndarray  # (n,) int64

    def costs(self, weights: CostWeights) -> np.ndarray:
        """(n,) float64 cost of each row (see ``CostWeights``)."""
        return (weights.row + weights.token * self.num_tokens + weights.attention * self.sum_len2
                + weights.vision * self.vision_tokens)


def read_row_stats(shards: ShardSet) -> RowStats:
    """Read only the three small columns the cost needs (``cu_seqlens`` has E+1 values per row)."""
    tokens, sq, vision = [], [], []
    for s in range(len(shards.shards)):
        table = shards.parquet(s).read(columns=["num_tokens", "num_vision_tokens", "cu_seqlens"])
        off, cu = list_column(table, "cu_seqlens")
        lens = np.diff(cu.astype(np.int64))  # (sum E + n - 1,): the steps between rows are junk, dropped below
        lens[off[1:-1] - 1] = 0  # the difference across two rows' cu lists (last of one, first of the next)
        per_row = np.add.reduceat(lens**2, off[:-1]) if len(lens) else np.zeros(len(off) - 1, np.int64)
        per_row[np.diff(off) <= 1] = 0  # reduceat gives the next value for empty ranges
        tokens.append(table.column("num_tokens").to_numpy().astype(np.int64))
        vision.append(table.column("num_vision_tokens").to_numpy().astype(np.int64))
        sq.append(per_row)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))  # noqa: E731
    return RowStats(cat(tokens), cat(sq), cat(vision))


def pad_order(order: np.ndarray, world_size: int, *, drop_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The epoch order made a multiple of ``world_size`` long: (rows, filler), filler True on added rows.

    Fillers repeat the order from its start (cyclically if there are fewer rows than ranks); ``drop_last``
    drops the order's last ``n % world_size`` rows instead.

        pad_order([4, 0, 3, 1, 2], 4)  ->  rows [4 0 3 1 2 4 0 3], filler [F F F F F T T T]
    """
    n = len(order)
    size = (n // world_size if drop_last else math.ceil(n / world_size)) * world_size
    rows = np.resize(order, size) if n else np.zeros(0, np.int64)  # resize repeats cyclically
    filler = np.arange(size) >= n
    return rows.astype(np.int64), filler


def deal(costs: np.ndarray, world_size: int, *, window: int, rng: np.random.Generator | None) -> np.ndarray:
    """Positions of a padded order (length a multiple of W) dealt to the ranks: (W, N), rank r reads row r.

    ``costs`` are the padded order's row costs. Each window of ``W * window`` consecutive positions is sorted
    by cost and cut into groups of W; a group is one column (the same step on every rank). ``rng`` shuffles
    the groups and the ranks within a group (None: cost order, rank 0 the cheapest; deterministic).
    """
    n, w = len(costs), world_size
    cols = []
    for start in range(0, n, w * window):
        stop = min(n, start + w * window)
        by_cost = start + np.argsort(costs[start:stop], kind="stable")  # (k*W,)
        groups = by_cost.reshape(-1, w)  # (k, W): W neighbours in cost per group
        if rng is not None:
            groups = groups[rng.permutation(len(groups))]
            groups = np.take_along_axis(groups, rng.permuted(np.tile(np.arange(w), (len(groups), 1)), axis=1), 1)
        cols.append(groups)
    return np.concatenate(cols).T if cols else np.zeros((w, 0), np.int64)


def loader_steps(num_positions: int, batch_size: int, num_workers: int) -> list[np.ndarray]:
    """The rank positions of each step a ``DataLoader(batch_size, num_workers)`` yields over ``num_positions``.

    Worker w batches its contiguous slice; the DataLoader takes one batch per worker in turn, skipping
    workers that are done (what torch's multi-worker iterator does for an ``IterableDataset``). The same on
    every rank when every rank has the same number of rows: that is what lets ``deal`` balance steps.
    """
    workers = max(num_workers, 1)
    per_worker = []
    for wk in range(workers):
        lo, hi = num_positions * wk // workers, num_positions * (wk + 1) // workers
        per_worker.append([np.arange(a, min(a + batch_size, hi)) for a in range(lo, hi, batch_size)])
    steps = []
    for k in range(max((len(b) for b in per_worker), default=0)):
        steps += [b[k] for b in per_worker if k < len(b)]
    return steps


def straggler_ratio(step_costs: np.ndarray) -> tuple[float, float]:
    """(mean over steps, worst step) of max / mean cost over ranks; ``step_costs`` is (steps, W)."""
    if step_costs.size == 0:
        return 1.0, 1.0
    mean = step_costs.mean(axis=1)
    ratio = np.where(mean > 0, step_costs.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
    return float(ratio.mean()), float(ratio.max())
