"""The Qwen-VL reader: images through ``Qwen2VLImageProcessorPil`` (the class transformers itself falls back to
without torchvision), videos from their planned frames only (``video_pixels.py``: the video processor's maths in
torch, no torchvision).

    pixel_values        (sum(t*h*w), 3*2*14*14) float32   image_grid_thw (N, 3) int64
    pixel_values_videos (sum(t*h*w), 3*2*14*14) float32   video_grid_thw (V, 3) int64   [second_per_grid_ts (V,)]
"""

from __future__ import annotations

from typing import Any

import torch

from packer.models.reader import Reader
from packer.models.shared.qwen_inputs import qwen2vl_image_processor
from packer.models.shared.qwen_video_pixels import planned_video_pixels


class QwenVLReader(Reader):
    """Qwen2-VL and Qwen2.5-VL (Qwen3-VL: ``Qwen3VLReader``)."""

    def make_image_processor(self) -> Any:
        return qwen2vl_image_processor(self.profile)

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``pixel_values_videos`` (sum(t*h*w), 3*2*14*14) float32, ``video_grid_thw`` (V, 3) int64 and, for
        Qwen2.5-VL, ``second_per_grid_ts`` (V,) float32 of ``videos`` (rows of the shards' ``videos`` column).

        Only the planned frames are decoded; qwen-vl-utils' resize to ``utils_height`` x ``utils_width`` then the
        processor's to ``height`` x ``width`` (``shared.qwen_video_pixels.planned_video_pixels``: torch ops, no
        torchvision).
        """
        p = self.profile
        pixels, grids = planned_video_pixels(videos, p)
        out = {"pixel_values_videos": pixels, "video_grid_thw": grids}
        if p.tokens_per_second is not None:  # the Qwen2.5-VL processor's float32 tensor
            out["second_per_grid_ts"] = torch.tensor([v["second_per_grid_t"] for v in videos], dtype=torch.float32)
        return out


class Qwen3VLReader(QwenVLReader):
    """Qwen3-VL: the same processor class with its checkpoints' patch 16 and mean = std = 0.5."""

    def make_image_processor(self) -> Any:
        # The PIL backend, as transformers picks it for qwen3_vl without torchvision (image_processing_auto.py).
        from transformers import Qwen2VLImageProcessorPil

        p = self.profile
        return Qwen2VLImageProcessorPil(
            min_pixels=p.min_pixels, max_pixels=p.max_pixels, patch_size=p.patch_size,
            temporal_patch_size=p.temporal_patch_size, merge_size=p.merge_size,
            image_mean=list(p.image_mean), image_std=list(p.image_std),
        )
