#!/usr/bin/env python
"""packer against TRL's own preprocessing on the same records, each in a fresh process, interleaved.

    python scripts/bench_peers.py --records 50000 --num-proc 2 --max-length 2048 --repeats 3

The records: linear chats (1-4 turns, lognormal answers) written from COCO's captions (real English sentences, so
BPE sees real words; ``shared/data/coco-mini``), the same JSONL file for both sides. Both use the builtin qwen2-vl
tokenizer (Qwen2's vocabulary and ChatML template) and ``--num-proc`` processes:

- packer: ``packer build CORPUS -o OUT --profile text --max-length L --overlong truncate --num-proc N`` (the CLI:
  parse, render, tokenize, one global plan, Parquet shards, stats, card, manifest; ``truncate`` keeps an over-long
  chat's head, as TRL's ``bfd`` does, so both sides keep every record);
- TRL 1.16: ``datasets.load_dataset("json", ...)`` and ``SFTTrainer(model, train_dataset=..., args=SFTConfig(
  packing=True, packing_strategy="bfd", max_length=L, dataset_num_proc=N))`` on a tiny model (its construction
  is what tokenizes and packs the data: ``_prepare_dataset``), with a fresh ``datasets`` cache per run.

Printed per side, median of ``--repeats`` runs: wall, CPU (the whole process tree: ``RUSAGE_CHILDREN`` after the
child exits, which counts every waited-for descendant), peak RSS (the sum of the tree's VmRSS, sampled every
50 ms), packs and packs over the lower bound (ceil(tokens / L) of that side's own tokens), and which tokens carry
loss (packer: assistant turns and their end token; TRL by default: every token). The machine is shared: the
load average before and after each run is printed with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_chats(path: Path, coco: Path, records: int, seed: int = 0) -> None:
    """Linear text chats from COCO caption sentences: 1-4 turns, answers of lognormal length."""
    rng = np.random.default_rng(seed)
    caps = json.loads((coco / "annotations" / "captions_train2017.json").read_text())["annotations"]
    sentences = [c["caption"].strip().rstrip(".") + "." for c in caps]

    def text(n: int) -> str:
        return " ".join(sentences[i] for i in rng.integers(0, len(sentences), size=max(1, n)))

    with open(path, "w") as f:
        for _ in range(records):
            size = rng.lognormal(np.log(4), 0.9)
            msgs = []
            for _t in range(int(rng.integers(1, 5))):
                msgs += [{"role": "user", "content": text(int(rng.integers(1, 3)))},
                         {"role": "assistant", "content": text(int(size))}]
            f.write(json.dumps({"messages": msgs}) + "\n")


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
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


def measure(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd`` to completion: wall, CPU of the whole tree, peak tree RSS, its last stdout line as JSON."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:  # never a full pipe
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=fout, stderr=ferr, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{err[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return {"wall": wall, "cpu": cpu, "rss_mib": peak / 2**20, "load": (load, os.getloadavg()[0]), **result}


def packer_side(corpus: Path, out: Path, max_length: int, num_proc: int, env: dict) -> dict:
    cmd = [str(Path(sys.executable).parent / "packer"), "build", str(corpus), "-o", str(out), "--profile", "text",
           "--tokenizer", "qwen2-vl", "--max-length", str(max_length), "--overlong", "truncate",
           "--num-proc", str(num_proc), "--overwrite",
           "--quiet"]
    r = measure(cmd, env)
    t = json.loads((out / "manifest.json").read_text())["totals"]
    return {**r, "packs": t["packs"], "tokens": t["tokens"], "loss_tokens": t["loss_tokens"], "examples": t["examples"]}


def trl_child(corpus: str, out: str, max_length: int, num_proc: int) -> None:
    """TRL's preprocessing in this process; prints its packs and token counts as JSON."""
    import torch
    from datasets import load_dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    from packer.encode.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("qwen2-vl")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=151936, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True))
    data = load_dataset("json", data_files=corpus, split="train")
    args = SFTConfig(output_dir=out, packing=True, packing_strategy="bfd", max_length=max_length,
                     dataset_num_proc=num_proc, bf16=False, use_cpu=True, report_to=[], disable_tqdm=True)
    trainer = SFTTrainer(model, args=args, train_dataset=data, processing_class=tokenizer)
    packed = trainer.train_dataset
    lengths = [sum(s) for s in packed["seq_lengths"]]
    loss = sum(sum(1 for x in labels if x != -100) for labels in packed["labels"])
    examples = sum(len(s) for s in packed["seq_lengths"])
    print(json.dumps({"packs": packed.num_rows, "tokens": int(sum(lengths)), "loss_tokens": int(loss),
                      "examples": int(examples)}))


