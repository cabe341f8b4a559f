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
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.models.base import ModelProfile
from packer.models.shared.audio_features import WhisperAudio, whisper_tokens

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader

MIN_TOKENS = 2  # fewer and the model's forward takes the batch for unexpanded input (module docstring)
AUDIO = WhisperAudio(min_tokens=MIN_TOKENS, hint="Qwen2-Audio's model takes a clip of one token for unexpanded "
                     "input, so packer needs at least 961 samples (60 ms)")


def feature_lengths(num_samples: np.ndarray) -> np.ndarray:
    """Mel frames the extractor's attention mask marks (padded to 30 s and cut there: ceil(n / 160), at most
    3000); -1 for an empty clip."""
    return AUDIO.feature_lengths(num_samples, np.full(np.shape(num_samples), -1))


tokens_from_frames = whisper_tokens


@dataclass(frozen=True, kw_only=True)
class Qwen2AudioProfile(ModelProfile):
    """Qwen2-Audio(-Instruct): audio clips and text; ``input_features`` (A, 128, 3000), ``feature_attention_mask``."""

    audio_token: str | None = "<|AUDIO|>"
    audio_start: str = "<|audio_bos|>"
    audio_end: str = "<|audio_eos|>"
    default_tokenizer: str | None = "qwen2-audio"

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "input_features", "feature_attention_mask")

    @cached_property
    def audio(self) -> WhisperAudio:
        return AUDIO

    def reader(self) -> Reader:
        from packer.models.reader import Reader

        return Reader(self)

    def proof(self) -> Proof:
        from packer.models.qwen2_audio.proof import Qwen2AudioProof

        return Qwen2AudioProof(self)
