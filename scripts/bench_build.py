"""Build throughput: `packer build --num-proc N` end to end vs the tokenizer alone, on the same records.

The corpus is synthetic but realistic: English text assembled from COCO captions (real sentences, so BPE
sees real words), lognormal conversation lengths, 1-4 turns, ~30% of records with a real COCO image,
~10% caption trees. The baseline renders the same records with the chat template and batch-encodes them
with the tokenizer in N processes (what any pipeline must do at minimum). Text tokens are compared
(vision tokens are the build's extra output, not tokenizer work). Peak RSS is the whole process tree's.

    python scripts/bench_build.py --records 200000 --num-proc 2
    python scripts/bench_build.py --records 50000 --rss-only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_corpus(path: Path, coco: Path, records: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    caps = json.loads((coco / "annotations" / "captions_train2017.json").read_text())["annotations"]
    sentences = [c["caption"].strip().rstrip(".") + "." for c in caps]
    images = sorted(str(p) for p in (coco / "train2017").glob("*.jpg"))

    def text(n_sent: int) -> str:
        return " ".join(sentences[i] for i in rng.integers(0, len(sentences), size=max(1, n_sent)))

    with open(path, "w") as f:
        for _ in range(records):
            turns = int(rng.integers(1, 5))
            size = rng.lognormal(np.log(4), 0.9)  # sentences per answer: median 4, long tail
            msgs = []
            for t in range(turns):
                q = text(int(rng.integers(1, 3)))
                if t == 0 and rng.random() < 0.3:
                    q = [{"type": "image", "image": images[int(rng.integers(len(images)))]}, {"type": "text", "text": q}]
                msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": text(int(size))}]
            rec: dict = {"messages": msgs}
            if rng.random() < 0.1:  # a caption tree: shared prefix, 3 branches
                rec = {"messages": msgs[:1], "branches": [[{"role": "assistant", "content": text(int(size))}]
                                                          for _ in range(3)]}
            f.write(json.dumps(rec) + "\n")


_TOK = None


def _init() -> None:
    global _TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from packer.encode.tokenizers import load_tokenizer

    _TOK = load_tokenizer("qwen2-vl")


def _render_and_encode(lines: list[str]) -> int:
    """Render each record's (linear) conversations with the template and batch-encode them: token count."""
    texts = []
    for line in lines:
        rec = json.loads(line)
        msgs = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
                if isinstance(m["content"], list) else m for m in rec["messages"]]
        for branch in rec.get("branches", [[]]):
            texts.append(_TOK.apply_chat_template(msgs + branch, tokenize=False))
    return sum(len(ids) for ids in _TOK(texts).input_ids)


def tokenizer_alone(path: Path, num_proc: int) -> dict[str, float]:
    lines = path.read_text().splitlines()
    chunks = [lines[i : i + 512] for i in range(0, len(lines), 512)]
    with mp.get_context("spawn").Pool(num_proc, initializer=_init) as pool:
        pool.map(_render_and_encode, chunks[:num_proc])  # warm: tokenizer loaded in every worker
        t0 = time.perf_counter()
        tokens = sum(pool.imap(_render_and_encode, chunks))
        dt = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt}


def _tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes (from /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total


def packer_build(path: Path, out: Path, num_proc: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "packer.cli", "build", str(path), "-o", str(out), "--profile", "qwen2-vl",
           "--max-length", "8192", "--max-pixels", str(256 * 28 * 28), "--num-proc", str(num_proc), "--overwrite", "-q"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.2)
    dt = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"packer build failed with exit code {proc.returncode}")
    manifest = json.loads((out / "manifest.json").read_text())
    t = manifest["totals"]
    return {"seconds": dt, "text_tokens": t["tokens"] - t["vision_tokens"], "tokens": t["tokens"],
            "text_tokens_per_s": (t["tokens"] - t["vision_tokens"]) / dt, "peak_rss_mib": peak / 2**20,
            "examples": t["examples"], "packs": t["packs"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, nargs="+", default=[50_000, 200_000])
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--coco", type=Path, default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    ap.add_argument("--rss-only", action="store_true", help="skip the tokenizer-alone baseline")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            corpus = Path(tmp) / f"corpus-{n}.jsonl"
            make_corpus(corpus, args.coco, n)
            print(f"\n{n:,} records ({corpus.stat().st_size / 2**20:.0f} MiB JSONL)")
            b = packer_build(corpus, Path(tmp) / f"out-{n}", args.num_proc)
            print(f"  packer build --num-proc {args.num_proc}: {b['seconds']:.1f} s, {b['text_tokens']:,} text tokens "
                  f"({b['tokens']:,} with vision), {b['text_tokens_per_s'] / 1e3:.0f}k text tokens/s, "
                  f"peak RSS {b['peak_rss_mib']:.0f} MiB, {b['examples']:,} examples in {b['packs']:,} packs")
            if not args.rss_only:
                a = tokenizer_alone(corpus, args.num_proc)
                print(f"  tokenizer alone ({args.num_proc} processes): {a['seconds']:.1f} s, {a['tokens']:,} tokens, "
                      f"{a['tokens_per_s'] / 1e3:.0f}k tokens/s")
                print(f"  build / tokenizer-alone throughput: {b['text_tokens_per_s'] / a['tokens_per_s']:.1%} "
                      f"(target >= 85%)")


if __name__ == "__main__":
    main()
