"""The SmolVLM proof: a tiny ``SmolVLMForConditionalGeneration`` (SigLIP-style vision tower on the profile's tiles, a
Llama LM as SmolLM2 is), and one path as SmolVLMProcessor gives it alone: its images' tiles as one sample."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config


class SmolVLMProof(Proof):
    model_class = "SmolVLMForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny SmolVLM: a 1-layer vision tower of width 32 on the profile's tiles (its real tile_px,
        patch_size and scale_factor, so a tile gives image_seq_len features), a Llama of ``tiny_text_config``."""
        from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

        p = self.profile
        width = kw.pop("vision_dim", 32)
        vision = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1, num_attention_heads=2,
                      image_size=p.tile_px, patch_size=p.patch_size)
        config = SmolVLMConfig(
            text_config=dict(tiny_text_config(vocab_size=vocab_size, **kw), model_type="llama"),
            vision_config=vision,
            scale_factor=p.scale_factor,
            image_token_id=token_ids[p.image_token],
            attn_implementation="sdpa",
        )
        return SmolVLMForConditionalGeneration(config).float().train()

    def image_table(self, batch: Mapping[str, Any], token_ids: dict[str, int]) -> list[tuple[int, int]]:
        """(first token, tiles) of every image: its tiles are the runs of ``<image>`` tokens from its offset to
        the next image's (the batch's end for the last)."""
        if batch.get("image_offsets") is None:
            return []
        ids = batch["input_ids"][0]
        is_image = (ids == token_ids[self.profile.image_token]).to(torch.int8)
        starts = torch.diff(is_image, prepend=torch.zeros(1, dtype=torch.int8)) == 1  # (T,) a run begins here
        offsets = batch["image_offsets"].tolist()
        ends = offsets[1:] + [ids.numel()]
        return [(a, int(starts[a:b].sum())) for a, b in zip(offsets, ends, strict=True)]

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's tiles (``num_tokens`` here: its tile counts, ``image_table``), as (1, tiles, ...)."""
        out, at = [], 0
        for tiles in num_tokens:
            out.append({k: batch[k][:, at : at + tiles] for k in ("pixel_values", "pixel_attention_mask")})
            at += tiles
        return out

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """One path as SmolVLMProcessor gives one text: its images' tiles joined as one sample (1, tiles, ...)."""
        out: dict[str, Any] = {"input_ids": input_ids, "use_cache": False}
        if images:
            for key in ("pixel_values", "pixel_attention_mask"):
                out[key] = torch.cat([im[key] for im in images], dim=1)
        return out
