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
  frequencies t, h, w, t, h, w, ...), which reads the same three rows. So the positions rule is Qwen2-VL's;
  tests/models/test_qwen3_vl.py checks it against the real ``get_rope_index`` on every root-to-leaf path.
- DeepStack adds vision features to the first decoder layers' hidden states at the vision tokens: per token,
  so a packed row needs nothing more (tests/train check packed == unpacked on the real model).
- Tokenizer: the builtin ``qwen3-vl`` (tokenizers.py): Qwen2's BPE with Qwen3's 26 added tokens
  at their real ids and Qwen3-VL-Instruct's chat template (no default system prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.types import EncodedVideo
from packer.models.qwen_vl.profile import QwenVLProfile
from packer.models.rules import Entries, MediaRun, Spans, frame_spans
from packer.models.shared.mrope import MRoPE
from packer.models.shared.qwen_rules import QwenVideo
from packer.models.shared.qwen_video_pixels import HALF_MEAN, HALF_STD
from packer.models.shared.qwen_video_plan import qwen3_video_text

if TYPE_CHECKING:
    from packer.media.video import VideoPlan
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True)
class Qwen3Video(QwenVideo):
    """Qwen3-VL's videos: a run of text, each temporal patch its own timestamped block."""

    token: str = "<|video_pad|>"
    start: str = "<|vision_start|>"
    end: str = "<|vision_end|>"

    def run(self, plan: VideoPlan) -> MediaRun:
        """``<{t:.1f} seconds><|vision_start|>`` + pad * (h*w/4) + ``<|vision_end|>`` per temporal patch: what
        transformers 5.23.0's ``Qwen3VLProcessor.replace_video_token`` substitutes for the ``<|video_pad|>``
        (processing_qwen3_vl.py:75-103), t the mean time of the patch's first and last frame."""
        text = qwen3_video_text(plan, video_token=self.token, vision_start=self.start, vision_end=self.end)
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), text=text, plan=plan)

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """A video as spans of its temporal patches (``rules.frame_spans``): its timestamps and start/end tokens
        lie between their runs."""
        return frame_spans(ids, row_starts, lists, entries, token_id)


@dataclass(frozen=True)
class Qwen3MRoPE(MRoPE):
    """Qwen2-VL's rule, each temporal patch of a video a (1, h, w) run of its own: ``get_rope_index`` splits
    ``video_grid_thw`` by frames (``repeat_interleave``, t = 1) and the timestamps between them are text."""

    def video_spans(self, videos: Sequence[EncodedVideo]) -> tuple[list[tuple[int, int, int]], list[float]]:
        frames = [(1, h, w) for v in videos for _ in range(v.grid_thw[0]) for h, w in [v.grid_thw[1:]]]
        return frames, [1.0] * len(frames)


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

    image_mean: ClassVar[tuple[float, ...]] = HALF_MEAN
    """The processor's normalization mean (images and videos alike)."""
    image_std: ClassVar[tuple[float, ...]] = HALF_STD

    @cached_property
    def video(self) -> Qwen3Video:
        return Qwen3Video(self.video_rule or self.name, self.video_min_pixels, self.video_max_pixels,
                          patch_size=self.patch_size, merge_size=self.merge_size,
                          temporal_patch_size=self.temporal_patch_size, token=self.video_token,
                          start=self.vision_start, end=self.vision_end)

    @cached_property
    def positions(self) -> Qwen3MRoPE:
        return Qwen3MRoPE(merge_size=self.merge_size, tokens_per_second=self.tokens_per_second)

    def reader(self) -> Reader:
        from packer.models.qwen_vl.reader import Qwen3VLReader

        return Qwen3VLReader(self)

    def proof(self) -> Proof:
        from packer.models.qwen_vl.proof import Qwen3VLProof

        return Qwen3VLProof(self)
