"""The Gemma 3 reader: ``Gemma3ImageProcessorPil`` (no torchvision), one (3, 896, 896) entry per stored block."""

from __future__ import annotations

from typing import Any

import torch

from packer.core.types import ImageRef
from packer.media.images import load_image
from packer.models.reader import Reader


class Gemma3Reader(Reader):
    def make_image_processor(self) -> Any:
        # The PIL backend (torchvision is not a dependency). google/gemma-3-*-it preprocessor_config.json:
        # 896x896, bilinear, rescale 1/255, mean = std = 0.5 (the class defaults but for the size), pan-and-scan
        # off; its settings as Gemma3Processor passes them (its defaults, or the profile's options).
        from transformers import Gemma3ImageProcessorPil

        return Gemma3ImageProcessorPil(
            size={"height": self.profile.image_px, "width": self.profile.image_px}, do_pan_and_scan=self.profile.do_pan_and_scan,
            pan_and_scan_min_crop_size=self.profile.pan_and_scan_min_crop_size,
            pan_and_scan_max_num_crops=self.profile.pan_and_scan_max_num_crops,
            pan_and_scan_min_ratio_to_activate=self.profile.pan_and_scan_min_ratio_to_activate,
        )

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """One (3, 896, 896) entry per stored block: grid (1 + k, ...) is block k of its image as the processor
        orders them (the whole image, then the crops); an image is decoded and processed once per call."""
        if not self.profile.do_pan_and_scan:
            return self.pixel_values(images)
        blocks: dict[ImageRef, torch.Tensor] = {}
        out = []
        for ref, grid in zip(images, grids, strict=True):
            if ref not in blocks:
                blocks[ref] = self.image_processor()(images=[load_image(ref)], return_tensors="pt")["pixel_values"]
            out.append(blocks[ref][int(grid[0]) - 1])
        return {"pixel_values": torch.stack(out)}
