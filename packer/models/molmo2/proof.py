"""The Molmo2 proof: a tiny ``Molmo2ForConditionalGeneration`` with the real 378-px geometry, and one path as
Molmo2Processor gives it alone (its images' inputs joined, ``mm_token_type_ids`` on the image and frame runs)."""

from __future__ import annotations

from typing import Any

import torch

from packer.models.molmo2.reader import cut_images
from packer.models.molmo2.tokenizers import FRAME_TOKENS, IMAGE_RUN_TOKENS
from packer.models.proof import Proof


class Molmo2Proof(Proof):
    model_class = "Molmo2ForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> Any:
        """A tiny random fp32 ``Molmo2ForConditionalGeneration`` (2+2 layers, width 64, vision width 32),
        whose image token ids are ``token_ids`` by token name (``<im_patch>``, ``<im_start>``,
        ``<low_res_im_start>``, ``<im_end>``; the frame tokens default to ``<im_start>`` / ``<im_end>``'s).

        The vision tower keeps the real 378-px / 14-px geometry (729 position embeddings): the processor's
        crops must fit it. ``kw`` overrides Molmo2Config fields (e.g. ``attn_implementation``). Train mode;
        the key biases are frozen (see below).
        """
        from transformers import Molmo2Config, Molmo2ForConditionalGeneration

        p = self.profile
        side = p.crop_px // p.patch_size
        config = Molmo2Config(
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                           "image_size": [p.crop_px, p.crop_px], "patch_size": p.patch_size,
                           "num_position_embeddings": side * side},
            adapter_config={"vision_feature_layer": [-1, -2], "hidden_size": 32, "num_attention_heads": 2,
                            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "text_hidden_size": 64},
            text_config={"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                         "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": vocab_size,
                         "additional_vocab_size": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
            image_patch_id=token_ids["<im_patch>"],
            image_start_token_id=token_ids["<im_start>"],
            low_res_image_start_token_id=token_ids["<low_res_im_start>"],
            image_end_token_id=token_ids["<im_end>"],
            frame_start_token_id=token_ids.get("<frame_start>", token_ids["<im_start>"]),
            frame_end_token_id=token_ids.get("<frame_end>", token_ids["<im_end>"]),
            **{"attn_implementation": "sdpa", **kw},
        )
        model = Molmo2ForConditionalGeneration(config).float().train()
        for name, param in model.named_parameters():
            # a key bias shifts all of a query's scores alike, which softmax ignores: its gradient is 0 but
            # for ~1e-17 of rounding noise, which no relative comparison of gradients can take
            if name.endswith("k_proj.bias"):
                param.requires_grad_(False)
        return model

    def model_tokens(self) -> tuple[str, ...]:
        """The tokens ``tiny_model``'s config names by id (and the image run's <im_col>, kept distinct)."""
        return (*IMAGE_RUN_TOKENS, *FRAME_TOKENS, "<|image|>", "<|video|>")

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """The batch's image inputs cut per image (``reader.cut_images``)."""
        return cut_images(batch)

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """One path as Molmo2Processor gives it: the images' inputs joined (pooling indices offset by the crops
        before; a video: its frames as crops, ``join_vision``), ``mm_token_type_ids`` 1 on the image and frame run
        tokens; the model's own attention and positions."""
        run_ids = torch.tensor([token_ids[t] for t in (*IMAGE_RUN_TOKENS, *FRAME_TOKENS) if t in token_ids],
                               device=input_ids.device)
        out: dict[str, Any] = {"input_ids": input_ids, "use_cache": False,
                               "mm_token_type_ids": torch.isin(input_ids, run_ids).long()}
        if images:
            pools, patches = [], 0
            for im in images:
                pool = im["image_token_pooling"]
                pools.append(pool.where(pool < 0, pool + patches))
                patches += im["pixel_values"].shape[0] * im["pixel_values"].shape[1]
            out["image_token_pooling"] = torch.cat(pools)
            for key in ("pixel_values", "image_grids", "image_num_crops"):
                out[key] = torch.cat([im[key] for im in images])
        return out
