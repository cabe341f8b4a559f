"""Straggler ratio of data-parallel steps, before (contiguous rank slices) and after ``PackedDataset``'s
per-step balancing, on three real builds made in a temp dir:

- ``coco``: the COCO caption-tree demo (scripts/coco_to_jsonl.py + configs/coco-caption-trees.yaml);
- ``text``: text conversations of lognormal length (median 300 tokens, sigma 1), packed into 4096 tokens;
- ``mixed``: the COCO caption trees and those text conversations in one build (4096 tokens).

The straggler ratio of a step is max / mean over ranks of the step's cost (``CostWeights`` defaults: tokens,
sum len^2 / 32768, vision tokens); a step's cost on a rank is the sum of its batch's rows. Reported: the mean
over steps and the worst step, over ``--epochs`` epochs, for each world size W, with the DataLoader
``--batch-size`` and ``--workers`` (steps as ``packer.train.data.rank_shares.loader_steps`` lays them out).

    python scripts/bench_balance.py --coco /work/shared/data/coco-mini
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packer.config import BuildConfig  # noqa: E402
from packer.pipeline.build import build  # noqa: E402
from packer.train.data.dataset import PackedDataset  # noqa: E402
from packer.train.data.rank_shares import loader_steps, read_row_stats, straggler_ratio  # noqa: E402


def text_jsonl(path: Path, coco: Path, n: int, seed: int = 0) -> Path:
    """``n`` conversations whose replies are lognormal in length (words of COCO captions)."""
    caps = json.loads((coco / "annotations" / "captions_train2017.json").read_text())["annotations"]
    words = " ".join(c["caption"].strip() for c in caps).split()
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for _ in range(n):
            length = int(np.clip(rng.lognormal(np.log(300), 1.0), 8, 3500))  # ~tokens: one word ~ 1.2 tokens
            start = int(rng.integers(0, len(words) - length))
            reply = " ".join(words[start : start + int(length / 1.2)])
            f.write(json.dumps({"messages": [{"role": "user", "content": "Continue the text."},
                                             {"role": "assistant", "content": reply}]}) + "\n")
    return path


def make_builds(tmp: Path, coco: Path, text_examples: int) -> dict[str, Path]:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "coco_to_jsonl.py"), "--coco", str(coco),
                    "--out", str(tmp / "jsonl")], check=True, stdout=subprocess.DEVNULL)
    trees = str(tmp / "jsonl" / "coco_caption_trees.jsonl")
    text = str(text_jsonl(tmp / "text.jsonl", coco, text_examples))
    yaml = ROOT / "configs" / "coco-caption-trees.yaml"
    configs = {
        "coco": BuildConfig.from_yaml(yaml, inputs=[trees], output=str(tmp / "coco")),
        "text": BuildConfig.from_inputs([text], str(tmp / "text"), max_length=4096),
        "mixed": BuildConfig.from_yaml(yaml, inputs=[trees, text], output=str(tmp / "mixed"), max_length=4096,
                                       max_vision_tokens=3072),
    }
    for config in configs.values():
        build(config, progress=False)
    return {name: Path(c.output) for name, c in configs.items()}


def ratios(path: Path, world: int, *, balance: bool, batch_size: int, workers: int, epochs: int) -> tuple[float, float]:
    ds = PackedDataset(path, world_size=world, seed=0, balance=balance)
    costs = read_row_stats(ds.shards).costs(ds.cost_weights)
    means, worst = [], 1.0
    for epoch in range(epochs):
        rows, _ = ds.epoch_plan(epoch)  # (W, N) global rows; fillers cost what the row they copy costs
        steps = loader_steps(rows.shape[1], batch_size, workers)
        step_costs = np.array([[costs[rows[r, s]].sum() for r in range(world)] for s in steps])  # (S, W)
        m, w = straggler_ratio(step_costs)
        means.append(m)
        worst = max(worst, w)
    return float(np.mean(means)), worst


def read_rate(path: Path, world: int, *, balance: bool) -> float:
    """Rows/s one process (= one DataLoader worker) of rank 0 reads, without pixel decoding or collate:
    a balanced rank draws its rows from every row group of a window, so it decodes more row groups."""
    ds = PackedDataset(path, world_size=world, seed=0, balance=balance, load_images=False)
    start = time.perf_counter()
    n = sum(1 for _ in ds)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco", type=Path, default=Path("/work/shared/data/coco-mini"))
    parser.add_argument("--text-examples", type=int, default=3000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        builds = make_builds(Path(tmp), args.coco, args.text_examples)
        print(f"batch_size={args.batch_size} workers={args.workers} epochs={args.epochs}")
        print("| build | rows | W | before: mean | before: worst | after: mean | after: worst |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, path in builds.items():
            n = PackedDataset(path, balance=False).num_rows
            for world in args.worlds:
                kw = dict(batch_size=args.batch_size, workers=args.workers, epochs=args.epochs)
                b = ratios(path, world, balance=False, **kw)
                a = ratios(path, world, balance=True, **kw)
                print(f"| {name} | {n} | {world} | {b[0]:.3f} | {b[1]:.3f} | {a[0]:.3f} | {a[1]:.3f} |", flush=True)
        world = max(args.worlds)
        print(f"\nreader, rank 0 of W={world}, one process, no pixels: rows/s contiguous -> balanced")
        for name, path in builds.items():
            before, after = read_rate(path, world, balance=False), read_rate(path, world, balance=True)
            print(f"| {name} | {before:.0f} | {after:.0f} |", flush=True)


if __name__ == "__main__":
    main()
