"""The Llama 4 reader: transformers' ``Llama4ImageProcessor`` with its torchvision calls done in torch
(``processor.py``), on the batch's images in token order.

    pixel_values (tiles, 3, 336, 336) float32

Each image's canvas tiles row by row, then its global tile when it has several, images one after the other: the
order of the ``<|patch|>`` runs in the tokens, which is the order the model scatters the tiles' features in. The
image processor rescales and normalizes in bfloat16 (the original implementation's precision); the reader hands
those values on exactly, as float32 (every bfloat16 is a float32), so an fp32 model takes them as they are and a
bf16 model after ``.to(torch.bfloat16)``, which gives the processor's tensor back bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from packer.core.types import ImageRef
from packer.media.images import load_image
from packer.models.reader import Reader


class Llama4Reader(Reader):
    def make_image_processor(self) -> Any:
        # Llama-4-Scout's preprocessor_config: the class defaults (bilinear, rescale 1/255, mean = std = 0.5, RGB) but
        # the profile's size, max_patches and resize_to_max_canvas (16 and false in the checkpoints).
        from packer.models.llama4.processor import image_processor_class

        p = self.profile
        return image_processor_class()(size={"height": p.tile_px, "width": p.tile_px}, max_patches=p.max_patches,
                                       resize_to_max_canvas=p.resize_to_max_canvas)

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Every image's tiles, in order, as float32 holding the processor's bfloat16 values."""
        out = self.image_processor()(images=[load_image(ref) for ref in images], return_tensors="pt")
        return {"pixel_values": out["pixel_values"].to(torch.float32)}
