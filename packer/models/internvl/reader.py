"""The InternVL reader: ``GotOcr2ImageProcessorPil`` with InternVLProcessor's tiling (no torchvision)."""

from __future__ import annotations

from typing import Any

from packer.models.reader import Reader


class InternVLReader(Reader):
    def make_image_processor(self) -> Any:
        # InternVL3-hf's preprocessor: 448-px tiles, ImageNet mean/std, bicubic; InternVLProcessor turns
        # crop_to_patches on. The PIL backend: torchvision is not a dependency.
        from transformers import GotOcr2ImageProcessorPil
        from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling

        return GotOcr2ImageProcessorPil(
            size={"height": self.profile.tile_px, "width": self.profile.tile_px},
            crop_to_patches=True,
            min_patches=self.profile.min_tiles,
            max_patches=self.profile.max_tiles,
            image_mean=IMAGENET_DEFAULT_MEAN,
            image_std=IMAGENET_DEFAULT_STD,
            resample=PILImageResampling.BICUBIC,
            do_convert_rgb=True,
        )
