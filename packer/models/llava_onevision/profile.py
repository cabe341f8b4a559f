"""LLaVA-OneVision: SigLIP crops of 384 px, anyres tiling (``anyres_max_9``), unpadding and a newline per row.

An example's ONE image is tiled; every image of an example with several is not (the processor's and the
model's ``batch_num_images`` rule, "only single image patching is supported"). In a message tree the example
the model sees is one root-to-leaf path: an image is tiled when every path through its node holds it alone,
untiled when every such path holds others too, and the record is refused (``image_tree``) when they differ:

    one image, 640x480 -> best pinpoint (h, w) = (768, 768): 1 base crop + 2x2 tiles of 384 px = 5 crops
        tiles' features 54x54 (27 per tile side), unpadded to the image's aspect: 40 x 54 (7 rows of
        padding cut each side), under 9 crops' worth of features (ratio 0.57 <= 1.1), so not downscaled
        -> 729 base + 40 rows x (54 + 1 newline) = 729 + 40*55 = 2929 tokens of <image>
    two images in one example -> each 384x384 padded to square, 1 crop: 729 + 1 newline = 730 tokens

Stored grid (t, h, w) = (crops, feature rows, feature columns): (5, 40, 54) above, (1, 27, 27) for an
untiled image, so ``grid_num_tokens`` re-derives every count from the shards alone. Positions stay 1-D.

Exact against transformers 5.23.0: counts against ``LlavaOnevisionProcessor`` on every COCO-mini image and
odd sizes, tokens against its ``input_ids``, feature lengths against ``LlavaOnevisionModel.
pack_image_features``, and packed == unpacked on ``LlavaOnevisionForConditionalGeneration``
(tests/models/test_llava_onevision.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.models.base import ModelProfile
from packer.models.llava_onevision.anyres import (
    anyres_pinpoints,
    select_best_resolution,
    tiled_alone,
    unpadded_features,
)
from packer.models.rules import ImageRule, Media, MediaRun

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True)
class AnyresImage(ImageRule):
    """``anyres_max_<max_tiles>``: an image tiled over the best pinpoint, its unpadded feature map downscaled past
    1.1x ``max_tiles`` crops' worth; ``run`` is the tiled form (the profile's ``media_runs`` picks it per example).
    """

    crop_px: int
    patch_size: int
    max_tiles: int
    pinpoints: tuple[tuple[int, int], ...]

    @property
    def side(self) -> int:
        """Features per crop side (27)."""
        return self.crop_px // self.patch_size

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(crops, feature rows, feature columns) of an image tiled alone (its example's one image)."""
        best_h, best_w = select_best_resolution(height, width, self.pinpoints)
        rows, cols = best_h // self.crop_px, best_w // self.crop_px
        feat_h, feat_w = unpadded_features(height, width, self.side * rows, self.side * cols)
        ratio = math.sqrt(feat_h * feat_w / (self.max_tiles * self.side**2))
        if ratio > 1.1:  # both the processor and the model's interpolate floor each side
            feat_h, feat_w = int(feat_h // ratio), int(feat_w // ratio)
        return (1 + rows * cols, feat_h, feat_w)

    def untiled(self) -> MediaRun:
        """An image beside others on its path: one crop, side**2 + 1 tokens."""
        return MediaRun((1, self.side, self.side), self.side**2 + 1)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """side**2 base features + h rows of (w + 1 newline) for a tiled image; side**2 + 1 untiled."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        t, h, w = grids[:, 0], grids[:, 1], grids[:, 2]
        base = self.side**2
        untiled = (t == 1) & (h == self.side) & (w == self.side)
        tiled = (t > 1) & (h > 0) & (w > 0)
        return np.where(untiled, base + 1, np.where(tiled, base + h * (w + 1), -1))


@dataclass(frozen=True, kw_only=True)
class LlavaOnevisionProfile(ModelProfile):
    """LLaVA-OneVision (llava-hf/llava-onevision-qwen2-*-ov-hf): SigLIP 384/14, ``anyres_max_9``.

    ``pixel_inputs`` gives {"pixel_values": (sum(crops), 3, px, px) float32, "image_sizes": (N, 2) int64 (h, w),
    "batch_num_images": (G,) int64}: groups of one (tiled) or several (untiled) images, as the model reads them.
    """

    image_token: str | None = "<image>"
    default_tokenizer: str = "llava-onevision"
    crop_px: int = 384
    """The side of every crop the vision tower sees (SigLIP's image_size)."""
    patch_size: int = 14
    """Vision transformer patch side in pixels: 384 // 14 = 27 features per crop side, 729 per crop."""
    max_tiles: int = 9
    """``anyres_max_<n>``: above 1.1x this many crops' worth of features, the unpadded map is downscaled."""
    pinpoints: tuple[tuple[int, int], ...] = field(default_factory=lambda: anyres_pinpoints(384))
    """The (h, w) resolutions a tiled image is resized and padded to (the processor's image_grid_pinpoints)."""

    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_sizes", "batch_num_images"
    )

    def __post_init__(self) -> None:
        if self.crop_px < self.patch_size or any(h % self.crop_px or w % self.crop_px for h, w in self.pinpoints):
            raise ConfigError(
                f"profile {self.name!r}: every pinpoint must be a multiple of 'crop_px' ({self.crop_px}) and "
                f"'crop_px' at least 'patch_size' ({self.patch_size})"
            )

    @property
    def side(self) -> int:
        """Features per crop side (27)."""
        return self.crop_px // self.patch_size

    @cached_property
    def image(self) -> AnyresImage:
        return AnyresImage(self.crop_px, self.patch_size, self.max_tiles, self.pinpoints, bidirectional=self.bidirectional_images)

    def media_runs(self, media: list[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """Tiled if every path through the image's node holds it alone; else one crop: side**2 + 1 tokens.

        The model sees each root-to-leaf path as its own example (``tiled_alone``): the per-example image mode."""
        if any(not isinstance(m.ref, ImageRef) for m in media):
            return super().media_runs(media, node_parents)  # refused: no video or audio here
        alone = tiled_alone(np.array([m.node for m in media], dtype=np.int64), np.asarray(node_parents))
        return [self.image.run(self.image.plan(m.ref)) if a else self.image.untiled()
                for m, a in zip(media, alone, strict=True)]

    # ------------------------------------------------------------------ read

    def reader(self) -> Reader:
        from packer.models.llava_onevision.reader import LlavaOnevisionReader

        return LlavaOnevisionReader(self)

    def proof(self) -> Proof:
        from packer.models.llava_onevision.proof import LlavaOnevisionProof

        return LlavaOnevisionProof(self)
