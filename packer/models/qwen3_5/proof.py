"""The Qwen3.5 proof: a tiny ``Qwen3_5ForCausalLM`` (or ``Qwen3_5MoeForCausalLM``) with three Gated DeltaNet
layers and one full-attention layer (the released interval of 4), every path alone with the model's own torch
linear-attention kernels and SDPA."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.proof import Proof


class Qwen35Proof(Proof):
    """``model_class`` by the profile: dense or MoE."""

    @property
    def model_class(self) -> str:  # type: ignore[override]
        return "Qwen3_5MoeForCausalLM" if self.profile.moe else "Qwen3_5ForCausalLM"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """Hidden 32; layers linear, linear, linear, full; full attention 4 heads of 8 (2 KV heads, rotary over
        half the head as Qwen3.5's partial rotary, mRoPE sections 1/1/0 interleaved); linear attention 2 key
        heads and 4 value heads of 8 (grouped, as the released 16/32), conv kernel 4. MoE: 4 experts, top 2, a
        shared expert. ``kw`` overrides config fields (e.g. ``layer_types``)."""
        import transformers

        cls = getattr(transformers, kw.pop("model_class", None) or self.model_class)
        layers = kw.pop("layers", 4)
        config = dict(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32768,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, layer_types=["linear_attention" if (i + 1) % 4 else "full_attention"
                                                   for i in range(layers)],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True},
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )
        if self.profile.moe:
            config.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                          shared_expert_intermediate_size=16)
        config.update(kw)
        return cls(cls.config_class(**config, attn_implementation="sdpa")).float().train()
