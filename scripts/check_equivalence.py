#!/usr/bin/env python
"""Prove packing changes the cost, never the maths: packed batch vs every path run alone.

    python scripts/check_equivalence.py --data examples.jsonl --model qwen2-vl [--backend sdpa]
    python scripts/check_equivalence.py --data texts.jsonl --model text --model-class LlamaForCausalLM
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
entry |d| <= 1e-5 (|ref| + max |ref| of its parameter, floored at 1e-2 of the model's largest gradient).
``grad_max_rel`` is max |d| / that scale per parameter. The token ids are renumbered 0..K-1 (``compact_vocab``) so a 2-layer model runs in seconds; the
functions here are also what tests/train/test_equivalence.py runs.

Works for any registered profile: the family's proof (``ModelProfile.proof()``, packer/models/<family>/proof.py)
says what to build and how to run one path alone (``model_class``, ``tiny_model``, ``model_tokens``,
``path_inputs``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny models come from configs; nothing is downloaded

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a source checkout

from packer.core.types import IGNORE_INDEX  # noqa: E402
from packer.models.base import ModelProfile  # noqa: E402
from packer.train.attention.hf import attn_implementations, model_inputs, use_packed_attention  # noqa: E402
from packer.train.attention.layout import PackedLayout  # noqa: E402
from packer.train.trainers.loss import packed_cross_entropy  # noqa: E402

RTOL = 1e-5  # fp32: packed and unpacked matmuls differ only in summation order (~1e-7 relative)
LOSS_ATOL = 1e-6  # per-token losses are ~5-12 for random weights: 1e-6 is ~1e-7 relative
GRAD_ATOL_SCALE = 1e-5  # a gradient entry's atol: 1e-5 of its parameter's largest entry (near-zero entries)
# A parameter's scale is floored at 1e-2 of the model's largest gradient, so its atol is >= 1e-7 of it: about
# fp32's epsilon (1.2e-7), the finest difference two summation orders of terms that large can be told apart by.
# A gradient that is analytically zero (a key bias under softmax: CLIP's k_proj.bias) or tiny (Molmo2's pooling
# attention q/k, ~1e-8 of the largest: summation-order noise of 1.2e-8 of it was measured there), or small and
# summed over ~30k vision tokens (InternVL, 28 tiles of 1025 patches: a layernorm bias at 1e-4 of the largest,
# ~2e-5 of its own scale), holds only round-off; a packing error moves gradients by far more than that.
GRAD_ZERO_SCALE = 1e-2


def compact_vocab(
    batches: list[dict[str, Any]], token_ids: Mapping[str, int]
) -> tuple[list[dict[str, Any]], dict[str, int], int]:
    """Renumber the token ids used by ``batches`` (and the model's special ``token_ids``) as 0..K-1.

    The model's maths is the same for any id -> row mapping, and an LM head of K (~hundreds) rows instead of
    151936 makes a 2-layer model's step ~100x cheaper (the vocabulary projection dominates at hidden 32).
    Returns the new batches, {token: new id} and the vocabulary size (K rounded up to 64).
    """
    special = torch.tensor(list(token_ids.values()), dtype=torch.long)
    used = torch.cat([b["input_ids"].reshape(-1) for b in batches] + [special])
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
    return out, {k: int(table[v]) for k, v in token_ids.items()}, (used.numel() + 63) // 64 * 64


def profile_token_ids(profile: ModelProfile, tokenizer: Any) -> dict[str, int]:
    """The tokenizer's ids of the tokens the profile's model config names (``model_tokens()``)."""
    return {t: int(tokenizer.convert_tokens_to_ids(t)) for t in profile.proof().model_tokens()}


VOCAB = 151936  # Qwen2's padded vocabulary: the builtin tokenizers' ids go up to 151664


def tiny_model(
    profile: str | ModelProfile,
    *,
    token_ids: dict[str, int] | None = None,
    vocab_size: int = VOCAB,
    seed: int = 0,
    tokenizer: str | None = None,
    **kw: Any,
) -> torch.nn.Module:
    """The profile's tiny random-weight fp32 model (``Proof.tiny_model``), seeded.

    ``token_ids`` default to the ids of ``tokenizer`` (default: the profile's ``default_tokenizer``), for a model
    over the full vocabulary; ``compact_vocab`` gives them for a renumbered one.

        tiny_model("qwen2-vl")                                    # a 2-layer Qwen2VLForConditionalGeneration
        tiny_model("text", model_class="LlamaForCausalLM", vocab_size=256)
    """
    from packer.models import get_profile

    profile = get_profile(profile) if isinstance(profile, str) else profile
    if token_ids is None:
        from packer.encode.tokenizers import load_tokenizer

        name = tokenizer or profile.default_tokenizer
        if name is None:
            raise ValueError(f"profile {profile.name!r} has no default tokenizer: pass tokenizer= or token_ids=")
        token_ids = profile_token_ids(profile, load_tokenizer(name))
    torch.manual_seed(seed)
    return profile.proof().tiny_model(token_ids=token_ids, vocab_size=vocab_size, **kw)


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


def reference(
    model: torch.nn.Module, batch: Mapping[str, Any], profile: ModelProfile, token_ids: dict[str, int]
) -> dict[str, Any]:
    """Per-token losses (T,) and total of every path run alone (default attention), and the gradients.

    ``profile.proof().path_inputs`` gives the model kwargs of one path (its images and videos), so each path runs
    with the model's own positions (Qwen2-VL: ``get_rope_index``) and attention.
    """
    return path_reference(model, batch, profile.proof().path_inputs(batch, token_ids))


def path_reference(
    model: torch.nn.Module, batch: Mapping[str, Any], path_kwargs: Callable[[torch.Tensor], dict[str, Any]]
) -> dict[str, Any]:
    """Run every root-to-leaf path alone (sdpa, no packing) with ``path_kwargs(tokens)`` as the model's inputs,
    ``tokens`` (L,) the path's row positions; each target is counted on the first path through its node.
    Per-token losses (T,), their total and the gradients of the total."""
    model.set_attn_implementation(attn_implementations(model, "sdpa"))
    model.zero_grad(set_to_none=True)
    layout = PackedLayout.from_batch(batch)
    labels = batch["labels"][0]
    ranges = _node_ranges(layout)
    per_token = torch.zeros(layout.num_tokens, dtype=torch.float64)
    owner: dict[int, int] = {}  # node -> the first path through it: its targets are counted there only
    paths = leaf_paths(layout)
    for p, nodes in enumerate(paths):
        for n in nodes:
            owner.setdefault(n, p)
    total = 0.0
    for p, nodes in enumerate(paths):
        tokens = torch.cat([torch.arange(*ranges[n]) for n in nodes])  # (L,) row positions along the path
        logits = model(**path_kwargs(tokens)).logits[0]  # (L, V)
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
    model.set_attn_implementation(attn_implementations(model, "sdpa"))
    return {"per_token": out.loss.detach().double(), "total": float(total.detach()), "grads": grads}


def compare(
    model: torch.nn.Module,
    batch: Mapping[str, Any],
    backends: list[str],
    *,
    profile: ModelProfile | None = None,
    token_ids: dict[str, int] | None = None,
    ref: dict | None = None,
) -> dict:
    """Max abs/rel differences of per-token losses, total and gradients, and a verdict, per backend.

    ``ref`` is ``reference(model, batch, profile, token_ids)`` unless given (a family test's own reference).
    """
    if ref is None:
        if profile is None or token_ids is None:
            raise ValueError("compare() needs profile and token_ids to compute the reference, or ref")
        ref = reference(model, batch, profile, token_ids)
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
            floor = GRAD_ZERO_SCALE * max(float(g.abs().max()) for g in ref["grads"].values())
            for name, gr in ref["grads"].items():
                if name not in got["grads"]:
                    continue
                diff = (got["grads"][name] - gr).abs()
                scale = max(float(gr.abs().max()), floor) or 1.0  # relative to the parameter's largest entry
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
    from packer.train.attention.backends import flash_available, varlen_available

    backends = ["sdpa", "sdpa_varlen", "flex"]
    if device == "cuda":
        backends += [b for b, ok in (("varlen", varlen_available()), ("flash", flash_available())) if ok]
    return backends


def main(argv: list[str] | None = None) -> int:
    from packer.models import get_profile, profile_names

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a JSONL file of examples (any packer input format)")
    parser.add_argument("--model", choices=profile_names(), default="qwen2-vl", help="the profile (model family)")
    parser.add_argument("--model-class", help="a transformers class to build instead of the profile's "
                        "(e.g. LlamaForCausalLM for --model text)")
    parser.add_argument("--tokenizer", help="the build's tokenizer (default: the profile's default_tokenizer)")
    parser.add_argument("--backend", action="append", help="backend(s) to check (default: all available)")
    parser.add_argument("--max-length", type=int, default=1024, help="pack capacity in tokens")
    parser.add_argument("--max-pixels", type=int, default=56 * 56 * 4,
                        help="small images keep it fast (profiles with a max_pixels setting)")
    parser.add_argument("--profile-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a profile setting, as `packer build --profile-option` (e.g. do_pan_and_scan=true)")
    parser.add_argument("--max-batches", type=int, default=4, help="rows checked (each row is one batch)")
    parser.add_argument("--out", help="shard directory (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tiny models: 1 is fastest)")
    args = parser.parse_args(argv)

    from packer.config import BuildConfig, parse_profile_options
    from packer.encode.tokenizers import load_tokenizer
    from packer.pipeline.build import build
    from packer.train.data.collate import collate
    from packer.train.data.dataset import PackedDataset

    cuda_only = sorted({"flash", "varlen"} & set(args.backend or []))
    if cuda_only:
        parser.error(f"{cuda_only} run on CUDA in bf16; this check is fp32 on CPU. Use `pytest -m gpu` on a GPU machine")
    torch.set_num_threads(args.threads)
    profile = get_profile(args.model)
    options: dict[str, Any] = {"profile": args.model, "tokenizer": args.tokenizer}
    if "max_pixels" in profile.overridable:
        options["max_pixels"] = args.max_pixels
        if getattr(profile, "min_pixels", 0) > args.max_pixels:  # Qwen3-VL / Qwen3.5: 65536 by default
            options["min_pixels"] = args.max_pixels
    if args.profile_option:
        options["profile_options"] = parse_profile_options(args.profile_option)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or str(Path(tmp) / "shards")
        config = BuildConfig.from_inputs([args.data], out, max_length=args.max_length, overwrite=True, **options)
        build(config, progress=False)
        profile = get_profile(args.model, **config.profile_overrides())
        tokenizer = load_tokenizer(config.tokenizer_name())
        rows = list(PackedDataset(out, shuffle=False))[: args.max_batches]
        batches, ids, vocab = compact_vocab([collate([row]) for row in rows], profile_token_ids(profile, tokenizer))
        other = {"model_class": args.model_class} if args.model_class else {}
        model = tiny_model(profile, token_ids=ids, vocab_size=vocab, **other)
        backends = args.backend or default_backends("cpu")
        reports = [compare(model, batch, backends, profile=profile, token_ids=ids) for batch in batches]
    summary: dict[str, Any] = {"model": args.model, "model_class": type(model).__name__, "data": args.data,
                               "rows": len(reports)}
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
