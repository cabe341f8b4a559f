"""packer.train.layout, .attention, .hf: the tree mask, the varlen plan, every backend against the SDPA
reference, HF wiring."""

from __future__ import annotations

import random

import pytest
import torch

from packer.core.tree import predecessor_index
from packer.errors import ConfigError, ShardError
from packer.train.attention import BACKENDS, packed_attention, resolve_backend
from packer.train.hf import (
    LAYOUT_KWARG,
    implementation_name,
    make_attention_function,
    model_inputs,
    register,
    use_packed_attention,
)
from packer.train.layout import PackedLayout, build_attention_mask, image_spans
from tests.helpers import GOLDEN_LAYOUT, random_layout

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


def _qkv(T: int, dtype=torch.float64, heads: int = 4, kv_heads: int = 2, dim: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, heads, dim, generator=g, dtype=dtype)
    k = torch.randn(T, kv_heads, dim, generator=g, dtype=dtype)
    v = torch.randn(T, kv_heads, dim, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("seed", range(6))
def test_sdpa_varlen_matches_reference_with_grads(seed):
    layout = PackedLayout.from_tensors(**random_layout(random.Random(100 + seed), examples=5))
    q, k, v = (x.requires_grad_() for x in _qkv(layout.num_tokens, seed=seed))
    ref = packed_attention(q, k, v, layout, backend="sdpa")  # (T, H, D)
    got = packed_attention(q, k, v, layout, backend="sdpa_varlen")
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    g_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_flex_forward_matches_reference_on_cpu(bidirectional):
    layout_args = random_layout(random.Random(7), examples=4)
    spans = [(0, 2)] if bidirectional else None
    layout = PackedLayout.from_tensors(**layout_args, bidirectional_spans=spans)
    q, k, v = _qkv(layout.num_tokens, dtype=torch.float32)
    with torch.no_grad():
        ref = packed_attention(q, k, v, layout, backend="sdpa")
        got = packed_attention(q, k, v, layout, backend="flex")
    diff = (got - ref).abs().max()
    print(f"flex vs sdpa max abs diff: {diff:.2e}")
    assert diff < 1e-5


def test_flex_cannot_train_on_cpu():
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT)
    q, k, v = (x.requires_grad_() for x in _qkv(10, dtype=torch.float32))
    with pytest.raises(ConfigError, match="no CPU backward"):
        packed_attention(q, k, v, layout, backend="flex")


def test_causal_segment_backends_refuse_bidirectional_spans():
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT, bidirectional_spans=[(0, 2)])
    q, k, v = _qkv(10)
    with pytest.raises(ConfigError, match="bidirectional image spans need backend 'flex' or 'sdpa'"):
        packed_attention(q, k, v, layout, backend="sdpa_varlen")


def test_resolve_backend():
    assert resolve_backend("auto", "cpu") == "sdpa_varlen"
    assert resolve_backend("auto", "cpu", bidirectional=True) == "sdpa"
    assert resolve_backend("flex", "cpu") == "flex"
    with pytest.raises(ConfigError, match="unknown attention backend 'fast'"):
        resolve_backend("fast", "cpu")


# ---- transformers integration


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def _batch(layout_args: dict) -> dict:
    T = layout_args["num_tokens"]
    layout = PackedLayout.from_tensors(**layout_args)
    pred = predecessor_index(T, layout.node_offsets, layout.node_parents)
    # 1-D positions: a token's position is its predecessor's + 1, 0 at an example start
    pos = torch.zeros(T, dtype=torch.long)
    for t in range(T):
        pos[t] = 0 if pred[t] < 0 else pos[pred[t]] + 1
    return {
        "input_ids": torch.arange(T)[None] % 64,
        "labels": torch.arange(T)[None] % 64,
        "position_ids": pos[None],
        "cu_seqlens": layout.cu_seqlens,
        "node_offsets": layout.node_offsets,
        "node_parents": layout.node_parents,
        "max_seqlen": layout.max_seqlen,
        "num_loss_tokens": T,
        "example_ids": ["a", "b"],
    }


def test_register_and_use():
    names = register()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert names == ["packer"] + [f"packer_{b}" for b in BACKENDS]
    assert all(n in AttentionInterface._global_mapping and n in AttentionMaskInterface._global_mapping for n in names)
    model = _tiny_llama()
    assert use_packed_attention(model, "sdpa_varlen") == "packer_sdpa_varlen"
    assert model.config._attn_implementation == "packer_sdpa_varlen"
    assert implementation_name("auto") == "packer"


