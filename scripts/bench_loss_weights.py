"""What per-token loss weights cost the encoder: the same chats encoded unweighted and with every assistant turn
weighted (``"loss": 0.5``, so the loss rule runs once more per batch), and with two weights (twice more), in one
process, interleaved, median of ``--repeats``; ratios to the unweighted run printed. And what the normalizations
add to ``packed_cross_entropy`` on a (T, V) row of trees: each weighting x prefix's coefficients (``loss_count``,
the part that differs) against the whole token-mean loss.

    python scripts/bench_loss_weights.py --records 4000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def chats(n: int, weights: list[float | None]) -> list[dict]:
    rng = np.random.default_rng(0)
    words = "a cat dog red bus on the street near two people with an umbrella sitting in kitchen table".split()
    out = []
    for i in range(n):
        turns = []
        for t in range(1 + i % 3):
            turns.append({"role": "user", "content": " ".join(rng.choice(words, 5 + i % 40))})
            msg = {"role": "assistant", "content": " ".join(rng.choice(words, 10 + (i * 7) % 120))}
            w = weights[t % len(weights)]
            if w is not None:
                msg["loss"] = w
            turns.append(msg)
        out.append({"messages": turns})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from packer.config import BuildConfig
    from packer.formats import parse_record
    from packer.pipeline.stages import make_encoder

    encoder = make_encoder(BuildConfig.from_inputs(["x.jsonl"], "out", profile="text", max_length=8192))
    kinds = {"unweighted": [None], "one weight": [0.5], "two weights": [0.5, 2.0]}
    examples = {k: [parse_record(r, path="x.jsonl", line=i + 1, base_dir=".") for i, r in enumerate(chats(args.records, w))]
                for k, w in kinds.items()}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for k, ex in examples.items():
            t = time.perf_counter()
            for i in range(0, len(ex), 64):
                encoder.encode_batch(ex[i : i + 64])
            times[k].append(time.perf_counter() - t)
    base = statistics.median(times["unweighted"])
    for k, v in times.items():
        m = statistics.median(v)
        print(f"encode {k:<12} {m:7.3f} s  ({args.records / m:,.0f} records/s)  {m / base:.2f}x unweighted")

    import torch

    from packer.train.trainers.loss import PREFIXES, WEIGHTINGS, loss_count, packed_cross_entropy

    T, V = 4096, 32000
    rng = np.random.default_rng(1)
    starts = np.sort(rng.choice(np.arange(1, T), 63, replace=False))
    cu = torch.tensor([0, *starts.tolist(), T])
    offsets, parents = [], []
    for e in range(64):  # each example: a prefix and two branches
        a, b = int(cu[e]), int(cu[e + 1])
        if b - a >= 3:
            base_n = len(offsets)
            offsets += [a, a + (b - a) // 3, a + 2 * (b - a) // 3]
            parents += [-1, base_n, base_n]
        else:
            offsets.append(a)
            parents.append(-1)
    labels = torch.randint(0, V, (T,))
    labels[cu[:-1]] = -100
    meta = {"cu_seqlens": cu, "node_offsets": torch.tensor(offsets), "node_parents": torch.tensor(parents)}
    logits = torch.randn(T, V)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        packed_cross_entropy(logits, labels, meta)
        runs.append(time.perf_counter() - t)
    full = statistics.median(runs)
    print(f"packed_cross_entropy token/once on ({T}, {V}) fp32 logits: {1000 * full:.1f} ms")
    for prefix in PREFIXES:
        for weighting in WEIGHTINGS:
            runs = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                loss_count(labels, meta, weighting=weighting, prefix=prefix)
                runs.append(time.perf_counter() - t)
            m = statistics.median(runs)
            print(f"coefficients {weighting:<8} {prefix:<5} {1000 * m:6.2f} ms  ({m / full:.1%} of the loss)")


if __name__ == "__main__":
    main()
