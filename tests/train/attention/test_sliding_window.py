"""Sliding-window layers on packed rows: the window counts positions along each root-to-leaf path.

Reference: every path of a hand-made row (two examples, one a nested tree) run alone with the mask
transformers builds for a sliding layer, AND(kv > q - window, OR(causal, same image block)), on dense SDPA;
the packed row must give each path's outputs on every CPU backend (flex forward-only), with and without
bidirectional spans (on sdpa_varlen: span_attention's two calls, the window on the causal one). A branch's first token is far from its parent's last in the row but adjacent on its path.
"""

from __future__ import annotations

import pytest
import torch

from packer.train.attention.backends import packed_attention
from packer.train.attention.layout import PackedLayout
from tests.train.attention import path_reference as ref


def _reference(q, k, v, layout, window: int | None, spans) -> torch.Tensor:
    if window is None:
        return ref.reference(q, k, v, layout, spans, None)
    return ref.reference(q, k, v, layout, spans, lambda i, j: j > i - window)  # transformers' sliding_window_overlay, on the path's own positions


@pytest.mark.slow
@pytest.mark.parametrize("window", [1, 2, 3, 5, 100])
@pytest.mark.parametrize("with_spans", [False, True])
def test_packed_sliding_window_matches_each_path_alone(window: int, with_spans: bool) -> None:
    torch.manual_seed(window)
    q, k, v = torch.randn(ref.T, 4, 8), torch.randn(ref.T, 2, 8), torch.randn(ref.T, 2, 8)
    spans = ref.SPANS if with_spans else []
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS, bidirectional_spans=spans or None)
    assert layout.path_positions().tolist()[11:14] == [6, 7, 8]  # branch 2 continues its parent, not the row
    expected = _reference(q, k, v, layout, window, spans)
    for backend in ("sdpa", "flex", "sdpa_varlen"):  # sdpa_varlen with spans: the two merged varlen calls
        with torch.no_grad():
            got = packed_attention(q, k, v, layout, backend=backend, window=window)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=backend)


def test_no_window_is_the_plain_tree_mask() -> None:
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS)
    assert torch.equal(layout.dense_mask("cpu", ref.T), layout.dense_mask("cpu"))
    assert not torch.equal(layout.dense_mask("cpu", 2), layout.dense_mask("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "varlen", "flex"])
@pytest.mark.parametrize("with_spans", [False, True])
def test_cuda_kernels_take_the_window(backend: str, with_spans: bool) -> None:
    """window_size=(window - 1, 0) on the varlen segments (and span_attention's causal call) equals fp32 sdpa."""
    q, k, v = ref.cuda_qkv(backend)
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS, bidirectional_spans=ref.SPANS if with_spans else None)
    for window in (2, 5):
        ref.assert_matches_fp32_sdpa(q, k, v, layout, backend, window=window)
