"""Qwen2-Audio: each clip becomes one run of ``<|AUDIO|>`` between ``<|audio_bos|>`` and ``<|audio_eos|>``
(the chat template writes those); positions stay 1-D.

    clip 3.2 s 44.1 kHz   resampled to 16 kHz -> 51200 samples
                          -> WhisperFeatureExtractor, padded to 30 s: ceil(51200 / 160) = 320 mel frames
                          -> ((320 - 1) // 2 + 1 - 2) // 2 + 1 = 80 <|AUDIO|>          (30 s and over: 750)

The counts are ``Qwen2AudioProcessor._process_audio``'s (transformers 5.23): the extractor runs with
``padding="max_length"`` and its default ``truncation`` (a clip past 30 s is cut to its first 480,000 samples),
``feature_attention_mask.sum()`` frames, then the encoder's conv (stride 2) and pool (stride 2) rule. The
samples are what librosa.load(sr=16000) yields, as Qwen2-Audio's model card loads clips
(``media.audio.loaded_num_samples`` from the header).

The reader is the default one (``models.reader.Reader``): each clip's window decoded at 16 kHz as librosa.load
gives it, Whisper log-mel features in numpy (128 bins, the released preprocessor_config's feature_size), the
mask of its frames: ``input_features`` (A, 128, 3000), ``feature_attention_mask`` (A, 3000), ``audio_offsets``.

Refused (``bad_audio``): a clip under 961 samples (60 ms) at 16 kHz. It makes at most one ``<|AUDIO|>``, and
``Qwen2AudioModel.forward`` takes a batch with no two adjacent audio tokens for unexpanded (legacy) input and
re-expands it, so such a clip cannot train as the processor laid it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.errors import RecordError
from packer.models.base import MediaRun, ModelProfile

if TYPE_CHECKING:
    from packer.core.types import AudioRef
    from packer.media.audio import AudioInfo
    from packer.models.proof import Proof

MIN_TOKENS = 2  # fewer and the model's forward takes the batch for unexpanded input (module docstring)


def feature_lengths(num_samples: np.ndarray) -> np.ndarray:
    """Mel frames the extractor's attention mask marks (``feature_frames``, padded to 30 s and cut there:
    ceil(n / 160), at most 3000); -1 for an empty clip."""
    from packer.models.shared.audio_features import feature_frames

    n = np.asarray(num_samples, dtype=np.int64).reshape(-1)
    frames = np.array(feature_frames([max(int(x), 0) for x in n.tolist()], padding="max_length"), dtype=np.int64)
    return np.where(n > 0, frames, -1)


def tokens_from_frames(frames: np.ndarray) -> np.ndarray:
    """``Qwen2AudioProcessor``'s ``(((L - 1) // 2 + 1) - 2) // 2 + 1`` (the encoder's conv2, then its avg pool)."""
    f = np.asarray(frames, dtype=np.int64)
    return ((f - 1) // 2 + 1 - 2) // 2 + 1


@dataclass(frozen=True, kw_only=True)
class Qwen2AudioProfile(ModelProfile):
    """Qwen2-Audio(-Instruct): audio clips and text; ``input_features`` (A, 128, 3000), ``feature_attention_mask``."""

    audio_token: str | None = "<|AUDIO|>"
    audio_start: str = "<|audio_bos|>"
    audio_end: str = "<|audio_eos|>"
    default_tokenizer: str | None = "qwen2-audio"

    audio_sample_rate: ClassVar[int] = 16000
    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "input_features", "feature_attention_mask")

    def audio_feature_lengths(self, num_samples: np.ndarray) -> np.ndarray:
        return feature_lengths(num_samples)

    def audio_num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """The processor's count; -1 where it gives fewer than two tokens (refused: module docstring)."""
        f = np.asarray(feature_lengths, dtype=np.int64)
        n = tokens_from_frames(f)
        return np.where((f > 0) & (n >= MIN_TOKENS), n, -1)

    def audio_run(self, audio: AudioRef, info: AudioInfo) -> MediaRun:
        plan = self.audio_plan(info)
        n = int(self.audio_num_tokens(np.array([plan.feature_length], dtype=np.int64))[0])
        if n < MIN_TOKENS:
            raise RecordError(
                "bad_audio", f"{info.source}: {plan.num_samples} samples at 16 kHz ({plan.feature_length} mel frames) "
                f"make {int(tokens_from_frames(np.array([plan.feature_length]))[0])} audio token(s); Qwen2-Audio's "
                "model takes a clip of one token for unexpanded input, so packer needs at least 961 samples (60 ms)")
        return MediaRun((), n, audio=plan)

    def proof(self) -> Proof:
        from packer.models.qwen2_audio.proof import Qwen2AudioProof

        return Qwen2AudioProof(self)
