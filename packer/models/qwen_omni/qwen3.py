"""Qwen3-Omni's thinker (``qwen3-omni``): Qwen2.5-Omni's media with Qwen3-Omni's rules (``rope3.py``).

    image 640x480      smart_resize to multiples of 32 -> grid (1, 30, 40) -> 300 <|image_pad|>   (16 px patches)
    audio 3.2 s 44.1k  librosa.load at 16 kHz -> 51200 samples -> 320 mel frames alone (320 beside a longer clip)
                       -> 13 per whole 100 frames + the rest's conv arithmetic = 42 <|audio_pad|>  (no 30 s cap)
    video with sound   <|vision_start|><|audio_start|> frame 0, audio tokens until frame 1's time, frame 1, ...
                       <|audio_end|><|vision_end|>: frame t at t * second_per_grid * 13 positions, audio 1 a token

What differs from Qwen2.5-Omni, and where packer follows what:

- Audio is padded per processor call, i.e. per example: a clip's frames depend on the longest clip of its
  example (``rope3.mel_frames``), so ``audio_plans`` plans every clip of the example first and stores that
  longest length (``AudioPlan.padded_samples``, the shards' ``audios.padded_samples``), which the reader pads
  to. In a tree each root-to-leaf path is one example; a clip its paths pad differently is refused
  (``audio_tree``): no single set of features is every path's.
- Positions are float32 (``rope3.omni3_position_ids``; ``Positions.fractional``).
- Images: ``Qwen2VLImageProcessor`` with 16 px patches, merge 2, mean/std 0.5 (the SigLIP2-initialised tower
  Qwen3-VL also uses) and the profile's min/max pixels (default 3136 / 12845056, Qwen2.5-Omni's checkpoint
  bounds: set yours from your checkpoint's preprocessor_config.json). The processor is packer's reference for
  images: qwen-omni-utils' fetch_image would first resize to multiples of 28.
- Videos: qwen-omni-utils' sampling and resize (its default image_patch_size 14, as Qwen's cookbooks call
  ``process_mm_info``), then the processor's Qwen2VLVideoProcessor with 16 px patches and 128..768 * 32 * 32
  pixels per frame (the ``qwen3-omni`` video family); ``second_per_grid`` is ``temporal_patch_size / fps`` with
  fps the part's ``fps`` option (what a user hands on to the processor), else the processor's 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.tree import path_maxima
from packer.core.types import AudioRef
from packer.errors import RecordError
from packer.media.audio import loaded_num_samples
from packer.models.qwen_omni.profile import OmniAudio, OmniPositions, OmniVideo, QwenOmniProfile
from packer.models.qwen_omni.rope import Block
from packer.models.qwen_omni.rope3 import (
    audio_tokens,
    frames_for_tokens,
    layout,
    mel_frames,
    omni3_position_ids,
)
from packer.models.rules import AudioPlan, Media, MediaRun, audio_info

if TYPE_CHECKING:
    from packer.models.proof import Proof

DEFAULT_FPS = 1.0  # Qwen3OmniMoeProcessor._process_videos: fps = videos_kwargs.get("fps") or 1.0
SIGLIP_MEAN = (0.5, 0.5, 0.5)


def path_padding(nodes: Sequence[int], samples: Sequence[int], node_parents: np.ndarray) -> list[int]:
    """Each clip's padded length: the longest clip (samples) on the root-to-leaf paths through its node, one
    number for all of them (``core.tree.path_maxima``); RecordError "audio_tree" where two paths through a clip's
    node pad it differently."""
    out = []
    for i, lengths in enumerate(path_maxima(node_parents, nodes, samples)):
        if len(lengths) > 1:
            raise RecordError("audio_tree", f"audio clip {i + 1} of the record is padded to {sorted(lengths)} samples "
                              "by the branches that share it (Qwen3-Omni pads an example's clips to its longest), "
                              "so no one set of its features is every branch's; give the branches clips of one "
                              "length, or put each branch's clips in its own record")
        out.append(lengths.pop())
    return out


@dataclass(frozen=True)
class Omni3Audio(OmniAudio):
    """Qwen3-Omni's audio: every clip of an example padded to its paths' longest (``path_padding``), its frames
    ``rope3.mel_frames`` of that padding, its tokens ``rope3.audio_tokens``."""

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        """``rope3.mel_frames``: min(ceil(n / 160), L // 160), L the longest clip of the example (``padded_samples``;
        the clip itself where -1); -1 where no frame, or L too short for the extractor's STFT (<= 200 samples)."""
        n = np.asarray(num_samples, dtype=np.int64)
        padded = np.asarray(padded_samples, dtype=np.int64)
        padded = np.where(padded < 0, n, padded)
        frames = mel_frames(n, padded)
        return np.where((n > 0) & (padded >= n) & (padded > 200) & (frames > 0), frames, -1)

    def num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """``rope3.audio_tokens`` (n_window 50); -1 where none."""
        f = np.asarray(feature_lengths, dtype=np.int64)
        n = audio_tokens(f)
        return np.where((f > 0) & (n > 0), n, -1)

    def frames_for_tokens(self, tokens: int) -> int:
        return int(frames_for_tokens(tokens))

    def padded_plan(self, ref: AudioRef, samples: int, padded: int) -> AudioPlan:
        frames = int(self.feature_lengths(np.array([samples]), np.array([padded]))[0])
        if frames <= 0:
            raise RecordError("bad_audio", f"{ref.path or 'inline audio'}: {samples} samples at 16 kHz, padded to "
                              f"{padded}, make no mel frame Qwen3OmniMoeProcessor can compute (its example needs a "
                              "clip of more than 200 samples)")
        return AudioPlan(self.sample_rate, samples, frames, padded_samples=padded)

    def plan(self, ref: AudioRef) -> AudioPlan:
        """A clip alone (its own length its padding)."""
        n = int(loaded_num_samples(audio_info(ref), self.sample_rate))
        return self.padded_plan(ref, n, n)

    def run(self, plan: AudioPlan) -> MediaRun:
        return MediaRun((), int(self.num_tokens(np.array([plan.feature_length]))[0]), audio=plan)

    def plan_example(self, media: Sequence[Media], node_parents: np.ndarray) -> dict[int, MediaRun]:
        """Every clip planned against the longest clip of its example's paths (``path_padding``)."""
        clips = [i for i, m in enumerate(media) if isinstance(m.ref, AudioRef)]
        samples = [int(loaded_num_samples(audio_info(media[i].ref), self.sample_rate)) for i in clips]
        padded = path_padding([media[i].node for i in clips], samples, node_parents)
        return {i: self.run(self.padded_plan(media[i].ref, n, length))
                for i, n, length in zip(clips, samples, padded, strict=True)}


