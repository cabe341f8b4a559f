"""LLaVA-1.5: a fixed-resolution CLIP ViT-L/14 at 336 px, one token per patch, whatever the image size.

    640x480 -> shortest edge to 336, centre crop 336x336 -> grid (t, h, w) = (1, 24, 24) patches of 14 px
            -> 24*24 = 576 tokens, the placeholder repeated 576 times; positions stay 1-D

The placeholder defaults to <|image_pad|>, which the builtin (Qwen2) tokenizer has, so ``--tokenizer qwen2-vl``
builds a stand-in; a LLaVA tokenizer has its own <image> (``--image-token``). No tokenizer is the default
(``default_tokenizer`` None): LLaVA-1.5's is Vicuna's, which no package ships offline. Pixel values are exact against ``LlavaImageProcessorPil``
(tests/models/test_llava.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.models.base import ModelProfile, tiny_text_config

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class LlavaProfile(ModelProfile):
    """LLaVA-1.5: every image becomes (image_px / patch_size)**2 tokens; ``pixel_values`` (N, 3, 336, 336)."""

    image_token: str | None = "<|image_pad|>"
    default_tokenizer: str | None = None  # LLaVA-1.5's is Vicuna's (Llama-2 SentencePiece): none ships offline
    image_px: int = 336
    """The square side the processor resizes and crops to."""
    patch_size: int = 14
    """Vision transformer patch side in pixels (no merging: one token per patch)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values")
    hf_model_class: ClassVar[str | None] = "LlavaForConditionalGeneration"

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        side = self.image_px // self.patch_size
        return (1, side, side)

    @property
    def tokens_per_image(self) -> int:
        return (self.image_px // self.patch_size) ** 2

    def num_tokens(self, width: int, height: int) -> int:
        return self.tokens_per_image

    def make_image_processor(self) -> Any:
        # The PIL backend (torchvision is not a dependency). LLaVA-1.5 (llava-hf/llava-1.5-7b-hf
        # preprocessor_config): CLIP preprocessing, shortest edge resized to 336 then a 336x336 centre crop,
        # no padding to square.
        from transformers import LlavaImageProcessorPil
        from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

        side = self.image_px
        return LlavaImageProcessorPil(
            size={"shortest_edge": side},
            crop_size={"height": side, "width": side},
            do_center_crop=True,
            do_pad=False,
            resample=PILImageResampling.BICUBIC,
            image_mean=OPENAI_CLIP_MEAN,
            image_std=OPENAI_CLIP_STD,
            do_convert_rgb=True,
        )

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """576 for any stored grid: the count is fixed."""
        return np.full(len(grids), self.tokens_per_image, dtype=np.int64)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny LLaVA: a 1-layer CLIP tower of width 32 at ``image_px`` (576 patches), a Llama of
        ``tiny_text_config``; features from the last layer, CLS dropped (LLaVA-1.5's "default")."""
        from transformers import LlavaConfig, LlavaForConditionalGeneration

        width = kw.pop("vision_dim", 32)
        vision = dict(model_type="clip_vision_model", hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=1, num_attention_heads=2, image_size=self.image_px,
                      patch_size=self.patch_size, projection_dim=width)
        config = LlavaConfig(
            text_config=dict(tiny_text_config(vocab_size=vocab_size, **kw), model_type="llama"),
            vision_config=vision,
            image_token_index=token_ids[self.image_token],
            image_seq_length=self.tokens_per_image,
            vision_feature_layer=-1,
            attn_implementation="sdpa",
        )
        return LlavaForConditionalGeneration(config).float().train()