def test_model_inputs_keeps_model_keys_only():
    batch = _batch(GOLDEN_LAYOUT)
    inputs = model_inputs(batch)
    assert set(inputs) == {"input_ids", "position_ids", "use_cache", LAYOUT_KWARG}
    assert inputs["use_cache"] is False and inputs[LAYOUT_KWARG].num_nodes == 4
    with pytest.raises(ConfigError, match="linear pack"):
        model_inputs(batch, with_labels=True)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "sdpa_varlen"])
def test_packed_model_equals_each_example_alone(backend):
    """A linear pack through a stock LlamaForCausalLM equals each example run alone (default SDPA)."""
    model = _tiny_llama()
    layout = dict(num_tokens=9, cu_seqlens=[0, 4, 5, 9])
    batch = _batch(layout)
    use_packed_attention(model, backend)
    with torch.no_grad():
        packed = model(**model_inputs(batch)).logits[0]  # (T, V)
        model.set_attn_implementation("sdpa")
        for a, b in zip(layout["cu_seqlens"][:-1], layout["cu_seqlens"][1:], strict=True):
            alone = model(input_ids=batch["input_ids"][:, a:b]).logits[0]
            torch.testing.assert_close(packed[a:b], alone, rtol=1e-5, atol=1e-6)


def test_gradient_checkpointing_keeps_the_layout():
    """Recomputed layers get the same kwargs: gradients with checkpointing equal those without."""
    batch = _batch(GOLDEN_LAYOUT)
    grads = []
    for checkpointing in (False, True):
        model = _tiny_llama().train()
        if checkpointing:
            model.activation_checkpointing_enable()
        use_packed_attention(model, "sdpa_varlen")
        model(**model_inputs(batch)).logits.square().mean().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-8)


def test_packed_row_without_boundaries_is_refused():
    model = _tiny_llama()
    use_packed_attention(model, "sdpa")
    batch = _batch(dict(num_tokens=9, cu_seqlens=[0, 4, 9]))
    with pytest.raises(ConfigError, match="without its boundaries"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    # one plain sequence (positions 0..T-1) is fine: it is ordinary causal attention
    model(input_ids=batch["input_ids"])


def test_refuses_padded_batches_and_masks():
    attn = make_attention_function("sdpa")
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT)
    module = torch.nn.Module()
    q = torch.randn(2, 4, 10, 8)
    with pytest.raises(ConfigError, match="batch size 1"):
        attn(module, q, q, q, None, **{LAYOUT_KWARG: layout})
    with pytest.raises(ConfigError, match="not both"):
        attn(module, q[:1], q[:1], q[:1], torch.ones(1, 1, 10, 10, dtype=torch.bool), **{LAYOUT_KWARG: layout})


def test_non_causal_calls_fall_through_to_sdpa():
    """A vision tower's per-image (non-causal) attention ignores the text layout riding in kwargs."""
    attn = make_attention_function("sdpa_varlen")
    module = torch.nn.Module()
    module.is_causal = False
    q = torch.randn(1, 2, 6, 8)
    out, _ = attn(module, q, q, q, None, is_causal=False, **{LAYOUT_KWARG: PackedLayout.from_tensors(**GOLDEN_LAYOUT)})
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2)
    torch.testing.assert_close(out, ref)


# ---- CUDA kernels (skipped without a GPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "varlen", "flex"])
@pytest.mark.parametrize("seed", range(3))
def test_cuda_kernels_match_sdpa(backend, seed):
    from packer.train.attention import flash_available, varlen_available

    if backend == "flash" and not flash_available():
        pytest.skip("flash-attn is not installed")
    if backend == "varlen" and not varlen_available():
        pytest.skip("torch varlen_attn needs PyTorch's flash kernels")
    layout = PackedLayout.from_tensors(**random_layout(random.Random(seed), examples=6, max_len=200, max_nodes=6))
    q, k, v = (x.cuda().to(torch.bfloat16).requires_grad_() for x in _qkv(layout.num_tokens, dim=64, seed=seed))
    ref = packed_attention(q.float(), k.float(), v.float(), layout, backend="sdpa")
    got = packed_attention(q, k, v, layout, backend=backend)
    diff = (got.float() - ref).abs().max()
    print(f"{backend} vs fp32 sdpa: max abs diff {diff:.2e}")
    assert diff < 2e-2
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    g_got = torch.autograd.grad((got.float() * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_ref, strict=True):
        cos = torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0)
        assert cos > 0.999
