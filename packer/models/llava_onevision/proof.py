"""The LLaVA-OneVision proof: a tiny ``LlavaOnevisionForConditionalGeneration`` (SigLIP + Qwen2); one path's
images are one processor sample, so the model itself decides which to tile."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.llava_onevision.anyres import select_best_resolution
from packer.models.proof import Proof


class LlavaOnevisionProof(Proof):
    model_class = "LlavaOnevisionForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        """``<image>`` and ``<video>``: the config names both, so a renumbered vocabulary keeps them apart."""
        return (self.profile.image_token or "<image>", "<video>")

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, hidden: int = 32) -> Any:
        """A random-weight fp32 ``LlavaOnevisionForConditionalGeneration`` shaped like this profile's crops:
        a 1-layer SigLIP of ``crop_px`` / ``patch_size``, a 2-layer Qwen2 of width ``hidden``; ``token_ids``
        maps ``model_tokens()`` to ids in ``vocab_size``. SigLIP's key bias is frozen: softmax ignores it, so
        its exact gradient is 0 and both sides hold only rounding noise that no tolerance compares."""
        from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

        p = self.profile
        image, video = self.model_tokens()
        config = LlavaOnevisionConfig(
            text_config=dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=hidden,
                             intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=1, num_attention_heads=2, image_size=p.crop_px,
                               patch_size=p.patch_size),
            image_token_index=token_ids[image],
            video_token_index=token_ids[video],
            image_grid_pinpoints=[list(p) for p in p.pinpoints],
            vision_aspect_ratio=f"anyres_max_{p.max_tiles}",
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            attn_implementation="sdpa",
        )
        model = LlavaOnevisionForConditionalGeneration(config).float().train()
        for name, param in model.named_parameters():
            if name.endswith("k_proj.bias"):
                param.requires_grad_(False)
        return model

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's crops and size: ``side**2 + 1`` tokens mark an untiled image (one crop; a tiled one has
        at least side**2 + 2), else its crops are the base one plus its pinpoint's tiles."""
        p = self.profile
        out, row = [], 0
        for i, n in enumerate(num_tokens):
            h, w = batch["image_sizes"][i].tolist()
            best_h, best_w = select_best_resolution(h, w, p.pinpoints)
            crops = 1 if n == p.side**2 + 1 else 1 + (best_h // p.crop_px) * (best_w // p.crop_px)
            out.append({"pixel_values": batch["pixel_values"][row : row + crops],
                        "image_sizes": batch["image_sizes"][i : i + 1]})
            row += crops
        return out

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """One path as the processor gives it alone: its images are one sample (``batch_num_images`` = how
        many), so the model itself decides which to tile; the model's own positions and attention."""
        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        if images:
            out["batch_num_images"] = torch.tensor([len(images)], dtype=torch.int64)
        return out
