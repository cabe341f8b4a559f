"""Tokens computed for DPO: packed preference trees vs TRL-style padded (chosen, rejected) pairs.

A pair is a prompt of P tokens and two answers of C and R tokens. Counted per layout:

    packed tree     P + C + R per pair (the prompt once), rows packed to --capacity by packer's planner;
                    "computed" = the rows' real tokens (varlen attention computes no padding), and the row
                    capacity too for a trainer that pads every row to it
    unpadded pairs  2P + C + R (prompt+chosen and prompt+rejected as two packed sequences, TRL padding_free)
    padded pairs    TRL's default: a batch of B pairs becomes 2B sequences, prompts left-padded to the
                    batch's longest prompt and answers right-padded to its longest answer (chosen or
                    rejected): 2B * (max P + max(C, R)), batches in data order

Lengths are drawn from the Krell et al. 2021 histograms in /work/shared/data/length-histograms (Wikipedia
BERT-512 and SQuAD 1.1 BERT-384 sequence lengths), sampled with replacement, seed 0::

    PYTHONPATH=$PWD python scripts/bench_preference.py [--pairs 20000] [--batch 8] [--capacity 4096]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from packer.packing import plan

SHARED = Path(os.environ.get("PACKER_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
HISTOGRAMS = SHARED / "data" / "length-histograms"  # PACKER_SHARED as in tests/conftest.py


def histogram(name: str) -> np.ndarray:
    table = np.loadtxt(HISTOGRAMS / name, delimiter=",", skiprows=1, dtype=np.int64)
    return np.repeat(table[:, 0], table[:, 1])


def count(p: np.ndarray, c: np.ndarray, r: np.ndarray, *, batch: int, capacity: int) -> dict[str, float]:
    """Tokens computed by each layout for pairs with prompt lengths p and answer lengths c, r (each (n,))."""
    tree = p + c + r  # (n,)
    packs = plan(tree, capacity, seed=0)
    rows = int(packs.max()) + 1
    n = p.shape[0] // batch * batch  # whole batches only, for every layout
    padded = 0
    for i in range(0, n, batch):
        s = slice(i, i + batch)
        padded += 2 * batch * (int(p[s].max()) + int(np.maximum(c[s], r[s]).max()))
    tree_n = int(tree[:n].sum())
    return {
        "tree": tree_n,
        "tree_rows_padded": rows * capacity * n / p.shape[0],
        "unpadded_pairs": int((2 * p[:n] + c[:n] + r[:n]).sum()),
        "padded_pairs": padded,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=8, help="pairs per TRL batch (per device)")
    ap.add_argument("--capacity", type=int, default=4096, help="tokens per packed row")
    args = ap.parse_args()
    wiki, squad = histogram("wikipedia_bert_512.csv"), histogram("squad_1_1_bert_384.csv")
    rng = np.random.default_rng(0)
    mixes = {
        "prompt ~ Wikipedia, answers ~ SQuAD": (wiki, squad),
        "prompt ~ SQuAD, answers ~ Wikipedia": (squad, wiki),
        "prompt ~ Wikipedia, answers ~ SQuAD / 4 (short answers)": (wiki, squad // 4 + 1),
    }
    print(f"{args.pairs} pairs, TRL batch {args.batch} pairs, packed rows of {args.capacity} tokens\n")
    print("| length mix | mean P / C / R | padded pairs | unpadded pairs | packed tree | tree rows padded to capacity | padded / tree |")
    print("|---|---|---|---|---|---|---|")
    for name, (hp, ha) in mixes.items():
        p, c, r = (rng.choice(h, args.pairs) for h in (hp, ha, ha))
        t = count(p, c, r, batch=args.batch, capacity=args.capacity)
        print(
            f"| {name} | {p.mean():.0f} / {c.mean():.0f} / {r.mean():.0f} | {t['padded_pairs'] / 1e6:.2f}M "
            f"| {t['unpadded_pairs'] / 1e6:.2f}M | {t['tree'] / 1e6:.2f}M | {t['tree_rows_padded'] / 1e6:.2f}M "
            f"| {t['padded_pairs'] / t['tree']:.2f}x |"
        )


if __name__ == "__main__":
    main()
