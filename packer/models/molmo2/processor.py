"""transformers' Molmo2 image and video processors without torchvision: their two torchvision calls (a bilinear
float resize without antialias, normalize) done by the torch functions torchvision runs for them. Imported by
the reader and the tests only (torch, transformers)."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F


@lru_cache(maxsize=1)
def image_processor_class() -> type:
    """transformers' ``Molmo2ImageProcessor`` with its two torchvision calls done in torch (no torchvision)."""
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    class Molmo2ImageProcessorTorch(Molmo2ImageProcessor):
        def resize(self, image, size, resample=None, antialias=True, **kwargs):
            # torchvision's tensor resize of a float image: this very interpolate call (bilinear is the only
            # mode Molmo2 uses; it passes antialias=False)
            return F.interpolate(
                image, size=(size.height, size.width), mode="bilinear", align_corners=False, antialias=antialias
            )

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            return image.sub_(mean).div_(std) if inplace else (image - mean) / std

    return Molmo2ImageProcessorTorch


@lru_cache(maxsize=1)
def video_processor_class() -> type:
    """transformers' ``Molmo2VideoProcessor`` with the same two calls done in torch (as for images)."""
    from transformers.models.molmo2.video_processing_molmo2 import Molmo2VideoProcessor

    image_class = image_processor_class()

    class Molmo2VideoProcessorTorch(Molmo2VideoProcessor):
        resize = image_class.resize
        normalize = image_class.normalize

    return Molmo2VideoProcessorTorch
