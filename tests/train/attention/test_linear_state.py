"""Linear-state layers on packed rows and trees (packer.train.attention.linear_state): the causal conv and the gated delta
rule along every root-to-leaf path, against transformers' own kernels run on each path alone; the whole
``Qwen3_5ForCausalLM`` (3 Gated DeltaNet layers + 1 full-attention layer) packed == unpacked with trees; the
leak it fixes, shown; what it refuses."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError
from packer.models import get_profile
from packer.train.attention import linear_state
from packer.train.attention.hf import LAYOUT_KWARG, use_packed_attention
from packer.train.attention.layout import PackedLayout

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)


# Two examples, then a linear one: example 0 = node 0 (70 tokens) with branches 1 (5) and 2 (80), node 2 with a
# nested branch 3 (3) and a sibling 4 (1 token); example 1 = node 5 (12); example 2 = node 6 (9).
#   paths: 0-1, 0-2-3, 0-2-4, 5, 6
OFFSETS = [0, 70, 75, 155, 158, 159, 171]
PARENTS = [-1, 0, 0, 2, 2, -1, -1]
T = 180
CU = [0, 159, 171, 180]


def _layout() -> PackedLayout:
    return PackedLayout.from_tensors(T, CU, OFFSETS, PARENTS)


def _paths(layout: PackedLayout) -> list[torch.Tensor]:
    """Row positions of every root-to-leaf path."""
    ranges = list(zip(layout.node_offsets.tolist(), layout.node_offsets.tolist()[1:] + [layout.num_tokens], strict=True))
    return [torch.cat([torch.arange(*ranges[n]) for n in nodes]) for nodes in ce.leaf_paths(layout)]


def test_conv_windows_follow_each_path():
    """lag j of a branch's first token reaches into its parent, never into a sibling; zeros before a root."""
    layout = PackedLayout.from_tensors(10, [0, 8, 10], [0, 3, 5, 8], [-1, 0, 0, -1])  # | P P P | a a | b b b | Q Q |
    lags = linear_state.conv_lags(layout, 4)  # (4, 10), 10 = the zero input
    assert lags[:, 5].tolist() == [5, 2, 1, 0]  # b's first token: itself, then P P P (not a a)
    assert lags[:, 6].tolist() == [6, 5, 2, 1]
    assert lags[:, 3].tolist() == [3, 2, 1, 0]  # a's first token
    assert lags[:, 9].tolist() == [9, 8, 10, 10]  # Q: a new example, zeros before it
    assert lags[:, 0].tolist() == [0, 10, 10, 10]


@pytest.mark.parametrize("bias", [False, True])
def test_tree_conv_equals_conv1d_on_each_path(bias):
    torch.manual_seed(0)
    layout, C, K = _layout(), 6, 4
    x = torch.randn(T, C, dtype=torch.float64)
    conv = torch.nn.Conv1d(C, C, K, groups=C, padding=K - 1, bias=bias).double()
    got = linear_state.tree_causal_conv(x, conv.weight[:, 0], conv.bias, layout)  # (T, C)
    for tokens in _paths(layout):
        ref = conv(x[tokens].t()[None])[0, :, : len(tokens)].t()  # (L, C): the path alone, as transformers runs it
        torch.testing.assert_close(got[tokens], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [4, 64])
