"""On-the-fly packing (``OnlinePackedDataset``) against the offline build of the same JSONL.

The corpus is scripts/bench_build.py's (COCO caption text, lognormal lengths, 1-4 turns, ~30% with a real
COCO image, ~10% caption trees). (1) efficiency = tokens / (rows x max_length) of the offline build and of
one online epoch per pool size; (2) rows/s and tokens/s of one epoch read through a DataLoader with 1 and 2
workers (collate_fn returns the rows: packing cost only, no pixel decoding), wall time from the loader's
start (worker start-up included) to its last row.

    python scripts/bench_online.py --records 20000 --pools 1000 10000 --workers 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    from bench_build import make_corpus
    from torch.utils.data import DataLoader

    from packer.config import BuildConfig
    from packer.pipeline.build import build
    from packer.train.data.online import OnlinePackedDataset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--max-length", type=int, default=4096)
    ap.add_argument("--pools", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--coco", type=Path, default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    args = ap.parse_args()

    results: dict = {"records": args.records, "max_length": args.max_length}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        make_corpus(corpus, args.coco, args.records)
        config = BuildConfig.from_inputs([str(corpus)], str(Path(tmp) / "out"), max_length=args.max_length)

        t = time.perf_counter()
        stats = build(config, progress=False).stats
        results["offline"] = {"rows": stats["packs"], "tokens": stats["tokens"], "seconds": time.perf_counter() - t,
                              "efficiency": stats["tokens"] / (stats["packs"] * args.max_length)}
        print(json.dumps(results["offline"]), flush=True)

        for pool in args.pools:
            ds = OnlinePackedDataset(config, pool_size=pool)
            t = time.perf_counter()
            rows = tokens = 0
            for row in ds:
                rows += 1
                tokens += len(row["input_ids"])
            r = {"pool": pool, "rows": rows, "tokens": tokens, "seconds": time.perf_counter() - t,
                 "efficiency": tokens / (rows * args.max_length)}
            r["over_offline_rows"] = rows - results["offline"]["rows"]
            results[f"pool_{pool}"] = r
            print(json.dumps(r), flush=True)

        for workers in args.workers:
            ds = OnlinePackedDataset(config, pool_size=args.pools[0])
            loader = DataLoader(ds, batch_size=1, num_workers=workers, collate_fn=lambda rows: rows)
            t = time.perf_counter()
            rows = tokens = 0
            for batch in loader:
                rows += len(batch)
                tokens += sum(len(row["input_ids"]) for row in batch)
            seconds = time.perf_counter() - t
            r = {"workers": workers, "pool": args.pools[0], "rows": rows, "seconds": seconds,
                 "rows_per_s": rows / seconds, "tokens_per_s": tokens / seconds,
                 "rows_per_s_per_worker": rows / seconds / workers, "tokens_per_s_per_worker": tokens / seconds / workers}
            results[f"workers_{workers}"] = r
            print(json.dumps(r), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
