"""What the Qwen-VL and Qwen-Omni readers and proofs share: the image processor and the per-image and per-video
slices of a batch's pixel rows. torch and transformers load inside the functions (callers are readers and
proofs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def qwen2vl_image_processor(profile: Any) -> Any:
    """``Qwen2VLImageProcessorPil`` with ``profile``'s min/max pixels, patch, temporal patch and merge sizes and
    its normalization (CLIP's for Qwen2-VL and Qwen2.5-Omni, 0.5 for Qwen3-Omni)."""
    # The PIL backend: torchvision is not a dependency, and transformers' Qwen2VLImageProcessor itself
    # falls back to Qwen2VLImageProcessorPil without it. Grids are identical in both backends.
    from transformers import Qwen2VLImageProcessorPil

    p = profile
    return Qwen2VLImageProcessorPil(
        min_pixels=p.min_pixels, max_pixels=p.max_pixels, patch_size=p.patch_size,
        temporal_patch_size=p.temporal_patch_size, merge_size=p.merge_size,
        image_mean=list(p.image_mean), image_std=list(p.image_std),
    )


def image_rows(batch: Mapping[str, Any]) -> list[dict[str, torch.Tensor]]:
    """Each image's t*h*w rows of ``pixel_values`` and its ``image_grid_thw`` row."""
    out, row = [], 0
    for i, (t, h, w) in enumerate(batch["image_grid_thw"].tolist()):
        out.append({"pixel_values": batch["pixel_values"][row : row + t * h * w],
                    "image_grid_thw": batch["image_grid_thw"][i : i + 1]})
        row += t * h * w
    return out


def video_table(batch: Mapping[str, Any]) -> list[tuple[int, int, int, int]]:
    """(first token, first pixel row, pixel rows, index) of every video in the batch."""
    if batch.get("video_grid_thw") is None:
        return []
    out, row = [], 0
    for i, ((t, h, w), off) in enumerate(zip(batch["video_grid_thw"].tolist(), batch["video_offsets"].tolist(),
                                             strict=True)):
        out.append((off, row, t * h * w, i))
        row += t * h * w
    return out
