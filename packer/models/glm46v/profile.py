"""GLM-4.6V (GLM-4.6V, GLM-4.6V-Flash; transformers' ``glm46v``): Qwen2-VL-style dynamic resolution with GLM's own
``smart_resize``, 2x2 patch merging, 3-D mRoPE, video as one timestamped image run per temporal patch.

    640x480 -> smart_resize(2 frames, factor 28, 12544 <= 2 * area <= 9633792) -> 644x476
            -> grid (t, h, w) = (1, 34, 46) patches of 14 px -> 34 * 46 // 2**2 = 391 tokens
    rendered <|begin_of_image|><|image|><|end_of_image|>, the <|image|> repeated 391 times; mRoPE gives those
    tokens (t, h, w) positions over the merged 1x17x23 grid, text tokens three equal rows.

Exact against transformers 5.23.0 (tests/models/test_glm46v.py): grids against ``Glm46VImageProcessorPil`` on every
COCO-mini image and odd sizes (its ``get_number_of_image_patches`` and its pixels), every example's ids against
``Glm46VProcessor``, positions against ``Glm46VModel.get_rope_index`` on every root-to-leaf path.

Positions: ``Glm46VModel.get_rope_index`` is Qwen2-VL's (transformers 5.23.0 ``modeling_qwen2_vl.py``), line for
line: runs of one ``mm_token_type_ids`` value are text (1-D) or one vision grid ((t, h, w) from the current
position, then ``max(h, w) // 2`` on), with one difference: it first splits ``video_grid_thw`` into one (1, h, w)
grid per temporal patch (``repeat_interleave``), because each patch is a run of its own between timestamps. So
every image and every temporal patch of a video is a (1, h, w) run of ``<|image|>`` tokens (GLM's videos hold the
image token too), and ``packer.models.shared.mrope`` (Qwen2-VL's rule, per root-to-leaf path) gives exactly GLM's
positions when handed those runs' grids in token order.

Videos are built by default; their frames hold ``<|image|>``, so the image rule's ``spans`` tells verify that the video
spans (one per temporal patch) hold the image placeholder too, and verify checks it against images' and videos'
spans together. ``videos=False`` refuses every video with the reason (docs/models/glm46v.md, "Videos").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.tree import ancestor_matrix
from packer.core.types import EncodedAudio, EncodedVideo, VideoRef
from packer.errors import RecordError
from packer.models.base import ModelProfile
from packer.models.glm46v.resize import smart_resize
from packer.models.glm46v.video import VIDEOS_OFF, GlmVideo
from packer.models.rules import ImageRule, Media, MediaRun, flat_mrope
from packer.models.shared.mrope import MRoPE, mrope_position_ids
from packer.models.shared.qwen_resize import check_pixel_bounds

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader

__all__ = ["VIDEOS_OFF", "Glm46VProfile", "GlmImage", "GlmMRoPE"]


@dataclass(frozen=True)
class GlmImage(ImageRule):
    """Glm46VImageProcessorPil: ``smart_resize`` of the image as 2 frames, 2x2 patches per token."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 112 * 112
    max_pixels: int = 28 * 28 * 2 * 6144

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, h, w) patches: ``Glm46VImageProcessorPil``'s ``image_grid_thw`` (``smart_resize`` of 2 frames)."""
        h, w = _image_size(height, width, self.patch_size * self.merge_size, self.temporal_patch_size,
                           self.min_pixels, self.max_pixels)
        return (1, h // self.patch_size, w // self.patch_size)

    def num_tokens(self, width: int, height: int) -> int:
        _, h, w = self.grid_thw(width, height)
        return h * w // self.merge_size**2

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """h * w / 4 of an image's (1, h, w); -1 unless t is 1 and h, w are whole merges."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        m = self.merge_size
        ok = (grids[:, 0] == 1) & (grids[:, 1] >= m) & (grids[:, 2] >= m) & (grids[:, 1] % m == 0) & (grids[:, 2] % m == 0)
        return np.where(ok, grids[:, 1] * grids[:, 2] // m**2, -1)


@dataclass(frozen=True)
class GlmMRoPE(MRoPE):
    """``Glm46VModel.get_rope_index``: Qwen2-VL's rule over every run of ``<|image|>`` tokens, each image and each
    temporal patch of a video a (1, h, w) grid, in token order (verify's spans give videos so already)."""

    images_as_qwen2 = True  # with no video, ``extra`` below is MRoPE's

    def extra(self, ids: np.ndarray, positions: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray,
              images: Sequence[tuple[int, int, int]], *, token_ids: Mapping[str, int | None],
              videos: Sequence[EncodedVideo] = (), audios: Sequence[EncodedAudio] = ()) -> np.ndarray:
        if not images and not videos:  # text alone: three rows equal to the 1-D positions (a read-only view)
            return flat_mrope(positions)
        image_id = token_ids["image_token"]
        runs = _grids_in_token_order(np.asarray(ids), image_id, images, videos) if videos else list(images)
        return mrope_position_ids(ids, node_offsets, node_parents, runs, image_token_id=image_id,
                                  spatial_merge_size=self.merge_size)




@dataclass(frozen=True, kw_only=True)
class Glm46VProfile(ModelProfile):
    """GLM-4.6V: the GLM-V checkpoints' preprocessor_config.json for images (``size`` shortest_edge 12544,
    longest_edge 9633792; patch 14, merge 2, temporal patch 2), ``Glm46VVideoProcessor``'s class defaults for video.

    ``pixel_values`` gives {"pixel_values": (sum(h*w), 3*2*14*14) float32, "image_grid_thw": (N, 3) int64}; a
    batch's videos are in them too, each temporal patch a (1, h, w) image (``Glm46VReader``).
    """

    image_token: str | None = "<|image|>"
    vision_start: str | None = "<|begin_of_image|>"
    vision_end: str | None = "<|end_of_image|>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    video_token: str | None = "<|video|>"
    default_tokenizer: str | None = "glm-4.6v"
    patch_size: int = 14
    """The vision tower's patch side in pixels."""
    merge_size: int = 2
    """Patches merged per side into one LLM token (2x2 -> 1)."""
    temporal_patch_size: int = 2
    """Frames per temporal patch (an image is two copies of itself: ``smart_resize`` sees 2 frames)."""
    min_pixels: int = 112 * 112
    """``size["shortest_edge"]``: the lower bound on 2 x the resized area (the image counts as 2 frames)."""
    max_pixels: int = 28 * 28 * 2 * 6144
    """``size["longest_edge"]``: the upper bound on 2 x the resized area, 9633792 in the GLM-V checkpoints'
    preprocessor_config.json (at most 6144 tokens an image); the class default is 28 * 28 * 15000."""
    video_min_pixels: int = 112 * 112
    """The video processor's ``size["shortest_edge"]``: lower bound on frames x area."""
    video_max_pixels: int = 28 * 28 * 2 * 30000
    """The video processor's ``size["longest_edge"]``: upper bound on frames x area (its class default)."""
    videos: bool = True
    """Build videos (``False``: refuse each with ``VIDEOS_OFF``)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values", "image_grid_thw")
    overridable: ClassVar[tuple[str, ...]] = (
        "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", "videos", *ModelProfile.overridable,
    )

    def __post_init__(self) -> None:
        check_pixel_bounds(self, ("min_pixels", "max_pixels"), ("video_min_pixels", "video_max_pixels"))

    @cached_property
    def image(self) -> GlmImage:
        return GlmImage(self.patch_size, self.merge_size, self.temporal_patch_size, self.min_pixels, self.max_pixels,
                        start=self.vision_start, end=self.vision_end, bidirectional=self.bidirectional_images)

    @cached_property
    def video(self) -> GlmVideo:
        return GlmVideo(self.image_token, self.vision_start, self.vision_end, self.patch_size, self.merge_size,
                        self.temporal_patch_size, self.video_min_pixels, self.video_max_pixels, enabled=self.videos)

    @cached_property
    def positions(self) -> GlmMRoPE:
        return GlmMRoPE(merge_size=self.merge_size)

    def media_runs(self, media: list[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """Each alone (the image and video rules' ``run``); RecordError for an image and a video on one root-to-leaf
        path: ``Glm46VModel.get_placeholder_mask`` takes every ``<|image|>`` token as an image token AND as a video
        token (a video's frames hold ``<|image|>``), so with both kinds in one sample the image features meet more
        placeholders than they fill, and the model raises."""
        kinds = [isinstance(m.ref, VideoRef) for m in media]
        if any(kinds) and not all(kinds):
            anc = ancestor_matrix(np.asarray(node_parents))
            video_nodes = [m.node for m, v in zip(media, kinds, strict=True) if v]
            image_nodes = [m.node for m, v in zip(media, kinds, strict=True) if not v]
            if any(anc[a, b] or anc[b, a] for a in video_nodes for b in image_nodes):
                raise RecordError(
                    "bad_video", f"profile {self.name!r} takes no image beside a video in one example (path): "
                    "Glm46VModel counts a video's <|image|> tokens as image placeholders too and refuses the pair; "
                    "split the record",
                )
        return super().media_runs(media, node_parents)

    # ------------------------------------------------------------------ read / proof

    def reader(self) -> Reader:
        from packer.models.glm46v.reader import Glm46VReader

        return Glm46VReader(self)

    def proof(self) -> Proof:
        from packer.models.glm46v.proof import Glm46VProof

        return Glm46VProof(self)


@lru_cache(maxsize=65536)
def _image_size(height: int, width: int, factor: int, frames: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    return smart_resize(frames, height, width, temporal_factor=frames, factor=factor, min_pixels=min_pixels,
                        max_pixels=max_pixels)


def _grids_in_token_order(
    ids: np.ndarray, image_id: int, grids: Sequence[tuple[int, int, int]], videos: Sequence[EncodedVideo],
) -> list[tuple[int, int, int]]:
    """The (1, h, w) grid of every run of ``<|image|>`` tokens in ``ids``, in token order: a video's temporal patches
    are the ``grid_t`` runs from its offset, the other runs the images, in order. RecordError where the runs do
    not fall so (``mrope_position_ids`` then checks every run's length against its grid)."""
    hits = ids == image_id
    starts = np.flatnonzero(hits & ~np.concatenate([[False], hits[:-1]])).tolist()
    kind: list[tuple[int, int, int] | None] = [None] * len(starts)
    for v in videos:
        t, h, w = (int(x) for x in v.grid_thw)
        k = int(np.searchsorted(starts, v.offset))
        if k + t > len(starts) or starts[k] != v.offset or any(kind[k : k + t]):
            raise RecordError("image_count_mismatch", f"a video's {t} temporal patches are not runs of image "
                                                      f"tokens from its offset {v.offset}")
        kind[k : k + t] = [(1, h, w)] * t
    images = iter(grids)
    out = [g if g is not None else next(images, None) for g in kind]
    if None in out or next(images, None) is not None:
        raise RecordError("image_count_mismatch", f"{len(starts)} runs of image tokens do not match {len(grids)} "
                                                  f"images and {sum(int(v.grid_thw[0]) for v in videos)} video patches")
    return out  # type: ignore[return-value]
