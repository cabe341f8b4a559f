#!/usr/bin/env python
"""Training-step throughput: naive padding vs packer rows, on the same model and the same examples.

    python scripts/bench_train_step.py                 # default run: ~2-3 minutes on 2 CPU cores
    python scripts/bench_train_step.py --device cuda --dtype bfloat16 --backend varlen   # make gpu-check

Forward + backward, useful tokens per second, for:

(a) text examples, batches padded to each batch's longest (HF's usual attention_mask + labels), vs
(b) the same examples in packer rows (``packer.pipeline.build``), ``sdpa_varlen`` attention (the best CPU backend;
    ``varlen``/``flash`` on CUDA via ``--backend``) and ``packed_cross_entropy``;
(c) COCO captions, one example per caption (image + prompt + caption) padded to each batch's longest, vs
(d) COCO caption trees in packer rows: the image and prompt once, one branch per caption.

Text lengths follow a real length histogram (``--histogram``, default Wikipedia/BERT-512: mean 256,
median 204). A padded batch holds ``capacity / mean length`` examples, so it carries about as many real
tokens as one packed row. Useful tokens: real tokens for (a)/(b); for (c)/(d) the tokens of the unpacked
per-caption sequences (the same supervision: identical paths and loss tokens), so each ratio is a time ratio.
The model is a small random-weight Llama / Qwen2-VL with the corpus' token ids renumbered 0..K-1
(``compact_vocab``): identical maths for the benchmark, and the LM head stops dominating a tiny model.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_equivalence import compact_vocab, profile_token_ids, tiny_model  # noqa: E402

from packer.config import BuildConfig  # noqa: E402
from packer.core.types import IGNORE_INDEX  # noqa: E402
from packer.encode.tokenizers import load_tokenizer  # noqa: E402
from packer.models import get_profile  # noqa: E402
from packer.pipeline.build import build  # noqa: E402
from packer.train.attention.hf import (  # noqa: E402
    LAYOUT_KWARG,
    attn_implementations,
    model_inputs,
    use_packed_attention,
)
from packer.train.data.collate import collate  # noqa: E402
from packer.train.data.dataset import PackedDataset  # noqa: E402
from packer.train.trainers.loss import packed_cross_entropy  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
PROMPT = "Describe this image."


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _captions(coco: Path, n_images: int) -> list[tuple[Path, list[str]]]:
    data = json.loads((coco / "annotations" / "captions_val2017.json").read_text())
    names = {im["id"]: im["file_name"] for im in data["images"]}
    caps: dict[int, list[str]] = {}
    for a in sorted(data["annotations"], key=lambda a: a["id"]):
        caps.setdefault(a["image_id"], []).append(a["caption"].strip())
    out = [(coco / "val2017" / names[i], c[:5]) for i, c in sorted(caps.items()) if len(c) >= 5]
    return [o for o in out if o[0].exists()][:n_images]


def text_records(histogram: Path, n: int, words: list[str], seed: int) -> list[dict]:
    """n chat examples whose answers have lengths drawn from a real token-length histogram (~1 token/word)."""
    hist = np.loadtxt(histogram, delimiter=",", skiprows=1)
    rng = np.random.default_rng(seed)
    lengths = rng.choice(hist[:, 0].astype(int), size=n, p=hist[:, 1] / hist[:, 1].sum())
    recs = []
    for i, length in enumerate(lengths):
        start = int(rng.integers(len(words)))
        answer = " ".join(words[(start + k) % len(words)] for k in range(max(1, int(length) - 20)))
        recs.append({"messages": [{"role": "user", "content": f"Write passage {i}."},
                                  {"role": "assistant", "content": answer}]})
    return recs


def examples_of(rows: list[dict]) -> list[dict]:
    """Split packed rows back into their examples (same token ids and labels)."""
    out = []
    for row in rows:
        cu = row["cu_seqlens"]
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            out.append({"input_ids": torch.as_tensor(row["input_ids"][a:b], dtype=torch.long),
                        "labels": torch.as_tensor(row["labels"][a:b], dtype=torch.long)})
    return out


def padded_batches(examples: list[dict], batch_size: int, seed: int) -> list[dict]:
    """Shuffled examples, each batch right-padded to its longest (pad id 0, attention_mask, labels -100)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    batches = []
    for s in range(0, len(order), batch_size):
        group = [examples[i] for i in order[s : s + batch_size]]
        width = max(len(e["input_ids"]) for e in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        labels = torch.full((len(group), width), IGNORE_INDEX)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for r, e in enumerate(group):
            n = len(e["input_ids"])
            ids[r, :n], labels[r, :n], mask[r, :n] = e["input_ids"], e["labels"], 1
        batch = {"input_ids": ids, "labels": labels, "attention_mask": mask}
        if "pixel_values" in group[0]:
            batch["pixel_values"] = torch.cat([e["pixel_values"] for e in group])
            batch["image_grid_thw"] = torch.cat([e["image_grid_thw"] for e in group])
        batches.append(batch)
    return batches


def padded_step(model, batch: dict, image_token_id: int | None) -> None:
    """Forward + backward of one padded batch with HF's own loss (mean over its loss tokens)."""
    model.set_attn_implementation("sdpa")
    kwargs = dict(batch, use_cache=False)
    if image_token_id is not None:
        kwargs["mm_token_type_ids"] = (batch["input_ids"] == image_token_id).int()
    model(**kwargs).loss.backward()
    model.zero_grad(set_to_none=True)


def packed_step(model, item: tuple[dict, torch.Tensor]) -> None:
    """Forward + backward of one packed row with packer attention and the exact packed loss.

    ``item`` is what ``collator_side`` made off the clock: the model's inputs on the device (the layout built
    on the host, as ``PackedCollator`` builds it in a DataLoader worker) and the row's labels on the CPU.
    """
    inputs, labels = item
    logits = model(**inputs).logits  # (1, T, V): all positions, as the padded run
    out = packed_cross_entropy(logits, labels, inputs[LAYOUT_KWARG], reduction="sum")
    (out.loss / out.count).backward()
    model.zero_grad(set_to_none=True)


def packed_run(model, backend: str, batches: list[dict], device: str, dtype: torch.dtype):
    """(step, batches, prepare) for ``time_passes``: the model switched to ``backend`` at each step (the padded
    run shares the model), and each pass's rows made fresh by the collator's side, so no device copy of a
    layout carries over from one pass to the next (a trainer sees each row once an epoch)."""
    switch = attn_implementations(model, use_packed_attention(model, backend))

    def step(item: tuple[dict, torch.Tensor]) -> None:
        model.set_attn_implementation(switch)
        packed_step(model, item)

    def prepare(rows: list[dict]) -> list[tuple[dict, torch.Tensor]]:
        return [(to_device([model_inputs(b)], device, dtype)[0], b["labels"]) for b in rows]

    return step, batches, prepare


def to_device(batches: list[dict], device: str, dtype: torch.dtype) -> list[dict]:
    """Batches with every tensor on ``device``; floating tensors (pixel values) in ``dtype``."""
    def move(v):
        if not isinstance(v, torch.Tensor):
            return v
        return v.to(device, dtype) if v.is_floating_point() else v.to(device)
    return [{k: move(v) for k, v in b.items()} for b in batches]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_passes(runs: list, repeats: int) -> list[float]:
    """Seconds of each run (a step function, its batches and optionally a ``prepare`` of them), best of
    ``repeats`` interleaved passes.

    One untimed warm-up step each first; passes alternate between the runs so that a busy machine's load
    drift hits both alike, and the minimum drops passes slowed down by other processes. ``prepare`` runs off
    the clock before each pass: what a DataLoader worker does.
    """
    runs = [(r[0], r[1], r[2] if len(r) > 2 else None) for r in runs]
    for step, batches, prepare in runs:
        step((prepare(batches[:1]) if prepare else batches)[0])
    best = [float("inf")] * len(runs)
    for _ in range(repeats):
        for i, (step, batches, prepare) in enumerate(runs):
            items = prepare(batches) if prepare else batches
            _sync()
            t0 = time.perf_counter()
            for item in items:
                step(item)
            _sync()  # CUDA kernels run asynchronously: time them to completion
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def profile_runs(runs: list[tuple], out: Path, steps: int = 4) -> dict:
    """torch.profiler over ``steps`` steps of each named run: a chrome trace (with Python stacks) and a table of
    the ops by self CPU time per run under ``out``; returns each run's host (CPU) and device ms per step.

    A step whose host time exceeds its device time is host-bound: the GPU waits on Python and kernel launches.
    """
    from torch.profiler import ProfilerActivity, profile

    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    summary = {}
    for name, step, batches, *prepare in runs:
        chosen = prepare[0](batches[:steps]) if prepare else batches[:steps]
        step(chosen[0])  # warm
        _sync()
        with profile(activities=activities, with_stack=True) as prof:
            t0 = time.perf_counter()
            for batch in chosen:
                step(batch)
            _sync()
            wall = time.perf_counter() - t0
        prof.export_chrome_trace(str(out / f"{name}.trace.json"))
        events = prof.key_averages()
        table = events.table(sort_by="self_cpu_time_total", row_limit=60)
        (out / f"{name}.ops.txt").write_text(table)
        device = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events)
        summary[name] = {"steps": len(chosen), "wall_ms_per_step": 1e3 * wall / len(chosen),
                         "device_ms_per_step": device / 1e3 / len(chosen),
                         "ops_per_step": sum(e.count for e in events) / len(chosen)}
    return summary


