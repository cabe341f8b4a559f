"""Repack vs full build (issue 32): `packer repack` of a finished build against the full build it reuses, on
bench_build.py's corpus (COCO-caption text, ~30% of records with a real COCO image, 10% caption trees).

Three commands, each in a fresh process, timed in wall and CPU seconds of its whole process tree (workers
included): the full build (--max-length 8192), its repack to --max-length 4096 --seed 1, and a fresh build with
those options, whose shards the repack's must equal byte for byte.

    python scripts/bench_repack.py --records 200000 --num-proc 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import REPO, _tree_usage, make_corpus  # noqa: E402

BUILD = ["--profile", "qwen2-vl", "--max-pixels", str(256 * 28 * 28), "-q"]


def timed(args: list[str]) -> dict[str, float]:
    """``packer ARGS`` in a fresh process: wall seconds, CPU seconds of its process tree, peak RSS (MiB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "packer.cli", *args], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    peak, cpu = 0, {}
    while proc.poll() is None:
        peak = max(peak, _tree_usage(proc.pid, cpu))
        time.sleep(0.1)
    if proc.returncode:
        raise SystemExit(f"packer {' '.join(args)} failed with exit code {proc.returncode}")
    return {"wall": time.perf_counter() - t0, "cpu": sum(c for _, c in cpu.values()), "rss_mib": peak / 2**20}


def sums(out: Path) -> list[str]:
    return [s["sha256"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--coco", type=Path,
                    default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        make_corpus(corpus, args.coco, args.records)
        n = ["--num-proc", str(args.num_proc)]
        full = timed(["build", str(corpus), "-o", str(root / "full"), "--max-length", "8192", *BUILD, *n])
        rep = timed(["repack", str(root / "full"), "-o", str(root / "repack"), "--max-length", "4096", "--seed", "1",
                     "-q", *n])
        fresh = timed(["build", str(corpus), "-o", str(root / "fresh"), "--max-length", "4096", "--seed", "1", *BUILD,
                       *n])
        same = sums(root / "repack") == sums(root / "fresh")
        for name, r in (("full build (8192)", full), ("repack -> 4096, seed 1", rep), ("fresh build (4096, seed 1)", fresh)):
            print(f"{name:28s} wall {r['wall']:7.1f} s  CPU {r['cpu']:7.1f} s  peak RSS {r['rss_mib']:6.0f} MiB")
        print(f"repack / full build: wall {rep['wall'] / full['wall']:.1%}, CPU {rep['cpu'] / full['cpu']:.1%}; "
              f"repack / fresh build: wall {rep['wall'] / fresh['wall']:.1%}, CPU {rep['cpu'] / fresh['cpu']:.1%}; "
              f"repacked shards {'==' if same else '!='} fresh build's ({len(sums(root / 'fresh'))} shards)")


if __name__ == "__main__":
    main()
