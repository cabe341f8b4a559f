"""Gemma 3: a SigLIP at 896 px whose 64x64 patches are average-pooled 4x4, so 256 tokens per image, whatever
its size; the image's tokens see each other in both directions.

    640x480 -> 896x896 (squashed, no crop) -> 64x64 patches of 14 px -> pooled 16x16 -> 256 tokens
    rendered "\\n\\n<start_of_image>" + "<image_soft_token>" * 256 + "<end_of_image>\\n\\n"
    (Gemma3Processor.full_image_sequence); token_type_ids = 1 on the 256 soft tokens only

Bidirectional attention: ``Gemma3Model`` builds, from ``token_type_ids``, blocks of consecutive image tokens
that see each other whole (``blockwise_overlay``), ORed onto causal; its sliding-window layers AND a window
onto that. packer's spans are the same blocks (``image_spans``: each image's soft-token run, not the begin/end
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
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.media.images import load_image
from packer.models.base import ImageBlocks, ModelProfile

if TYPE_CHECKING:
    import torch

# Gemma3Processor.replace_image_token: the text around an image's blocks when it has pan-and-scan crops
ORIGINAL_PREFIX = "Here is the original image "
CROPS_INTRO = " and here are some crops to help you see better "


@dataclass(frozen=True, kw_only=True)
class Gemma3Profile(ModelProfile):
    """Gemma 3 (google/gemma-3-{4b,12b,27b}-it): ``pixel_values`` (N, 3, 896, 896), 256 tokens per image."""

    image_token: str | None = "<image_soft_token>"
    vision_start: str | None = "<start_of_image>"
    vision_end: str | None = "<end_of_image>"
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
    hf_model_class: ClassVar[str | None] = "Gemma3ForConditionalGeneration"

    def __post_init__(self) -> None:
        side, pooled = self.image_px // self.patch_size, round(self.tokens_per_image**0.5)
        if pooled**2 != self.tokens_per_image or side % pooled:
            raise ConfigError(
                f"profile {self.name!r}: 'tokens_per_image' ({self.tokens_per_image}) must be a square whose side "
                f"divides the {side} patches per side"
            )

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

    @property
    def splits_images(self) -> bool:
        return self.do_pan_and_scan

    def image_blocks(self, width: int, height: int) -> ImageBlocks | None:
        """With crops: the whole image's block, then one per crop, as ``Gemma3Processor.replace_image_token``
        writes them; grid (1 + k, 16, 16) is crop k (the whole image is k = 0, as without crops)."""
        rows, cols = self.crop_layout(width, height)
        if not rows:
            return None
        block = f"\n\n{self.vision_start}{self.image_token}{self.vision_end}\n\n"  # full_image_sequence, 1 token
        text = ORIGINAL_PREFIX + block + CROPS_INTRO + " ".join([block] * (rows * cols))
        side = self.pooled_side
        return ImageBlocks(rendered=block, text=text, grids=tuple((1 + k, side, side) for k in range(1 + rows * cols)))

    def make_image_processor(self) -> Any:
        # The PIL backend (torchvision is not a dependency). google/gemma-3-*-it preprocessor_config.json:
        # 896x896, bilinear, rescale 1/255, mean = std = 0.5 (the class defaults but for the size), pan-and-scan
        # off; its settings as Gemma3Processor passes them (its defaults, or the profile's options).
        from transformers import Gemma3ImageProcessorPil

        return Gemma3ImageProcessorPil(
            size={"height": self.image_px, "width": self.image_px}, do_pan_and_scan=self.do_pan_and_scan,
            pan_and_scan_min_crop_size=self.pan_and_scan_min_crop_size,
            pan_and_scan_max_num_crops=self.pan_and_scan_max_num_crops,
            pan_and_scan_min_ratio_to_activate=self.pan_and_scan_min_ratio_to_activate,
        )

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """One (3, 896, 896) entry per stored block: grid (1 + k, ...) is block k of its image as the processor
        orders them (the whole image, then the crops); an image is decoded and processed once per call."""
        if not self.do_pan_and_scan:
            return self.pixel_values(images)
        import torch

        blocks: dict[ImageRef, torch.Tensor] = {}
        out = []
        for ref, grid in zip(images, grids, strict=True):
            if ref not in blocks:
                blocks[ref] = self.image_processor()(images=[load_image(ref)], return_tensors="pt")["pixel_values"]
            out.append(blocks[ref][int(grid[0]) - 1])
        return {"pixel_values": torch.stack(out)}

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """tokens_per_image for a block's grid (1 + crop index, 16, 16), -1 for any other."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        blocks = 1 + (self.pan_and_scan_max_num_crops if self.do_pan_and_scan else 0)
        ok = (grids[:, 0] >= 1) & (grids[:, 0] <= blocks) & (grids[:, 1] == self.pooled_side) & (
            grids[:, 2] == self.pooled_side)
        return np.where(ok, self.tokens_per_image, -1)

    def tiny_model(
        self, *, token_ids: dict[str, int], vocab_size: int, seed: int = 0, hidden: int = 32, sliding_window: int = 16
    ) -> Any:
        """A random-weight fp32 ``Gemma3ForConditionalGeneration`` for this profile's images: a 1-layer SigLIP of
        ``image_px`` / ``patch_size``, a 2-layer Gemma 3 text model (one sliding-window layer of
        ``sliding_window``, one global). ``token_ids``: the ids of ``model_tokens()`` (soft, begin, end of image)."""
        import torch
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration

        torch.manual_seed(seed)
        config = Gemma3Config(
            text_config=dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             layer_types=["sliding_attention", "full_attention"], sliding_window=sliding_window,
                             max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                             pad_token_id=None),
            vision_config=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                               num_attention_heads=2, image_size=self.image_px, patch_size=self.patch_size),
            mm_tokens_per_image=self.tokens_per_image,
            image_token_index=token_ids[self.image_token],
            boi_token_index=token_ids[self.vision_start],
            eoi_token_index=token_ids[self.vision_end],
            attn_implementation="sdpa",
        )
        return Gemma3ForConditionalGeneration(config).float().train()

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """The path's pixels (one entry per block) and the processor's ``token_type_ids`` (1 on soft tokens),
        from which ``Gemma3Model`` builds its own bidirectional blocks: each run of consecutive soft tokens."""
        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        if images:
            out["token_type_ids"] = (input_ids == token_ids[self.image_token]).long()
        return out
