"""Chunked-attention layers (Llama 4) on packed rows: chunks of positions counted along each root-to-leaf path.

A chunked layer's token at position p sees the keys of its own chunk, positions c * C .. p with c = p // C
(transformers' ``chunked_overlay`` ANDed onto causal). Reference: every path of a hand-made row (two examples, one a
nested tree whose branches start mid-chunk) run alone under that mask on dense SDPA; the packed row must give each
path's outputs and gradients on every CPU backend (flex forward only), with and without bidirectional spans (where
the varlen backends refuse chunks loudly). Then the real ``Llama4ForCausalLM`` (a chunked RoPE layer with a chunk
shorter than the rows, a NoPE layer with temperature tuning): packed == every path alone, and each of packer's two
rules (chunks along the path, the NoPE temperature at path positions) is needed: without it the packed loss is wrong.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import packer.train.attention.hf as hf
from packer.core import tree
from packer.errors import ConfigError
from packer.models import get_profile
from packer.train.attention.backends import packed_attention
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.attention.layout import PackedLayout
from tests.train.attention import path_reference as ref

_spec = importlib.util.spec_from_file_location(
    "check_equivalence", Path(__file__).resolve().parents[3] / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

def _reference(q, k, v, layout, chunk: int | None, spans) -> torch.Tensor:
    if chunk is None:
        return ref.reference(q, k, v, layout, spans, None)
    return ref.reference(q, k, v, layout, spans, lambda i, j: (j // chunk) == (i // chunk))  # transformers' chunked_overlay, on the path's own positions


def _qkv(seed: int, dtype=torch.float64):
    torch.manual_seed(seed)
    return [torch.randn(ref.T, h, 8, dtype=dtype, requires_grad=True) for h in (4, 2, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 100])
def test_packed_chunks_match_each_path_alone(chunk: int) -> None:
    """Values and gradients (fp64) of sdpa and sdpa_varlen, values of flex, against every path alone."""
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS)
    assert layout.path_positions().tolist()[11:14] == [6, 7, 8]  # branch 2 continues its parent, not the row
    q, k, v = _qkv(chunk)
    want = _reference(q, k, v, layout, chunk, [])
    grads_want = torch.autograd.grad(want.square().sum(), (q, k, v))
    for backend in ("sdpa", "sdpa_varlen"):
        got = packed_attention(q, k, v, layout, backend=backend, chunk=chunk)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12, msg=backend)
        for g, w in zip(torch.autograd.grad(got.square().sum(), (q, k, v)), grads_want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12, msg=backend)
    with torch.no_grad():
        got = packed_attention(q.float(), k.float(), v.float(), layout, backend="flex", chunk=chunk)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5, msg="flex")


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [2, 5])
def test_chunks_with_bidirectional_spans_on_the_mask_backends(chunk: int) -> None:
    """sdpa and flex AND the chunks onto causal-or-span (a span split by a chunk boundary sees only its own chunk's
    part); the varlen backends, whose span call would cross chunks, refuse."""
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS, bidirectional_spans=ref.SPANS)
    q, k, v = _qkv(chunk)
    want = _reference(q, k, v, layout, chunk, ref.SPANS)
    torch.testing.assert_close(packed_attention(q, k, v, layout, backend="sdpa", chunk=chunk), want)
    with torch.no_grad():
        got = packed_attention(q.float(), k.float(), v.float(), layout, backend="flex", chunk=chunk)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="run on backend 'sdpa' or 'flex'"):
        packed_attention(q, k, v, layout, backend="sdpa_varlen", chunk=chunk)


@pytest.mark.slow
def test_chunk_plan_covers_the_chunk_mask_exactly() -> None:
    """Random forests and chunks: the chunk plan's segments, each causal bottom-right over its gathered keys, see
    every pair of the dense chunk mask exactly once and nothing else; no segment holds more than ``chunk`` keys."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        parents, roots = [], []
        for _ in range(rng.integers(1, 4)):  # examples, each a random tree (a parent is an earlier node of it)
            first = len(parents)
            roots.append(first)
            parents += [-1] + [int(rng.integers(first, first + i)) for i in range(1, rng.integers(1, 6))]
        sizes = rng.integers(1, 9, size=len(parents))
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        roots = [int(offsets[r]) for r in roots]
        total = int(sizes.sum())
        layout = PackedLayout.from_tensors(total, roots + [total], offsets, parents)
        for chunk in (1, 2, 3, 4, 7):
            plan = layout.chunk_plan("cpu", chunk)
            seen = torch.zeros(total, total, dtype=torch.long)
            for s in range(len(plan.bounds_q) - 1):
                q0, q1, k0, k1 = plan.bounds_q[s], plan.bounds_q[s + 1], plan.bounds_k[s], plan.bounds_k[s + 1]
                lq, lk = q1 - q0, k1 - k0
                assert 1 <= lq <= lk <= chunk
                mask = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
                rows = torch.arange(q0, q1)[:, None].expand(lq, lk)
                cols = plan.k_index[k0:k1][None, :].expand(lq, lk)
                seen.index_put_((rows[mask], cols[mask]), torch.ones(int(mask.sum()), dtype=torch.long),
                                accumulate=True)
            assert torch.equal(seen, layout.dense_mask("cpu", chunk=chunk).long()), (trial, chunk)
            assert plan.max_seqlen_k <= chunk and plan.bounds_q[-1] == total


