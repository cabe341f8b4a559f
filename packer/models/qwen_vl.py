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
second_per_grid_ts``. Released checkpoints' ``preprocessor_config.json`` set ``max_pixels=12845056``; the
class default (used here) is 1003520 - pass ``max_pixels`` to match a checkpoint.

Video (``plan_video``): frames sampled as qwen-vl-utils samples them and resized as ``Qwen2VLVideoProcessor``
does, from the container's header (``packer.models.qwen_video_plan``); rendered
``<|vision_start|><|video_pad|><|vision_end|>`` with the pad repeated t*h*w/4 times. mRoPE gives a video's
tokens (t, h, w) positions like an image's, the temporal index of patch k being k (Qwen2-VL) or
``int(k * tokens_per_second * second_per_grid_t)`` in float32 (Qwen2.5-VL), and the text after it continues
at ``max(h, w) // 2`` past its start, as for an image (transformers 5.23.0 ``get_rope_index``).

    10 s clip at 30 fps, 640x480, qwen2.5-vl: 20 frames -> grid (10, 34, 46), 3910 tokens,
    second_per_grid_t 1.0 -> temporal indices 0, 2, 4, ..., 18 (tokens_per_second 2)
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.tree import check_layout, node_lengths, node_start_positions
from packer.core.types import EncodedVideo, VideoRef
from packer.errors import ConfigError, RecordError
from packer.models.base import ModelProfile, tiny_text_config
from packer.models.qwen_video import CLIP_MEAN, CLIP_STD

if TYPE_CHECKING:
    import torch

    from packer.media.video import VideoPlan
    from packer.models.qwen_video_plan import VideoFamily

