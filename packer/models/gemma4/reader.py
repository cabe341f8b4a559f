"""The Gemma 4 reader: images through ``Gemma4ImageProcessorPil`` (no torchvision), videos from their planned frames
only (``video_pixels.py``: the video processor's maths in torch).

    pixel_values        (I, 2520, 768) float32   image_position_ids (I, 2520, 2) int64    one row per image
    pixel_values_videos (F, 630, 768) float32    video_position_ids (F, 630, 2) int64     one row per frame
    num_frames_per_video (V,) int64

Gemma4Model encodes each row alone (the padding patches masked), so a batch's images and frames are its
examples' in token order, exactly as the processor gives one text with those images and videos.
"""

from __future__ import annotations

from typing import Any

import torch

from packer.errors import ShardError
from packer.media.video import decode_frames
from packer.models.gemma4.resize import target_size
from packer.models.gemma4.video_pixels import video_pixel_values
from packer.models.reader import Reader


class Gemma4Reader(Reader):
    def make_image_processor(self) -> Any:
        # google/gemma-4-*-it processor_config.json: the class defaults (bicubic, rescale 1/255, no normalize,
        # patch 16, pooling 3) and max_soft_tokens 280, which is the profile's. The PIL backend: torchvision is
        # not a dependency.
        from transformers import Gemma4ImageProcessorPil

        p = self.profile
        return Gemma4ImageProcessorPil(max_soft_tokens=p.max_soft_tokens, patch_size=p.patch_size,
                                       pooling_kernel_size=p.pooling_kernel_size)

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Each stored video's planned frames decoded (``media.video.decode_frames``) and made what
        Gemma4VideoProcessor makes of them, frames of all videos in one leading axis."""
        p = self.profile
        pixels, positions = [], []
        for v in videos:
            frames = decode_frames(v["source"], v["frame_indices"])  # (T, H, W, 3) uint8
            size = target_size(frames.shape[1], frames.shape[2], patch_size=p.patch_size,
                               max_soft_tokens=p.video_max_soft_tokens, pooling=p.pooling_kernel_size)
            if size != (int(v["height"]), int(v["width"])):
                raise ShardError(f"{v['source']}: its frames are {frames.shape[2]}x{frames.shape[1]} px now, which "
                                 f"do not resize to the stored {v['width']}x{v['height']}; the clip changed since the build")
            x, pos = video_pixel_values(frames, patch_size=p.patch_size, max_soft_tokens=p.video_max_soft_tokens,
                                        pooling=p.pooling_kernel_size)
            pixels.append(x)
            positions.append(pos)
        return {"pixel_values_videos": torch.cat(pixels), "video_position_ids": torch.cat(positions),
                "num_frames_per_video": torch.tensor([len(v["frame_indices"]) for v in videos], dtype=torch.int64)}
