"""Bidirectional image spans on the varlen backends (packer.train.attention.spans): the span plan, the two calls
covering the mask exactly once, the LSE merge and its gradient against SDPA with the dense mask, collate's
spans, and a stock transformers model on packed rows vs each example alone under its own 4-D mask.
The CUDA kernels (flash-attn, torch varlen) are checked by the ``gpu`` tests at the end."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from packer.core.types import EncodedImage
from packer.errors import ConfigError, ShardError
from packer.train.attention.backends import packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.attention.spans import AFTER, CAUSAL, span_attention
from packer.train.attention.varlen_kernels import KERNELS, ReferenceKernel, window_mask
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.helpers import GOLDEN_LAYOUT, random_example, random_layout, random_spans, write_shardset
from tests.train.attention.test_layout import brute_force_mask


def _qkv(T: int, *, dtype=torch.float64, heads: int = 4, kv_heads: int = 2, dim: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(T, h, dim, generator=g, dtype=dtype) for h in (heads, kv_heads, kv_heads))


def _spanned(seed: int, **kw) -> PackedLayout:
    """A random row of trees with random spans inside nodes (some of one token, some a whole node)."""
    rng = random.Random(seed)
    args = random_layout(rng, **kw)
    return PackedLayout.from_tensors(**args, bidirectional_spans=random_spans(rng, args))


def _grads(out: torch.Tensor, inputs, w: torch.Tensor):
    return torch.autograd.grad((out * w).sum(), inputs)


# ---- the plan


def test_span_plan_golden():
    # node 0 = [0, 3), node 2 = [5, 8), node 3 = [8, 10): spans [1, 3), [5, 8) and the one-token [8, 9)
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT, bidirectional_spans=[(5, 8), (1, 3), (8, 9)])
    assert layout.bidirectional_spans.tolist() == [[1, 3], [5, 8], [8, 9]]  # sorted
    plan = layout.span_plan()
    assert plan.q_index.tolist() == [1, 5, 6]  # each span but its last token
    assert plan.k_index.tolist() == [2, 6, 7]  # each span but its first token
    assert plan.bounds_q == plan.bounds_k == [0, 1, 3]  # the one-token span adds nothing
    assert plan.cu_seqlens_q.dtype == plan.cu_seqlens_k.dtype == torch.int32
    assert (plan.max_seqlen_q, plan.max_seqlen_k) == (2, 2)
    assert layout.span_plan() is plan  # built once per batch (per device), shared by every layer
    assert PackedLayout.from_tensors(**GOLDEN_LAYOUT, bidirectional_spans=[(8, 9)]).span_plan() is None
    assert PackedLayout.from_tensors(**GOLDEN_LAYOUT).span_plan() is None


@pytest.mark.parametrize("seed", range(30))
def test_the_two_calls_cover_the_mask_exactly_once(seed):
    """Count, for every (query, key), the calls that score it: the dense mask, each pair once, nothing else."""
    layout = _spanned(seed, examples=5, max_len=16)
    count = torch.zeros(layout.num_tokens, layout.num_tokens, dtype=torch.long)
    plans = [(layout.varlen_plan(), CAUSAL), (layout.span_plan(), AFTER)]
    for plan, window in plans:
        if plan is None:
            continue
        q_rows = torch.arange(layout.num_tokens) if plan.q_index is None else plan.q_index
        k_rows = torch.arange(layout.num_tokens) if plan.k_index is None else plan.k_index
        for s in range(len(plan.bounds_q) - 1):
            q0, q1, k0, k1 = plan.bounds_q[s], plan.bounds_q[s + 1], plan.bounds_k[s], plan.bounds_k[s + 1]
            seen = window_mask(q1 - q0, k1 - k0, window).long()  # (lq, lk)
            count.index_put_((q_rows[q0:q1, None], k_rows[None, k0:k1]), seen, accumulate=True)
    spans = [tuple(s) for s in (layout.bidirectional_spans.tolist() if layout.bidirectional_spans is not None else [])]
    args = dict(num_tokens=layout.num_tokens, cu_seqlens=layout.cu_seqlens.tolist(),
                node_offsets=layout.node_offsets.tolist(), node_parents=layout.node_parents.tolist())
    assert torch.equal(count, brute_force_mask(**args, spans=spans).long())


def test_window_mask():
    assert window_mask(2, 3, (-1, 0)).int().tolist() == [[1, 1, 0], [1, 1, 1]]
    assert window_mask(3, 3, (0, -1)).int().tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]


@pytest.mark.parametrize(
    ("spans", "match"),
    [([(2, 4)], "crosses a node boundary"), ([(0, 2), (1, 3)], "overlap"), ([(8, 11)], "inside 0..10")],
)
def test_bad_spans_are_refused(spans, match):
    with pytest.raises(ShardError, match=match):
        PackedLayout.from_tensors(**GOLDEN_LAYOUT, bidirectional_spans=spans)


# ---- the reference kernel and the merge


@pytest.mark.parametrize("seed", range(4))
def test_reference_kernel_is_varlen_attention_with_its_lse(seed):
    """One causal call of the plain-torch kernel = SDPA on the tree mask; its LSE = the masked logsumexp; its
    backward, given its own output and LSE, = autograd through SDPA."""
    layout = PackedLayout.from_tensors(**random_layout(random.Random(seed), examples=4))
    q, k, v = (x.requires_grad_() for x in _qkv(layout.num_tokens, seed=seed))
    plan, kernel, scale = layout.varlen_plan(), ReferenceKernel(), 0.3
    kg, vg = (x.index_select(0, plan.k_index) if plan.k_index is not None else x for x in (k, v))
    out, lse, state = kernel.forward(q.detach(), kg.detach(), vg.detach(), plan, scale=scale, window=CAUSAL)
    ref = packed_attention(q, k, v, layout, backend="sdpa", scale=scale)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    scores = torch.einsum("thd,shd->hts", q, k.repeat_interleave(2, dim=1)) * scale  # (H, T, T)
    ref_lse = scores.masked_fill(~layout.dense_mask(), float("-inf")).logsumexp(-1)  # (H, T)
    torch.testing.assert_close(lse, ref_lse.detach(), rtol=1e-12, atol=1e-12)
    w = torch.randn_like(out)
    dq, dkg, dvg = kernel.backward(w, q.detach(), kg.detach(), vg.detach(), out, lse, plan, scale=scale,
                                   window=CAUSAL, state=state)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    rows = plan.k_index if plan.k_index is not None else torch.arange(layout.num_tokens)
    dk.index_add_(0, rows, dkg)
    dv.index_add_(0, rows, dvg)
    for a, b in zip((dq, dk, dv), _grads(ref, (q, k, v), w), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_merged_attention_equals_the_dense_mask_with_gradients(seed):
    """Trees + several examples + spans, GQA, fp64: the two merged calls = SDPA with the dense mask, to ~1e-15."""
    layout = _spanned(seed, examples=5, max_len=20)
    q, k, v = (x.requires_grad_() for x in _qkv(layout.num_tokens, seed=seed))
    ref = packed_attention(q, k, v, layout, backend="sdpa")  # (T, H, D)
    got = packed_attention(q, k, v, layout, backend="sdpa_varlen")  # the two calls when a span has >= 2 tokens
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(ref)
    for a, b in zip(_grads(got, (q, k, v), w), _grads(ref, (q, k, v), w), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_merge_in_fp32_and_mha():
    """fp32, one kv head per query head, long spans (a whole 30-token image in a 60-token example)."""
    layout = PackedLayout.from_tensors(100, [0, 60, 100], [0, 10, 60, 70], [-1, 0, -1, 2],
                                       bidirectional_spans=[(15, 45), (60, 61), (75, 90)])
    q, k, v = (x.requires_grad_() for x in _qkv(100, dtype=torch.float32, kv_heads=4, dim=16))
    ref = packed_attention(q, k, v, layout, backend="sdpa")
    got = span_attention(q, k, v, layout, KERNELS["reference"], scale=16 ** -0.5)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    w = torch.randn_like(ref)
    for a, b in zip(_grads(got, (q, k, v), w), _grads(ref, (q, k, v), w), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_spans_refuse_dropout_on_the_merged_backends():
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT, bidirectional_spans=[(0, 2)])
    q, k, v = _qkv(10)
    with pytest.raises(ConfigError, match="attention dropout with bidirectional spans needs backend 'sdpa'"):
        packed_attention(q, k, v, layout, backend="sdpa_varlen", dropout=0.1)


# ---- collate


def _linear_with_images(rng: np.random.Generator, i: int, images: list[tuple[int, int]]):
    """A one-node example whose images are (offset, num_tokens)."""
    ex = random_example(rng, i, max_len=20)
    n = len(ex.input_ids)
    imgs = [EncodedImage(source=f"/img/{i}.jpg", data=None, grid_thw=(1, 2, 2), offset=o, num_tokens=t)
            for o, t in images if o + t <= n]
    return dataclasses.replace(ex, node_offsets=np.array([0], np.int32), node_parents=np.array([-1], np.int32),
                               position_ids=np.arange(n, dtype=np.int32), images=imgs)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_collate_emits_each_rows_spans_in_batch_offsets(tmp_path, bidirectional):
    rng = np.random.default_rng(5)
    examples = [_linear_with_images(rng, i, [(1, 3), (5, 1)] if i % 2 else [(2, 2)]) for i in range(6)]
    root = write_shardset(tmp_path / "out", examples, [2, 3, 1], profile="qwen2-vl")
    rows = list(PackedDataset(root, shuffle=False, load_images=False))
    for r in rows:  # the profile switch a Molmo-style family sets by default
        r["profile_options"] = {**r["profile_options"], "bidirectional_images": bidirectional}
    batch = collate(rows)
    if not bidirectional:
        assert "bidirectional_spans" not in batch and PackedLayout.from_batch(batch).bidirectional_spans is None
        return
    starts = np.cumsum([0] + [len(r["input_ids"]) for r in rows])
    expected = [(im["offset"] + s, im["offset"] + im["num_tokens"] + s) for r, s in zip(rows, starts, strict=False)
                for im in r["images"]]
    spans = batch["bidirectional_spans"]
    assert spans.dtype == torch.int32 and spans.shape == (len(expected), 2) and len(expected) >= 6
    assert [tuple(s) for s in spans.tolist()] == expected
    assert PackedLayout.from_batch(batch).bidirectional_spans.tolist() == [list(s) for s in expected]
    assert collate(rows[:1])["bidirectional_spans"].tolist() == [list(s) for s in expected[: len(rows[0]["images"])]]


# ---- end to end: a stock transformers model, packed vs each example alone


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("backend", ["sdpa_varlen", "sdpa"])
def test_packed_model_with_spans_equals_each_example_under_its_own_mask(backend):
    """LlamaForCausalLM (2 layers) on a packed row of trees with image spans, through ``model(**batch)``, equals
    each example alone under stock SDPA with its own 4-D mask (tree + spans, from the definition): logits and
    the parameter gradients of the summed per-token loss."""
    from packer.train.attention.hf import use_packed_attention

    # example 0: node 0 [0, 9) with an image [2, 7), branches [9, 12) and [12, 16) (image [13, 16));
    # example 1: [16, 24) with images [17, 20) and [20, 23) (adjacent spans stay apart)
    cu, offsets, parents = [0, 16, 24], [0, 9, 12, 16], [-1, 0, 0, -1]
    spans = [(2, 7), (13, 16), (17, 20), (20, 23)]
    pos = torch.tensor([*range(9), 9, 10, 11, 9, 10, 11, 12, *range(8)])
    ids = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "position_ids": pos[None], "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
             "node_offsets": torch.tensor(offsets, dtype=torch.int32),
             "node_parents": torch.tensor(parents, dtype=torch.int32), "max_seqlen": 16,
             "bidirectional_spans": torch.tensor(spans, dtype=torch.int32)}
    model = _tiny_llama()
    use_packed_attention(model, backend)
    packed = model(**batch).logits[0]  # (T, V)
    packed.logsumexp(-1).sum().backward()
    g_packed = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    model.set_attn_implementation("sdpa")
    total = 0
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        own = [(o - a, p if p < 0 else p - offsets.index(a)) for o, p in zip(offsets, parents, strict=True)
               if a <= o < b]
        mask = brute_force_mask(b - a, [0, b - a], [o for o, _ in own], [p for _, p in own],
                                spans=[(s - a, t - a) for s, t in spans if a <= s < b])
        alone = model(input_ids=ids[:, a:b], position_ids=pos[None, a:b], attention_mask=mask[None, None]).logits[0]
        torch.testing.assert_close(packed[a:b], alone.detach(), rtol=1e-5, atol=1e-5)
        total = total + alone.logsumexp(-1).sum()
    total.backward()
    for gp, p in zip(g_packed, model.parameters(), strict=True):
        torch.testing.assert_close(gp, p.grad, rtol=1e-4, atol=1e-6)


# ---- the CUDA kernels (``pytest -m gpu``; scripts/gpu_check.py runs them)


def _cuda_kernel_ok(backend: str) -> None:
    from packer.train.attention.backends import flash_available, varlen_available

    if backend == "flash" and not flash_available():
        pytest.skip("flash-attn is not installed")
    if backend == "varlen" and not varlen_available():
        pytest.skip("torch varlen_attn needs PyTorch's flash kernels")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "varlen"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", range(3))
def test_cuda_kernels_with_spans_match_sdpa(backend, dtype, seed):
    """The real kernels (bf16 inside; fp32 inputs are cast) on trees + spans vs fp32 SDPA with the dense mask."""
    _cuda_kernel_ok(backend)
    layout = _spanned(seed, examples=6, max_len=300, max_nodes=6)
    assert layout.span_plan() is not None
    q, k, v = (x.cuda().to(dtype).requires_grad_() for x in _qkv(layout.num_tokens, dtype=torch.float32,
                                                               dim=64, seed=seed))
    ref = packed_attention(q.float(), k.float(), v.float(), layout, backend="sdpa")
    got = packed_attention(q, k, v, layout, backend=backend)
    assert got.dtype == dtype
    diff = (got.float() - ref).abs().max()
    print(f"{backend} {dtype} with spans vs fp32 sdpa: max abs diff {diff:.2e}")
    assert diff < 2e-2
    w = torch.randn_like(ref)
    for a, b in zip(_grads(got.float(), (q, k, v), w), _grads(ref, (q, k, v), w), strict=True):
        cos = torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0)
        rel = (a.float() - b.float()).norm() / b.float().norm()
        print(f"  grad cos {cos:.6f} rel {rel:.2e}")
        assert cos > 0.999 and rel < 3e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "varlen"])
def test_cuda_kernel_lse_and_backward_match_the_reference(backend):
    """Each raw kernel call (both windows) vs the plain-torch reference on the same bf16 inputs: output, LSE and
    the backward given the call's own output and LSE (what the merge relies on), head dim 40 (flash pads it)."""
    _cuda_kernel_ok(backend)
    layout = _spanned(11, examples=5, max_len=200, max_nodes=4)
    kernel, ref_kernel = KERNELS[backend], ReferenceKernel()
    q, k, v = (x.cuda().to(torch.bfloat16) for x in _qkv(layout.num_tokens, dtype=torch.float32, dim=40))
    for plan, window in ((layout.varlen_plan("cuda"), CAUSAL), (layout.span_plan("cuda"), AFTER)):
        qs = q if plan.q_index is None else q.index_select(0, plan.q_index)
        ks, vs = (x if plan.k_index is None else x.index_select(0, plan.k_index) for x in (k, v))
        out, lse, state = kernel.forward(qs, ks, vs, plan, scale=0.15, window=window)
        r_out, r_lse, _ = ref_kernel.forward(qs, ks, vs, plan, scale=0.15, window=window)
        assert lse.shape == r_lse.shape == (qs.shape[1], qs.shape[0]) and lse.dtype == torch.float32
        torch.testing.assert_close(lse, r_lse, rtol=0, atol=2e-2)
        torch.testing.assert_close(out.float(), r_out.float(), rtol=0, atol=2e-2)
        dout = torch.randn_like(out)
        got = kernel.backward(dout, qs, ks, vs, out, lse, plan, scale=0.15, window=window, state=state)
        ref = ref_kernel.backward(dout, qs, ks, vs, out, lse, plan, scale=0.15, window=window, state=None)
        for a, b in zip(got, ref, strict=True):
            assert a.shape == b.shape
            rel = (a.float() - b.float()).norm() / b.float().norm()
            assert rel < 2e-2, f"{backend} {window}: relative gradient error {rel:.2e}"
