"""The Llama 4 proof: a tiny ``Llama4ForConditionalGeneration`` (or ``Llama4ForCausalLM`` for text), its language model
a chunked-attention RoPE layer with a chunk SHORTER than the rows (so chunks fall inside every example) and a NoPE
full-attention layer with temperature tuning at a small ``floor_scale`` (so its query scale changes along a row), one
of them mixture-of-experts; its vision tower at the profile's tile geometry. One path runs as ``Llama4Processor``
gives it alone: its images' tiles, in order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from packer.models.llama4.tokens import IMAGE_END, IMAGE_START, PATCH, TILE_X, TILE_Y
from packer.models.proof import Proof, tiny_text_config


class Llama4Proof(Proof):
    model_class = "Llama4ForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        """``<|patch|>`` (the config's ``image_token_index``), ``<|image_start|>`` / ``<|image_end|>`` (``boi`` /
        ``eoi_token_index``), and the run's other tokens kept distinct."""
        return (PATCH, IMAGE_START, IMAGE_END, self.profile.image_token, TILE_X, TILE_Y)

    def text_config(self, *, vocab_size: int, chunk_size: int = 16, floor_scale: int = 8, **kw: Any) -> dict[str, Any]:
        """A 2-layer Llama 4 text model of ``tiny_text_config``: layer 0 RoPE with chunked attention of
        ``chunk_size`` (L2 qk-norm, dense MLP), layer 1 NoPE with full attention and temperature tuning at
        ``floor_scale`` (a mixture of 4 experts, top 1, and the shared expert)."""
        base = tiny_text_config(vocab_size=vocab_size, **kw)
        return dict(base, head_dim=base["hidden_size"] // base["num_attention_heads"],
                    intermediate_size_mlp=base["intermediate_size"], no_rope_layers=[1, 0],
                    attention_chunk_size=chunk_size, attn_temperature_tuning=True, floor_scale=floor_scale,
                    attn_scale=0.1, moe_layers=[1], num_local_experts=4, num_experts_per_tok=1, use_qk_norm=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 500000.0})

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny random-weight fp32 Llama 4 (train mode): ``text_config``'s language model and, for
        ``Llama4ForConditionalGeneration``, a 1-layer vision tower of width 32 at the profile's tile_px, patch_size
        and pixel_shuffle_ratio (so a tile gives tokens_per_tile features). ``chunk_size`` and ``floor_scale`` pass
        to the text model; ``model_class="Llama4ForCausalLM"`` builds the text model alone."""
        import transformers

        name = kw.pop("model_class", None) or self.model_class
        width = kw.pop("vision_dim", 32)
        text = self.text_config(vocab_size=vocab_size, **kw)
        if name == "Llama4ForCausalLM":
            config = transformers.Llama4TextConfig(**text, attn_implementation="sdpa")
            return transformers.Llama4ForCausalLM(config).float().train()
        p = self.profile
        vision = dict(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=1, num_attention_heads=2,
                      image_size=p.tile_px, patch_size=p.patch_size, pixel_shuffle_ratio=p.pixel_shuffle_ratio,
                      projector_input_dim=width, projector_output_dim=width, vision_output_dim=width,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        config = transformers.Llama4Config(
            text_config=text, vision_config=vision, image_token_index=token_ids[PATCH],
            boi_token_index=token_ids[IMAGE_START], eoi_token_index=token_ids[IMAGE_END], attn_implementation="sdpa",
        )
        return getattr(transformers, name)(config).float().train()

    def image_table(self, batch: Mapping[str, Any], token_ids: dict[str, int]) -> list[tuple[int, int]]:
        """(first token, tiles) of every image: its ``<|patch|>`` tokens from its offset to the next image's (the
        batch's end for the last), tokens_per_tile a tile."""
        if batch.get("image_offsets") is None:
            return []
        is_patch = batch["input_ids"][0] == token_ids[PATCH]
        offsets = batch["image_offsets"].tolist()
        ends = offsets[1:] + [is_patch.numel()]
        per_tile = self.profile.tokens_per_tile
        return [(a, int(is_patch[a:b].sum()) // per_tile) for a, b in zip(offsets, ends, strict=True)]

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's tiles (``num_tokens`` here: its tile counts, ``image_table``), (tiles, 3, tile_px, tile_px)."""
        out, at = [], 0
        for n in num_tokens:
            out.append({"pixel_values": batch["pixel_values"][at : at + n]})
            at += n
        return out
