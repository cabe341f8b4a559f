#!/usr/bin/env python
"""Prove packing changes the cost, never the maths: packed batch vs every path run alone.

    python scripts/check_equivalence.py --data examples.jsonl --model qwen2-vl [--backend sdpa]
    python scripts/check_equivalence.py --data videos.jsonl --model qwen2.5-vl   # videos too

Builds shards from the JSONL (``packer.pipeline.build``), reads them back with ``PackedDataset`` + ``collate``, and
for every batch compares, on a tiny random-weight model in fp32:

- per-token losses and the total loss of the packed batch (``packed_cross_entropy`` on the model run with a
  packer attention backend), against
- the reference: every root-to-leaf path of every example run alone, unpadded, with the model's own default
  attention (SDPA) and its own positions (``get_rope_index`` for Qwen2-VL / Qwen2.5-VL, with the path's images
  and videos: ``second_per_grid_ts`` for Qwen2.5-VL), each distinct target token counted
  once (a shared prefix's loss tokens are taken from the first path through them), and
- the gradients of every parameter of both totals.

Prints ONE JSON line (max abs / rel differences and a verdict per backend); exit 0 only if every backend is
within tolerance: per-token losses |d| <= 1e-6 + 1e-5 |ref|, total within 1e-5 relative, every gradient
entry |d| <= 1e-5 (|ref| + max |ref| of its parameter). ``grad_max_rel`` is max |d| / max |ref| per
parameter. The token ids are renumbered 0..K-1 (``compact_vocab``) so a 2-layer model runs in seconds; the
functions here are also what tests/train/test_equivalence.py runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny models come from configs; nothing is downloaded

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a source checkout

from packer.core.types import IGNORE_INDEX  # noqa: E402
from packer.train.hf import model_inputs, use_packed_attention  # noqa: E402
from packer.train.layout import PackedLayout  # noqa: E402
from packer.train.loss import packed_cross_entropy  # noqa: E402

MODELS = ("llama", "qwen2", "qwen2-vl", "qwen2.5-vl")
RTOL = 1e-5  # fp32: packed and unpacked matmuls differ only in summation order (~1e-7 relative)
LOSS_ATOL = 1e-6  # per-token losses are ~12 (ln 151936) for random weights: 1e-6 is ~1e-7 relative
GRAD_ATOL_SCALE = 1e-5  # a gradient entry's atol: 1e-5 of its parameter's largest entry (near-zero entries)
VOCAB = 151936  # Qwen2's padded vocabulary: real ids from the qwen2-vl tokenizer go up to 151656


# Qwen2-VL's special ids (image pad, video pad, vision start/end): kept distinct when the vocabulary is compacted.
SPECIAL_IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
               "vision_end_token_id": 151653}


def compact_vocab(batches: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Renumber the token ids used by ``batches`` (and Qwen2-VL's special ids) as 0..K-1.

    The model's maths is the same for any id -> row mapping, and an LM head of K (~hundreds) rows instead of
    151936 makes a 2-layer model's step ~100x cheaper (the vocabulary projection dominates at hidden 32).
    Returns the new batches and {"vocab_size": K rounded up to 64, <special>: new id}.
    """
    used = torch.cat([b["input_ids"].reshape(-1) for b in batches] + [torch.tensor(list(SPECIAL_IDS.values()))])
    used = torch.unique(torch.cat([used] + [b["labels"][b["labels"] != IGNORE_INDEX] for b in batches]))
    table = torch.full((int(used.max()) + 1,), -1, dtype=torch.long)
    table[used] = torch.arange(used.numel())

    def renumber(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x == IGNORE_INDEX, x, table[x.clamp(min=0)])

    out = []
    for b in batches:
        b = dict(b)
        for key in ("input_ids", "labels", "shift_labels"):
            if key in b:
                b[key] = renumber(b[key])
        out.append(b)
    ids = {k: int(table[v]) for k, v in SPECIAL_IDS.items()}
    return out, {"vocab_size": (used.numel() + 63) // 64 * 64, **ids}


def tiny_model(
    kind: str,
    *,
    seed: int = 0,
    vocab_size: int = VOCAB,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vision_depth: int = 1,
    vision_dim: int = 32,
    **special_ids: int,
) -> torch.nn.Module:
    """A small random-weight model from a config (no hub access); defaults: hidden 32, 2 layers, 4 heads,
    2 KV heads (GQA), a 1-block vision tower of width 32. ``vocab_size`` and Qwen2-VL's ``image_token_id``
    etc. may come from ``compact_vocab``.
    """
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    torch.manual_seed(seed)
    text = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        bos_token_id=None,  # generation ids are irrelevant here and may not exist in a compacted vocabulary
        eos_token_id=None,
        pad_token_id=None,
    )
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**text, attn_implementation="sdpa"))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**text, attn_implementation="sdpa"))
    elif kind == "qwen2-vl":
        # mRoPE splits the head's rotary frequencies t/h/w as Qwen2-VL does (16/24/24 of 64): 1/1/2 of 4 here.
        half = hidden // heads // 2
        t = max(1, half // 4)
        section = [t, (half - t) // 2, half - t - (half - t) // 2]
        text_config = dict(text, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": section})
        vision_config = dict(depth=vision_depth, embed_dim=vision_dim, hidden_size=hidden, num_heads=2, mlp_ratio=2,
                             spatial_merge_size=2)
        config = Qwen2VLConfig(
            text_config=text_config,
            vision_config=vision_config,
            attn_implementation="sdpa",
            **{k: special_ids.get(k, v) for k, v in SPECIAL_IDS.items()},
        )
        model = Qwen2VLForConditionalGeneration(config)
    elif kind == "qwen2.5-vl":
        # as Qwen2-VL's, plus windowed vision attention (window 56 px: 2x2 merged tokens; block 0 full) and
        # tokens_per_second 2, the released checkpoints' value and the qwen2.5-vl profile's
        half = hidden // heads // 2
        t = max(1, half // 4)
        section = [t, (half - t) // 2, half - t - (half - t) // 2]
        text_config = dict(text, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": section})
        vision_config = dict(depth=max(vision_depth, 2), hidden_size=vision_dim, intermediate_size=2 * vision_dim,
                             num_heads=2, out_hidden_size=hidden, spatial_merge_size=2, window_size=56,
                             fullatt_block_indexes=[0], tokens_per_second=2)
        config = Qwen2_5_VLConfig(
            text_config=text_config,
            vision_config=vision_config,
            attn_implementation="sdpa",
            **{k: special_ids.get(k, v) for k, v in SPECIAL_IDS.items()},
        )
        model = Qwen2_5_VLForConditionalGeneration(config)
    else:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    return model.float().train()


# --------------------------------------------------------------------------------------------------------
# The reference: every root-to-leaf path alone


def leaf_paths(layout: PackedLayout) -> list[list[int]]:
    """Root-to-leaf node lists of every example, leaves in row order."""
    parents = layout.node_parents.tolist()
    has_child = set(p for p in parents if p >= 0)
    anc = layout.ancestors()
    return [anc[n].nonzero().reshape(-1).tolist() for n in range(layout.num_nodes) if n not in has_child]


def _node_ranges(layout: PackedLayout) -> list[tuple[int, int]]:
    offsets = layout.node_offsets.tolist()
    return list(zip(offsets, offsets[1:] + [layout.num_tokens], strict=True))


def _image_table(batch: Mapping[str, Any], merge: int, kind: str = "image") -> list[tuple[int, int, int, int]]:
    """(first token, token count, first pixel row, pixel rows) of every image (``kind="video"``: video) in the
    batch."""
    if batch.get(f"{kind}_grid_thw") is None:
        return []
    grids = batch[f"{kind}_grid_thw"].tolist()
    offsets = batch[f"{kind}_offsets"].tolist()
    out, row = [], 0
    for (t, h, w), off in zip(grids, offsets, strict=True):
        out.append((off, t * h * w // merge**2, row, t * h * w))
        row += t * h * w
    return out


def reference(model: torch.nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
    """Per-token losses (T,) and total of every path run alone (default attention), and the gradients."""
    model.set_attn_implementation("sdpa")
    model.zero_grad(set_to_none=True)
    layout = PackedLayout.from_batch(batch)
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    ranges = _node_ranges(layout)
    is_vl = hasattr(model.config, "vision_config")
    images = _image_table(batch, model.config.vision_config.spatial_merge_size) if is_vl else []
    videos = _image_table(batch, model.config.vision_config.spatial_merge_size, "video") if is_vl else []
    per_token = torch.zeros(layout.num_tokens, dtype=torch.float64)
    owner: dict[int, int] = {}  # node -> the first path through it: its targets are counted there only
    paths = leaf_paths(layout)
    for p, nodes in enumerate(paths):
        for n in nodes:
            owner.setdefault(n, p)
    total = 0.0
    for p, nodes in enumerate(paths):
        tokens = torch.cat([torch.arange(*ranges[n]) for n in nodes])  # (L,) row positions along the path
        kwargs: dict[str, Any] = {"input_ids": ids[tokens][None], "use_cache": False}
        if is_vl:
            inside = [im for im in images if bool(((tokens >= im[0]) & (tokens < im[0] + im[1])).any())]
            if inside:
                kwargs["pixel_values"] = torch.cat([batch["pixel_values"][r : r + n] for _, _, r, n in inside])
                kwargs["image_grid_thw"] = torch.stack([batch["image_grid_thw"][images.index(im)] for im in inside])
            clips = [v for v in videos if bool(((tokens >= v[0]) & (tokens < v[0] + v[1])).any())]
            if clips:  # the path's videos, as the processor gives them for that example alone
                kwargs["pixel_values_videos"] = torch.cat([batch["pixel_values_videos"][r : r + n] for _, _, r, n in clips])
                kwargs["video_grid_thw"] = torch.stack([batch["video_grid_thw"][videos.index(v)] for v in clips])
                if "second_per_grid_ts" in batch:
                    kwargs["second_per_grid_ts"] = torch.stack([batch["second_per_grid_ts"][videos.index(v)] for v in clips])
            if inside or clips:  # the processor's mm_token_type_ids: image 1, video 2
                kwargs["mm_token_type_ids"] = ((kwargs["input_ids"] == model.config.image_token_id).int()
                                               + 2 * (kwargs["input_ids"] == model.config.video_token_id).int())
        logits = model(**kwargs).logits[0]  # (L, V)
        node_of = torch.cat([torch.full((ranges[n][1] - ranges[n][0],), n) for n in nodes])  # (L,)
        target = labels[tokens]  # (L,)
        counted = (target != IGNORE_INDEX) & torch.tensor([owner[int(n)] == p for n in node_of])
        if bool(counted[0]):
            raise ValueError("a path's first token carries a label: nothing can predict it")
        k = counted.nonzero().reshape(-1)  # path indices of the targets this path owns
        if k.numel() == 0:
            continue
        losses = F.cross_entropy(logits[k - 1].float(), target[k], reduction="none")  # (K,)
        per_token[tokens[k]] = losses.detach().double()
        total = total + losses.sum()
    total.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"per_token": per_token, "total": float(total.detach()), "grads": grads, "num_paths": len(paths)}


def packed(model: torch.nn.Module, batch: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """The same numbers from the packed batch through a packer attention backend and packed_cross_entropy.

    ``flex`` on CPU runs forward only (torch 2.13 has no CPU flex backward): grads are None then.
    """
    use_packed_attention(model, backend)
    model.zero_grad(set_to_none=True)
    inputs = model_inputs(batch)
    cpu_flex = backend == "flex" and next(model.parameters()).device.type == "cpu"
    with torch.set_grad_enabled(not cpu_flex):
        logits = model(**inputs).logits  # (1, T, V)
        out = packed_cross_entropy(logits, batch["labels"], batch, reduction="none")
        total = out.loss.sum()
    grads = None
    if not cpu_flex:
        total.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.set_attn_implementation("sdpa")
    return {"per_token": out.loss.detach().double(), "total": float(total.detach()), "grads": grads}


def compare(model: torch.nn.Module, batch: Mapping[str, Any], backends: list[str], ref: dict | None = None) -> dict:
    """Max abs/rel differences of per-token losses, total and gradients, and a verdict, per backend."""
    ref = ref if ref is not None else reference(model, batch)
    report: dict[str, Any] = {"tokens": int(batch["input_ids"].shape[-1]), "paths": ref["num_paths"]}
    mask = batch["labels"][0] != IGNORE_INDEX
    for backend in backends:
        got = packed(model, batch, backend)
        d = (got["per_token"] - ref["per_token"]).abs()
        loss_abs = float(d.max())
        loss_rel = float((d / ref["per_token"].abs().clamp(min=1e-12))[mask].max())
        loss_ok = bool((d <= LOSS_ATOL + RTOL * ref["per_token"].abs()).all())
        total_rel = abs(got["total"] - ref["total"]) / abs(ref["total"])
        entry = {"loss_max_abs": loss_abs, "loss_max_rel": loss_rel, "total_rel": total_rel}
        ok = loss_ok and total_rel <= RTOL
        if got["grads"] is not None:
            g_abs, g_rel, g_ok, missing = 0.0, 0.0, True, sorted(set(ref["grads"]) ^ set(got["grads"]))
            for name, gr in ref["grads"].items():
                if name not in got["grads"]:
                    continue
                diff = (got["grads"][name] - gr).abs()
                scale = float(gr.abs().max()) or 1.0  # relative to the parameter's largest gradient entry
                g_abs = max(g_abs, float(diff.max()))
                g_rel = max(g_rel, float(diff.max()) / scale)
                g_ok &= bool((diff <= GRAD_ATOL_SCALE * scale + RTOL * gr.abs()).all())
            entry.update(grad_max_abs=g_abs, grad_max_rel=g_rel, grad_params=len(ref["grads"]), grad_missing=missing)
            ok = ok and g_ok and not missing
        else:
            entry["grads"] = "skipped (flex has no CPU backward in torch 2.13)"
        entry["ok"] = ok
        report[backend] = entry
    return report


# --------------------------------------------------------------------------------------------------------
# CLI


def default_backends(device: str) -> list[str]:
    """Every backend that can run here: sdpa, sdpa_varlen, flex; plus varlen and flash on CUDA."""
    from packer.train.attention import flash_available, varlen_available

    backends = ["sdpa", "sdpa_varlen", "flex"]
    if device == "cuda":
        backends += [b for b, ok in (("varlen", varlen_available()), ("flash", flash_available())) if ok]
    return backends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a JSONL file of examples (any packer input format)")
    parser.add_argument("--model", choices=MODELS, default="qwen2-vl")
    parser.add_argument("--backend", action="append", help="backend(s) to check (default: all available)")
    parser.add_argument("--max-length", type=int, default=1024, help="pack capacity in tokens")
    parser.add_argument("--max-pixels", type=int, default=56 * 56 * 4, help="small images keep it fast")
    parser.add_argument("--max-batches", type=int, default=4, help="rows checked (each row is one batch)")
    parser.add_argument("--out", help="shard directory (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tiny models: 1 is fastest)")
    args = parser.parse_args(argv)

    from packer.config import BuildConfig
    from packer.pipeline.build import build
    from packer.train.collate import collate
    from packer.train.dataset import PackedDataset

    cuda_only = sorted({"flash", "varlen"} & set(args.backend or []))
    if cuda_only:
        parser.error(f"{cuda_only} run on CUDA in bf16; this check is fp32 on CPU. Use `pytest -m gpu` on a GPU machine")
    torch.set_num_threads(args.threads)
    vision = {"profile": args.model, "max_pixels": args.max_pixels} if "-vl" in args.model else {"profile": "text"}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or str(Path(tmp) / "shards")
        config = BuildConfig.from_inputs([args.data], out, max_length=args.max_length, overwrite=True, **vision)
        build(config, progress=False)
        rows = list(PackedDataset(out, shuffle=False))[: args.max_batches]
        batches, ids = compact_vocab([collate([row]) for row in rows])
        model = tiny_model(args.model, **ids)
        backends = args.backend or default_backends("cpu")
        reports = [compare(model, batch, backends) for batch in batches]
    summary: dict[str, Any] = {"model": args.model, "data": args.data, "rows": len(reports)}
    for b in backends:
        entries = [r[b] for r in reports]
        summary[b] = {
            k: max(e[k] for e in entries)
            for k in ("loss_max_abs", "loss_max_rel", "total_rel", "grad_max_abs", "grad_max_rel")
            if k in entries[0]
        }
        summary[b]["ok"] = all(e["ok"] for e in entries)
    summary["ok"] = all(summary[b]["ok"] for b in backends) and len(reports) > 0
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
