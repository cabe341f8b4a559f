"""The Qwen-VL proof: tiny ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` /
``Qwen3VLForConditionalGeneration`` / ``Qwen3_5ForConditionalGeneration`` (and Qwen3.5's MoE and text classes)
models, and one path alone as the processor gives it: its images' and videos' pixels and grids,
``mm_token_type_ids`` (image 1, video 2), from which the model's own ``get_rope_index`` finds the vision runs
(mRoPE)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config
from packer.models.shared.qwen_inputs import image_rows, video_table


class QwenVLProof(Proof):
    """Qwen2-VL: ``tiny_text_config`` + a 1-block vision tower of width 32."""

    model_class = "Qwen2VLForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        return (*super().model_tokens(), self.profile.video_token)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny Qwen2-VL (or Qwen2.5-VL): ``tiny_text_config`` + a 1-block vision tower of width 32.

        mRoPE splits the head's rotary frequencies t/h/w as Qwen2-VL does (16/24/24 of 64): 1/1/2 of 4 here.
        """
        import transformers

        vision_depth, vision_dim = kw.pop("vision_depth", 1), kw.pop("vision_dim", 32)
        text = tiny_text_config(vocab_size=vocab_size, **kw)
        half = text["hidden_size"] // text["num_attention_heads"] // 2
        t = max(1, half // 4)
        section = [t, (half - t) // 2, half - t - (half - t) // 2]
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}
        vision = self._tiny_vision(depth=vision_depth, width=vision_dim, out=text["hidden_size"])
        cls = getattr(transformers, self.model_class)
        config = cls.config_class(
            text_config=text, vision_config=vision, attn_implementation="sdpa", **self._config_ids(token_ids)
        )
        return cls(config).float().train()

    def _config_ids(self, token_ids: dict[str, int]) -> dict[str, int]:
        """The model config's token-id fields from ``token_ids`` (token -> id)."""
        p = self.profile
        names = {"image_token_id": p.image_token, "video_token_id": p.video_token,
                 "vision_start_token_id": p.vision_start, "vision_end_token_id": p.vision_end}
        return {key: token_ids[tok] for key, tok in names.items()}

    def _tiny_vision(self, *, depth: int, width: int, out: int) -> dict[str, Any]:
        return dict(depth=depth, embed_dim=width, hidden_size=out, num_heads=2, mlp_ratio=2,
                    spatial_merge_size=self.profile.merge_size)

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        return image_rows(batch)

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """Adds ``mm_token_type_ids``, from which the model's ``get_rope_index`` finds the images (mRoPE)."""
        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        if images:
            out["mm_token_type_ids"] = (input_ids == token_ids[self.profile.image_token]).int()
        return out

    def path_inputs(
        self, batch: Mapping[str, Any], token_ids: dict[str, int]
    ) -> Callable[[torch.Tensor], dict[str, Any]]:
        """The base's images, plus the path's videos as the processor gives them for that example alone."""
        base = super().path_inputs(batch, token_ids)
        videos = video_table(batch)

        def inputs(tokens: torch.Tensor) -> dict[str, Any]:
            kwargs = base(tokens)
            clips = [v for v in videos if bool((tokens == v[0]).any())]
            if clips:
                kwargs["pixel_values_videos"] = torch.cat([batch["pixel_values_videos"][r : r + n] for _, r, n, _ in clips])
                kwargs["video_grid_thw"] = torch.stack([batch["video_grid_thw"][i] for *_, i in clips])
                if "second_per_grid_ts" in batch:
                    kwargs["second_per_grid_ts"] = torch.stack([batch["second_per_grid_ts"][i] for *_, i in clips])
                path_ids = kwargs["input_ids"]  # the processor's mm_token_type_ids: image 1, video 2
                kwargs["mm_token_type_ids"] = ((path_ids == token_ids[self.profile.image_token]).int()
                                               + 2 * (path_ids == token_ids[self.profile.video_token]).int())
            return kwargs

        return inputs


class Qwen25VLProof(QwenVLProof):
    """Qwen2.5-VL: windowed vision attention."""

    model_class = "Qwen2_5_VLForConditionalGeneration"

    def _tiny_vision(self, *, depth: int, width: int, out: int) -> dict[str, Any]:
        # windows of 56 px (2x2 merged tokens) and the last block full: both attention kinds run
        p = self.profile
        return dict(depth=max(depth, 2), hidden_size=width, out_hidden_size=out, intermediate_size=2 * width,
                    num_heads=2, spatial_merge_size=p.merge_size, window_size=56,
                    fullatt_block_indexes=[max(depth, 2) - 1], tokens_per_second=p.tokens_per_second or 2)


class Qwen3VLProof(QwenVLProof):
    """Qwen3-VL: interleaved mRoPE, DeepStack."""

    model_class = "Qwen3VLForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A random-weight fp32 ``Qwen3VLForConditionalGeneration`` small enough for CPU tests.

        Text: hidden 32, 2 layers, 4 heads of 8 with 2 KV heads, interleaved mRoPE over the 4 rotary
        frequencies (sections 2/1/1, as the released 24/20/20 of 64); vision: 2 blocks of width 32, patch 16,
        DeepStack from both blocks into the first two decoder layers. ``token_ids``: the ids of
        ``model_tokens()`` (e.g. from a compacted vocabulary); ``kw`` overrides text-config fields.
        """
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        p = self.profile
        text = dict(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=32768, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                             "mrope_interleaved": True},
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        ) | kw
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=p.patch_size,
            spatial_merge_size=p.merge_size, temporal_patch_size=p.temporal_patch_size, out_hidden_size=32,
            num_position_embeddings=64, deepstack_visual_indexes=[0, 1],
        )
        config = Qwen3VLConfig(text_config=text, vision_config=vision, attn_implementation="sdpa",
                               **self._config_ids(token_ids))
        return Qwen3VLForConditionalGeneration(config).float().train()


class Qwen35Proof(Qwen3VLProof):
    """Qwen3.5: the hybrid language model under Qwen3-VL's vision tower without DeepStack; ``model_class`` by the
    profile (dense or MoE), ``text_model_class`` its language model alone."""

    @property
    def model_class(self) -> str:  # type: ignore[override]
        return "Qwen3_5MoeForConditionalGeneration" if self.profile.moe else "Qwen3_5ForConditionalGeneration"

    @property
    def text_model_class(self) -> str:
        """The text-only class (``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``): ``tiny_model(model_class=...)``
        builds it, for text rows."""
        return "Qwen3_5MoeForCausalLM" if self.profile.moe else "Qwen3_5ForCausalLM"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A random-weight fp32 Qwen3.5 small enough for CPU tests.

        Text: hidden 32, layers linear, linear, linear, full (the released interval of 4); full attention 4 heads
        of 8 (2 KV heads), rotary over 3/4 of each head (Qwen3.5's partial rotary; released 1/4 of 256) with the
        3 frequencies interleaved t, h, w (sections 1/1/1, as the released 11/11/10); linear attention 2 key heads
        and 4 value heads of 8 (grouped, as the released 16 / 32), conv kernel 4. MoE: 4 experts, top 2, a shared
        expert. Vision (``model_class`` a ``...ForConditionalGeneration``): Qwen3-VL's tiny tower (2 blocks of
        width 32, patch 16), no DeepStack (Qwen3.5 has none). ``token_ids``: the ids of ``model_tokens()`` (unused
        by a text class); ``kw`` overrides text-config fields (``layers``: the layer count, ``model_class``).
        """
        import transformers

        name = kw.pop("model_class", None) or self.model_class
        cls = getattr(transformers, name)
        layers = kw.pop("layers", 4)
        text = dict(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32768,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, layer_types=["linear_attention" if (i + 1) % 4 else "full_attention"
                                                   for i in range(layers)],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.75,
                             "mrope_section": [1, 1, 1], "mrope_interleaved": True},
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )
        if self.profile.moe:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        shared_expert_intermediate_size=16)
        text.update(kw)
        if name.endswith("ForCausalLM"):
            return cls(cls.config_class(**text, attn_implementation="sdpa")).float().train()
        p = self.profile
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=p.patch_size,
            spatial_merge_size=p.merge_size, temporal_patch_size=p.temporal_patch_size,
            out_hidden_size=text["hidden_size"], num_position_embeddings=64,
        )
        config = cls.config_class(text_config=text, vision_config=vision, attn_implementation="sdpa",
                                  **self._config_ids(token_ids))
        return cls(config).float().train()
