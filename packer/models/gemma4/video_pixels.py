"""Video pixels for Gemma 4 without torchvision: a clip's sampled frames -> ``pixel_values_videos``.

transformers' ``Gemma4VideoProcessor`` needs torchvision (its module does not even import without it). What it
computes is short, and its one torchvision call (``tvF.resize``) is torch's ``interpolate``, so
``video_pixel_values`` does the same steps with the same ops (transformers 5.23.0,
``video_processing_gemma4.py``, ``video_processing_utils.py``, ``image_processing_backends.py``):

    frames (T, H, W, 3) uint8 -> (T, 3, H, W), contiguous        (_prepare_input_videos)
      resize     to ``resize.target_size`` with max_soft_tokens 70; bicubic, antialiased, on the uint8 tensor:
                 torchvision v2 ``resize_image`` runs torch's native uint8 kernel on CPU; skipped at the same size
      normalize  float32 (x - 255 * 0) / (255 * 1): the fused rescale (1/255) + normalize (mean 0, std 1)
      patchify   (T, ph * pw, 16 * 16 * 3), a patch's pixels in (y, x, channel) order
      positions  (x, y) of each patch, row-major; both padded to max_soft_tokens * 9 patches (0 and -1)

    32 frames of 480x640, defaults -> resized to 336x432 -> 21 x 27 patches (567 of 630)
      -> pixel_values_videos (32, 630, 768) float32, video_position_ids (32, 630, 2) int64

tests/models/test_gemma4.py checks it against the processor's own code (its module run with torchvision's two
calls, ``resize`` and ``normalize``, done by the torch functions torchvision runs for them). On CUDA torchvision
would take the float path instead (a cast, the float kernel, clamp, round): the reader runs on CPU tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.functional import interpolate

from packer.models.gemma4.resize import target_size


def video_pixel_values(
    frames: np.ndarray, *, patch_size: int = 16, max_soft_tokens: int = 70, pooling: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """One video's (``pixel_values_videos`` (T, P, 3 * patch**2) float32, ``video_position_ids`` (T, P, 2)
    int64), P = max_soft_tokens * pooling**2, as ``Gemma4VideoProcessor`` gives them for these frames
    (``do_sample_frames=False``: ``frames`` are the sampled ones, ``packer.media.video.decode_frames``)."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must be (T, H, W, 3) uint8 with T >= 1, got {frames.dtype} {frames.shape}")
    video = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()  # (T, 3, H, W) uint8
    height, width = target_size(video.shape[2], video.shape[3], patch_size=patch_size,
                                max_soft_tokens=max_soft_tokens, pooling=pooling)
    if (height, width) != tuple(video.shape[2:]):
        video = interpolate(video, size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    # TorchvisionBackend.rescale_and_normalize: mean and std float32 tensors times 1 / rescale_factor, then
    # x.to(float32).sub_(mean).div_(std)
    mean = (torch.tensor([0.0, 0.0, 0.0]) * (1.0 / (1 / 255))).view(-1, 1, 1)
    std = (torch.tensor([1.0, 1.0, 1.0]) * (1.0 / (1 / 255))).view(-1, 1, 1)
    video = video.to(torch.float32).sub_(mean).div_(std)  # (T, 3, h, w)
    t, ph, pw = video.shape[0], height // patch_size, width // patch_size
    patches = video.reshape(t, 3, ph, patch_size, pw, patch_size).permute(0, 2, 4, 3, 5, 1)  # (T, ph, pw, p, p, 3)
    patches = patches.reshape(t, ph * pw, 3 * patch_size**2)  # (T, ph * pw, 768)
    ys, xs = torch.meshgrid(torch.arange(ph), torch.arange(pw), indexing="ij")  # (ph, pw) each
    positions = torch.stack([xs, ys], dim=-1).reshape(1, ph * pw, 2).expand(t, -1, -1)  # (T, ph * pw, 2): (x, y)
    pad = max_soft_tokens * pooling**2 - ph * pw
    pixels = torch.cat([patches, patches.new_zeros(t, pad, patches.shape[2])], dim=1)  # (T, P, 768)
    positions = torch.cat([positions, positions.new_full((t, pad, 2), -1)], dim=1)  # (T, P, 2)
    return pixels, positions
