"""GLM-4.6V's ``smart_resize``: multiples of a factor, bounds on frames x area, aspect kept.

transformers 5.23.0 ships it twice, the same function in ``image_processing_pil_glm46v.py`` (images, called with
``num_frames = temporal_patch_size`` = 2) and ``video_processing_glm46v.py`` (a clip's sampled frame count): unlike
Qwen2-VL's, it bounds ``t_bar * h_bar * w_bar`` (so an image's area is bounded by half of ``max_pixels``) and first
scales a side shorter than the factor up to it.

    smart_resize(2, 480, 640, factor=28, min_pixels=12544, max_pixels=9633792)   # (476, 644): 17 x 23 tokens
"""

from __future__ import annotations

from packer.errors import RecordError
from packer.models.shared.qwen_resize import frames_area_resize, short_side_up

MAX_ASPECT_RATIO = 200
"""``smart_resize`` raises beyond this long side / short side (after scaling a short side up to the factor)."""


def smart_resize(
    num_frames: int, height: int, width: int, *, temporal_factor: int = 2, factor: int = 28, min_pixels: int,
    max_pixels: int, what: str = "image",
) -> tuple[int, int]:
    """(height, width) GLM-4.6V's processors resize to: its ``smart_resize`` line by line (rounding and all), a
    RecordError (``bad_image``, or ``bad_video`` for ``what="video"``) where it raises a ValueError."""
    reason = "bad_video" if what == "video" else "bad_image"
    if min(height, width) < 1:
        raise RecordError(reason, f"{what} of {width}x{height} px has no pixels")
    if num_frames < temporal_factor:
        raise RecordError(reason, f"{num_frames} frames: GLM-4.6V needs at least {temporal_factor}")
    height, width = short_side_up(height, width, factor)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise RecordError(
            reason,
            f"{what} of {width}x{height} px (after scaling its short side up to {factor}) has an aspect ratio above "
            f"{MAX_ASPECT_RATIO}, which GLM-4.6V's processor refuses",
        )
    return frames_area_resize(num_frames, height, width, temporal_factor=temporal_factor, factor=factor,
                              min_pixels=min_pixels, max_pixels=max_pixels)