def test_chunk_plan_of_a_small_tree() -> None:
    """The module docstring's picture: P (positions 0-2), a (3-4) and b (3-5), chunk 2."""
    layout = PackedLayout.from_tensors(8, [0, 8], [0, 3, 5], [-1, 0, 0])
    plan = layout.chunk_plan("cpu", 2)
    segments = [(list(range(plan.bounds_q[s], plan.bounds_q[s + 1])),
                 plan.k_index[plan.bounds_k[s]:plan.bounds_k[s + 1]].tolist()) for s in range(len(plan.bounds_q) - 1)]
    # rows: P = 0 1 2, a = 3 4, b = 5 6 7
    assert segments == [([0, 1], [0, 1]), ([2], [2]), ([3], [2, 3]), ([4], [4]), ([5], [2, 5]), ([6, 7], [6, 7])]


def test_refusals() -> None:
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS)
    q, k, v = _qkv(0)
    with pytest.raises(ConfigError, match="both a sliding window"):
        packed_attention(q, k, v, layout, backend="sdpa", window=4, chunk=4)
    with pytest.raises(ConfigError, match="positive integer"):
        layout.chunk_plan("cpu", 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash", "varlen", "flex"])
def test_cuda_kernels_take_the_chunks(backend: str) -> None:
    """The chunk plan on flash-attn and torch varlen (causal segments), the chunk mask on compiled flex, equal fp32
    sdpa; with spans the varlen kernels refuse."""
    q, k, v = ref.cuda_qkv(backend)
    layout = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS)
    for chunk in (2, 5):
        ref.assert_matches_fp32_sdpa(q, k, v, layout, backend, chunk=chunk)
    if backend != "flex":
        spans = PackedLayout.from_tensors(ref.T, [0, 20, ref.T], ref.OFFSETS, ref.PARENTS, bidirectional_spans=ref.SPANS)
        with pytest.raises(ConfigError):
            packed_attention(q, k, v, spans, backend=backend, chunk=2)


# --------------------------------------------------------------------------------------------- the real model


def _tree_batch(seed: int = 0, vocab: int = 96) -> dict:
    """One packed row: a 30-token document, a 3-level tree whose branches start mid-chunk (the chunk is 8), a
    preference-style fork, a 12-token chat; labels on most non-first tokens. Tree positions, as the shards store."""
    rng = np.random.default_rng(seed)
    node_sizes = [30, 11, 6, 9, 5, 7, 13, 4, 12, 12]
    node_parents = [-1, -1, 1, 2, 2, 1, 5, -1, 7, 7]  # examples: [0], [1..6], [7..9]; node 9 is node 8's sibling
    offsets = np.concatenate([[0], np.cumsum(node_sizes)[:-1]]).astype(np.int64)
    total = int(sum(node_sizes))
    roots = [int(offsets[i]) for i, p in enumerate(node_parents) if p < 0]
    ids = torch.from_numpy(rng.integers(0, vocab, total)).long()[None]
    labels = ids.clone()
    labels[0, roots] = -100  # nothing predicts an example's first token
    labels[0, torch.from_numpy(rng.random(total) < 0.2)] = -100
    positions = tree.tree_position_ids(total, offsets, np.array(node_parents))
    return {
        "input_ids": ids, "labels": labels, "position_ids": torch.from_numpy(positions).long()[None],
        "cu_seqlens": torch.tensor(roots + [total], dtype=torch.int32),
        "node_offsets": torch.from_numpy(offsets).int(), "node_parents": torch.tensor(node_parents, dtype=torch.int32),
    }


