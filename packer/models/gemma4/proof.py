"""The Gemma 4 proof: a tiny ``Gemma4ForConditionalGeneration`` shaped like E2B (sliding-window and full-attention
layers of different head sizes, per-layer embeddings, the last layers reusing earlier layers' keys and values, a
vision tower pooling 3x3 patches, an audio tower of 2 conformer layers), and one path as Gemma4Processor gives
it alone: its images' and videos' rows, its audio clips' features and masks, and ``mm_token_type_ids`` (image 1, video 2,
audio 3)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from packer.models.proof import Proof


class Gemma4Proof(Proof):
    model_class = "Gemma4ForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        """The soft tokens, ``<|image>`` / ``<image|>``, and ``<pad>``: the model embeds every media token as the
        pad token before scattering the features in (its config's ``pad_token_id``)."""
        p = self.profile
        return (*super().model_tokens(), p.video_token, p.audio_token, p.audio_start, p.audio_end, "<pad>")

    def tiny_model(
        self, *, token_ids: dict[str, int], vocab_size: int, seed: int = 0, hidden: int = 32, sliding_window: int = 16
    ) -> torch.nn.Module:
        """A random-weight fp32 ``Gemma4ForConditionalGeneration``: 6 text layers (sliding and full in turn; a
        window of ``sliding_window``; head size 8 on sliding layers, 16 on full ones, whose rotary is Gemma 4's
        proportional one), per-layer inputs of 8, the last 2 layers reusing layers 3 and 4's keys and values
        (E2B reuses in its last 20 of 35; two layers of each kind before them, so every layer's output reaches
        the loss), logits soft-capped at 30; a 1-layer vision tower of width 32 on the profile's 16 px patches
        pooled 3x3; an audio tower of 2 layers of width 32 over the 128 mel bins, attention chunks of 4 frames
        seeing 5 back (E2B: 12 and 13), so a clip spans several chunks. ``token_ids``: the ids of
        ``model_tokens()``."""
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration

        torch.manual_seed(seed)
        p = self.profile
        text = dict(
            vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size_per_layer_input=8,
            hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, global_head_dim=16, num_kv_shared_layers=2,
            layer_types=["sliding_attention", "full_attention"] * 3,
            sliding_window=sliding_window, final_logit_softcapping=30.0, max_position_embeddings=32768,
            use_bidirectional_attention=p.use_bidirectional_attention,
            pad_token_id=token_ids["<pad>"], bos_token_id=None, eos_token_id=None,
        )
        vision = dict(
            hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, patch_size=p.patch_size, pooling_kernel_size=p.pooling_kernel_size,
            # a patch's x or y: at most 3 * the budget (a 1-token-high strip of max_soft_tokens tokens)
            position_embedding_size=p.pooling_kernel_size * max(p.max_soft_tokens, p.video_max_soft_tokens),
        )
        # the first convolution's channels must be the mel bins: Gemma4AudioSubSampleConvProjection sizes its
        # projection as channels[0] // 4 * channels[1], the mel bins left after two stride-2 convolutions
        audio = dict(
            hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 4],
            conv_kernel_size=5, attention_chunk_size=4, attention_context_left=6, attention_context_right=0,
            output_proj_dims=hidden,
        )
        config = Gemma4Config(
            text_config=text, vision_config=vision, audio_config=audio,
            image_token_id=token_ids[p.image_token], video_token_id=token_ids[p.video_token],
            boi_token_id=token_ids[p.vision_start], eoi_token_id=token_ids[p.vision_end],
            audio_token_id=token_ids[p.audio_token], boa_token_id=token_ids[p.audio_start],
            eoa_token_index=token_ids[p.audio_end],
            # the audio tower has only its eager chunked attention (Gemma4AudioModel supports no other)
            attn_implementation={"text_config": "sdpa", "vision_config": "sdpa", "audio_config": "eager"},
        )
        return Gemma4ForConditionalGeneration(config).float().train()

    # ------------------------------------------------------------------ one path alone

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's row of ``pixel_values`` and ``image_position_ids`` (the videos' keys are not images')."""
        return [{k: batch[k][i : i + 1] for k in ("pixel_values", "image_position_ids")} for i in range(len(num_tokens))]

    def path_inputs(
        self, batch: Mapping[str, Any], token_ids: dict[str, int]
    ) -> Callable[[torch.Tensor], dict[str, Any]]:
        """The base's images, plus the path's videos (their frames' rows and frame counts) and audio clips (their
        features and masks, padded to the batch's longest clip: the audio tower's valid tokens do not depend on
        the padding, tests/models/test_gemma4_audio.py)."""
        base = super().path_inputs(batch, token_ids)
        videos = _video_table(batch)
        audio_offsets = batch["audio_offsets"].tolist() if batch.get("audio_offsets") is not None else []

        def inputs(tokens: torch.Tensor) -> dict[str, Any]:
            kwargs = base(tokens)
            clips = [v for v in videos if bool((tokens == v[0]).any())]
            if clips:
                for key in ("pixel_values_videos", "video_position_ids"):
                    kwargs[key] = torch.cat([batch[key][row : row + n] for _, row, n in clips])
                kwargs["num_frames_per_video"] = torch.tensor([n for *_, n in clips], dtype=torch.int64)
            sounds = [i for i, off in enumerate(audio_offsets) if bool((tokens == off).any())]
            if sounds:
                kwargs["input_features"] = batch["input_features"][sounds]
                kwargs["input_features_mask"] = batch["input_features_mask"][sounds]
            ids = kwargs["input_ids"]
            kwargs["mm_token_type_ids"] = ((ids == token_ids[self.profile.image_token]).long()
                                           + 2 * (ids == token_ids[self.profile.video_token]).long()
                                           + 3 * (ids == token_ids[self.profile.audio_token]).long())
            return kwargs

        return inputs


def _video_table(batch: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(first token, first frame row, frames) of every video in the batch."""
    if batch.get("num_frames_per_video") is None:
        return []
    out, row = [], 0
    for off, n in zip(batch["video_offsets"].tolist(), batch["num_frames_per_video"].tolist(), strict=True):
        out.append((off, row, n))
        row += n
    return out