@dataclass(frozen=True)
class Omni3Positions(OmniPositions):
    """``rope3``: each frame at its time, audio token a at a (13 positions a second), float32."""

    fractional = True

    def av_kinds(self, grid: tuple[int, int, int], second_per_grid: float, audio_tokens: int) -> np.ndarray:
        """``rope3.layout``: each frame at its time, audio token a at a (13 positions a second)."""
        return layout(grid, second_per_grid, audio_tokens, merge=self.merge_size)

    def block_positions(self, length: int, node_offsets: np.ndarray, node_parents: np.ndarray,
                        blocks: list[Block]) -> np.ndarray:
        return omni3_position_ids(length, node_offsets, node_parents, blocks, merge=self.merge_size)


@dataclass(frozen=True, kw_only=True)
class Qwen3OmniProfile(QwenOmniProfile):
    """Qwen3-Omni (thinker, ``Qwen3OmniMoeThinkerForConditionalGeneration``): images, videos with or without
    their sound, and audio clips padded per example."""

    image_token: str | None = "<|image_pad|>"
    video_token: str | None = "<|video_pad|>"
    audio_token: str | None = "<|audio_pad|>"
    vision_start: str | None = "<|vision_start|>"
    vision_end: str | None = "<|vision_end|>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    audio_start: str = "<|audio_start|>"
    audio_end: str = "<|audio_end|>"
    default_tokenizer: str | None = "qwen3-omni"
    patch_size: int = 16

    image_mean: ClassVar[tuple[float, ...]] = SIGLIP_MEAN
    image_std: ClassVar[tuple[float, ...]] = SIGLIP_MEAN

    @cached_property
    def video(self) -> OmniVideo:
        return OmniVideo("qwen3-omni", self.video_min_pixels, self.video_max_pixels, patch_size=self.patch_size,
                         merge_size=self.merge_size, temporal_patch_size=self.temporal_patch_size,
                         default_fps=DEFAULT_FPS)

    @cached_property
    def audio(self) -> Omni3Audio:
        return Omni3Audio()

    @cached_property
    def positions(self) -> Omni3Positions:
        return Omni3Positions(merge_size=self.merge_size)

    def proof(self) -> Proof:
        from packer.models.qwen_omni.proof import Qwen3OmniProof

        return Qwen3OmniProof(self)
