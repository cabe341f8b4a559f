"""The Gemma 4 reader: images through ``Gemma4ImageProcessorPil`` (no torchvision), videos from their planned frames
only (``video_pixels.py``: the video processor's maths in torch).

    pixel_values        (I, 2520, 768) float32   image_position_ids (I, 2520, 2) int64    one row per image
    pixel_values_videos (F, 630, 768) float32    video_position_ids (F, 630, 2) int64     one row per frame
    num_frames_per_video (V,) int64
    input_features      (A, T, 128) float32      input_features_mask (A, T) bool          one row per clip
    audio_offsets       (A,) int64: each clip's first soft token in the batch (the base reader's)

Gemma4Model encodes each row alone (the padding patches masked), so a batch's images and frames are its
examples' in token order, exactly as the processor gives one text with those images and videos. Its audio tower
encodes each clip as a row of its own too (its frames padded to the batch's longest clip, masked): a clip's
soft tokens do not depend on the other clips of the batch (tests/models/test_gemma4_audio.py measures it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packer.errors import ShardError
from packer.media.video import decode_frames
from packer.models.gemma4.resize import target_size
from packer.models.gemma4.video_pixels import video_pixel_values
from packer.models.reader import Reader


class Gemma4Reader(Reader):
    def audio_features(self, samples: list[np.ndarray], audios: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """What Gemma4AudioFeatureExtractor gives the batch's clips (``audio.log_mel``, bit-equal): features and
        masks padded to the longest clip. ShardError where a mask's sum is not the stored ``feature_length``."""
        from packer.models.gemma4.audio import batch_features, log_mel

        clips = []
        for y, a in zip(samples, audios, strict=True):
            clip = log_mel(y)
            if int(clip.mask.sum()) != a["feature_length"]:
                raise ShardError(f"{a['source'] or 'inline audio'}: {int(clip.mask.sum())} feature frames, the build "
                                 f"counted {a['feature_length']} (built by another profile?)")
            clips.append(clip)
        features, mask = batch_features(clips)
        return {"input_features": torch.from_numpy(features), "input_features_mask": torch.from_numpy(mask)}

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