@pytest.mark.parametrize("grouped", [False, True])
def test_tree_delta_rule_equals_transformers_on_each_path(chunk, grouped):
    """Values and gradients of every input against transformers' torch_chunk_gated_delta_rule on each path alone
    (chunk 4: nodes of many chunks, a branch forked mid-way through its parent's chunk grid). Both compute in
    fp32 whatever the inputs (as transformers does), so the tolerance is fp32's: chunks start at node starts
    here and at path multiples of the chunk there, the same sums in another order."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    torch.manual_seed(1)
    layout, Hk, Hv, Dk, Dv = _layout(), 2, 4 if grouped else 2, 8, 6
    q, k = torch.randn(T, Hk, Dk), torch.randn(T, Hk, Dk)
    v, g, beta = torch.randn(T, Hv, Dv), -F.softplus(torch.randn(T, Hv)), torch.rand(T, Hv)
    inputs = [t.requires_grad_() for t in (q, k, v, g, beta)]
    got = linear_state.tree_gated_delta_rule(*inputs, layout, chunk=chunk)  # (T, Hv, Dv)
    weights = torch.randn_like(got)
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    ref_out = torch.zeros_like(got)
    ref_loss = 0
    owner = {}
    for p, tokens in enumerate(_paths(layout)):
        for t in tokens.tolist():
            owner.setdefault(t, p)
    for p, tokens in enumerate(_paths(layout)):
        out, _ = torch_chunk_gated_delta_rule(*(x[tokens][None] for x in inputs), chunk_size=chunk,
                                              use_qk_l2norm_in_kernel=True)  # (1, L, Hv, Dv)
        mine = torch.tensor([owner[t] == p for t in tokens.tolist()])  # shared tokens counted once
        ref_out[tokens[mine]] = out[0, mine].detach()
        ref_loss = ref_loss + (out[0, mine] * weights[tokens[mine]]).sum()
    torch.testing.assert_close(got.detach(), ref_out, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, torch.autograd.grad(ref_loss, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def test_tree_delta_rule_in_fp64_equals_each_path_alone_exactly():
    """In fp64 the tree of chunks (chunks restart at every node) and each path alone (chunks from the path's
    start) agree to 1e-12, values and gradients: the fp32 differences above are rounding, not maths."""
    torch.manual_seed(5)
    layout = _layout()
    q, k, v = (torch.randn(T, 2, 8, dtype=torch.float64) for _ in range(3))
    g, beta = -F.softplus(torch.randn(T, 2, dtype=torch.float64)), torch.rand(T, 2, dtype=torch.float64)
    inputs = [x.requires_grad_() for x in (q, k, v, g, beta)]
    got = linear_state.tree_gated_delta_rule(*inputs, layout, chunk=16)
    weights = torch.randn_like(got)
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    ref_loss, seen = 0, set()
    for tokens in _paths(layout):
        alone = PackedLayout.from_tensors(len(tokens), [0, len(tokens)])
        out = linear_state.tree_gated_delta_rule(*(x[tokens] for x in inputs), alone, chunk=16)
        mine = torch.tensor([t not in seen for t in tokens.tolist()])
        seen.update(tokens.tolist())
        torch.testing.assert_close(got[tokens].detach(), out.detach(), rtol=1e-12, atol=1e-12)
        ref_loss = ref_loss + (out[mine] * weights[tokens[mine]]).sum()
    for a, b in zip(got_grads, torch.autograd.grad(ref_loss, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_branches_fork_from_the_parent_not_the_sibling():
    """The same tokens under 'node 2 is node 1's child' (chained) give different outputs for node 2 than under
    'node 2 is node 0's child' (forked): the parent really is what a branch starts from."""
    torch.manual_seed(2)
    q, k = torch.randn(20, 1, 4), torch.randn(20, 1, 4)
    v, g, beta = torch.randn(20, 1, 4), -torch.rand(20, 1), torch.rand(20, 1)
    forked = PackedLayout.from_tensors(20, [0, 20], [0, 8, 14], [-1, 0, 0])
    chained = PackedLayout.from_tensors(20, [0, 20], [0, 8, 14], [-1, 0, 1])
    a = linear_state.tree_gated_delta_rule(q, k, v, g, beta, forked)
    b = linear_state.tree_gated_delta_rule(q, k, v, g, beta, chained)
    torch.testing.assert_close(a[:14], b[:14], rtol=0, atol=0)
    assert (a[14:] - b[14:]).abs().max() > 1e-3


# The rotary these tests were measured with (half of each head, sections 1/1/0; the proof's default rotates 3/4
# of it over t, h and w). Rotary is no part of the linear layers; it is pinned because this row's A_log
# gradients sit at fp32's floor (~1e-7 of the largest gradient, the tolerance itself): another rotary moves
# their round-off to either side of it (8.6e-6 here, 1.04e-5 with the proof's).
TEXT_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0],
             "mrope_interleaved": True}


def _tiny(moe: bool = False):
    """Qwen3.5's language model alone (``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``): the text rows' model."""
    torch.manual_seed(0)
    proof = get_profile("qwen3.5-moe" if moe else "qwen3.5").proof()
    return proof.tiny_model(token_ids={}, vocab_size=64, model_class=proof.text_model_class,
                            rope_parameters=TEXT_ROPE)


def _batch() -> dict:
    """A collated-style batch of the row above: random ids, loss on most tokens incl. every branch's first
    token (a branch starting on a loss token is predicted by its parent's last logit), none at example starts."""
    g = torch.Generator().manual_seed(3)
    layout = _layout()
    ids = torch.randint(0, 64, (1, T), generator=g)
    labels = ids.clone()
    labels[0, torch.rand(T, generator=g) < 0.2] = IGNORE_INDEX
    labels[0, CU[:-1]] = IGNORE_INDEX  # nothing predicts an example's first token
    labels[0, OFFSETS[1:5]] = ids[0, OFFSETS[1:5]]  # branches start on loss tokens
    return {"input_ids": ids, "labels": labels, "position_ids": layout.path_positions()[None],
            "cu_seqlens": torch.tensor(CU, dtype=torch.int32), "max_seqlen": 159,
            "node_offsets": torch.tensor(OFFSETS, dtype=torch.int32),
            "node_parents": torch.tensor(PARENTS, dtype=torch.int32),
            "num_loss_tokens": int((labels != IGNORE_INDEX).sum()), "example_ids": ["a", "b", "c"]}


