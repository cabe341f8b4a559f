"""The toy family's reader: each image resized to 48x48, RGB in [0, 1], under its own batch key."""

from __future__ import annotations

import numpy as np
import torch

from packer.core.types import ImageRef
from packer.media.images import load_image
from packer.models.reader import Reader


class ToyReader(Reader):
    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        s = self.profile.side_px
        pixels = np.stack([np.asarray(load_image(r).resize((s, s)), dtype=np.float32) / 255 for r in images])
        return {"toy_pixel_values": torch.from_numpy(pixels).permute(0, 3, 1, 2)}  # (N, 3, S, S)
