"""``packer verify`` throughput: the checks of a finished build against reading its shards alone, for one or
more checkouts of packer side by side (e.g. before and after a change), in one run.

Each ``--repo`` builds the same corpus (``bench_build.make_corpus``: COCO-caption chats, ~30% with a real
COCO image, ~10% caption trees) with the qwen2-vl profile in a fresh process using that checkout's code (a
shard format change between checkouts cannot mix them up), then times ``verify_build`` (no tokenizer check:
that is the tokenizer's time, not verify's) and ``pyarrow.parquet.read_table`` of every shard, in CPU seconds,
best of ``--repeat``.

    python scripts/bench_verify.py --records 20000 --repo . --repo ../before
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

REPO = Path(__file__).resolve().parents[1]


def _child(out: str, corpus: str, repeat: int) -> None:
    """In a checkout's own process: build ``corpus`` into ``out``, then time verify and the plain shard reads."""
    import pyarrow.parquet as pq

    from packer.config import BuildConfig
    from packer.pipeline.build import build
    from packer.report.verify import verify_build

    config = BuildConfig.from_inputs([corpus], out, profile="qwen2-vl", max_length=8192, num_proc=2,
                                     max_pixels=256 * 28 * 28)
    build(config, progress=False)
    shards = sorted(Path(out).glob("shard-*.parquet"))
    tokens = sum(len(pq.read_table(s, columns=["input_ids"])["input_ids"].combine_chunks().flatten()) for s in shards)
    best: dict[str, float] = {}
    for _ in range(repeat):
        c = time.process_time()
        report = verify_build(out, tokenizer_check=0)
        best["verify"] = min(best.get("verify", 1e9), time.process_time() - c)
        c = time.process_time()
        for s in shards:
            pq.read_table(s)
        best["read"] = min(best.get("read", 1e9), time.process_time() - c)
    print(json.dumps({"ok": bool(report.ok), "tokens": tokens, "shards": len(shards), **best}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repo", action="append", type=Path, help="a packer checkout (repeatable); default: this one")
    ap.add_argument("--coco", type=Path, default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared"))
                    / "data" / "coco-mini")
    ap.add_argument("--child", nargs=3, metavar=("OUT", "CORPUS", "REPEAT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child[0], args.child[1], int(args.child[2]))
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_build import make_corpus

    repos = [r.resolve() for r in (args.repo or [REPO])]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        make_corpus(corpus, args.coco, args.records)
        rows = []
        for k, repo in enumerate(repos):
            env = {**os.environ, "PYTHONPATH": str(repo), "TOKENIZERS_PARALLELISM": "false"}
            run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_verify.py"), "--child",
                                  str(Path(tmp) / f"out{k}"), str(corpus), str(args.repeat)], env=env, cwd=repo,
                                 capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"{repo}: {run.stderr[-2000:]}")
            rows.append((repo, json.loads(run.stdout.strip().splitlines()[-1])))
    base = rows[0][1]
    print(f"{args.records:,} records, qwen2-vl, CPU seconds best of {args.repeat}")
    for repo, r in rows:
        print(f"{str(repo):40s} verify {r['verify']:.2f} s ({r['tokens'] / r['verify'] / 1e6:.2f}M tokens/s, "
              f"ok={r['ok']}), shards read alone {r['read']:.2f} s ({r['read'] / r['verify']:.0%} of verify); "
              f"verify x{base['verify'] / r['verify']:.2f} vs the first")


if __name__ == "__main__":
    main()
