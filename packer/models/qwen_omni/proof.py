"""The Qwen2.5-Omni proof: a tiny ``Qwen2_5OmniThinkerForConditionalGeneration`` (fp32, random weights: a 2-layer
mRoPE language model, a 2-block windowed vision tower, a 2-layer audio tower) and one path alone as the
processor gives it: its images, its videos with ``video_second_per_grid``, its audio clips' features and masks,
``use_audio_in_video`` where a video brings its sound, and an attention mask, from which the model's own
``get_rope_index`` computes the path's positions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config
from packer.models.shared.qwen_inputs import image_rows, video_table


class QwenOmniProof(Proof):
    """Qwen2.5-Omni's thinker."""

    model_class = "Qwen2_5OmniThinkerForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        p = self.profile
        return (*super().model_tokens(), p.video_token, p.audio_token, p.audio_start, p.audio_end)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """Text: ``tiny_text_config`` with mRoPE sections 1/1/2 of the 4 rotary frequencies (the released
        16/24/24 of 64); vision: 2 blocks of width 32, windows of 56 px, the last block full; audio: 2 layers of
        width 32 over 128 mel bins, windows of 2 * n_window = 8 frames so a clip spans several."""
        from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

        p = self.profile
        text = tiny_text_config(vocab_size=vocab_size, **kw)
        half = text["hidden_size"] // text["num_attention_heads"] // 2
        t = max(1, half // 4)
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6,
                                   "mrope_section": [t, (half - t) // 2, half - t - (half - t) // 2]}
        vision = dict(depth=2, hidden_size=32, out_hidden_size=text["hidden_size"], intermediate_size=64,
                      num_heads=2, spatial_merge_size=p.merge_size, window_size=56, fullatt_block_indexes=[1],
                      patch_size=p.patch_size, temporal_patch_size=p.temporal_patch_size)
        audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                     output_dim=text["hidden_size"], n_window=4, max_source_positions=1500)
        config = Qwen2_5OmniThinkerConfig(
            text_config=text, vision_config=vision, audio_config=audio, attn_implementation="sdpa",
            image_token_index=token_ids[p.image_token], video_token_index=token_ids[p.video_token],
            audio_token_index=token_ids[p.audio_token], audio_start_token_id=token_ids[p.audio_start],
            audio_end_token_id=token_ids[p.audio_end],
        )
        # a released checkpoint's thinker_config key that the config class does not define (get_rope_index reads it)
        config.vision_start_token_id = token_ids[p.vision_start]
        return Qwen2_5OmniThinkerForConditionalGeneration(config).float().train()

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        return image_rows(batch)

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        out["attention_mask"] = torch.ones_like(input_ids)  # compute_3d_position_ids needs one
        return out

    def path_inputs(
        self, batch: Mapping[str, Any], token_ids: dict[str, int]
    ) -> Callable[[torch.Tensor], dict[str, Any]]:
        base = super().path_inputs(batch, token_ids)
        videos = video_table(batch)

        audio_offsets = batch["audio_offsets"].tolist() if batch.get("audio_offsets") is not None else []
        ids = batch["input_ids"][0]
        video_id = token_ids[self.profile.video_token]

        def inputs(tokens: torch.Tensor) -> dict[str, Any]:
            kwargs = base(tokens)
            clips = [v for v in videos if bool((tokens == v[0]).any())]
            if clips:
                kwargs["pixel_values_videos"] = torch.cat([batch["pixel_values_videos"][r : r + n] for _, r, n, _ in clips])
                kwargs["video_grid_thw"] = torch.stack([batch["video_grid_thw"][i] for *_, i in clips])
                kwargs["video_second_per_grid"] = torch.stack([batch["video_second_per_grid"][i] for *_, i in clips])
            sounds = [i for i, off in enumerate(audio_offsets) if bool((tokens == off).any())]
            if sounds:
                kwargs["input_features"] = batch["input_features"][sounds]
                kwargs["feature_attention_mask"] = batch["feature_attention_mask"][sounds]
                # a video's sound track starts right after its first frames' tokens (a clip alone after
                # <|audio_bos|>): the processor's use_audio_in_video, which the model's get_rope_index needs too
                kwargs["use_audio_in_video"] = any(int(ids[audio_offsets[i] - 1]) == video_id for i in sounds)
            return kwargs

        return inputs


class Qwen3OmniProof(QwenOmniProof):
    """Qwen3-Omni's thinker: a tiny ``Qwen3OmniMoeThinkerForConditionalGeneration`` (a 2-layer MoE language
    model with interleaved mRoPE, a 2-block vision tower with one deepstack layer, a 2-layer audio tower) fed one
    path alone as the processor gives it; the model's ``get_rope_index`` computes the path's positions.

    The router's load-balancing loss is off (``output_router_logits`` False, as the released config): it is a
    statistic of the whole batch's routing, not a sum over examples, so no packing can keep it per example."""

    model_class = "Qwen3OmniMoeThinkerForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """Text: ``tiny_text_config`` as a 4-expert MoE (2 a token), mRoPE sections 2/1/1 of the 4 rotary
        frequencies, interleaved as the model always does; vision: 2 blocks of width 32 with 16 px patches, a
        deepstack merger after block 0; audio: 2 layers of width 32 over 128 mel bins, the released n_window 50
        (the token count depends on it) and attention windows of 200 frames, so a clip spans several."""
        from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

        from packer.models.qwen_omni.rope3 import N_WINDOW, POSITION_ID_PER_SECONDS

        p = self.profile
        text = tiny_text_config(vocab_size=vocab_size, **kw)
        half = text["hidden_size"] // text["num_attention_heads"] // 2
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1,
                    output_router_logits=False, head_dim=2 * half,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                     "mrope_section": [half - 2 * (half // 4), half // 4, half // 4],
                                     "interleaved": True})
        vision = dict(depth=2, hidden_size=32, out_hidden_size=text["hidden_size"], intermediate_size=64,
                      num_heads=2, spatial_merge_size=p.merge_size, patch_size=p.patch_size,
                      temporal_patch_size=p.temporal_patch_size, num_position_embeddings=64,
                      deepstack_visual_indexes=[0])
        audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                     output_dim=text["hidden_size"], n_window=N_WINDOW, n_window_infer=200,
                     downsample_hidden_size=16, max_source_positions=1500)
        config = Qwen3OmniMoeThinkerConfig(
            text_config=text, vision_config=vision, audio_config=audio, attn_implementation="sdpa",
            image_token_id=token_ids[p.image_token], video_token_id=token_ids[p.video_token],
            audio_token_id=token_ids[p.audio_token], audio_start_token_id=token_ids[p.audio_start],
            position_id_per_seconds=POSITION_ID_PER_SECONDS,
        )
        # released thinker_config keys the config class does not define (get_rope_index reads the first)
        config.vision_start_token_id = token_ids[p.vision_start]
        config.audio_end_token_id = token_ids[p.audio_end]
        return Qwen3OmniMoeThinkerForConditionalGeneration(config).float().train()
