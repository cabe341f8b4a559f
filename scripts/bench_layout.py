#!/usr/bin/env python
"""Per-batch layout costs on CPU: what a training step pays before attention runs (docs/benchmarks.md).

    python scripts/bench_layout.py

Rows: 21 or 84 caption trees (a 300-token prefix + 5 branches of 15 tokens: 8k / 32k tokens) and a linear
row of 32 examples in 8192 tokens. Times are CPU time (``time.process_time``), best of 5, 1 torch thread,
so they hold on a shared machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.core.tree import tree_position_ids  # noqa: E402
from packer.train.attention.layout import PackedLayout  # noqa: E402
from packer.train.trainers.loss import loss_targets  # noqa: E402


def best(fn, n: int, reps: int = 5) -> float:
    """Seconds per call: the best of ``reps`` runs of ``n`` calls."""
    times = []
    for _ in range(reps):
        t = time.process_time()
        for _ in range(n):
            fn()
        times.append((time.process_time() - t) / n)
    return min(times)


def tree_row(trees: int, prefix: int = 300, branches: int = 5, branch_len: int = 15):
    offsets, parents, cu, pos = [], [], [0], 0
    for _ in range(trees):
        root = len(offsets)
        offsets.append(pos)
        parents.append(-1)
        pos += prefix
        for _ in range(branches):
            offsets.append(pos)
            parents.append(root)
            pos += branch_len
        cu.append(pos)
    return pos, np.array(cu, np.int32), np.array(offsets, np.int32), np.array(parents, np.int32)


def linear_row(tokens: int = 8192, examples: int = 32):
    cu = np.linspace(0, tokens, examples + 1).astype(np.int32)
    return tokens, cu, cu[:-1].copy(), np.full(examples, -1, np.int32)


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = {"8k tree row (21 trees, 126 nodes)": tree_row(21), "8k linear row (32 examples)": linear_row(),
            "32k tree row (84 trees, 504 nodes)": tree_row(84)}
    for name, (T, cu, off, par) in rows.items():
        labels = torch.from_numpy(np.where(rng.random(T) < 0.3, 5, -100))
        labels[cu[:-1]] = -100
        batch = {"input_ids": torch.zeros(1, T, dtype=torch.long), "cu_seqlens": torch.from_numpy(cu),
                 "node_offsets": torch.from_numpy(off), "node_parents": torch.from_numpy(par)}
        layout = best(lambda b=batch: PackedLayout.from_batch(b), 200)
        plan = best(lambda b=batch: PackedLayout.from_batch(b).varlen_plan("cpu"), 20)
        loss = best(lambda b=batch, y=labels: loss_targets(y, PackedLayout.from_batch(b)), 50)
        print(f"{name:36s} layout {layout * 1e3:7.3f} ms   layout + varlen plan {plan * 1e3:8.3f} ms   "
              f"layout + loss targets {loss * 1e3:7.3f} ms")
    T, _, off, par = tree_row(1)
    print(f"tree_position_ids of one 6-node example: {best(lambda: tree_position_ids(T, off, par), 5000) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