@pytest.mark.parametrize("moe", [False, True])
def test_qwen35_packed_trees_equal_each_path_alone(moe):
    """The proof on the real model: per-token losses, total and every gradient (both backends: the full-attention
    layer's tree mask and the linear layers' forked state in one forward)."""
    model = _tiny(moe)
    assert sum(type(m).__name__.endswith("GatedDeltaNet") for m in model.modules()) == 3
    batch = _batch()
    proof = get_profile("qwen3.5-moe" if moe else "qwen3.5").proof()
    report = ce.compare(model, batch, ["sdpa_varlen", "sdpa"], ref=ce.path_reference(model, batch, proof.path_inputs(batch, {})))
    assert report["paths"] == 5
    for backend in ("sdpa_varlen", "sdpa"):
        assert report[backend]["ok"], json.dumps(report)
        assert report[backend]["grad_missing"] == []


def test_without_packer_the_second_example_is_wrong():
    """The bug, caught: full attention masked by packer but the linear layers left as transformers wrote them
    (the TRL / DataCollatorWithFlattening convention: per-example positions, no state reset): the first
    example is exact, the next ones are not. With packer's routing, all are."""
    model = _tiny()
    batch = _batch()
    layout = _layout()
    use_packed_attention(model, "sdpa_varlen")
    kwargs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False,
              LAYOUT_KWARG: layout}
    with torch.no_grad():
        packed = model(**kwargs).logits[0]  # (T, V)
        unrouted = copy.deepcopy(model)
        for m in unrouted.modules():
            m.__dict__.pop("forward", None)  # transformers' own forward again
        leaky = unrouted(**kwargs).logits[0]
        model.set_attn_implementation("sdpa")
        first = torch.arange(0, 75)  # example 0's first path (nodes 0, 1): a prefix of the row
        second = torch.arange(159, 171)  # example 1
        ref_first, ref_second = (model(input_ids=batch["input_ids"][:, p], use_cache=False).logits[0]
                                 for p in (first, second))
    assert (leaky[first] - ref_first).abs().max() < 1e-5  # nothing before it to leak
    assert (leaky[second] - ref_second).abs().max() > 1e-2  # the conv window and the state ran across
    assert (packed[first] - ref_first).abs().max() < 1e-5
    assert (packed[second] - ref_second).abs().max() < 1e-5


def test_unpacked_forward_is_transformers_own():
    """Routing changes nothing without a layout (generation, unpacked batches): the same logits, bit for bit."""
    model = _tiny()
    ids = torch.randint(0, 64, (2, 30))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        use_packed_attention(model, "sdpa_varlen")
        model.set_attn_implementation("sdpa")
        after = model(input_ids=ids).logits
    torch.testing.assert_close(before, after, rtol=0, atol=0)
    twin = copy.deepcopy(model)  # the routed forward is bound to its own module in a copy
    routed = [m for m in twin.modules() if "forward" in m.__dict__]
    assert len(routed) == 3 and all(m.forward.__self__ is m for m in routed)


def test_refuses_a_cache_on_a_packed_row():
    model = _tiny()
    use_packed_attention(model, "sdpa_varlen")
    batch = _batch()
    with pytest.raises(ConfigError, match="use_cache=False"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=True,
              **{LAYOUT_KWARG: _layout()})


def test_refuses_a_stateful_layer_it_cannot_fork():
    """Qwen3-Next's Gated DeltaNet (fused projections, another forward) has no adapter: refused by name, never
    run leaking."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
                             linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                             num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                             shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ConfigError, match="Qwen3NextGatedDeltaNet"):
        use_packed_attention(Qwen3NextForCausalLM(config))


def test_refuses_a_stateful_model_with_no_known_layer():
    class Recurrent(torch.nn.Module):
        _is_stateful = True

        def __init__(self):
            super().__init__()
            self.cell = torch.nn.GRU(4, 4)

    with pytest.raises(ConfigError, match="Recurrent is a stateful model"):
        linear_state.install(Recurrent())


def test_tree_ssd_equals_transformers_mamba2_chunk_scan_on_each_path():
    """Mamba-2's SSD (Granite-4.0-H, Nemotron-H, Bamba) against transformers' torch mamba2_chunk_scan on each
    path alone: values and gradients of x, dt, B, C (fp32; chunk 16 theirs from the path start, 4 ours)."""
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import mamba2_chunk_scan

    torch.manual_seed(6)
    layout, H, P, G, N = _layout(), 4, 6, 2, 5
    x, dt = torch.randn(T, H, P), torch.randn(T, H)
    B, C = torch.randn(T, G, N), torch.randn(T, G, N)
    A, D, dt_bias = -torch.rand(H) - 0.1, torch.randn(H), torch.randn(H)
    inputs = [t.requires_grad_() for t in (x, dt, B, C)]
    got = linear_state.tree_ssd(*inputs[:2], A, *inputs[2:], layout, D=D, dt_bias=dt_bias, chunk=4)  # (T, H, P)
    weights = torch.randn_like(got)
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    ref_loss, seen = 0, set()
    for tokens in _paths(layout):
        out = mamba2_chunk_scan(x[tokens][None], dt[tokens][None], A, B[tokens][None], C[tokens][None], chunk_size=16,
                                D=D, dt_bias=dt_bias, dt_softplus=True)[0]  # (L, H, P)
        mine = torch.tensor([t not in seen for t in tokens.tolist()])
        seen.update(tokens.tolist())
        torch.testing.assert_close(got[tokens].detach(), out.detach(), rtol=1e-5, atol=1e-5)
        ref_loss = ref_loss + (out[mine] * weights[tokens[mine]]).sum()
    for a, b in zip(got_grads, torch.autograd.grad(ref_loss, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def _ids_only(batch):
    """One path alone: its token ids, the model's own defaults for everything else."""
    return lambda tokens: {"input_ids": batch["input_ids"][0][tokens][None], "use_cache": False}


