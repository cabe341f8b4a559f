"""The toy family's profile: every image 9 tokens, 1-D positions; audio as a Whisper-style encoder hears it.

    640x480 -> 48x48 -> grid (t, h, w) = (1, 3, 3) -> 9 tokens of <|vision_pad|>
    1.3 s at 22.05 kHz -> 20,800 samples at 16 kHz -> 130 Whisper frames (10 ms hops) -> 13 tokens of <|quad_start|>

The audio token is ``<|quad_start|>``, another special token of Qwen2's vocabulary no builtin family uses; the
frames are those of the default reader's features (``WhisperFeatureExtractor``'s mask over a clip padded to 30 s:
``shared.audio_features.feature_frames``), the tokens one per 10 frames (the toy exercises the audio plumbing
and the default reader; the token rule is no model's).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.models.base import ModelProfile
from packer.models.rules import AudioRule, FixedImage
from packer.models.shared.audio_features import feature_frames

if TYPE_CHECKING:
    from packer.models.reader import Reader


@dataclass(frozen=True)
class ToyAudio(AudioRule):
    """Whisper frames of a clip padded to 30 s alone (``feature_frames``), one token per ``frames_per_token``."""

    frames_per_token: int = 10

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        """-1 where a clip is stored as padded: the toy's features are each clip's alone."""
        frames = np.array([feature_frames(int(n)) for n in num_samples], dtype=np.int64).reshape(-1)
        return np.where(np.asarray(padded_samples) < 0, frames, -1)

    def num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        lengths = np.asarray(feature_lengths, dtype=np.int64)
        return np.where(lengths > 0, -(-lengths // self.frames_per_token), -1)


@dataclass(frozen=True, kw_only=True)
class ToyProfile(ModelProfile):
    """Fixed resolution: (side_px / patch_px)**2 tokens per image; pixels (N, 3, 48, 48) in [0, 1]."""

    image_token: str | None = "<|vision_pad|>"
    audio_token: str | None = "<|quad_start|>"
    frames_per_token: int = 10
    """Feature frames per audio token (a partial last group makes a token too)."""
    side_px: int = 48
    """The square side every image is resized to."""
    patch_px: int = 16
    """Patch side in pixels (one token per patch)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "toy_pixel_values")

    @cached_property
    def image(self) -> FixedImage:
        return FixedImage(self.side_px, self.patch_px, bidirectional=self.bidirectional_images)

    @cached_property
    def audio(self) -> ToyAudio:
        return ToyAudio(frames_per_token=self.frames_per_token)

    @property
    def tokens_per_image(self) -> int:
        return self.image.tokens_per_image

    def reader(self) -> Reader:
        from tests.models.toy_family.reader import ToyReader

        return ToyReader(self)
