"""The hand-made row the chunked and sliding-window tests pack, and their reference: each root-to-leaf path run
alone on dense SDPA under causal OR same-image-block, ANDed with the layer's own rule on the path's positions."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from packer.train.attention.layout import PackedLayout

# Example 0: a tree, prefix 0 (6 tokens) -> branches 1 (5) and 2 (3); 2 -> 3 (4) and 4 (2). Example 1: 7 tokens.
OFFSETS = [0, 6, 11, 14, 18, 20]
PARENTS = [-1, 0, 0, 2, 2, -1]
T = 27
SPANS = [(1, 4), (21, 25)]  # an image in the prefix, one in example 1


def paths(layout: PackedLayout) -> list[list[int]]:
    """Row positions of each root-to-leaf path of ``layout``."""
    offsets = layout.node_offsets.tolist() + [layout.num_tokens]
    anc = layout.ancestors()
    leaves = [n for n in range(layout.num_nodes) if n not in set(layout.node_parents.tolist())]
    return [[t for m in anc[n].nonzero().reshape(-1).tolist() for t in range(offsets[m], offsets[m + 1])]
            for n in leaves]


def reference(q, k, v, layout: PackedLayout, spans,
              overlay: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """Each path alone: causal OR same span, AND ``overlay(i, j)`` (query / key positions on the path) if given."""
    out = torch.zeros_like(q)
    for path in paths(layout):
        idx = torch.tensor(path)
        n = len(path)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        block = torch.full((n,), -1)
        for b, (s, e) in enumerate(spans):
            block[(idx >= s) & (idx < e)] = b
        allowed = (j <= i) | ((block[:, None] == block[None, :]) & (block[:, None] >= 0))
        if overlay is not None:
            allowed &= overlay(i, j)
        qh, kh, vh = (x[idx].transpose(0, 1)[None] for x in (q, k, v))  # (1, H, n, D)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, enable_gqa=True)[0].transpose(0, 1)
        out[idx] = o  # a shared prefix gets the same output on every path through it
    return out


def cuda_qkv(backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded bf16 q, k, v (4 query heads, 2 kv heads, 64 dims) on CUDA for the row; skips a kernel not
    installed."""
    import pytest

    from packer.train.attention.backends import flash_available, varlen_available

    if (backend == "flash" and not flash_available()) or (backend == "varlen" and not varlen_available()):
        pytest.skip(f"{backend} is not available")
    torch.manual_seed(0)
    q, k, v = (torch.randn(T, h, 64, device="cuda").to(torch.bfloat16) for h in (4, 2, 2))
    return q, k, v


def assert_matches_fp32_sdpa(q, k, v, layout: PackedLayout, backend: str, **rule: int) -> None:
    """``backend`` on bf16 q, k, v within 2e-2 of fp32 sdpa under the layer's ``rule`` (chunk= or window=)."""
    from packer.train.attention.backends import packed_attention

    ref = packed_attention(q.float(), k.float(), v.float(), layout, backend="sdpa", **rule)
    got = packed_attention(q, k, v, layout, backend=backend, **rule)
    assert (got.float() - ref).abs().max() < 2e-2, (backend, rule)
