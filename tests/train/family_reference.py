"""Packed == unpacked for a vision family whose model takes its own image inputs (Gemma 3).

scripts/check_equivalence.py's reference runs Qwen2-VL's inputs; this one asks the family: every root-to-leaf
path of every example runs alone (default attention, no packing) with ``path_inputs(tokens, images)`` — the
row's images inside the path, from the profile's own ``pixel_inputs`` — and ``ce.compare`` checks the packed
forward (packer backends + packed_cross_entropy) against it: per-token losses, total and gradients.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.train.layout import PackedLayout

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

CPU_BACKENDS = ["sdpa", "sdpa_varlen", "flex"]


def compact(batches: list[dict[str, Any]], keep: list[int]) -> tuple[list[dict[str, Any]], dict[int, int], int]:
    """Renumber the ids the batches use (and ``keep``) as 0..K-1: same maths, a K-row LM head instead of 151k.
    Returns the batches, {old id: new id} and the vocabulary size (K rounded up to 64)."""
    used = torch.cat([b["input_ids"].reshape(-1) for b in batches] + [torch.tensor(keep)])
    used = torch.unique(used)
    table = torch.full((int(used.max()) + 1,), -1, dtype=torch.long)
    table[used] = torch.arange(used.numel())
    out = []
    for b in batches:
        b = dict(b)
        for key in ("input_ids", "labels", "shift_labels"):
            if key in b:
                b[key] = torch.where(b[key] == IGNORE_INDEX, b[key], table[b[key].clamp(min=0)])
        out.append(b)
    return out, {int(k): int(table[k]) for k in keep}, (used.numel() + 63) // 64 * 64


def batch_images(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The images of ``collate(rows)`` in order, each with its batch offset ("at")."""
    out, start = [], 0
    for r in rows:
        out += [{**im, "at": start + im["offset"]} for im in r["images"]]
        start += len(r["input_ids"])
    return out


def reference(
    model: torch.nn.Module,
    batch: dict[str, Any],
    images: list[dict[str, Any]],
    path_inputs: Callable[[torch.Tensor, list[dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    """Per-token losses, total and gradients of every path alone; ``path_inputs(ids, images)`` gives the
    path's model kwargs besides input_ids (``images``: ``batch_images`` inside the path). Each target is
    counted on the first path through it."""
    model.set_attn_implementation("sdpa")
    model.zero_grad(set_to_none=True)
    layout = PackedLayout.from_batch(batch)
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    offsets = layout.node_offsets.tolist()
    ranges = list(zip(offsets, offsets[1:] + [layout.num_tokens], strict=True))
    per_token = torch.zeros(layout.num_tokens, dtype=torch.float64)
    paths = ce.leaf_paths(layout)
    owner: dict[int, int] = {}
    for p, nodes in enumerate(paths):
        for n in nodes:
            owner.setdefault(n, p)
    total = torch.zeros((), dtype=torch.float32)
    for p, nodes in enumerate(paths):
        tokens = torch.cat([torch.arange(*ranges[n]) for n in nodes])  # (L,) row positions along the path
        inside = [im for im in images if bool(((tokens >= im["at"]) & (tokens < im["at"] + im["num_tokens"])).any())]
        logits = model(input_ids=ids[tokens][None], use_cache=False, **path_inputs(ids[tokens], inside)).logits[0]
        node_of = torch.cat([torch.full((ranges[n][1] - ranges[n][0],), n) for n in nodes])  # (L,)
        target = labels[tokens]
        counted = (target != IGNORE_INDEX) & torch.tensor([owner[int(n)] == p for n in node_of])
        k = counted.nonzero().reshape(-1)
        if k.numel() == 0:
            continue
        losses = F.cross_entropy(logits[k - 1].float(), target[k], reduction="none")  # (K,)
        per_token[tokens[k]] = losses.detach().double()
        total = total + losses.sum()
    total.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"per_token": per_token, "total": float(total.detach()), "grads": grads, "num_paths": len(paths)}


def freeze_key_biases(model: torch.nn.Module) -> None:
    """Softmax is invariant to a key bias (it adds q.b to every score of a row): its exact gradient is 0, so
    both sides give rounding noise (~1e-9) that no relative tolerance compares. SigLIP's k_proj has one."""
    for name, p in model.named_parameters():
        if name.endswith("k_proj.bias"):
            p.requires_grad_(False)


def check(report: dict[str, Any], backends: list[str]) -> None:
    for b in backends:
        assert report[b]["ok"], (b, report[b])
        if b != "flex":  # no CPU backward for flex in torch 2.13: losses only
            assert report[b]["grad_missing"] == [] and report[b]["grad_params"] > 0
