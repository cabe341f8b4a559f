"""Qwen-VL's resize rule: ``smart_resize`` (multiples of a factor, area bounds, aspect kept), shared by its
image processor and by qwen-vl-utils' frame sizing (``video_plan.py``)."""

from __future__ import annotations

import math
from typing import Any

from packer.errors import ConfigError, RecordError

# Qwen2-VL's smart_resize refuses images whose long side is more than 200x the short side.
MAX_ASPECT_RATIO = 200


def check_pixel_bounds(profile: Any, *pairs: tuple[str, str]) -> None:
    """ConfigError unless 1 <= low <= high for each (low, high) pair of the profile's pixel-bound fields."""
    for low, high in pairs or (("min_pixels", "max_pixels"),):
        if getattr(profile, low) < 1 or getattr(profile, high) < getattr(profile, low):
            raise ConfigError(f"profile {profile.name!r}: need 1 <= {low!r} <= {high!r}, got "
                              f"{low}={getattr(profile, low)}, {high}={getattr(profile, high)}")


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize target (height, width): multiples of ``factor``, area in [min, max], same aspect.

    Same arithmetic as transformers' ``qwen2_vl.image_processing_qwen2_vl.smart_resize`` (rounding and all),
    but a RecordError instead of a ValueError for an aspect ratio above 200.
    """
    if min(height, width) < 1 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise RecordError(
            "bad_image",
            f"image of {width}x{height} px has an aspect ratio above {MAX_ASPECT_RATIO}, which Qwen2-VL refuses",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def short_side_up(height: int, width: int, factor: int) -> tuple[int, int]:
    """(height, width) with a side shorter than ``factor`` scaled up to it, aspect kept (``int`` truncation), as
    the frames-and-area ``smart_resize`` of Qwen3-VL's and GLM-4.6V's video processors does first."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    return height, width


def frames_area_resize(num_frames: int, height: int, width: int, *, temporal_factor: int, factor: int,
                       min_pixels: float, max_pixels: float) -> tuple[int, int]:
    """(height, width) in multiples of ``factor`` with ``t_bar * h_bar * w_bar`` in [min_pixels, max_pixels]
    (``t_bar`` the frames rounded to ``temporal_factor``): the bounds of Qwen3-VL's and GLM-4.6V's
    ``smart_resize``, after their own checks, rounding and all."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
