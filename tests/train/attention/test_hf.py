"""packer.train.attention.hf: a stock transformers model on packed rows (AttentionInterface, pre-hook, model_inputs)."""

from __future__ import annotations

import pytest
import torch

from packer.core.tree import predecessor_index
from packer.errors import ConfigError
from packer.train.attention.backends import BACKENDS
from packer.train.attention.hf import (
    LAYOUT_KWARG,
    implementation_name,
    make_attention_function,
    model_inputs,
    register,
    use_packed_attention,
)
from packer.train.attention.layout import PackedLayout
from tests.helpers import GOLDEN_LAYOUT


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


@pytest.mark.parametrize("backend", ["flash", "sdpa_varlen"])
def test_a_vision_towers_images_stay_apart_under_a_flash_named_backend(backend):
    """Qwen2-VL's and Pixtral's towers, under an implementation whose name holds "flash" (packer_flash), pass
    their images' boundaries as cu_seq_lens and no mask: each image attends within itself, as each alone."""
    attn = make_attention_function(backend)
    module = torch.nn.Module()
    module.is_causal = False
    q, k, v = torch.randn(3, 1, 2, 10, 8).unbind(0)  # (1, H, T, D): two images of 4 and 6 patches
    bounds = torch.tensor([0, 4, 10], dtype=torch.int32)
    out, _ = attn(module, q, k, v, None, is_causal=False, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds,
                  max_length_q=6, max_length_k=6)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    alone = torch.cat([sdpa(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in ((0, 4), (4, 10))], dim=2)
    torch.testing.assert_close(out, alone.transpose(1, 2))
    together = sdpa(q, k, v).transpose(1, 2)
    assert (out - together).abs().max() > 1e-3  # the boundaries matter: one attention over both differs


def test_hook_passes_no_bookkeeping_to_the_model():
    """Every key collate adds for packer's own use (boundaries, counts, fillers) stays out of the forward."""
    from packer.train.attention.hf import _packed_batch_hook
    from packer.train.data.collate import collate

    lay = PackedLayout.from_tensors(**GOLDEN_LAYOUT)
    row = {"input_ids": (torch.arange(GOLDEN_LAYOUT["num_tokens"]) % 64).numpy(),
           "labels": (torch.arange(GOLDEN_LAYOUT["num_tokens"]) % 64).numpy(),
           "position_ids": torch.zeros(GOLDEN_LAYOUT["num_tokens"], dtype=torch.long).numpy(),
           "cu_seqlens": lay.cu_seqlens.numpy(), "node_offsets": lay.node_offsets.numpy(),
           "node_parents": lay.node_parents.numpy(), "images": [], "example_ids": ["a", "b"],
           "is_filler": True, "_state": {"count": 1}}
    batch = collate([row])
    assert {"num_rows", "num_filler_rows", "filler_examples", "packer_state"} <= set(batch)
    _, kwargs = _packed_batch_hook(None, (), batch)
    assert set(kwargs) <= {"input_ids", "position_ids", "labels", "shift_labels", "use_cache", LAYOUT_KWARG}


def test_attn_implementations_keeps_only_a_sub_model_that_refuses():
    """A sub-model that runs sdpa takes packer's backends even without ``_supports_attention_backend`` (Qwen3.5's
    towers: keeping them on sdpa leaked across examples); one with only its eager kernel keeps it (Gemma 4 audio)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from packer.train.attention.hf import attn_implementations, implementation_name

    register()
    config = Qwen3_5Config(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, layer_types=["linear_attention", "full_attention"]),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32))
    model = Qwen3_5ForConditionalGeneration(config)
    assert not model.model.language_model._supports_attention_backend  # the case this guards
    name = implementation_name("sdpa_varlen")
    assert attn_implementations(model, name) == name
    assert attn_implementations(model, "sdpa") == "sdpa"
