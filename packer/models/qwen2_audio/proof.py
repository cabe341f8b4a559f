"""The Qwen2-Audio proof: a tiny ``Qwen2AudioForConditionalGeneration`` (fp32, random weights: a 2-layer Qwen2
language model, a 2-layer Whisper-style audio encoder over 128 mel bins, the projector) and one path alone as the
processor gives it: its ids and the features and masks of the clips on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config
from packer.models.reader import Reader


class Qwen2AudioProof(Proof):
    """Qwen2-Audio."""

    model_class = "Qwen2AudioForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        p = self.profile
        return (p.audio_token, p.audio_start, p.audio_end)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """Text: ``tiny_text_config`` (a Qwen2); audio: 2 layers of width 32 over 128 mel bins, 1500 positions
        (the released encoder's input length, which its forward checks); no dropout, no layer drop."""
        from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

        p = self.profile
        text = {"model_type": "qwen2", **tiny_text_config(vocab_size=vocab_size, **kw)}
        audio = dict(num_mel_bins=Reader.audio_feature_size, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                     d_model=32, max_source_positions=1500, dropout=0.0, attention_dropout=0.0,
                     activation_dropout=0.0, encoder_layerdrop=0.0)
        config = Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_index=token_ids[p.audio_token],
                                  attn_implementation="sdpa")
        return Qwen2AudioForConditionalGeneration(config).float().train()

    def path_inputs(
        self, batch: Mapping[str, Any], token_ids: dict[str, int]
    ) -> Callable[[torch.Tensor], dict[str, Any]]:
        base = super().path_inputs(batch, token_ids)
        offsets = batch["audio_offsets"].tolist() if batch.get("audio_offsets") is not None else []

        def inputs(tokens: torch.Tensor) -> dict[str, Any]:
            kwargs = base(tokens)
            clips = [i for i, off in enumerate(offsets) if bool((tokens == off).any())]
            if clips:
                kwargs["input_features"] = batch["input_features"][clips]
                kwargs["feature_attention_mask"] = batch["feature_attention_mask"][clips]
            return kwargs

        return inputs
