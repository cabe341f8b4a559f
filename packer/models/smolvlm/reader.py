"""The SmolVLM reader: ``SmolVLMImageProcessorPil`` (no torchvision), a batch's images as ONE processor sample.

    pixel_values (1, tiles, 3, 384, 384)   pixel_attention_mask (1, tiles, 384, 384)

SmolVLMModel takes (batch, images, 3, H, W), drops all-zero padding images and scatters the tiles' features
into the ``<image>`` tokens in order; a packed batch is one row, so its images are one sample's, tiles in token
order (each image's rows x cols tiles, then its global view), exactly what SmolVLMProcessor gives one text
with those images. Every tile is tile_px square (the split cuts whole tiles, the global view is resized to
one), so nothing is padded and the mask is all ones.
"""

from __future__ import annotations

from typing import Any

import torch

from packer.core.types import ImageRef
from packer.media.images import load_image
from packer.models.reader import Reader


class SmolVLMReader(Reader):
    def make_image_processor(self) -> Any:
        # SmolVLM2's preprocessor_config: the class defaults (LANCZOS, rescale 1/255, mean = std = 0.5, pad)
        # but the sizes, which are the profile's. The PIL backend: torchvision is not a dependency.
        from transformers import SmolVLMImageProcessorPil

        p = self.profile
        return SmolVLMImageProcessorPil(
            size={"longest_edge": p.longest_edge}, max_image_size={"longest_edge": p.tile_px},
            do_image_splitting=p.do_image_splitting,
        )

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Every image of the batch as one sample (a nested list of one), as the processor gives one text."""
        out = self.image_processor()(images=[[load_image(ref) for ref in images]], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "pixel_attention_mask": out["pixel_attention_mask"]}
