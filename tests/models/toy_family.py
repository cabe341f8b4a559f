"""A toy model family, whole in this one file (registered by tests/models/test_new_family.py).

Every image becomes 9 tokens, whatever its size: a 48 px square cut into 3x3 patches of 16 px, one token
each. Its placeholder is its own, ``<|vision_pad|>`` (a special token of the builtin Qwen2 tokenizer that
no builtin family uses), its positions are 1-D, and its pixel values travel under its own batch key.

    640x480 -> 48x48 -> grid (t, h, w) = (1, 3, 3) -> 9 tokens of <|vision_pad|>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.types import ImageRef
from packer.media.images import load_image
from packer.models.base import ModelProfile

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class ToyProfile(ModelProfile):
    """Fixed resolution: (side_px / patch_px)**2 tokens per image; pixels (N, 3, 48, 48) in [0, 1]."""

    image_token: str | None = "<|vision_pad|>"
    side_px: int = 48
    """The square side every image is resized to."""
    patch_px: int = 16
    """Patch side in pixels (one token per patch)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "toy_pixel_values")

    @property
    def tokens_per_image(self) -> int:
        return (self.side_px // self.patch_px) ** 2

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        side = self.side_px // self.patch_px
        return (1, side, side)

    def num_tokens(self, width: int, height: int) -> int:
        return self.tokens_per_image

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        import torch

        s = self.side_px
        pixels = np.stack([np.asarray(load_image(r).resize((s, s)), dtype=np.float32) / 255 for r in images])
        return {"toy_pixel_values": torch.from_numpy(pixels).permute(0, 3, 1, 2)}  # (N, 3, S, S)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return np.full(len(grids), self.tokens_per_image, dtype=np.int64)
