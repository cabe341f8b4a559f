"""The LLaVA-1.5 proof: a tiny ``LlavaForConditionalGeneration`` (a 1-layer CLIP at 336 px, a Llama)."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config


class LlavaProof(Proof):
    model_class = "LlavaForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny LLaVA: a 1-layer CLIP tower of width 32 at ``image_px`` (576 patches), a Llama of
        ``tiny_text_config``; features from the last layer, CLS dropped (LLaVA-1.5's "default")."""
        from transformers import LlavaConfig, LlavaForConditionalGeneration

        p = self.profile
        width = kw.pop("vision_dim", 32)
        vision = dict(model_type="clip_vision_model", hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=1, num_attention_heads=2, image_size=p.image_px,
                      patch_size=p.patch_size, projection_dim=width)
        config = LlavaConfig(
            text_config=dict(tiny_text_config(vocab_size=vocab_size, **kw), model_type="llama"),
            vision_config=vision,
            image_token_index=token_ids[p.image_token],
            image_seq_length=p.tokens_per_image,
            vision_feature_layer=-1,
            attn_implementation="sdpa",
        )
        return LlavaForConditionalGeneration(config).float().train()
