"""packer.train.attention.layout: the tree mask and the varlen plan against the definition, bad layouts refused."""

from __future__ import annotations

import random

import pytest
import torch

from packer.errors import ShardError
from packer.train.attention.layout import PackedLayout, build_attention_mask, image_spans
from tests.helpers import GOLDEN_LAYOUT, random_layout

# packer.core.tree's docstring row: example 0 = prefix P (node 0) with branches a (1) and b (2); example 1 = Q.
GOLDEN_MASK = """
x.........
xx........
xxx.......
xxxx......
xxxxx.....
xxx..x....
xxx..xx...
xxx..xxx..
........x.
........xx
"""


def _render(mask: torch.Tensor) -> str:
    return "\n" + "\n".join("".join("x" if v else "." for v in row) for row in mask.tolist()) + "\n"


def brute_force_mask(num_tokens: int, cu_seqlens, node_offsets, node_parents, spans=()) -> torch.Tensor:
    """Token by token, straight from the definition (the independent reference)."""
    node_of = [max(n for n, o in enumerate(node_offsets) if o <= t) for t in range(num_tokens)]
    example_of = [max(e for e, c in enumerate(cu_seqlens[:-1]) if c <= t) for t in range(num_tokens)]

    def ancestors(n: int) -> set[int]:
        out = set()
        while n >= 0:
            out.add(n)
            n = node_parents[n]
        return out

    mask = torch.zeros(num_tokens, num_tokens, dtype=torch.bool)
    for i in range(num_tokens):
        anc = ancestors(node_of[i])
        for j in range(num_tokens):
            mask[i, j] = example_of[i] == example_of[j] and node_of[j] in anc and j <= i
            if any(s <= i < e and s <= j < e for s, e in spans):
                mask[i, j] = True
    return mask


def test_golden_mask_and_plan():
    mask = build_attention_mask(**GOLDEN_LAYOUT)
    assert _render(mask) == GOLDEN_MASK
    plan = PackedLayout.from_tensors(**GOLDEN_LAYOUT).varlen_plan()
    assert plan.bounds_q == [0, 3, 5, 8, 10]
    assert plan.bounds_k == [0, 3, 8, 14, 16]
    assert plan.k_index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8, 9]
    assert (plan.max_seqlen_q, plan.max_seqlen_k) == (3, 6)
    assert plan.cu_seqlens_q.dtype == plan.cu_seqlens_k.dtype == torch.int32


def test_linear_plan_gathers_nothing():
    layout = PackedLayout.from_tensors(7, [0, 1, 4, 7])  # no node metadata: one node per example
    plan = layout.varlen_plan()
    assert layout.is_linear and plan.k_index is None
    assert plan.bounds_q == plan.bounds_k == [0, 1, 4, 7]


@pytest.mark.parametrize("seed", range(12))
def test_mask_matches_brute_force(seed):
    rng = random.Random(seed)
    layout = random_layout(rng)
    spans = []
    if seed % 3 == 0:  # a bidirectional span inside the first example's first node
        end = layout["node_offsets"][1] if len(layout["node_offsets"]) > 1 else layout["num_tokens"]
        spans = [(0, min(3, end))]
    got = build_attention_mask(**layout, bidirectional_spans=spans or None)
    assert torch.equal(got, brute_force_mask(**layout, spans=spans))


def test_empty_nodes_are_transparent():
    # node 1 is empty: its child (node 2) hangs off node 0
    with_empty = PackedLayout.from_tensors(6, [0, 6], [0, 3, 3, 5], [-1, 0, 1, 0])
    plain = PackedLayout.from_tensors(6, [0, 6], [0, 3, 5], [-1, 0, 0])
    assert with_empty.node_offsets.tolist() == [0, 3, 5] and with_empty.node_parents.tolist() == [-1, 0, 0]
    assert torch.equal(with_empty.dense_mask(), plain.dense_mask())


def test_image_spans():
    ids = torch.tensor([[1, 7, 7, 2, 7, 3, 7, 7]])
    assert image_spans(ids, 7).tolist() == [[1, 3], [4, 5], [6, 8]]


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        (dict(num_tokens=5, cu_seqlens=[0, 4]), "cu_seqlens"),
        (dict(num_tokens=5, cu_seqlens=[0, 3, 3, 5]), "cu_seqlens"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 2], node_parents=[-1, 1]), "earlier node"),
        (dict(num_tokens=5, cu_seqlens=[0, 2, 5], node_offsets=[0, 3], node_parents=[-1, -1]), "root node"),
        (dict(num_tokens=5, cu_seqlens=[0, 2, 5], node_offsets=[0, 2, 3], node_parents=[-1, -1, 0]), "same example"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 2], node_parents=[-1]), "differ in length"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 3, 2], node_parents=[-1, 0, 0]), "not decrease"),
    ],
)
def test_bad_layouts_are_refused(layout, match):
    with pytest.raises(ShardError, match=match):
        PackedLayout.from_tensors(**layout)
