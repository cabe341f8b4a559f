"""Qwen3-VL: Qwen2-VL's dynamic resolution with 16 px patches, interleaved mRoPE and DeepStack.

    640x480 -> smart_resize (multiples of 32, 65536 <= area <= 16777216) -> 640x480
            -> grid (t, h, w) = (1, 30, 40) patches of 16 px -> 30*40 // 2**2 = 300 tokens
    rendered <|vision_start|><|image_pad|><|vision_end|>, the pad repeated 300 times (Qwen2-VL's ids).

What changes from Qwen2-VL (transformers 5.23.0), and what does not:

- Image processor: Qwen3-VL ships none of its own; transformers maps ``qwen3_vl`` to ``Qwen2VLImageProcessor``
  (``Qwen2VLImageProcessorPil`` without torchvision) configured by the checkpoint's preprocessor_config.json:
  patch 16, merge 2 (so smart_resize's factor is 32), mean = std = 0.5, and size shortest_edge 65536 (256x256)
  / longest_edge 16777216 (4096x4096), the same in every released Qwen3-VL checkpoint. Those are the defaults
  here; ``min_pixels``/``max_pixels`` override them as for Qwen2-VL.
- Positions: ``Qwen3VLModel.get_rope_index`` gives images exactly Qwen2-VL's ids (a maximal run of image
  tokens, (t, h, w) over the merged grid from the current position, then max(h, w) // 2 on); the
  *interleaving* is in the rotary embedding (``Qwen3VLTextRotaryEmbedding.recomposition_frequencies`` assigns
  frequencies t, h, w, t, h, w, ...), which reads the same three rows. So ``extra_positions`` is Qwen2-VL's;
  tests/models/test_qwen3_vl.py checks it against the real ``get_rope_index`` on every root-to-leaf path.
- DeepStack adds vision features to the first decoder layers' hidden states at the vision tokens: per token,
  so a packed row needs nothing more (tests/train check packed == unpacked on the real model).
- Tokenizer: the builtin ``qwen3-vl`` (packer/encode/tokenizers.py): Qwen2's BPE with Qwen3's 26 added tokens
  at their real ids and Qwen3-VL-Instruct's chat template (no default system prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import EncodedVideo
from packer.models.qwen_vl.profile import QwenVLProfile
from packer.models.qwen_vl.video_pixels import HALF_MEAN, HALF_STD
from packer.models.shared.mrope import mrope_position_ids

if TYPE_CHECKING:
    import torch

    from packer.media.video import VideoPlan


@dataclass(frozen=True, kw_only=True)
class Qwen3VLProfile(QwenVLProfile):
    """Qwen3-VL (2B-235B, Instruct and Thinking): an image of any size, resized to multiples of 32 px.

    ``pixel_values`` gives {"pixel_values": (sum(t*h*w), 3*2*16*16) float32, "image_grid_thw": (N, 3) int64}.
    """

    patch_size: int = 16
    min_pixels: int = 65536
    """Smart-resize lower bound (the checkpoints' size["shortest_edge"]: 256 x 256, 64 tokens)."""
    max_pixels: int = 16777216
    """Smart-resize upper bound (the checkpoints' size["longest_edge"]: 4096 x 4096, 16384 tokens)."""
    default_tokenizer: str = "qwen3-vl"

    hf_model_class: ClassVar[str | None] = "Qwen3VLForConditionalGeneration"
    """The transformers class a checkpoint of this family loads as."""
    image_mean: ClassVar[tuple[float, ...]] = HALF_MEAN
    """The processor's normalization mean (images and videos alike)."""
    image_std: ClassVar[tuple[float, ...]] = HALF_STD

    timestamped_video: ClassVar[bool] = True
    """Each temporal patch of a video is its own run of video tokens behind a timestamp (verify splits them)."""

    def video_text(self, plan: VideoPlan) -> str:
        """``<{t:.1f} seconds><|vision_start|>`` + pad * (h*w/4) + ``<|vision_end|>`` per temporal patch: what
        transformers 5.23.0's ``Qwen3VLProcessor.replace_video_token`` substitutes for the ``<|video_pad|>``
        (processing_qwen3_vl.py:75-103), t the mean time of the patch's first and last frame."""
        from packer.models.qwen_vl.video_plan import qwen3_video_text

        return qwen3_video_text(
            plan, video_token=self.video_token, vision_start=self.vision_start, vision_end=self.vision_end
        )

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
        """Qwen2-VL's rule, each temporal patch of a video a (1, h, w) run of its own: ``get_rope_index`` splits
        ``video_grid_thw`` by frames (``repeat_interleave``, t = 1) and the timestamps between them are text."""
        if not videos:
            return super().extra_positions(ids, positions, node_offsets, node_parents, grids, token_ids=token_ids)
        frames = [(1, h, w) for v in videos for _ in range(v.grid_thw[0]) for h, w in [v.grid_thw[1:]]]
        return mrope_position_ids(
            ids, node_offsets, node_parents, grids, image_token_id=token_ids["image_token"],
            spatial_merge_size=self.merge_size, video_token_id=token_ids["video_token"], video_grids=frames,
            video_intervals=[1.0] * len(frames),
        )

    def make_image_processor(self) -> Any:
        # The PIL backend, as transformers picks it for qwen3_vl without torchvision (image_processing_auto.py).
        from transformers import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            merge_size=self.merge_size,
            image_mean=list(self.image_mean),
            image_std=list(self.image_std),
        )

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A random-weight fp32 ``Qwen3VLForConditionalGeneration`` small enough for CPU tests.

        Text: hidden 32, 2 layers, 4 heads of 8 with 2 KV heads, interleaved mRoPE over the 4 rotary
        frequencies (sections 2/1/1, as the released 24/20/20 of 64); vision: 2 blocks of width 32, patch 16,
        DeepStack from both blocks into the first two decoder layers. ``token_ids``: the ids of
        ``model_tokens()`` (e.g. from a compacted vocabulary); ``kw`` overrides text-config fields.
        """
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        text = dict(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=32768, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                             "mrope_interleaved": True},
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        ) | kw
        vision = dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=self.patch_size,
            spatial_merge_size=self.merge_size, temporal_patch_size=self.temporal_patch_size, out_hidden_size=32,
            num_position_embeddings=64, deepstack_visual_indexes=[0, 1],
        )
        config = Qwen3VLConfig(text_config=text, vision_config=vision, attn_implementation="sdpa",
                               **self._config_ids(token_ids))
        return Qwen3VLForConditionalGeneration(config).float().train()
