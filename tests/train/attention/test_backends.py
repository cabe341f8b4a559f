"""packer.train.attention.backends: every backend against the SDPA reference (CUDA kernels skip without a GPU)."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from packer.errors import ConfigError
from packer.train.attention.backends import packed_attention, resolve_backend
from packer.train.attention.layout import PackedLayout
from tests.helpers import GOLDEN_LAYOUT, random_layout, random_spans


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


@pytest.mark.slow
@pytest.mark.parametrize("bidirectional", [False, True])
def test_flex_forward_matches_reference_on_cpu(bidirectional):
    rng = random.Random(7)
    layout_args = random_layout(rng, examples=4)
    spans = random_spans(rng, layout_args) if bidirectional else None
    layout = PackedLayout.from_tensors(**layout_args, bidirectional_spans=spans)
    q, k, v = _qkv(layout.num_tokens, dtype=torch.float32)
    with torch.no_grad():
        ref = packed_attention(q, k, v, layout, backend="sdpa")
        got = packed_attention(q, k, v, layout, backend="flex")
    diff = (got - ref).abs().max()
    print(f"flex vs sdpa max abs diff: {diff:.2e}")
    assert diff < 1e-5


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["tree", "spans", "window", "chunk"])
def test_padded_flex_mask_is_the_row_mask_and_isolates_the_padding(seed, kind):
    """CUDA flex runs at static padded shapes (``flex_padding``): inside the row the padded mask is the row's
    dense mask, no real token sees padding, padding sees no real token; eager flex on the padded row (CPU) gives
    the unpadded output."""
    from torch.nn.attention.flex_attention import create_mask, flex_attention

    from packer.train.attention.backends import flex_padding, flex_static_inputs

    rng = random.Random(300 + seed)
    args = random_layout(rng, examples=5, max_len=40, max_nodes=6)
    spans = random_spans(rng, args) if kind == "spans" else None
    layout = PackedLayout.from_tensors(**args, bidirectional_spans=spans)
    window, chunk = {"window": (5, None), "chunk": (None, 7)}.get(kind, (None, None))
    T = layout.num_tokens
    pad = flex_padding(T, layout.num_nodes)
    assert pad[0] >= T and pad[0] & (pad[0] - 1) == 0 and pad[1] > layout.num_nodes
    full = create_mask(layout.mask_mod("cpu", window, chunk, pad), None, None, pad[0], pad[0], device="cpu")[0, 0]
    assert torch.equal(full[:T, :T], layout.dense_mask("cpu", window, chunk))
    assert not full[:T, T:].any() and not full[T:, :T].any()
    assert full[T:, T:].diagonal().all()  # every padding row sees a key: no NaN in the padded output
    q, k, v = _qkv(T, dtype=torch.float32)  # head dim 8: padded to 16 as on CUDA
    qh, kh, vh, pad2, scale = flex_static_inputs(*(x.transpose(0, 1)[None] for x in (q, k, v)), layout, None)
    assert pad2 == pad and qh.shape[-1] == 16 and scale == pytest.approx(8**-0.5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex_attention(qh, kh, vh, block_mask=layout.block_mask("cpu", window, chunk, pad), scale=scale,
                             enable_gqa=True)
        ref = packed_attention(q, k, v, layout, backend="sdpa", window=window, chunk=chunk)
    assert not got[0, :, :, 8:].any()
    torch.testing.assert_close(got[0, :, :T, :8].transpose(0, 1), ref, rtol=1e-5, atol=1e-5)


def test_padded_flex_mask_refuses_a_pad_smaller_than_the_row():
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT)
    with pytest.raises(ValueError, match="smaller than the row"):
        layout.mask_mod("cpu", pad=(layout.num_tokens, layout.num_nodes))


def test_flex_cannot_train_on_cpu():
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT)
    q, k, v = (x.requires_grad_() for x in _qkv(10, dtype=torch.float32))
    with pytest.raises(ConfigError, match="no CPU backward"):
        packed_attention(q, k, v, layout, backend="flex")


def test_resolve_backend():
    assert resolve_backend("auto", "cpu") == "sdpa_varlen"
    assert resolve_backend("auto", "cpu", bidirectional=True) == "sdpa"
    assert resolve_backend("flex", "cpu") == "flex"
    with pytest.raises(ConfigError, match="'backend' must be one of 'auto', 'flash', 'varlen', 'flex', 'sdpa', 'sdpa_varlen'; got 'fast'"):
        resolve_backend("fast", "cpu")


# ---- CUDA kernels (skipped without a GPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "varlen", "flex"])
@pytest.mark.parametrize("seed", range(3))
def test_cuda_kernels_match_sdpa(backend, seed):
    from packer.train.attention.backends import flash_available, varlen_available

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