def trl_side(corpus: Path, out: Path, max_length: int, num_proc: int, env: dict) -> dict:
    cache = tempfile.mkdtemp(prefix="bench-peers-hf-")  # TRL's and datasets' map caches: cold every run
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(corpus), str(out), str(max_length),
           str(num_proc)]
    try:
        return measure(cmd, {**env, "HF_DATASETS_CACHE": cache})
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


def summary(runs: list[dict], max_length: int) -> dict:
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu", "rss_mib")}
    last = runs[-1]
    bound = math.ceil(last["tokens"] / max_length)
    return {**med, "packs": last["packs"], "lower_bound": bound, "over_bound": last["packs"] - bound,
            "tokens": last["tokens"], "loss_tokens": last["loss_tokens"], "examples": last["examples"],
            "loss_share": last["loss_tokens"] / last["tokens"], "loads": [r["load"] for r in runs],
            "walls": [r["wall"] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--coco", type=Path,
                    default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    ap.add_argument("--trl-child", nargs=4, metavar=("CORPUS", "OUT", "MAX_LENGTH", "NUM_PROC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    if args.trl_child:
        corpus, out, length, procs = args.trl_child
        trl_child(corpus, out, int(length), int(procs))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "chats.jsonl"
        make_chats(corpus, args.coco, args.records)
        print(f"{args.records:,} chats ({corpus.stat().st_size / 2**20:.1f} MiB JSONL), max_length {args.max_length}, "
              f"{args.num_proc} processes, {args.repeats} runs each (interleaved), load {os.getloadavg()[0]:.1f}")
        runs: dict[str, list[dict]] = {"packer": [], "trl": []}
        for i in range(args.repeats):
            for side, fn in (("packer", packer_side), ("trl", trl_side)):
                r = fn(corpus, Path(tmp) / f"{side}-{i}", args.max_length, args.num_proc, env)
                runs[side].append(r)
                print(f"  run {i + 1} {side:6s}: {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU-s, {r['rss_mib']:.0f} MiB, "
                      f"load {r['load'][0]:.1f} -> {r['load'][1]:.1f}", flush=True)
        s = {side: summary(r, args.max_length) for side, r in runs.items()}
        for side, v in s.items():
            print(f"{side:6s} median: {v['wall']:.1f} s wall, {v['cpu']:.1f} CPU-s, peak RSS {v['rss_mib']:.0f} MiB; "
                  f"{v['examples']:,} examples, {v['tokens']:,} tokens in {v['packs']:,} packs (lower bound "
                  f"{v['lower_bound']:,}: +{v['over_bound']}); loss on {v['loss_tokens']:,} tokens "
                  f"({v['loss_share']:.1%})")
        p, t = s["packer"], s["trl"]
        print(f"packer / TRL: wall {p['wall'] / t['wall']:.2f}x, CPU {p['cpu'] / t['cpu']:.2f}x, "
              f"peak RSS {p['rss_mib'] / t['rss_mib']:.2f}x, packs {p['packs']:,} vs {t['packs']:,}")
        print("loss: packer on assistant turns (content + end-of-turn token); TRL's default on every token "
              "(assistant_only_loss needs a template with generation markers)")
        print(json.dumps(s))


if __name__ == "__main__":
    main()
