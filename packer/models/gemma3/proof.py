"""The Gemma 3 proof: a tiny ``Gemma3ForConditionalGeneration`` (one sliding-window layer, one global), and one
path with the processor's ``token_type_ids``, from which the model builds its own bidirectional image blocks."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.proof import Proof


class Gemma3Proof(Proof):
    model_class = "Gemma3ForConditionalGeneration"

    def tiny_model(
        self, *, token_ids: dict[str, int], vocab_size: int, seed: int = 0, hidden: int = 32, sliding_window: int = 16
    ) -> Any:
        """A random-weight fp32 ``Gemma3ForConditionalGeneration`` for this profile's images: a 1-layer SigLIP of
        ``image_px`` / ``patch_size``, a 2-layer Gemma 3 text model (one sliding-window layer of
        ``sliding_window``, one global). ``token_ids``: the ids of ``model_tokens()`` (soft, begin, end of image)."""
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration

        torch.manual_seed(seed)
        p = self.profile
        config = Gemma3Config(
            text_config=dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             layer_types=["sliding_attention", "full_attention"], sliding_window=sliding_window,
                             max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                             pad_token_id=None),
            vision_config=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                               num_attention_heads=2, image_size=p.image_px, patch_size=p.patch_size),
            mm_tokens_per_image=p.tokens_per_image,
            image_token_index=token_ids[p.image_token],
            boi_token_index=token_ids[p.vision_start],
            eoi_token_index=token_ids[p.vision_end],
            attn_implementation="sdpa",
        )
        return Gemma3ForConditionalGeneration(config).float().train()

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """The path's pixels (one entry per block) and the processor's ``token_type_ids`` (1 on soft tokens),
        from which ``Gemma3Model`` builds its own bidirectional blocks: each run of consecutive soft tokens."""
        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        if images:
            out["token_type_ids"] = (input_ids == token_ids[self.profile.image_token]).long()
        return out
