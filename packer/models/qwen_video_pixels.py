"""A Qwen video's ``pixel_values_videos`` without torchvision: decode only the planned frames, resize each to
the planned size with PIL, normalize, then patch in time and space exactly like ``Qwen2VLVideoProcessor``.

    20 frames of a 640x480 clip planned to 476x644, grid (10, 34, 46):
      decode  frames 0, 16, 31, ... (media/video.decode_frames)      (20, 480, 640, 3) uint8
      resize  PIL bicubic to 644x476, /255, (x - CLIP mean) / std     (20, 3, 476, 644) float32
      patch   (t 10, 2 frames) x (h 17, 2, 14) x (w 23, 2, 14)        (10*34*46, 3*2*14*14) = (15640, 1176)

transformers' video processors and qwen-vl-utils resize with torchvision (bicubic, antialiased), which these
machines cannot import; PIL's bicubic filter (antialiased when shrinking) is the same kernel but rounds to
uint8 between the two resizes, so pixels may differ by a few levels from theirs (tests/models/
test_video_pixels.py checks the layout against the HF processor's patchify on the same frames). The grid,
token count and frame choice are exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from packer.models.qwen_vl import QwenVLProfile

# OPENAI_CLIP_MEAN / OPENAI_CLIP_STD: Qwen2VLVideoProcessor's image_mean / image_std
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def sampled_frames(video: dict[str, Any]) -> list[np.ndarray]:
    """The planned frames of one stored video (a ``videos`` column entry), RGB uint8 (H, W, 3) each."""
    from packer.media.video import decode_frame_list, decode_frames

    indices = video["frame_indices"]
    if video["frames"]:
        return decode_frame_list([video["frames"][i] for i in indices])
    return list(decode_frames(video["source"], indices))


def resized(frames: list[np.ndarray], *, height: int, width: int) -> np.ndarray:
    """Frames resized to height x width (PIL bicubic), rescaled and normalized: float32 (T, 3, H, W)."""
    from PIL import Image

    out = np.empty((len(frames), height, width, 3), dtype=np.float32)
    for k, frame in enumerate(frames):
        im = Image.fromarray(frame)
        if im.size != (width, height):
            im = im.resize((width, height), Image.Resampling.BICUBIC)
        out[k] = np.asarray(im, dtype=np.float32)
    out = (out / np.float32(255.0) - MEAN) / STD
    return out.transpose(0, 3, 1, 2)


def patchify(video: np.ndarray, *, patch_size: int, merge_size: int, temporal_patch_size: int) -> np.ndarray:
    """(T, C, H, W) -> (grid_t * grid_h * grid_w, C * tps * p * p): video_processing_qwen2_vl.py ``patchify``
    (the last frame repeated to fill the last temporal patch), one video."""
    if pad := -video.shape[0] % temporal_patch_size:
        video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
    t, c, h, w = video.shape
    gt, gh, gw, m, p = t // temporal_patch_size, h // patch_size, w // patch_size, merge_size, patch_size
    patches = video.reshape(gt, temporal_patch_size, c, gh // m, m, p, gw // m, m, p)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(patches).reshape(gt * gh * gw, c * temporal_patch_size * p * p)


def video_pixels(video: dict[str, Any], *, profile: QwenVLProfile) -> np.ndarray:
    """One stored video's rows of ``pixel_values_videos``: float32 (t*h*w, 3 * tps * p * p)."""
    frames = resized(sampled_frames(video), height=video["height"], width=video["width"])
    return patchify(frames, patch_size=profile.patch_size, merge_size=profile.merge_size,
                    temporal_patch_size=profile.temporal_patch_size)
