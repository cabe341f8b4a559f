"""Gemma 4's one resize rule, for images and video frames alike: keep the aspect ratio, fit a patch budget, make
both sides multiples of patch * pooling (16 * 3 = 48 px). Pure arithmetic on a header's size (no torch).

    soft_tokens(480, 640, max_soft_tokens=280)  # 640x480 -> 672x912 px -> 14 x 19 pooled tokens = 266
    soft_tokens(48, 48, max_soft_tokens=280)    #   48x48 -> 768x768 px (upscaled) -> 16 x 16 = 256

An image's token count depends on its size, from about max_soft_tokens * 0.8 to max_soft_tokens (a square
image: 16 x 16 = 256 of 280); a pooled token covers 3 x 3 patches of 16 px.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from packer.errors import RecordError
from packer.models.rules import ImageRule, MediaRun

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)
"""The budgets Gemma4ImageProcessor and Gemma4VideoProcessor accept (``_SUPPORTED_SOFT_TOKENS``)."""


@lru_cache(maxsize=8192)
def target_size(height: int, width: int, *, patch_size: int, max_soft_tokens: int, pooling: int) -> tuple[int, int]:
    """(height, width) in pixels the processor resizes a ``height`` x ``width`` image (or frame) to:
    ``get_aspect_ratio_preserving_size`` of transformers 5.23.0's ``image_processing_pil_gemma4.py`` (the video
    processor's and the processor's own copies are the same function), in the same float arithmetic.

    The largest size of the image's aspect ratio within ``max_soft_tokens * pooling**2`` patches, each side
    rounded down to a multiple of ``patch_size * pooling``; a side that rounds to 0 becomes one multiple and the
    other ``floor(long / short)`` multiples, at most ``max_soft_tokens``.

        target_size(480, 640, patch_size=16, max_soft_tokens=280, pooling=3)  # (672, 912)
    """
    if height < 1 or width < 1:
        raise RecordError("bad_image", f"image of {width}x{height} px has no pixels")
    max_patches = max_soft_tokens * pooling**2
    target_px = max_patches * patch_size**2
    factor = math.sqrt(target_px / (height * width))
    side = pooling * patch_size
    h = int(math.floor(factor * height / side)) * side
    w = int(math.floor(factor * width / side)) * side
    if h == 0 and w == 0:  # the processor raises ValueError; no budget it accepts reaches this
        raise RecordError("bad_image", f"a {width}x{height} image resizes to 0x0 under Gemma 4's rule")
    longest = (max_patches // pooling**2) * side
    if h == 0:
        h, w = side, min(int(math.floor(width / height)) * side, longest)
    elif w == 0:
        w, h = side, min(int(math.floor(height / width)) * side, longest)
    if h * w > target_px:  # the processor raises ValueError here too
        raise RecordError("bad_image", f"a {width}x{height} image resizes past {max_patches} patches")
    return h, w


def pooled_grid(height: int, width: int, *, patch_size: int, max_soft_tokens: int, pooling: int) -> tuple[int, int]:
    """(rows, cols) of soft tokens of a ``height`` x ``width`` image: the resized size over ``patch_size * pooling``.
    rows * cols is the processor's ``num_soft_tokens_per_image`` (patches // pooling**2)."""
    h, w = target_size(height, width, patch_size=patch_size, max_soft_tokens=max_soft_tokens, pooling=pooling)
    side = patch_size * pooling
    return h // side, w // side


def tokens_within(grids: np.ndarray, budget: int, *, image: bool) -> np.ndarray:
    """t * rows * cols of stored grids, -1 unless 1 <= rows * cols <= ``budget`` (and t == 1 for an image)."""
    grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    t, r, c = grids[:, 0], grids[:, 1], grids[:, 2]
    ok = (r >= 1) & (c >= 1) & (r * c <= budget) & ((t == 1) if image else (t >= 1))
    return np.where(ok, t * r * c, -1)


@dataclass(frozen=True)
class Gemma4Image(ImageRule):
    """Gemma 4's image processor: resized within ``max_soft_tokens`` (``pooled_grid``), one soft token per
    ``pooling`` x ``pooling`` patches, written ``<|image>`` + the soft tokens + ``<image|>``."""

    token: str = "<|image|>"
    patch_size: int = 16
    pooling: int = 3
    max_soft_tokens: int = 280

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, rows, cols) of pooled soft tokens: the resized image over 48 px."""
        rows, cols = pooled_grid(height, width, patch_size=self.patch_size, max_soft_tokens=self.max_soft_tokens,
                                 pooling=self.pooling)
        return (1, rows, cols)

    def num_tokens(self, width: int, height: int) -> int:
        """The processor's ``num_soft_tokens_per_image``: rows * cols."""
        _, rows, cols = self.grid_thw(width, height)
        return rows * cols

    def run(self, size: tuple[int, int]) -> MediaRun:
        """``Gemma4Processor.replace_image_token``: ``<|image>`` + the soft tokens + ``<image|>``, the entry at the
        first soft token."""
        grid = self.grid_thw(*size)
        n = grid[1] * grid[2]
        return MediaRun(grid, n, tokens=(self.start, *(self.token,) * n, self.end), lead=1)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """rows * cols of stored (1, rows, cols), -1 unless 1 <= rows * cols <= max_soft_tokens (what the resize
        can give: its sides are whole tokens within the budget; the processor raises past it)."""
        return tokens_within(grids, self.max_soft_tokens, image=True)

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("patches", rows * cols * 9): the 16 px patches the vision tower encodes per image (before pooling;
        the processor pads each image to max_soft_tokens * 9 patch slots, which the tower masks)."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        return "patches", grids[:, 0] * grids[:, 1] * grids[:, 2] * self.pooling**2