def _mamba2_hybrid(name: str) -> torch.nn.Module:
    """A tiny Mamba-2 hybrid: 3 Mamba-2 mixers then 1 attention layer (4 heads, 2 groups, state 8)."""
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    mamba = dict(mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8, mamba_d_head="auto", mamba_chunk_size=16)
    if name == "granite":
        config = transformers.GraniteMoeHybridConfig(
            **common, **mamba, intermediate_size=64, num_hidden_layers=4,
            layer_types=["mamba", "mamba", "mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
            shared_intermediate_size=32, position_embedding_type="rope")
        cls = transformers.GraniteMoeHybridForCausalLM
    elif name == "bamba":
        config = transformers.BambaConfig(**common, **mamba, intermediate_size=64, num_hidden_layers=4,
                                          attn_layer_indices=[3])
        cls = transformers.BambaForCausalLM
    else:
        config = transformers.NemotronHConfig(
            **common, layers_block_type=["mamba", "mamba", "mamba", "attention"], head_dim=8, intermediate_size=64,
            ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=16, n_groups=2, chunk_size=16)
        cls = transformers.NemotronHForCausalLM
    model = cls(config)
    model.config._attn_implementation = "sdpa"
    return model.float().train()


@pytest.mark.parametrize("name", ["granite", "bamba", "nemotron_h"])
def test_mamba2_hybrids_packed_trees_equal_each_path_alone(name):
    """Granite-4.0-H, Bamba, Nemotron-H: Mamba-2 mixers through the same mechanism (conv along each path, SSD
    state forked at each branch) composed with the attention layer's tree mask, per-token losses, total and
    every gradient against each path alone."""
    model = _mamba2_hybrid(name)
    assert sum(type(m).__name__ in linear_state.ADAPTERS for m in model.modules()) == 3
    batch = _batch()
    report = ce.compare(model, batch, ["sdpa_varlen"], ref=ce.path_reference(model, batch, _ids_only(batch)))
    assert report["sdpa_varlen"]["ok"] and report["sdpa_varlen"]["grad_missing"] == [], json.dumps(report)
    for m in model.modules():  # unrouted: the SSD state and the conv run from example 0 into example 1
        m.__dict__.pop("forward", None)
    model.set_attn_implementation("packer_sdpa_varlen")  # the attention layer still masked by packer
    second = torch.arange(159, 171)
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                      **{LAYOUT_KWARG: _layout()}).logits[0, second]
        model.set_attn_implementation("sdpa")
        alone = model(input_ids=batch["input_ids"][:, second], use_cache=False).logits[0]
    assert (leaky - alone).abs().max() > 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not linear_state.fla_available(), reason="needs CUDA and flash-linear-attention")
def test_fla_per_depth_equals_the_torch_path():
    """fla's varlen kernel, one call per tree depth with forked initial states, against the torch path (fp32)."""
    torch.manual_seed(4)
    layout, dev = _layout(), "cuda"
    q, k = torch.randn(T, 2, 64, device=dev), torch.randn(T, 2, 64, device=dev)
    v = torch.randn(T, 4, 64, device=dev)
    g, beta = -F.softplus(torch.randn(T, 4, device=dev)), torch.rand(T, 4, device=dev)
    got = linear_state.fla_tree_gated_delta_rule(q, k, v, g, beta, layout)
    ref = linear_state.tree_gated_delta_rule(q, k, v, g, beta, layout)
    print("fla vs torch max abs diff", float((got - ref).abs().max()))
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)
