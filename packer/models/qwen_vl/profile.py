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

Video (``plan_video``): frames sampled as qwen-vl-utils samples them and resized as ``Qwen2VLVideoProcessor``
does, from the container's header (``video_plan.py``); rendered
``<|vision_start|><|video_pad|><|vision_end|>`` with the pad repeated t*h*w/4 times. mRoPE gives a video's
tokens (t, h, w) positions like an image's, the temporal index of patch k being k (Qwen2-VL) or
``int(k * tokens_per_second * second_per_grid_t)`` in float32 (Qwen2.5-VL), and the text after it continues
at ``max(h, w) // 2`` past its start, as for an image (transformers 5.23.0 ``get_rope_index``).

    10 s clip at 30 fps, 640x480, qwen2.5-vl: 20 frames -> grid (10, 34, 46), 3910 tokens,
    second_per_grid_t 1.0 -> temporal indices 0, 2, 4, ..., 18 (tokens_per_second 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.types import EncodedVideo, VideoRef
from packer.errors import ConfigError
from packer.models.base import ModelProfile
from packer.models.shared.mrope import expected_mrope, mrope_position_ids
from packer.models.shared.qwen_resize import smart_resize
from packer.models.shared.qwen_video_pixels import CLIP_MEAN, CLIP_STD

if TYPE_CHECKING:
    from packer.media.video import VideoPlan
    from packer.models.proof import Proof
    from packer.models.reader import Reader
    from packer.models.shared.qwen_video_plan import VideoFamily

@dataclass(frozen=True, kw_only=True)
class QwenVLProfile(ModelProfile):
    """Qwen2-VL / Qwen2.5-VL: an image of any size, resized to multiples of 28 px, 2x2 patches per token.

    ``pixel_values`` gives {"pixel_values": (sum(t*h*w), 3*2*14*14) float32, "image_grid_thw": (N, 3) int64}.
    """

    image_token: str | None = "<|image_pad|>"
    vision_start: str | None = "<|vision_start|>"
    vision_end: str | None = "<|vision_end|>"
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

    mrope: ClassVar[bool] = True
    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
        "second_per_grid_ts",  # Qwen2.5-VL only: video_pixel_values sets it where tokens_per_second is set
    )
    overridable: ClassVar[tuple[str, ...]] = (
        "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", *ModelProfile.overridable
    )

    def __post_init__(self) -> None:
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ConfigError(
                f"profile {self.name!r}: need 1 <= 'min_pixels' <= 'max_pixels', "
                f"got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}"
            )

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) before merging, exactly Qwen2VLImageProcessor's ``image_grid_thw``."""
        resized_h, resized_w = smart_resize(
            height,
            width,
            factor=self.patch_size * self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )
        return (1, resized_h // self.patch_size, resized_w // self.patch_size)

    def num_tokens(self, width: int, height: int) -> int:
        t, h, w = self.grid_thw(width, height)
        return t * h * w // self.merge_size**2

    def video_family(self) -> VideoFamily:
        """The qwen-vl-utils + HF video processor rule of this profile (``video_plan.py``)."""
        return _video_family(self.video_rule or self.name, self.video_min_pixels, self.video_max_pixels)

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """Frames, grid and tokens of a clip (from its header) or of a frame list (from the images' headers)."""
        import packer.models.shared.qwen_video_plan as rules
        from packer.media.video import probe, probe_frame_list

        request = rules.VideoRequest.from_part(dict(video.options))
        if video.frames:
            return rules.plan_frame_list(probe_frame_list(video.frames), request, self.video_family())
        return rules.plan_video(probe(video.path), request, self.video_family())

    def temporal_interval(self, second_per_grid_t: float) -> np.float32:
        """A video's temporal position step per patch, as get_rope_index computes it: float32
        ``tokens_per_second * second_per_grid_t`` (Qwen2.5-VL), 1 (Qwen2-VL)."""
        if self.tokens_per_second is None:
            return np.float32(1.0)
        return np.float32(np.float32(self.tokens_per_second) * np.float32(second_per_grid_t))

    def extra_positions(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        grids: list[tuple[int, int, int]],
        *,
        token_ids: dict[str, int | None],
        videos: Sequence[EncodedVideo] = (),
    ) -> np.ndarray:
        """mRoPE rows (3, L) int32, as ``get_rope_index`` gives them for each root-to-leaf path alone."""
        if not grids and not videos:  # get_rope_index on text alone: three rows equal to the 1-D positions
            # one row seen three times (row stride 0), read-only: no copy until the cache stores it token-major
            # (np.broadcast_to gives the same view, slower)
            row = np.ascontiguousarray(positions, dtype=np.int32)
            out = np.ndarray((3, row.shape[0]), np.int32, row, 0, (0, row.itemsize))
            out.flags.writeable = False
            return out
        return mrope_position_ids(
            ids, node_offsets, node_parents, grids,
            image_token_id=token_ids["image_token"], spatial_merge_size=self.merge_size,
            video_token_id=token_ids.get("video_token"), video_grids=[v.grid_thw for v in videos],
            video_intervals=[self.temporal_interval(v.second_per_grid_t) for v in videos],
        )

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """t * (h // m) * (w // m); -1 unless h and w are multiples of the merge size m, as every grid is."""
        m = self.merge_size
        whole = (grids[:, 1] % m == 0) & (grids[:, 2] % m == 0)
        return np.where(whole, grids[:, 0] * (grids[:, 1] // m) * (grids[:, 2] // m), -1)

    def expected_extra_positions(
        self,
        length: int,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        image_offsets: np.ndarray,
        image_grids: np.ndarray,
        *,
        video_offsets: np.ndarray | None = None,
        video_grids: np.ndarray | None = None,
        video_seconds: np.ndarray | None = None,
    ) -> np.ndarray:
        """Images and videos are one list of vision spans to ``expected_mrope``; a video's temporal step is its
        ``temporal_interval``, an image's 1 (its t index is always 0)."""
        offsets = np.asarray(image_offsets, dtype=np.int64)
        grids = np.asarray(image_grids, dtype=np.int64).reshape(-1, 3)
        intervals = np.ones(len(offsets), dtype=np.float32)
        if video_offsets is not None and len(video_offsets):
            seconds = np.asarray(video_seconds, dtype=np.float64)
            offsets = np.concatenate([offsets, np.asarray(video_offsets, dtype=np.int64)])
            grids = np.concatenate([grids, np.asarray(video_grids, dtype=np.int64).reshape(-1, 3)])
            intervals = np.concatenate([intervals, np.array([self.temporal_interval(x) for x in seconds.tolist()],
                                                            dtype=np.float32)])
            order = np.argsort(offsets, kind="stable")
            offsets, grids, intervals = offsets[order], grids[order], intervals[order]
        return expected_mrope(
            length, node_offsets, node_parents, offsets, grids, spatial_merge_size=self.merge_size,
            temporal_intervals=intervals,
        )

    def video_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t * temporal_patch_size, frame size = grid (h, w) * patch_size, (h, w) whole merges."""
        p, m = self.patch_size, self.merge_size
        return (
            (grids[:, 0] * self.temporal_patch_size != num_frames) | (grids[:, 0] < 1)
            | (grids[:, 1] * p != sizes[:, 0]) | (grids[:, 2] * p != sizes[:, 1])
            | (grids[:, 1] % m != 0) | (grids[:, 2] % m != 0) | (grids[:, 1] < 1) | (grids[:, 2] < 1)
        )

    # ------------------------------------------------------------------ reader, proof

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


@lru_cache(maxsize=16)
def _video_family(name: str, min_pixels: int | None, max_pixels: int | None) -> VideoFamily:
    from packer.models.shared.qwen_video_plan import get_video_family

    return get_video_family(name, min_pixels=min_pixels, max_pixels=max_pixels)
