#!/usr/bin/env python
"""Train a tiny HF model on packer shards: PackedDataset + DataLoader + packer attention + exact packed loss.

    python scripts/train_example.py --data demo_out/caption_trees --steps 10

The model is a small random-weight Llama (text shards) or Qwen2-VL (qwen2-vl / qwen2.5-vl shards) built from a
config with the real 151936-token vocabulary, trained with AdamW on CPU (or CUDA if present). Each optimizer
step takes ``--grad-accum`` micro-batches of ``--rows`` rows and normalizes by the step's global count (loss
tokens, or examples with ``--weighting example``), all-reduced across ranks when torch.distributed is up:

    count = sum(b["num_loss_tokens"] for b in micro_batches)          # known before any forward
    dist.all_reduce(count)                                           # the same divisor on every rank
    for b in micro_batches: (packed_cross_entropy(...).loss * world_size / count).backward()  # DDP averages

Prints one line per step: loss, token accuracy, tokens/s (all tokens) and loss tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_equivalence import tiny_model  # noqa: E402

from packer.train.attention.hf import LAYOUT_KWARG, model_inputs, use_packed_attention  # noqa: E402
from packer.train.data.collate import collate  # noqa: E402
from packer.train.data.dataset import PackedDataset  # noqa: E402
from packer.train.trainers.loss import logits_to_keep, packed_cross_entropy  # noqa: E402


def step_count(micro_batches: list[dict], weighting: str, device: torch.device) -> torch.Tensor:
    """The optimizer step's normalizer, summed over micro-batches and ranks (known before the forward)."""
    if weighting == "token":
        local = sum(b["num_loss_tokens"] for b in micro_batches)
    else:  # every packed example has >= 1 loss token (the build rejects the others)
        local = sum(len(b["example_ids"]) for b in micro_batches)
    count = torch.tensor(float(local), device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
    return count


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a finished `packer build` output directory")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1, help="packed rows per micro-batch (collated into one row)")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--backend", default="auto", help="auto, sdpa, sdpa_varlen, flex, varlen, flash")
    parser.add_argument("--weighting", choices=("token", "example"), default="token")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    dataset = PackedDataset(args.data, rank=rank, world_size=world, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.rows, collate_fn=collate)
    tokenizer = dataset.shards.manifest.config.tokenizer  # the build's (None: the profile's default)
    model = tiny_model(dataset.profile, tokenizer=tokenizer, hidden=args.hidden, seed=args.seed).to(device)
    kind = type(model).__name__
    name = use_packed_attention(model, args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    print(f"{kind} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), {name}, "
          f"{len(dataset)} rows, {device}")

    batches = iter(loader)
    for step in range(args.steps):
        micro = []
        for _ in range(args.grad_accum):
            try:
                micro.append(next(batches))
            except StopIteration:  # next epoch
                dataset.set_epoch(dataset.epoch + 1)
                batches = iter(loader)
                micro.append(next(batches))
        count = step_count(micro, args.weighting, device)
        t0 = time.perf_counter()
        loss_sum, correct, loss_tokens, tokens = 0.0, 0, 0, 0
        for batch in micro:
            batch = to_device(batch, device)
            inputs = model_inputs(batch)
            keep = logits_to_keep(batch["labels"], inputs[LAYOUT_KWARG]).to(device)  # only rows the loss reads
            logits = model(**inputs, logits_to_keep=keep).logits  # (1, K, V)
            out = packed_cross_entropy(logits, batch["labels"], inputs[LAYOUT_KWARG], weighting=args.weighting,
                                       logits_index=keep)
            (out.loss * world / count).backward()  # DDP averages gradients over ranks: * world undoes it
            loss_sum += float(out.loss.detach())
            correct += int(out.num_correct)
            loss_tokens += int(out.num_loss_tokens)
            tokens += int(batch["input_ids"].shape[-1])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        print(f"step {step:3d}  loss {loss_sum / float(count):.4f}  acc {correct / max(loss_tokens, 1):.3f}  "
              f"{tokens / dt:8.0f} tok/s  {loss_tokens / dt:7.0f} loss tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
