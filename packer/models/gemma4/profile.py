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
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.errors import ConfigError
from packer.models.base import MediaRun, ModelProfile
from packer.models.gemma4.resize import SUPPORTED_SOFT_TOKENS, pooled_grid
from packer.models.gemma4.video import plan, video_text

if TYPE_CHECKING:
    from packer.core.types import AudioRef, VideoRef
    from packer.media.audio import AudioInfo
    from packer.media.video import VideoPlan
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

    # ------------------------------------------------------------------ encode

    @property
    def token_side(self) -> int:
        """Pixels per soft token along a side: patch_size * pooling_kernel_size (48)."""
        return self.patch_size * self.pooling_kernel_size

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, rows, cols) of pooled soft tokens: the resized image over 48 px."""
        rows, cols = pooled_grid(height, width, patch_size=self.patch_size, max_soft_tokens=self.max_soft_tokens,
                                 pooling=self.pooling_kernel_size)
        return (1, rows, cols)

    def num_tokens(self, width: int, height: int) -> int:
        """The processor's ``num_soft_tokens_per_image``: rows * cols."""
        _, rows, cols = self.grid_thw(width, height)
        return rows * cols

    def image_run(self, width: int, height: int) -> MediaRun:
        """``Gemma4Processor.replace_image_token``: ``<|image>`` + the soft tokens + ``<image|>``, the entry at the
        first soft token."""
        grid = self.grid_thw(width, height)
        n = grid[1] * grid[2]
        return MediaRun(grid, n, tokens=(self.vision_start, *(self.image_token,) * n, self.vision_end), lead=1)

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """A clip's frames and tokens from its header (``video.plan``)."""
        return plan(self, video)

    def video_run(self, plan: VideoPlan) -> MediaRun:
        """``Gemma4Processor.replace_video_token``: per frame its mm:ss, then ``<|image>`` + its soft tokens +
        ``<image|>``, frames joined by a space (tokenized alone: the template puts "\\n\\n" around it)."""
        text = video_text(plan, video_token=self.video_token, boi=self.vision_start, eoi=self.vision_end)
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), text=text, plan=plan)

    def audio_run(self, audio: AudioRef, info: AudioInfo) -> MediaRun:
        """``Gemma4Processor.replace_audio_token``: ``<|audio>`` + the soft tokens + ``<audio|>``, the entry at the
        first soft token; the plan's ``feature_length`` is the clip's valid frames."""
        plan = self.audio_plan(info)
        n = int(self.audio_num_tokens(np.array([plan.feature_length], dtype=np.int64))[0])
        return MediaRun((), n, tokens=(self.audio_start, *(self.audio_token,) * n, self.audio_end), lead=1,
                        audio=plan)

    # ------------------------------------------------------------------ read / proof

    def reader(self) -> Reader:
        from packer.models.gemma4.reader import Gemma4Reader

        return Gemma4Reader(self)

    def proof(self) -> Proof:
        from packer.models.gemma4.proof import Gemma4Proof

        return Gemma4Proof(self)

    # ------------------------------------------------------------------ report

    def image_units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("patches", rows * cols * 9): the 16 px patches the vision tower encodes per image (before pooling;
        the processor pads each image to max_soft_tokens * 9 patch slots, which the tower masks)."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        return "patches", grids[:, 0] * grids[:, 1] * grids[:, 2] * self.pooling_kernel_size**2

    # ------------------------------------------------------------------ verify

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """rows * cols of stored (1, rows, cols), -1 unless 1 <= rows * cols <= max_soft_tokens (what the resize
        can give: its sides are whole tokens within the budget; the processor raises past it)."""
        return _tokens(grids, self.max_soft_tokens, image=True)

    def video_grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """frames * rows * cols of stored (frames, rows, cols), -1 unless 1 <= rows * cols <= the frame budget."""
        return _tokens(grids, self.video_max_soft_tokens, image=False)

    def audio_feature_lengths(self, num_samples: np.ndarray) -> np.ndarray:
        """The extractor's valid frames of clips of ``num_samples`` samples at 16 kHz, -1 under 161 samples
        (``audio.valid_frames``: a clip over 30 s counts its first 30 s, as the extractor cuts it)."""
        from packer.models.gemma4.audio import valid_frames

        return valid_frames(num_samples)

    def audio_num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """ceil(frames / 4), -1 outside 1..2,999 frames (``audio.soft_tokens``)."""
        from packer.models.gemma4.audio import soft_tokens

        return soft_tokens(feature_lengths)

    def video_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t, and the stored frame size (height, width) is the grid's: rows, cols * 48 px."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        return ((grids[:, 0] != num_frames) | (sizes[:, 0] != grids[:, 1] * self.token_side)
                | (sizes[:, 1] != grids[:, 2] * self.token_side) | (self.video_grid_num_tokens(grids) < 0))

    def verify_spans(
        self, what: str, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, fields: dict[str, np.ndarray],
        token_id: int | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
        """A video as spans of its frames: frame k a (1, rows, cols) span over the k-th run of ``<|video|>`` from
        its video's offset (its time stamp and ``<|image>`` / ``<image|>`` lie between the runs); a frame whose
        run is missing gets offset -1 (a bad span). Images are their entries."""
        if what != "video" or not len(fields["offset"]):
            return lists, fields, True
        rows = len(lists) - 1
        row_of_vid = np.repeat(np.arange(rows), np.diff(lists))  # (V,)
        t = np.maximum(fields["grid_t"], 0)  # (V,)
        edges = np.diff(np.concatenate([[0], (ids == token_id).astype(np.int8), [0]]))
        runs = np.flatnonzero(edges == 1)  # flat starts of every run of video tokens
        first = np.searchsorted(runs, row_starts[row_of_vid] + fields["offset"])  # (V,) each video's first run
        video_of = np.repeat(np.arange(len(t)), t)  # (F,) the video of each frame
        run = first[video_of] + np.arange(len(video_of)) - np.repeat(np.cumsum(t) - t, t)
        found = run < len(runs)
        flat = np.append(runs, -1)[np.where(found, run, len(runs))]  # (F,) -1 where the run is missing
        frames = {"offset": np.where(found, flat - row_starts[row_of_vid[video_of]], -1),
                  "grid_t": np.ones(len(video_of), dtype=np.int64), "grid_h": fields["grid_h"][video_of],
                  "grid_w": fields["grid_w"][video_of],
                  "num_tokens": fields["num_tokens"][video_of] // np.maximum(t[video_of], 1),
                  "second_per_grid_t": fields["second_per_grid_t"][video_of]}
        per_row = np.bincount(row_of_vid, weights=t, minlength=rows).astype(np.int64)
        return np.concatenate([[0], np.cumsum(per_row)]), frames, True


def _tokens(grids: np.ndarray, budget: int, *, image: bool) -> np.ndarray:
    grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    t, r, c = grids[:, 0], grids[:, 1], grids[:, 2]
    ok = (r >= 1) & (c >= 1) & (r * c <= budget) & ((t == 1) if image else (t >= 1))
    return np.where(ok, t * r * c, -1)
