"""Gemma 3: a SigLIP at 896 px whose 64x64 patches are average-pooled 4x4, so 256 tokens per image, whatever
its size; the image's tokens see each other in both directions.

    640x480 -> 896x896 (squashed, no crop) -> 64x64 patches of 14 px -> pooled 16x16 -> 256 tokens
    rendered "\\n\\n<start_of_image>" + "<image_soft_token>" * 256 + "<end_of_image>\\n\\n"
    (Gemma3Processor.full_image_sequence); token_type_ids = 1 on the 256 soft tokens only

Bidirectional attention: ``Gemma3Model`` builds, from ``token_type_ids``, blocks of consecutive image tokens
that see each other whole (``blockwise_overlay``), ORed onto causal; its sliding-window layers AND a window
onto that. packer's spans are the same blocks (``bidirectional_spans``: each image's soft-token run, not the begin/end
tokens), and its sliding window counts positions along each root-to-leaf path (packer/train/layout.py).

The builtin ``gemma3`` tokenizer is a stand-in (Gemma's SentencePiece model is on no registry): the Qwen2
ranks plus Gemma 3's special tokens, with Gemma 3's chat template writing an image part as the processor's
expansion with one soft token, which ``num_tokens`` repeats.

Pan-and-scan (``profile_options: {do_pan_and_scan: true}``; off in the checkpoints' config): an elongated image
also becomes 2..4 crops, each its own 256-token block after the whole image's, with the processor's text
between them (``image_blocks``); each block is a stored image entry, grid (1 + crop index, 16, 16).

    1000x400, pan-and-scan -> crops (1, 3) -> "Here is the original image " + block + " and here are some
    crops to help you see better " + block + " " + block + " " + block      (4 entries, 4 x 256 tokens)

Exact against transformers 5.23.0 (tests/models/test_gemma3.py, tests/train/test_gemma3_equivalence.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.errors import ConfigError
from packer.models.base import ModelProfile
from packer.models.rules import ImageBlocks, ImageRule, MediaRun

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader

# Gemma3Processor.replace_image_token: the text around an image's blocks when it has pan-and-scan crops
ORIGINAL_PREFIX = "Here is the original image "
CROPS_INTRO = " and here are some crops to help you see better "


@dataclass(frozen=True)
class Gemma3Image(ImageRule):
    """Every image resized to one square, ``tokens_per_image`` pooled tokens; with pan-and-scan an elongated image
    is also cut into crops, written as blocks with text between (``blocks``: the processor's rewrite)."""

    token: str = "<image_soft_token>"
    tokens_per_image: int = 256
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2

    @property
    def pooled_side(self) -> int:
        return round(self.tokens_per_image**0.5)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, 16, 16): the pooled token grid, the same for every image."""
        return (1, self.pooled_side, self.pooled_side)

    def num_tokens(self, width: int, height: int) -> int:
        return self.tokens_per_image

    def crop_layout(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of an image's pan-and-scan crops, (0, 0) for none: ``Gemma3ImageProcessorPil.pan_and_scan``
        on the header size (the crops are cut from the image as decoded, before any resize).

            1000x400 -> (1, 2): two 500x400 crops      400x400 -> (0, 0): not elongated enough
        """
        if not self.do_pan_and_scan:
            return (0, 0)
        long, short = max(width, height), min(width, height)
        if long / short < self.pan_and_scan_min_ratio_to_activate:
            return (0, 0)
        n = min(int(math.floor(long / short + 0.5)), int(math.floor(long / self.pan_and_scan_min_crop_size)))
        n = min(self.pan_and_scan_max_num_crops, max(2, n))
        rows, cols = (1, n) if width >= height else (n, 1)
        if min(math.ceil(width / cols), math.ceil(height / rows)) < self.pan_and_scan_min_crop_size:
            return (0, 0)
        return (rows, cols)

    def blocks(self, size: tuple[int, int]) -> ImageBlocks | None:
        """With crops: the whole image's block, then one per crop, as ``Gemma3Processor.replace_image_token``
        writes them; grid (1 + k, 16, 16) is crop k (the whole image is k = 0, as without crops)."""
        rows, cols = self.crop_layout(*size)
        if not rows:
            return None
        block = f"\n\n{self.start}{self.token}{self.end}\n\n"  # full_image_sequence, 1 token
        text = ORIGINAL_PREFIX + block + CROPS_INTRO + " ".join([block] * (rows * cols))
        side = self.pooled_side
        runs = tuple(MediaRun((1 + k, side, side), self.tokens_per_image) for k in range(1 + rows * cols))
        return ImageBlocks(rendered=block, text=text, runs=runs)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """tokens_per_image for a block's grid (1 + crop index, 16, 16), -1 for any other."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        blocks = 1 + (self.pan_and_scan_max_num_crops if self.do_pan_and_scan else 0)
        ok = (grids[:, 0] >= 1) & (grids[:, 0] <= blocks) & (grids[:, 1] == self.pooled_side) & (
            grids[:, 2] == self.pooled_side)
        return np.where(ok, self.tokens_per_image, -1)


@dataclass(frozen=True, kw_only=True)
class Gemma3Profile(ModelProfile):
    """Gemma 3 (google/gemma-3-{4b,12b,27b}-it): ``pixel_values`` (N, 3, 896, 896), 256 tokens per image."""

    image_token: str | None = "<image_soft_token>"
    vision_start: str | None = "<start_of_image>"
    vision_end: str | None = "<end_of_image>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    bidirectional_images: bool = True
    default_tokenizer: str = "gemma3"
    image_px: int = 896
    """The square every image is resized to (no crop, no aspect kept): the checkpoints' preprocessor size."""
    patch_size: int = 14
    """SigLIP patch side: 896 // 14 = 64 patches per side."""
    tokens_per_image: int = 256
    """``mm_tokens_per_image``: the 64x64 patches are average-pooled to 16x16."""
    do_pan_and_scan: bool = False
    """Also cut an elongated image into crops, each a block of ``tokens_per_image`` after the whole image
    (the processor's ``do_pan_and_scan``; off in the checkpoints' preprocessor config)."""
    pan_and_scan_min_crop_size: int = 256
    """Smallest crop side in pixels (Gemma3Processor's default)."""
    pan_and_scan_max_num_crops: int = 4
    """Most crops of one image (Gemma3Processor's default)."""
    pan_and_scan_min_ratio_to_activate: float = 1.2
    """Crop only an image whose long side is at least this many times its short one (Gemma3Processor's)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values")
    overridable: ClassVar[tuple[str, ...]] = (
        "do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
        "pan_and_scan_min_ratio_to_activate", *ModelProfile.overridable,
    )

    def __post_init__(self) -> None:
        side, pooled = self.image_px // self.patch_size, round(self.tokens_per_image**0.5)
        if pooled**2 != self.tokens_per_image or side % pooled:
            raise ConfigError(
                f"profile {self.name!r}: 'tokens_per_image' ({self.tokens_per_image}) must be a square whose side "
                f"divides the {side} patches per side"
            )

    @cached_property
    def image(self) -> Gemma3Image:
        return Gemma3Image(self.image_token, start=self.vision_start, end=self.vision_end, bidirectional=self.bidirectional_images,
                           tokens_per_image=self.tokens_per_image, do_pan_and_scan=self.do_pan_and_scan,
                           pan_and_scan_min_crop_size=self.pan_and_scan_min_crop_size,
                           pan_and_scan_max_num_crops=self.pan_and_scan_max_num_crops,
                           pan_and_scan_min_ratio_to_activate=self.pan_and_scan_min_ratio_to_activate)

    def reader(self) -> Reader:
        from packer.models.gemma3.reader import Gemma3Reader

        return Gemma3Reader(self)

    def proof(self) -> Proof:
        from packer.models.gemma3.proof import Gemma3Proof

        return Gemma3Proof(self)
