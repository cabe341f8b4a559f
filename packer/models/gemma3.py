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
expansion with one soft token, which ``num_tokens`` repeats. Pan-and-scan crops are not supported (the
processor's default, ``do_pan_and_scan`` off): a cropped image interleaves text between its crops' blocks.
Exact against transformers 5.23.0 (tests/models/test_gemma3.py, tests/train/test_gemma3_equivalence.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from packer.errors import ConfigError
from packer.models.base import ModelProfile


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

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values")
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

    def make_image_processor(self) -> Any:
        # The PIL backend (torchvision is not a dependency). google/gemma-3-*-it preprocessor_config.json:
        # 896x896, bilinear, rescale 1/255, mean = std = 0.5 (the class defaults but for the size), no pan-and-scan.
        from transformers import Gemma3ImageProcessorPil

        return Gemma3ImageProcessorPil(size={"height": self.image_px, "width": self.image_px}, do_pan_and_scan=False)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """tokens_per_image for the one grid every image has, -1 for any other."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        ok = (grids[:, 0] == 1) & (grids[:, 1] == self.pooled_side) & (grids[:, 2] == self.pooled_side)
        return np.where(ok, self.tokens_per_image, -1)

    def tiny_model(
        self, *, token_ids: dict[str, int], vocab_size: int, seed: int = 0, hidden: int = 32, sliding_window: int = 16
    ) -> Any:
        """A random-weight fp32 ``Gemma3ForConditionalGeneration`` for this profile's images: a 1-layer SigLIP of
        ``image_px`` / ``patch_size``, a 2-layer Gemma 3 text model (one sliding-window layer of
        ``sliding_window``, one global). ``token_ids``: "image_token", "vision_start", "vision_end"."""
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
            image_token_index=token_ids["image_token"],
            boi_token_index=token_ids["vision_start"],
            eoi_token_index=token_ids["vision_end"],
            attn_implementation="sdpa",
        )
        return Gemma3ForConditionalGeneration(config).float().train()
