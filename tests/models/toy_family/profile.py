"""The toy family's profile: every image 9 tokens, 1-D positions.

    640x480 -> 48x48 -> grid (t, h, w) = (1, 3, 3) -> 9 tokens of <|vision_pad|>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.models.base import ModelProfile

if TYPE_CHECKING:
    from packer.models.reader import Reader


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

    def reader(self) -> Reader:
        from tests.models.toy_family.reader import ToyReader

        return ToyReader(self)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return np.full(len(grids), self.tokens_per_image, dtype=np.int64)
