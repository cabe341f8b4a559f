"""The LLaVA-OneVision reader: ``LlavaOnevisionImageProcessorPil`` (no torchvision), images grouped as the model
reads them (``batch_num_images``): a tiled image alone, a path's untiled images together."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.media.images import load_image
from packer.models.reader import Reader


class LlavaOnevisionReader(Reader):
    def make_image_processor(self) -> Any:
        # The PIL backend: torchvision is not a dependency. llava-hf's preprocessor_config.json for OneVision
        # is the class defaults (384 px, bicubic, CLIP mean/std, the 36 anyres pinpoints).
        from transformers import LlavaOnevisionImageProcessorPil

        return LlavaOnevisionImageProcessorPil(
            size={"height": self.profile.crop_px, "width": self.profile.crop_px},
            image_grid_pinpoints=[list(p) for p in self.profile.pinpoints],
            do_pad=False,  # crops are concatenated (4-D), not padded to the batch's most crops
        )

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Each image as its example's only one (tiled): any grid with t > 1 says so."""
        return self.pixel_inputs(images, [(2, 0, 0)] * len(images))

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """Tiled images (t > 1) go to the processor alone, each run of untiled ones (t == 1) together, so its
        ``batch_num_images`` and the model's pick the same crops. An untiled image always has company: the
        other images on its paths, next to it in token order and kept in its row (the encoder refuses a cut
        that would part them)."""
        groups: list[list[int]] = []  # image indices, one processor "sample" each
        for i, (t, _, _) in enumerate(grids):
            if t == 1 and groups and grids[groups[-1][-1]][0] == 1:
                groups[-1].append(i)
            else:
                groups.append([i])
        if any(len(g) == 1 and grids[g[0]][0] == 1 for g in groups):
            raise ConfigError(
                f"profile {self.profile.name!r}: an untiled image without its example's other images; the model would "
                "tile it (batch_num_images 1). Collate whole examples"
            )
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=[[decoded[i] for i in g] for g in groups], return_tensors=None)
        return {
            "pixel_values": torch.from_numpy(np.concatenate(out["pixel_values"])),  # (sum(crops), 3, px, px)
            "image_sizes": torch.tensor(np.array(out["image_sizes"]), dtype=torch.int64),  # (N, 2) (h, w)
            "batch_num_images": torch.tensor([len(g) for g in groups], dtype=torch.int64),  # (G,)
        }
