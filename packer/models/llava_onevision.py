"""LLaVA-OneVision: SigLIP crops of 384 px, anyres tiling (``anyres_max_9``), unpadding and a newline per row.

An example's ONE image is tiled; every image of an example with several is not (the processor's and the
model's ``batch_num_images`` rule, "only single image patching is supported"):

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
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.media.images import load_image
from packer.models.base import ModelProfile

if TYPE_CHECKING:
    import torch


def anyres_pinpoints(crop_px: int, max_tiles_per_side: int = 6) -> tuple[tuple[int, int], ...]:
    """OneVision's ``image_grid_pinpoints`` (h, w): every 1..6 x 1..6 grid of crops, rows outer.

        anyres_pinpoints(384)[:2] == ((384, 384), (384, 768))
    """
    sides = range(1, max_tiles_per_side + 1)
    return tuple((crop_px * i, crop_px * j) for i in sides for j in sides)


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
    hf_model_class: ClassVar[str | None] = "LlavaOnevisionForConditionalGeneration"

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

    # ------------------------------------------------------------------ encode

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(crops, feature rows, feature columns) of an image tiled alone (its example's one image)."""
        best_h, best_w = select_best_resolution(height, width, self.pinpoints)
        rows, cols = best_h // self.crop_px, best_w // self.crop_px
        feat_h, feat_w = unpadded_features(height, width, self.side * rows, self.side * cols)
        ratio = math.sqrt(feat_h * feat_w / (self.max_tiles * self.side**2))
        if ratio > 1.1:  # both the processor and the model's interpolate floor each side
            feat_h, feat_w = int(feat_h // ratio), int(feat_w // ratio)
        return (1 + rows * cols, feat_h, feat_w)

    def num_tokens(self, width: int, height: int) -> int:
        return int(self.grid_num_tokens(np.array([self.grid_thw(width, height)]))[0])

    def example_images(self, sizes: list[tuple[int, int]]) -> list[tuple[tuple[int, int, int], int]]:
        """Tiled if the example has one image; else each image is one crop: side**2 + 1 newline tokens."""
        if len(sizes) == 1:
            return super().example_images(sizes)
        return [((1, self.side, self.side), self.side**2 + 1)] * len(sizes)

    # ------------------------------------------------------------------ read

    def make_image_processor(self) -> Any:
        # The PIL backend: torchvision is not a dependency. llava-hf's preprocessor_config.json for OneVision
        # is the class defaults (384 px, bicubic, CLIP mean/std, the 36 anyres pinpoints).
        from transformers import LlavaOnevisionImageProcessorPil

        return LlavaOnevisionImageProcessorPil(
            size={"height": self.crop_px, "width": self.crop_px},
            image_grid_pinpoints=[list(p) for p in self.pinpoints],
            do_pad=False,  # crops are concatenated (4-D), not padded to the batch's most crops
        )

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Each image as its example's only one (tiled): any grid with t > 1 says so."""
        return self.pixel_inputs(images, [(2, 0, 0)] * len(images))

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """Tiled images (t > 1) go to the processor alone, each run of untiled ones (t == 1) together, so its
        ``batch_num_images`` and the model's pick the same crops. An untiled image always has company: its
        example's other images, kept whole in one row (the encoder refuses a cut that would part them)."""
        import torch

        groups: list[list[int]] = []  # image indices, one processor "sample" each
        for i, (t, _, _) in enumerate(grids):
            if t == 1 and groups and grids[groups[-1][-1]][0] == 1:
                groups[-1].append(i)
            else:
                groups.append([i])
        if any(len(g) == 1 and grids[g[0]][0] == 1 for g in groups):
            raise ConfigError(
                f"profile {self.name!r}: an untiled image without its example's other images; the model would "
                "tile it (batch_num_images 1). Collate whole examples"
            )
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=[[decoded[i] for i in g] for g in groups], return_tensors=None)
        return {
            "pixel_values": torch.from_numpy(np.concatenate(out["pixel_values"])),  # (sum(crops), 3, px, px)
            "image_sizes": torch.tensor(np.array(out["image_sizes"]), dtype=torch.int64),  # (N, 2) (h, w)
            "batch_num_images": torch.tensor([len(g) for g in groups], dtype=torch.int64),  # (G,)
        }

    # ------------------------------------------------------------------ verify

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """side**2 base features + h rows of (w + 1 newline) for a tiled image; side**2 + 1 untiled."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        t, h, w = grids[:, 0], grids[:, 1], grids[:, 2]
        base = self.side**2
        untiled = (t == 1) & (h == self.side) & (w == self.side)
        tiled = (t > 1) & (h > 0) & (w > 0)
        return np.where(untiled, base + 1, np.where(tiled, base + h * (w + 1), -1))

    # ------------------------------------------------------------------ the reference model

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, seed: int = 0, hidden: int = 32) -> Any:
        """A random-weight fp32 ``LlavaOnevisionForConditionalGeneration`` shaped like this profile's crops:
        a 1-layer SigLIP of ``crop_px`` / ``patch_size``, a 2-layer Qwen2 of width ``hidden``.
        ``token_ids["image_token"]`` is the placeholder's id in ``vocab_size``."""
        import torch
        from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

        torch.manual_seed(seed)
        config = LlavaOnevisionConfig(
            text_config=dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=hidden,
                             intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=1, num_attention_heads=2, image_size=self.crop_px,
                               patch_size=self.patch_size),
            image_token_index=token_ids["image_token"],
            video_token_index=token_ids.get("video_token", vocab_size - 1),
            image_grid_pinpoints=[list(p) for p in self.pinpoints],
            vision_aspect_ratio=f"anyres_max_{self.max_tiles}",
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            attn_implementation="sdpa",
        )
        return LlavaOnevisionForConditionalGeneration(config).float().train()


def select_best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The pinpoint (h, w) that keeps most of the image's pixels, then wastes least: transformers'
    ``image_processing_utils.select_best_resolution``, same arithmetic, first of equals wins.

        select_best_resolution(480, 640, anyres_pinpoints(384)) == (768, 768)
    """
    best, most, least = (0, 0), 0, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = ph * pw - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (ph, pw), effective, wasted
    return best


def unpadded_features(height: int, width: int, feat_h: int, feat_w: int) -> tuple[int, int]:
    """The (rows, columns) of a (feat_h, feat_w) tile feature map left once the padding the resize to the
    pinpoint added is cut away: the processor's ``_get_unpadded_features`` and the model's ``unpad_image``.

        unpadded_features(480, 640, 54, 54) == (40, 54)   # 54 * 480/640 = 40.5 -> 40, 7 rows cut each side
    """
    if width / height > feat_w / feat_h:
        padding = (feat_h - int(round(height * (feat_w / width), 7))) // 2
        return feat_h - 2 * padding, feat_w
    padding = (feat_w - int(round(width * (feat_h / height), 7))) // 2
    return feat_h, feat_w - 2 * padding
