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