# Qwen2-VL's smart_resize refuses images whose long side is more than 200x the short side.
MAX_ASPECT_RATIO = 200


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
    min_pixels: int = 56 * 56
    """Smart-resize lower bound on resized height*width (the processor's class default)."""
    max_pixels: int = 28 * 28 * 1280
    """Smart-resize upper bound on resized height*width (class default: at most 1280 tokens per image)."""
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

    mrope: ClassVar[bool] = True
    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
        "second_per_grid_ts",  # Qwen2.5-VL only: video_pixel_values sets it where tokens_per_second is set
    )
    overridable: ClassVar[tuple[str, ...]] = (
        "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", *ModelProfile.overridable
    )
    hf_model_class: ClassVar[str | None] = "Qwen2VLForConditionalGeneration"

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
        """The qwen-vl-utils + HF video processor rule of this profile (``packer.models.qwen_video_plan``)."""
        return _video_family(self.name, self.video_min_pixels, self.video_max_pixels)

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """Frames, grid and tokens of a clip (from its header) or of a frame list (from the images' headers)."""
        from packer.media.video import probe, probe_frame_list
        from packer.models import qwen_video_plan as rules

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
            # one row seen three times (row stride 0), read-only: no copy, and encoded_table compares one row to
            # position_ids, not three, before it stores them as an empty list (np.broadcast_to: the same view, slower)
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

    def make_image_processor(self) -> Any:
        # The PIL backend: torchvision is not a dependency, and transformers' Qwen2VLImageProcessor itself
        # falls back to Qwen2VLImageProcessorPil without it. Grids are identical in both backends.
        from transformers import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            merge_size=self.merge_size,
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

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``pixel_values_videos`` (sum(t*h*w), 3*2*14*14) float32, ``video_grid_thw`` (V, 3) int64 and, for
        Qwen2.5-VL, ``second_per_grid_ts`` (V,) float32 of ``videos`` (rows of the shards' ``videos`` column).

        Only the planned frames are decoded (``media.video.decode_frames``); qwen-vl-utils' resize to
        ``utils_height`` x ``utils_width`` then the processor's to ``height`` x ``width`` follow
        ``qwen_video.video_pixel_values`` (torch ops, no torchvision). A frame list's images are first resized
        one by one as qwen-vl-utils' ``fetch_image`` resizes them (``_sampled_frames``).
        """
        import torch

        from packer.models.qwen_video import video_pixel_values

        pixels, grids = [], []
        for v in videos:
            utils_size = (v["utils_height"], v["utils_width"])
            pixel_values, grid = video_pixel_values(
                _sampled_frames(v, utils_size, self.video_family()), resized_height=v["height"], resized_width=v["width"],
                patch_size=self.patch_size, image_mean=self.image_mean, image_std=self.image_std,
                temporal_patch_size=self.temporal_patch_size, merge_size=self.merge_size, utils_size=utils_size,
            )
            pixels.append(pixel_values)
            grids.append(grid)
        out = {"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.cat(grids)}
        if self.tokens_per_second is not None:  # the Qwen2.5-VL processor's float32 tensor
            out["second_per_grid_ts"] = torch.tensor([v["second_per_grid_t"] for v in videos], dtype=torch.float32)
        return out


    # ------------------------------------------------------------------ check

    def model_tokens(self) -> tuple[str, ...]:
        return (*super().model_tokens(), self.video_token)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny Qwen2-VL (or Qwen2.5-VL): ``tiny_text_config`` + a 1-block vision tower of width 32.

        mRoPE splits the head's rotary frequencies t/h/w as Qwen2-VL does (16/24/24 of 64): 1/1/2 of 4 here.
        """
        import transformers

        vision_depth, vision_dim = kw.pop("vision_depth", 1), kw.pop("vision_dim", 32)
        text = tiny_text_config(vocab_size=vocab_size, **kw)
        half = text["hidden_size"] // text["num_attention_heads"] // 2
        t = max(1, half // 4)
        section = [t, (half - t) // 2, half - t - (half - t) // 2]
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}
        vision = self._tiny_vision(depth=vision_depth, width=vision_dim, out=text["hidden_size"])
        cls = getattr(transformers, self.hf_model_class)
        config = cls.config_class(
            text_config=text, vision_config=vision, attn_implementation="sdpa", **self._config_ids(token_ids)
        )
        return cls(config).float().train()

    def _config_ids(self, token_ids: dict[str, int]) -> dict[str, int]:
        """The model config's token-id fields from ``token_ids`` (token -> id)."""
        names = {"image_token_id": self.image_token, "video_token_id": self.video_token,
                 "vision_start_token_id": self.vision_start, "vision_end_token_id": self.vision_end}
        return {key: token_ids[tok] for key, tok in names.items()}

    def _tiny_vision(self, *, depth: int, width: int, out: int) -> dict[str, Any]:
        return dict(depth=depth, embed_dim=width, hidden_size=out, num_heads=2, mlp_ratio=2,
                    spatial_merge_size=self.merge_size)

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's t*h*w rows of ``pixel_values`` and its ``image_grid_thw`` row."""
        out, row = [], 0
        for i, (t, h, w) in enumerate(batch["image_grid_thw"].tolist()):
            out.append({"pixel_values": batch["pixel_values"][row : row + t * h * w],
                        "image_grid_thw": batch["image_grid_thw"][i : i + 1]})
            row += t * h * w
        return out

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """Adds ``mm_token_type_ids``, from which the model's ``get_rope_index`` finds the images (mRoPE)."""
        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        if images:
            out["mm_token_type_ids"] = (input_ids == token_ids[self.image_token]).int()
        return out


@dataclass(frozen=True, kw_only=True)
class Qwen25VLProfile(QwenVLProfile):
    """Qwen2.5-VL: Qwen2-VL's image side (see the module docstring); its own model class (window attention)."""

    hf_model_class: ClassVar[str | None] = "Qwen2_5_VLForConditionalGeneration"

    def _tiny_vision(self, *, depth: int, width: int, out: int) -> dict[str, Any]:
        # windows of 56 px (2x2 merged tokens) and the last block full: both attention kinds run
        return dict(depth=max(depth, 2), hidden_size=width, out_hidden_size=out, intermediate_size=2 * width,
                    num_heads=2, spatial_merge_size=self.merge_size, window_size=56,
                    fullatt_block_indexes=[max(depth, 2) - 1], tokens_per_second=self.tokens_per_second or 2)


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


# ---------------------------------------------------------------------------------------- mRoPE
def _runs(ids: np.ndarray, token_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the maximal runs of ``token_id`` in ``ids`` (none for a None id)."""
    if token_id is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    hits = ids == token_id
    if not hits.any():  # the usual case for the video token: one pass, no edges to find
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    edges = np.diff(np.concatenate([[False], hits, [False]]).astype(np.int8))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def mrope_position_ids(
    input_ids: np.ndarray,
    node_offsets: np.ndarray,
    node_parents: np.ndarray,
    image_grids: list[tuple[int, int, int]],
    *,
    image_token_id: int,
    spatial_merge_size: int = 2,
    video_token_id: int | None = None,
    video_grids: Sequence[tuple[int, int, int]] = (),
    video_intervals: Sequence[float] = (),
) -> np.ndarray:
    """Qwen2-VL 3-D mRoPE positions (int32, (3, L): t, h, w rows) of a tree, per root-to-leaf path.

    Each path gets exactly what transformers 5.23.0's ``Qwen2VLModel.get_rope_index`` (and Qwen2.5-VL's)
    returns for that path run alone. In that code an image is a maximal run of ``image_token_id`` tokens
    (``mm_token_type_ids == 1``), a video one of ``video_token_id`` (type 2), and:

    - text continues 1-D: all three rows equal ``current_pos + i``;
    - an image or video with grid (t, h, w) has llm grid (t, h // m, w // m) and positions
      ``current_pos + (T(ti), hi, wi)`` in t-major, then h, then w order, T(ti) = ti for an image and a
      Qwen2-VL video, ``int(float32(ti) * interval)`` for a Qwen2.5-VL video (``video_intervals``, float32
      tokens_per_second * second_per_grid_t);
    - after it ``current_pos += max(h, w) // m`` (for a still image, t = 1, this is its max + 1).

    A node starts from its parent's final ``current_pos`` (a whole packed row works too: every root starts
    at 0). ``image_grids`` / ``video_grids`` are the images / videos in token order. Every run must be one
    whole image or video inside one node; otherwise a RecordError ("image_count_mismatch"), which also
    catches a text containing a literal image or video token.
    """
    ids = np.asarray(input_ids)
    length = ids.shape[0]
    # the few nodes and runs as Python ints: scalar work instead of numpy calls on tiny arrays
    starts, parents = np.asarray(node_offsets).reshape(-1).tolist(), np.asarray(node_parents).reshape(-1).tolist()
    if starts != [0] or parents != [-1]:  # one node at 0 with no parent: a valid linear example, nothing to check
        check_layout(length, node_offsets, node_parents, empty_nodes=True)
    ends = [*starts[1:], length]
    spans = [  # (start, end, grid, interval) of each vision run, in token order
        *_vision_runs(ids, image_token_id, image_grids, None, spatial_merge_size, "image"),
        *_vision_runs(ids, video_token_id, video_grids, video_intervals, spatial_merge_size, "video"),
    ]
    spans.sort()
    # Zero-length nodes share an offset with the next node; bisect_right picks the last of them, which is the
    # one holding tokens.
    run_node = [bisect_right(starts, sp[0]) - 1 for sp in spans]
    if any(sp[1] > ends[n] for sp, n in zip(spans, run_node, strict=True)):
        raise RecordError("image_count_mismatch", "an image's or video's tokens are split across two tree nodes")

    # int32 throughout (the result's dtype): positions stay below the length, and lengths fit int32
    out = np.empty((3, length), dtype=np.int32)
    next_pos = [0] * len(starts)  # current_pos after each node's path
    k = 0  # next vision run, in token order
    m = spatial_merge_size
    for n, (s, e, parent) in enumerate(zip(starts, ends, parents, strict=True)):
        cur = 0 if parent < 0 else next_pos[parent]
        while k < len(spans) and run_node[k] == n:
            rs, re_, (t, h, w), interval = spans[k]
            out[:, s:rs] = np.arange(cur, cur + rs - s)  # text before the run, broadcast to 3 rows
            cur += rs - s
            np.add(_grid_positions(t, h // m, w // m, interval), cur, out=out[:, rs:re_])
            cur += max(h, w) // m
            s = re_
            k += 1
        out[:, s:e] = np.arange(cur, cur + e - s)
        next_pos[n] = cur + e - s
    return out


def _vision_runs(
    ids: np.ndarray,
    token_id: int | None,
    grids: Sequence[tuple[int, int, int]],
    intervals: Sequence[float] | None,
    merge: int,
    what: str,
) -> list[tuple[int, int, tuple[int, int, int], float]]:
    """(start, end, grid, interval) of each maximal run of ``token_id`` in ``ids``, the k-th run being the k-th
    of ``grids``: it must span exactly that grid's t * (h // merge) * (w // merge) tokens (RecordError
    "image_count_mismatch" otherwise). Scalar checks on the hits' indices instead of a pass for run edges:
    the k-th grid's tokens are the next ``count`` hits, and they form a maximal run when they are consecutive
    and the hit after them is not adjacent."""
    if len(grids) == 0 and (token_id is None or not (ids == token_id).any()):
        return []  # none named, none found (the video kind of an image example)
    hits = np.zeros(0, np.int64) if token_id is None else np.flatnonzero(ids == token_id)
    found, spans, j = hits.shape[0], [], 0
    for k, grid in enumerate(grids):
        t, h, w = (int(x) for x in grid)
        count = t * (h // merge) * (w // merge)
        if count <= 0 or j + count > found:
            break
        a, b = int(hits[j]), int(hits[j + count - 1])
        if b - a != count - 1 or (j + count < found and int(hits[j + count]) == b + 1):
            break
        spans.append((a, b + 1, (t, h, w), 1.0 if intervals is None else float(intervals[k])))
        j += count
    if len(spans) == len(grids) and j == found:
        return spans
    starts, ends = _runs(ids, token_id)
    sizes = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    counts = sizes[:, 0] * (sizes[:, 1] // merge) * (sizes[:, 2] // merge)
    raise RecordError(
        "image_count_mismatch",
        f"{starts.shape[0]} runs of {what} tokens of lengths {(ends - starts).tolist()} "
        f"do not match {sizes.shape[0]} {what}s of {counts.tolist()} tokens",
    )


@lru_cache(maxsize=256)  # a dataset has few distinct grids; <= 256 * 15 KB (1280-token images) cached
def _grid_positions(t: int, h: int, w: int, interval: float = 1.0) -> np.ndarray:
    """(t, h, w) rows of one llm grid in t-major, then h, then w order: (3, t*h*w) int32, read-only; the t
    row scaled by the float32 ``interval`` and truncated, as get_rope_index's ``(arange(t) * interval).long()``."""
    tt, rest = np.divmod(np.arange(t * h * w, dtype=np.int32), h * w)
    hh, ww = np.divmod(rest, w)
    if interval != 1.0:
        tt = (tt.astype(np.float32) * np.float32(interval)).astype(np.int32)
    block = np.stack([tt, hh, ww])
    block.flags.writeable = False
    return block


def mrope_position_deltas(
    mrope_ids: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray
) -> np.ndarray:
    """get_rope_index's ``mrope_position_deltas`` (max position + 1 - length) of each root-to-node path.

    int64 (N,). Only generation uses it (to continue positions after the prompt); entry n is for the path
    that ends with node n, so a leaf's entry is that branch's delta.
    """
    mrope_ids = np.asarray(mrope_ids)
    length = mrope_ids.shape[1]
    check_layout(length, node_offsets, node_parents, empty_nodes=True)
    offsets, lengths = np.asarray(node_offsets, dtype=np.int64), node_lengths(length, node_offsets)
    parents = np.asarray(node_parents, dtype=np.int64)
    n = offsets.shape[0]
    node_max = np.full(n, -1, dtype=np.int64)
    nonempty = lengths > 0
    if length:
        node_max[nonempty] = np.maximum.reduceat(mrope_ids.max(axis=0), offsets[nonempty])
    path_max = node_max.copy()
    path_len = lengths.copy()
    for i in range(n):  # parents come first, so one forward pass accumulates along each path
        if parents[i] >= 0:
            path_max[i] = max(path_max[i], path_max[parents[i]])
            path_len[i] += path_len[parents[i]]
    return path_max + 1 - path_len


def expected_mrope(
    length: int,
    node_offsets: np.ndarray,
    node_parents: np.ndarray,
    image_offsets: np.ndarray,
    image_grids: np.ndarray,
    *,
    spatial_merge_size: int,
    temporal_intervals: np.ndarray | None = None,
) -> np.ndarray:
    """``mrope_position_ids`` (as int64) of a node forest, without a Python loop over nodes: verify's check.

    Along a path, text advances the position by 1 per token and an image by max(h, w) // merge as a whole.
    So give every token a weight (1 for text; 0 inside an image except its last token, which carries the
    image's advance): a text token's position is the weighted prefix sum along its path (the ancestors'
    node sums from ``node_start_positions`` + the exclusive sum inside its node). An image token adds its
    (t, h, w) index in the merged grid to the position where its image starts. Images must be whole and
    inside one node (verify checks that first). Videos are spans like images (in offset order with them),
    their t index scaled by ``temporal_intervals`` (float32 per span, 1 for an image).
    """
    merge = spatial_merge_size
    grids = np.asarray(image_grids, dtype=np.int64).reshape(-1, 3)
    starts = np.asarray(image_offsets, dtype=np.int64)
    lh, lw = grids[:, 1] // merge, grids[:, 2] // merge  # (I,) the merged (llm) grid
    counts = grids[:, 0] * lh * lw
    g_off = np.asarray(node_offsets, dtype=np.int64)
    w = np.ones(length, dtype=np.int64)
    img_tok = np.repeat(np.arange(len(starts)), counts)  # (V,) image of each vision token
    k = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)  # index inside its image
    tok = np.repeat(starts, counts) + k  # (V,) flat position of each vision token
    w[tok] = 0
    w[starts + counts - 1] = np.maximum(grids[:, 1], grids[:, 2]) // merge
    node_w = np.add.reduceat(w, g_off) if len(g_off) else np.zeros(0, np.int64)
    base = node_start_positions(node_parents, node_w)  # (N,) weighted sum over each node's ancestors
    node_of_tok = np.repeat(np.arange(len(g_off)), np.diff(np.append(g_off, length)))
    excl = np.cumsum(w) - w
    text_pos = base[node_of_tok] + excl - excl[g_off][node_of_tok]  # (L,)
    out = np.broadcast_to(text_pos, (3, length)).copy()
    origin = text_pos[starts][img_tok]
    t_index = k // (lh * lw)[img_tok]
    if temporal_intervals is not None:
        interval = np.asarray(temporal_intervals, dtype=np.float32)[img_tok]
        t_index = (t_index.astype(np.float32) * interval).astype(np.int64)
    out[0, tok] = origin + t_index
    out[1, tok] = origin + (k // lw[img_tok]) % lh[img_tok]
    out[2, tok] = origin + k % lw[img_tok]
    return out


def _sampled_frames(video: dict[str, Any], utils_size: tuple[int, int], family: VideoFamily) -> np.ndarray:
    """The planned frames of one stored video, RGB uint8 (T, H, W, 3): decoded from the clip, or a frame list's
    images each resized as qwen-vl-utils' ``fetch_image`` resizes it (PIL's default bicubic, to
    ``qwen_video_plan.frame_list_fetch_size``); ``video_pixel_values`` then does fetch_video's resize."""
    from packer.media.video import decode_frame_list, decode_frames
    from packer.models.qwen_video_plan import frame_list_fetch_size

    if not video["frames"]:
        return decode_frames(video["source"], video["frame_indices"])
    from PIL import Image

    nframes = len(video["frame_indices"])
    out = []
    for f in decode_frame_list([video["frames"][i] for i in video["frame_indices"]]):
        h, w = frame_list_fetch_size(f.shape[0], f.shape[1], nframes=nframes, utils_size=utils_size, family=family)
        out.append(f if f.shape[:2] == (h, w) else np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BICUBIC)))
    return np.stack(out)


@lru_cache(maxsize=16)
def _video_family(name: str, min_pixels: int | None, max_pixels: int | None) -> VideoFamily:
    from packer.models.qwen_video_plan import get_video_family

    return get_video_family(name, min_pixels=min_pixels, max_pixels=max_pixels)
