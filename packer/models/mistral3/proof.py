"""The Mistral 3 proof: a tiny ``Mistral3ForConditionalGeneration`` (a Pixtral vision tower at the profile's patch
size, the patch merger, a Mistral LM), and one path as PixtralProcessor gives it alone: its images padded to
their own largest height and width."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.mistral3.tokens import IMAGE_BREAK, IMAGE_END
from packer.models.proof import Proof, tiny_text_config


class Mistral3Proof(Proof):
    model_class = "Mistral3ForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        """``[IMG]`` (the config's ``image_token_index``), and ``[IMG_BREAK]`` / ``[IMG_END]`` kept distinct."""
        return (self.profile.image_token, IMAGE_BREAK, IMAGE_END)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny Mistral 3: a 2-layer Pixtral tower of width 32 (2 heads, axial 2-D rope) at the profile's
        patch_size, the patch merger at its spatial_merge_size, a Mistral LM of ``tiny_text_config`` without a
        sliding window (Mistral Small 3.1 has none)."""
        from transformers import Mistral3Config, Mistral3ForConditionalGeneration

        p = self.profile
        width = kw.pop("vision_dim", 32)
        vision = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=2,
                      patch_size=p.patch_size, image_size=p.longest_edge)
        config = Mistral3Config(
            text_config=dict(tiny_text_config(vocab_size=vocab_size, **kw), model_type="mistral", sliding_window=None),
            vision_config=vision,
            spatial_merge_size=p.spatial_merge_size,
            image_token_index=token_ids[p.image_token],
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )
        return Mistral3ForConditionalGeneration(config).float().train()

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """One path as PixtralProcessor gives one text: its images' pixels padded to the path's own largest height
        and width (the batch's may be larger), their ``image_sizes``."""
        out: dict[str, Any] = {"input_ids": input_ids, "use_cache": False}
        if images:
            sizes = torch.cat([im["image_sizes"] for im in images])
            h, w = (int(x) for x in sizes.max(dim=0).values)
            out["pixel_values"] = torch.cat([im["pixel_values"][..., :h, :w] for im in images])
            out["image_sizes"] = sizes
        return out
