"""Qwen2-VL and Qwen2.5-VL: dynamic resolution (smart_resize), 2x2 patch merging, 3-D mRoPE positions.

    640x480 -> smart_resize (multiple of 28, min/max pixels) -> 644x476
            -> grid (t, h, w) = (1, 34, 46) patches of 14 px -> 34*46 // 2**2 = 391 tokens
    rendered <|vision_start|><|image_pad|><|vision_end|>, the pad repeated 391 times; mRoPE gives those 391
    tokens (t, h, w) positions over the merged 1x17x23 grid, text tokens three equal rows.

Exact against transformers 5.23.0: grids against ``Qwen2VLImageProcessorPil`` on every COCO-mini image
(tests/models/test_qwen_vl.py), positions against ``Qwen2VLModel.get_rope_index`` on trees and packed rows
(tests/models/test_mrope.py).

Qwen2.5-VL vs Qwen2-VL (transformers 5.23.0): the image side is identical. ``Qwen2_5_VLProcessor`` uses the
same ``Qwen2VLImageProcessor`` (same smart_resize, patch 14, merge 2, temporal patch 2, same 56*56 /
28*28*1280 pixel defaults), so grids and token counts are the same. Window attention lives in the vision
tower (model), not in the token count. ``get_rope_index`` is the same for images (temporal interval 1); it
differs only for video, where Qwen2.5-VL spaces temporal positions by ``tokens_per_second *
second_per_grid_ts``. The pixel bounds are the released checkpoints' ``preprocessor_config.json`` (min_pixels
3136, max_pixels 12845056: Qwen2-VL-7B-Instruct, Qwen2.5-VL-7B-Instruct, tests/models/released/qwen_vl.json), which
``from_pretrained`` passes over the class default max_pixels 1003520 (28*28*1280) that packer used before.

Video (``QwenVideo``, shared/qwen_rules.py): frames sampled as qwen-vl-utils samples them and resized as ``Qwen2VLVideoProcessor``
does, from the container's header (``video_plan.py``); rendered
``<|vision_start|><|video_pad|><|vision_end|>`` with the pad repeated t*h*w/4 times. mRoPE gives a video's
tokens (t, h, w) positions like an image's, the temporal index of patch k being k (Qwen2-VL) or
``int(k * tokens_per_second * second_per_grid_t)`` in float32 (Qwen2.5-VL), and the text after it continues
at ``max(h, w) // 2`` past its start, as for an image (transformers 5.23.0 ``get_rope_index``).

    10 s clip at 30 fps, 640x480, qwen2.5-vl: 20 frames -> grid (10, 34, 46), 3910 tokens,
    second_per_grid_t 1.0 -> temporal indices 0, 2, 4, ..., 18 (tokens_per_second 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from packer.models.base import ModelProfile
from packer.models.shared.mrope import MRoPE
from packer.models.shared.qwen_resize import check_pixel_bounds
from packer.models.shared.qwen_rules import QwenImage, QwenVideo
from packer.models.shared.qwen_video_pixels import CLIP_MEAN, CLIP_STD

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True, kw_only=True)
class QwenVLProfile(ModelProfile):
    """Qwen2-VL / Qwen2.5-VL: an image of any size, resized to multiples of 28 px, 2x2 patches per token.

    ``pixel_values`` gives {"pixel_values": (sum(t*h*w), 3*2*14*14) float32, "image_grid_thw": (N, 3) int64}.
    """

    image_token: str | None = "<|image_pad|>"
    vision_start: str | None = "<|vision_start|>"
    vision_end: str | None = "<|vision_end|>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    patch_size: int = 14
    """Vision transformer patch side in pixels."""
    merge_size: int = 2
    """Side of the patch square merged into one LLM token (2x2 -> 1)."""
    temporal_patch_size: int = 2
    """Frames per temporal patch (a still image is repeated to fill it; its grid_t is 1)."""
    min_pixels: int = 3136
    """Smart-resize lower bound on resized height*width (the released preprocessor_config.json's, = 56 * 56)."""
    max_pixels: int = 12845056
    """Smart-resize upper bound on resized height*width (the released preprocessor_config.json's, 16384 tokens;
    the class default, 1003520, is not what a checkpoint's processor loads)."""
    video_token: str | None = "<|video_pad|>"
    tokens_per_second: int | None = None
    """Qwen2.5-VL: the vision config's ``tokens_per_second`` (released checkpoints: 2), which spaces a video's
    temporal positions by ``second_per_grid_t``; None: Qwen2-VL's one position per temporal patch."""
    video_min_pixels: int | None = None
    """The video processor's per-frame lower bound on area (None: its class default, 128 * 28 * 28)."""
    video_max_pixels: int | None = None
    """The video processor's per-frame upper bound on area (None: its class default, 768 * 28 * 28)."""

    image_mean: ClassVar[tuple[float, ...]] = CLIP_MEAN
    """The processors' normalization mean (images and videos alike)."""
    image_std: ClassVar[tuple[float, ...]] = CLIP_STD
    video_rule: ClassVar[str | None] = None
    """The video rule (``video_plan.VIDEO_FAMILIES``) this profile's videos follow; None: the one of its name."""

    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
        "second_per_grid_ts",  # Qwen2.5-VL only: video_pixel_values sets it where tokens_per_second is set
    )
    overridable: ClassVar[tuple[str, ...]] = (
        "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", *ModelProfile.overridable
    )

    def __post_init__(self) -> None:
        check_pixel_bounds(self)

    @cached_property
    def image(self) -> QwenImage:
        return QwenImage.of(self)

    @cached_property
    def video(self) -> QwenVideo:
        return QwenVideo(self.video_rule or self.name, self.video_min_pixels, self.video_max_pixels,
                         patch_size=self.patch_size, merge_size=self.merge_size,
                         temporal_patch_size=self.temporal_patch_size)

    @cached_property
    def positions(self) -> MRoPE:
        """mRoPE rows (3, L) int32, as ``get_rope_index`` gives them for each root-to-leaf path alone."""
        return MRoPE(merge_size=self.merge_size, tokens_per_second=self.tokens_per_second)

    def reader(self) -> Reader:
        from packer.models.qwen_vl.reader import QwenVLReader

        return QwenVLReader(self)

    def proof(self) -> Proof:
        from packer.models.qwen_vl.proof import QwenVLProof

        return QwenVLProof(self)


@dataclass(frozen=True, kw_only=True)
class Qwen25VLProfile(QwenVLProfile):
    """Qwen2.5-VL: Qwen2-VL's image side (see the module docstring); its own model class (window attention)."""

    def proof(self) -> Proof:
        from packer.models.qwen_vl.proof import Qwen25VLProof

        return Qwen25VLProof(self)
