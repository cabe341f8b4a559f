"""Gemma 4 (google/gemma-4-E2B-it, -E4B-it): an image of any aspect ratio as up to 280 soft tokens, a video as
32 frames of up to 70 each, every image and frame wrapped in ``<|image>`` ... ``<image|>``.

    640x480 -> aspect-preserving resize into 280 * 9 patches of 16 px, sides multiples of 48: 912x672
            -> 57 x 42 patches, pooled 3x3 -> 19 x 14 = 266 soft tokens
    rendered "\\n\\n<|image|>\\n\\n" by the chat template; Gemma4Processor.replace_image_token writes the
    <|image|> as "<|image>" + "<|image|>" * 266 + "<image|>"

The count depends on the size (``resize.target_size``: a square image 256, a 4:3 one 266, a 1:100 strip 280);
the stored grid is (1, rows, cols) of pooled tokens, rows * cols = ``num_tokens``. The template's one
``<|image|>`` becomes the run ``<|image>`` + soft tokens + ``<image|>`` by name (``image_run``), the stored entry
starting at the first soft token (``lead`` 1). A video (``video.py``): frames sampled from the header, each
frame's soft tokens after its mm:ss time stamp, in a block ``<|image>`` ... ``<image|>`` of its own.

Attention: Gemma4Model makes consecutive vision tokens a bidirectional block only when the text config's
``use_bidirectional_attention`` is "vision", and then only on its sliding-window layers (its full-attention
layers stay causal: ``create_masks_for_vision_model``). E2B and E4B have it unset (google's ``gemma`` package,
``gemma/gm/nn/gemma4/_gemma4.py``): images attend causally like text, and the sliding-window layers count
their window along each path of a packed row as for Gemma 3 (packer/train/layout.py), which is exact. 31B and
26B-A4B set it to "vision": packer's bidirectional spans apply on every layer, so it cannot express that mask,
and this profile refuses the setting (``use_bidirectional_attention``) rather than train another model
(docs/models/gemma4.md, "Attention").

Audio (E2B, E4B; ``audio.py``): a clip loaded at 16 kHz as transformers' ``load_audio`` loads it (soundfile and
soxr, ``librosa.load``'s samples: ``packer.media.audio``), cut to its first 30 s, makes ceil(frames / 4) soft
tokens of 10 ms frames; the template's one ``<|audio|>`` becomes ``<|audio>`` + soft tokens + ``<audio|>``
(``audio_run``, the entry at the first soft token). The audio tower encodes each clip alone (one batch row
each), so clips never see each other (docs/models/gemma4.md, "Audio").

Exact against transformers 5.23.0 (tests/models/test_gemma4.py, test_gemma4_audio.py; packed == unpacked:
test_conformance.py, test_gemma4_audio.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from packer.errors import ConfigError
from packer.models.base import ModelProfile
from packer.models.gemma4.audio import Gemma4Audio
from packer.models.gemma4.resize import SUPPORTED_SOFT_TOKENS, Gemma4Image
from packer.models.gemma4.video import Gemma4Video

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True, kw_only=True)
class Gemma4Profile(ModelProfile):
    """Gemma 4 with the checkpoints' processor_config.json: images 280 soft tokens at most, videos 32 frames of 70.

    ``pixel_values`` gives {"pixel_values": (N, 2520, 768) float32, "image_position_ids": (N, 2520, 2) int64}:
    every image's 16 px patches (rows of y, x, channel), padded to max_soft_tokens * 9 patches at position -1.
    """

    image_token: str | None = "<|image|>"
    vision_start: str | None = "<|image>"
    vision_end: str | None = "<image|>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    video_token: str | None = "<|video|>"
    audio_token: str | None = "<|audio|>"
    audio_start: str = "<|audio>"
    """The token before a clip's soft tokens (the tokenizer's ``boa_token``)."""
    audio_end: str = "<audio|>"
    """The token after them (``eoa_token``)."""
    default_tokenizer: str | None = "gemma4"
    patch_size: int = 16
    """The vision tower's patch side (``vision_config.patch_size``, the processors' ``patch_size``)."""
    pooling_kernel_size: int = 3
    """Patches pooled into one soft token along each side (``vision_config.pooling_kernel_size``)."""
    max_soft_tokens: int = 280
    """An image's token budget, one of 70, 140, 280, 560, 1120 (the image processor's ``max_soft_tokens``)."""
    video_max_soft_tokens: int = 70
    """A video frame's budget (the video processor's ``max_soft_tokens``)."""
    video_num_frames: int = 32
    """Frames sampled from a clip (the video processor's ``num_frames``); a video part's "nframes" overrides it."""
    use_bidirectional_attention: str | None = None
    """The text config's ``use_bidirectional_attention``: None (E2B, E4B) is the only value packer is exact for;
    "vision" (31B, 26B-A4B) and "all" are refused (see the module docstring)."""

    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_position_ids", "pixel_values_videos",
        "video_position_ids", "num_frames_per_video", "input_features", "input_features_mask",
    )
    overridable: ClassVar[tuple[str, ...]] = (
        "max_soft_tokens", "video_max_soft_tokens", "video_num_frames", "use_bidirectional_attention",
        "image_token", "default_tokenizer",
    )

    def __post_init__(self) -> None:
        for name in ("max_soft_tokens", "video_max_soft_tokens"):
            if getattr(self, name) not in SUPPORTED_SOFT_TOKENS:
                raise ConfigError(f"profile {self.name!r}: {name!r} must be one of {SUPPORTED_SOFT_TOKENS} (Gemma 4's "
                                  f"processors refuse others), got {getattr(self, name)!r}")
        if self.video_num_frames < 1:
            raise ConfigError(f"profile {self.name!r}: 'video_num_frames' must be >= 1, got {self.video_num_frames}")
        if self.bidirectional_images:
            raise ConfigError(f"profile {self.name!r}: no Gemma 4 model lets image tokens see each other on every "
                              "layer, which is what 'bidirectional_images' means to packer")
        if self.use_bidirectional_attention is not None:
            raise ConfigError(
                f"profile {self.name!r}: 'use_bidirectional_attention' {self.use_bidirectional_attention!r} cannot be "
                "packed exactly: Gemma 4 ('vision': 31B, 26B-A4B) makes an image's tokens see each other on its "
                "sliding-window layers only, and packer applies a profile's bidirectional spans on every layer "
                "(docs/models/gemma4.md, 'Attention'); E2B and E4B (unset) are exact"
            )

    @cached_property
    def image(self) -> Gemma4Image:
        return Gemma4Image(self.image_token, start=self.vision_start, end=self.vision_end, patch_size=self.patch_size,
                           pooling=self.pooling_kernel_size, max_soft_tokens=self.max_soft_tokens)

    @cached_property
    def video(self) -> Gemma4Video:
        return Gemma4Video(self.video_token, self.vision_start, self.vision_end, patch_size=self.patch_size,
                           pooling=self.pooling_kernel_size, max_soft_tokens=self.video_max_soft_tokens,
                           num_frames=self.video_num_frames)

    @cached_property
    def audio(self) -> Gemma4Audio:
        return Gemma4Audio(token=self.audio_token, boa=self.audio_start, eoa=self.audio_end)

    # ------------------------------------------------------------------ read / proof

    def reader(self) -> Reader:
        from packer.models.gemma4.reader import Gemma4Reader

        return Gemma4Reader(self)

    def proof(self) -> Proof:
        from packer.models.gemma4.proof import Gemma4Proof

        return Gemma4Proof(self)