def _text_model(*, chunk_size: int = 8, floor_scale: int = 8):
    """A tiny ``Llama4ForCausalLM``: layer 0 RoPE with chunked attention (L2 qk-norm, dense MLP), layer 1 NoPE with
    full attention and temperature tuning (4 experts, top 1, and the shared one); fp32, train mode."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    config = Llama4TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, no_rope_layers=[1, 0],
        attention_chunk_size=chunk_size, attn_temperature_tuning=True, floor_scale=floor_scale, attn_scale=0.1,
        moe_layers=[1], num_local_experts=4, num_experts_per_tok=1, use_qk_norm=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, attn_implementation="sdpa")
    return Llama4ForCausalLM(config).float().train()


@pytest.fixture(scope="module")
def tree_batch():
    batch = _tree_batch()
    assert tree.tree_position_ids(batch["input_ids"].shape[1], batch["node_offsets"].numpy(),
                                  batch["node_parents"].numpy()).max() > 24  # paths cross several chunks of 8
    return batch


@pytest.mark.slow
def test_llama4_text_packed_trees_equal_each_path_alone(tree_batch) -> None:
    """``Llama4ForCausalLM`` (chunk 8, floor_scale 8: both rules active along every row): per-token losses, total
    and every gradient equal each root-to-leaf path alone with transformers' own masks and positions."""
    model = _text_model(chunk_size=8, floor_scale=8)
    report = ce.compare(model, tree_batch, ["sdpa", "sdpa_varlen", "flex"], profile=get_profile("text"),
                        token_ids={})
    assert report["paths"] == 1 + 3 + 2
    for backend in ("sdpa", "sdpa_varlen", "flex"):
        assert report[backend]["ok"], report


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["no chunks", "chunks along the row", "temperature along the row"])
def test_without_packers_rules_the_packed_result_is_wrong(tree_batch, broken: str, monkeypatch) -> None:
    """Each rule catches a real error: chunked layers run as full causal, chunks counted by row offset (what a
    row-indexed ``chunked_overlay`` does), or NoPE queries scaled by their row index (``Llama4TextAttention`` as it
    is): the packed losses and gradients then differ from every path alone by far more than the tolerance (the
    temperature's effect on a tiny random model is small in the losses, 1.9e-4, and 7% in the gradients)."""
    if broken == "no chunks":
        monkeypatch.setattr(hf, "attention_chunk", lambda module: None)
        model = _text_model(chunk_size=8, floor_scale=10**6)
    elif broken == "chunks along the row":  # positions along the row for the chunks; temperature tuning off
        monkeypatch.setattr(PackedLayout, "path_positions", lambda self: torch.arange(self.num_tokens))
        model = _text_model(chunk_size=8, floor_scale=10**6)
    else:
        monkeypatch.setattr(hf, "_path_temperature", lambda module, query, layout: query)
        model = _text_model(chunk_size=10**6, floor_scale=8)
    report = ce.compare(model, tree_batch, ["sdpa"], profile=get_profile("text"), token_ids={})
    got = report["sdpa"]
    assert not got["ok"] and got["grad_max_rel"] > 1e-2, report  # 1e-5 is the tolerance
    assert got["loss_max_abs"] > (1e-2 if "chunk" in broken else 1e-4), report  # measured: 0.10, 0.11, 1.9e-4


def test_plain_sequences_keep_their_local_layers() -> None:
    """One unpacked sequence through a packer backend (no boundaries, no attention_mask, no cache): chunked (Llama
    4) and sliding-window (Gemma 3) layers keep their pattern, as under transformers' own sdpa."""
    import transformers

    torch.manual_seed(0)
    gemma = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
        attn_implementation="sdpa"))
    ids = torch.randint(0, 96, (2, 20))
    for model in (_text_model(chunk_size=4, floor_scale=4), gemma):
        model.eval()
        with torch.no_grad():
            want = model(ids).logits
            use_packed_attention(model, "sdpa_varlen")
            got = model(ids).logits
            model.set_attn_implementation("sdpa")
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_attention_chunk_reads_the_layer(tree_batch) -> None:
    """Which layers are chunked comes from the config's layer_types at the module's layer_idx."""
    model = _text_model(chunk_size=8)
    layers = [layer.self_attn for layer in model.model.layers]
    assert [hf.attention_chunk(m) for m in layers] == [8, None]  # layer 0 RoPE + chunked, layer 1 NoPE + full

    class Anonymous(torch.nn.Module):
        config = model.config

    with pytest.raises(ConfigError, match="names no layer_idx"):
        hf.attention_chunk(Anonymous())
    use_packed_attention(model, "sdpa")
    with torch.no_grad():
        model(**model_inputs(tree_batch))  # a forward through both layer kinds
