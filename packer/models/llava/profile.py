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
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from packer.models.base import ModelProfile
from packer.models.rules import FixedImage

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


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

    @cached_property
    def image(self) -> FixedImage:
        return FixedImage(self.image_px, self.patch_size, bidirectional=self.bidirectional_images)

    @property
    def tokens_per_image(self) -> int:
        return self.image.tokens_per_image

    def reader(self) -> Reader:
        from packer.models.llava.reader import LlavaReader

        return LlavaReader(self)

    def proof(self) -> Proof:
        from packer.models.llava.proof import LlavaProof

        return LlavaProof(self)
