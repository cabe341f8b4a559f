"""The Qwen rules other families instantiate with their constants: ``QwenImage`` (smart_resize, merge x merge
patches per token) and ``QwenVideo`` (qwen-vl-utils' frame sampling + the HF video processor's sizes, from a clip's
header: ``qwen_video_plan.py``). Qwen2-VL / 2.5-VL / 3-VL / 3.5 and Qwen2.5-Omni / Qwen3-Omni use them.

    QwenImage(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=1003520)
        640x480 -> smart_resize -> 644x476 -> grid (1, 34, 46) -> 34 * 46 // 4 = 391 tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from packer.core.types import VideoRef
from packer.errors import ConfigError
from packer.media.video import VideoPlan, probe, probe_frame_list
from packer.models.rules import ImageRule, MediaRun, VideoRule
from packer.models.shared import qwen_video_plan as plans
from packer.models.shared.qwen_resize import smart_resize


def merged_tokens(grids: np.ndarray, merge: int) -> np.ndarray:
    """t * (h // m) * (w // m) of each (n, 3) grid; -1 unless h and w are multiples of the merge size m."""
    whole = (grids[:, 1] % merge == 0) & (grids[:, 2] % merge == 0)
    return np.where(whole, grids[:, 0] * (grids[:, 1] // merge) * (grids[:, 2] // merge), -1)


@dataclass(frozen=True)
class QwenImage(ImageRule):
    """Qwen2VLImageProcessor: resized to multiples of ``patch_size * merge_size`` with its area in
    [``min_pixels``, ``max_pixels``], one token per ``merge_size``**2 patches."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    def __post_init__(self) -> None:
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ConfigError(f"need 1 <= 'min_pixels' <= 'max_pixels', got min_pixels={self.min_pixels}, "
                              f"max_pixels={self.max_pixels}")

    @classmethod
    def of(cls, profile: Any) -> QwenImage:
        """The rule a Qwen profile's fields give: its patch and merge sizes, pixel bounds, ``vision_start`` /
        ``vision_end`` and ``bidirectional_images``."""
        return cls(patch_size=profile.patch_size, merge_size=profile.merge_size, min_pixels=profile.min_pixels,
                   max_pixels=profile.max_pixels, start=profile.vision_start, end=profile.vision_end,
                   bidirectional=profile.bidirectional_images)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) before merging, exactly Qwen2VLImageProcessor's ``image_grid_thw``."""
        h, w = smart_resize(height, width, factor=self.patch_size * self.merge_size, min_pixels=self.min_pixels,
                            max_pixels=self.max_pixels)
        return (1, h // self.patch_size, w // self.patch_size)

    def num_tokens(self, width: int, height: int) -> int:
        t, h, w = self.grid_thw(width, height)
        return t * h * w // self.merge_size**2

    def run(self, size: tuple[int, int]) -> MediaRun:
        """``num_tokens`` placeholders over ``grid_thw``, the resize done once."""
        grid = self.grid_thw(*size)
        return MediaRun(grid, grid[0] * grid[1] * grid[2] // self.merge_size**2)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return merged_tokens(grids, self.merge_size)


@dataclass(frozen=True)
class QwenVideo(VideoRule):
    """A clip (or a frame list) planned as qwen-vl-utils samples it and the HF video processor sizes it, under the
    video rule ``rule`` (``qwen_video_plan.VIDEO_FAMILIES``: "qwen2-vl", "qwen2.5-vl", "qwen3-vl", ...)."""

    rule: str
    min_pixels: int | None = None
    """The video processor's per-frame lower bound on area (None: the rule's default)."""
    max_pixels: int | None = None
    """The video processor's per-frame upper bound on area (None: the rule's default)."""
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    """Frames per temporal patch."""

    def family(self) -> plans.VideoFamily:
        return _video_family(self.rule, self.min_pixels, self.max_pixels)

    def plan(self, ref: VideoRef) -> VideoPlan:
        """Frames, grid and tokens of a clip (from its header) or of a frame list (from the images' headers)."""
        request = plans.VideoRequest.from_part(dict(ref.options))
        if ref.frames:
            return plans.plan_frame_list(probe_frame_list(ref.frames), request, self.family())
        return plans.plan_video(probe(ref.path), request, self.family())

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return merged_tokens(grids, self.merge_size)

    def plan_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t * temporal_patch_size, frame size = grid (h, w) * patch_size, (h, w) whole merges."""
        p, m = self.patch_size, self.merge_size
        return (
            (grids[:, 0] * self.temporal_patch_size != num_frames) | (grids[:, 0] < 1)
            | (grids[:, 1] * p != sizes[:, 0]) | (grids[:, 2] * p != sizes[:, 1])
            | (grids[:, 1] % m != 0) | (grids[:, 2] % m != 0) | (grids[:, 1] < 1) | (grids[:, 2] < 1)
        )


@lru_cache(maxsize=16)
def _video_family(name: str, min_pixels: int | None, max_pixels: int | None) -> plans.VideoFamily:
    return plans.get_video_family(name, min_pixels=min_pixels, max_pixels=max_pixels)
