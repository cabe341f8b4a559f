"""The toy family's profile: every image 9 tokens, 1-D positions; audio as a Whisper-style encoder hears it.

    640x480 -> 48x48 -> grid (t, h, w) = (1, 3, 3) -> 9 tokens of <|vision_pad|>
    1.3 s at 22.05 kHz -> 20,800 samples at 16 kHz -> 130 frames of 10 ms -> 13 tokens of <|quad_start|>

The audio token is ``<|quad_start|>``, another special token of Qwen2's vocabulary no builtin family uses (the
toy exercises the audio plumbing before a real audio family exists; it is no model's rule).
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
    audio_token: str | None = "<|quad_start|>"
    hop: int = 160
    """Samples per feature frame (10 ms at 16 kHz, Whisper's hop)."""
    frames_per_token: int = 10
    """Feature frames per audio token (a partial last group makes a token too)."""
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

    def audio_feature_lengths(self, num_samples: np.ndarray) -> np.ndarray:
        return np.asarray(num_samples, dtype=np.int64) // self.hop

    def audio_num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        lengths = np.asarray(feature_lengths, dtype=np.int64)
        return np.where(lengths > 0, -(-lengths // self.frames_per_token), -1)