def run_text(args, tmp: Path, kv_heads: int | None = None) -> dict:
    words = " ".join(c for _, caps in _captions(args.coco, 79) for c in caps).split()
    recs = text_records(args.histogram, args.text_examples, words, args.seed)
    data = _write_jsonl(tmp / "text.jsonl", recs)
    out = tmp / "text_shards"
    build(BuildConfig.from_inputs([str(data)], str(out), profile="text", max_length=args.capacity), progress=False)
    rows = list(PackedDataset(out, shuffle=True, seed=args.seed))
    packed = [collate([r]) for r in rows]
    packed, ids, vocab = compact_vocab(packed, {})
    examples = examples_of([{"input_ids": b["input_ids"][0], "labels": b["labels"][0],
                             "cu_seqlens": b["cu_seqlens"].tolist()} for b in packed])
    mean = float(np.mean([len(e["input_ids"]) for e in examples]))
    padded = padded_batches(examples, max(1, round(args.capacity / mean)), args.seed)
    model = tiny_model("text", model_class="LlamaForCausalLM", token_ids=ids, vocab_size=vocab, hidden=args.hidden,
                       layers=args.layers,
                       heads=args.heads, kv_heads=kv_heads or args.heads // 2).to(args.device, args.dtype)
    padded = to_device(padded, args.device, args.dtype)
    packed_side = packed_run(model, args.backend, packed, args.device, args.dtype)
    t_pad, t_pack = time_passes([(lambda b: padded_step(model, b, None), padded), packed_side], args.repeats)
    tok_pad = sum(int(b["attention_mask"].sum()) for b in padded)
    tok_pack = sum(int(b["input_ids"].numel()) for b in packed)
    slots = sum(int(b["input_ids"].numel()) for b in padded)
    result = {"examples": len(examples), "mean_len": mean, "batch": padded[0]["input_ids"].shape[0],
              "rows": len(packed), "pad_fraction": 1 - tok_pad / slots,
              "a_tok_s": tok_pad / t_pad, "b_tok_s": tok_pack / t_pack}
    if getattr(args, "profile", None):
        result["profile"] = profile_runs([("text_padded", lambda b: padded_step(model, b, None), padded),
                                          ("text_packed", *packed_side)], Path(args.profile))
    return result


def run_captions(args, tmp: Path) -> dict:
    images = _captions(args.coco, args.images)
    img = lambda p: [{"type": "image", "image": str(p)}, {"type": "text", "text": PROMPT}]  # noqa: E731
    flat = [{"messages": [{"role": "user", "content": img(p)}, {"role": "assistant", "content": c}]}
            for p, caps in images for c in caps]
    trees = [{"messages": [{"role": "user", "content": img(p)}],
              "branches": [[{"role": "assistant", "content": c}] for c in caps]} for p, caps in images]
    opts = dict(profile="qwen2-vl", max_length=args.capacity, max_pixels=args.max_pixels)
    for name, recs in (("flat", flat), ("trees", trees)):
        data = _write_jsonl(tmp / f"{name}.jsonl", recs)
        build(BuildConfig.from_inputs([str(data)], str(tmp / name), **opts), progress=False)
    tree_rows = [collate([r]) for r in PackedDataset(tmp / "trees", shuffle=True, seed=args.seed)]
    flat_rows = [collate([r]) for r in PackedDataset(tmp / "flat", shuffle=True, seed=args.seed)]
    profile = get_profile("qwen2-vl")
    batches, ids, vocab = compact_vocab(tree_rows + flat_rows, profile_token_ids(profile, load_tokenizer("qwen2-vl")))
    tree_rows, flat_rows = batches[: len(tree_rows)], batches[len(tree_rows) :]
    # one example per caption, with its own image rows (pixel_values) and grid
    examples = []
    for b in flat_rows:
        cu, row = b["cu_seqlens"].tolist(), 0
        grids = b["image_grid_thw"]
        for e, (s, t) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
            n = int(grids[e].prod())
            examples.append({"input_ids": b["input_ids"][0, s:t], "labels": b["labels"][0, s:t],
                             "pixel_values": b["pixel_values"][row : row + n], "image_grid_thw": grids[e : e + 1]})
            row += n
    mean = float(np.mean([len(e["input_ids"]) for e in examples]))
    padded = padded_batches(examples, max(1, round(args.capacity / mean)), args.seed)
    model = tiny_model(profile, token_ids=ids, vocab_size=vocab, hidden=args.hidden, layers=args.layers,
                       heads=args.heads, kv_heads=args.heads // 2, vision_depth=args.vision_depth,
                       vision_dim=args.vision_dim).to(args.device, args.dtype)
    tree_tokens = sum(_path_tokens(b) for b in tree_rows)
    padded = to_device(padded, args.device, args.dtype)
    t_pad, t_tree = time_passes(
        [(lambda b: padded_step(model, b, ids[profile.image_token]), padded),
         packed_run(model, args.backend, tree_rows, args.device, args.dtype)],
        args.repeats,
    )
    # useful tokens: the per-caption sequences (a tree row covers all of its root-to-leaf paths)
    tok_pad = sum(int(b["attention_mask"].sum()) for b in padded)
    tok_tree = tree_tokens
    return {"images": len(images), "captions": len(examples), "mean_len": mean,
            "batch": padded[0]["input_ids"].shape[0], "tree_rows": len(tree_rows),
            "tree_tokens": sum(int(b["input_ids"].numel()) for b in tree_rows),
            "flat_tokens": sum(len(e["input_ids"]) for e in examples),
            "c_tok_s": tok_pad / t_pad, "d_tok_s": tok_tree / t_tree}


def _path_tokens(batch: dict) -> int:
    """Tokens of the batch's root-to-leaf paths, each run alone (what one-example-per-path would process)."""
    from packer.train.attention.layout import PackedLayout

    layout = PackedLayout.from_batch(batch)
    anc = layout.ancestors().long()  # (N, N)
    lengths = torch.diff(layout.node_offsets.long(), append=torch.tensor([layout.num_tokens]))  # (N,)
    leaves = torch.ones(layout.num_nodes, dtype=torch.bool)
    leaves[layout.node_parents.long()[layout.node_parents >= 0]] = False
    return int((anc[leaves] @ lengths).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco", type=Path, default=SHARED / "coco-mini")
    parser.add_argument("--histogram", type=Path, default=SHARED / "length-histograms" / "wikipedia_bert_512.csv")
    parser.add_argument("--text-examples", type=int, default=64)
    parser.add_argument("--images", type=int, default=24, help="COCO images (5 captions each)")
    parser.add_argument("--capacity", type=int, default=2048, help="packed row length (max_length)")
    parser.add_argument("--max-pixels", type=int, default=200704, help="448*448: 256 vision tokens per image")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    # A vision tower of depth 2, width 64 costs ~1.1x the LLM's per-token work per image token (4 patches);
    # in Qwen2-VL-2B it is ~1.8x (675M vision params on 4 patches vs 1.5B LLM params per token).
    parser.add_argument("--vision-depth", type=int, default=2)
    parser.add_argument("--vision-dim", type=int, default=64)
    parser.add_argument("--backend", default="sdpa_varlen", help="packer backend for (b) and (d)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared machine)")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per run; the best one counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=Path, default=None,
                        help="also profile a few text steps of each side: chrome traces and op tables here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="model and pixel dtype (bfloat16 on CUDA for flash-attn)")
    args = parser.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        text = run_text(args, Path(tmp))
        caps = run_captions(args, Path(tmp))
    result = {
        "text": text,
        "captions": caps,
        "ratio_b_over_a": text["b_tok_s"] / text["a_tok_s"],
        "ratio_d_over_c": caps["d_tok_s"] / caps["c_tok_s"],
        "config": {k: str(v) for k, v in vars(args).items()},
        "torch_threads": torch.get_num_threads(),
    }
    print(f"(a) text, padded to batch max : {text['a_tok_s']:8.0f} useful tok/s  "
          f"(batch {text['batch']}, {text['pad_fraction']:.0%} padding)")
    print(f"(b) text, packer rows         : {text['b_tok_s']:8.0f} useful tok/s  ({text['rows']} rows)"
          f"   b/a = {result['ratio_b_over_a']:.2f}x")
    print(f"(c) captions, one per example : {caps['c_tok_s']:8.0f} useful tok/s  (batch {caps['batch']})")
    print(f"(d) caption trees, packer rows: {caps['d_tok_s']:8.0f} useful tok/s  ({caps['tree_rows']} rows, "
          f"{caps['tree_tokens']} tokens for {caps['flat_tokens']} unpacked)   d/c = {result['ratio_d_over_c']:.2f}x")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
