"""The InternVL proof: a tiny ``InternVLForConditionalGeneration`` (InternViT + Qwen2), each image its tiles."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config


class InternVLProof(Proof):
    model_class = "InternVLForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny InternVL: a 1-layer InternViT of width 32 on 448-px tiles (1024 patches -> 256 tokens after
        the 0.5 pixel shuffle), a Qwen2 of ``tiny_text_config`` (InternVL3's LLM is Qwen2.5)."""
        from transformers import InternVLConfig, InternVLForConditionalGeneration

        p = self.profile
        width = kw.pop("vision_dim", 32)
        vision = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1, num_attention_heads=2,
                      image_size=p.tile_px, patch_size=14)
        config = InternVLConfig(
            text_config=dict(tiny_text_config(vocab_size=vocab_size, **kw), model_type="qwen2"),
            vision_config=vision,
            image_token_id=token_ids[p.image_token],
            image_seq_length=p.tokens_per_tile,
            attn_implementation="sdpa",
        )
        return InternVLForConditionalGeneration(config).float().train()

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's tiles (num_tokens / 256 rows of ``pixel_values``)."""
        out, row = [], 0
        for n in num_tokens:
            tiles = n // self.profile.tokens_per_tile
            out.append({"pixel_values": batch["pixel_values"][row : row + tiles]})
            row += tiles
        return out
