"""Whisper's log-mel features in numpy: what transformers' ``WhisperFeatureExtractor`` gives a family's audio
encoder (Qwen2-Audio, Qwen2.5-Omni, Qwen3-Omni and the other Whisper-fronted families), without torch or
torchaudio, so a reader can build them where the model is not.

    mel = whisper_log_mel(audio_16k, feature_size=128)               # Qwen2-Audio / Qwen2.5-Omni: padded to 30 s
    mel.features.shape, int(mel.attention_mask.sum())                -> (128, 3000), ceil(len(audio_16k) / 160)

The extractor (transformers 5.23) pads or truncates the clip to ``chunk_length`` seconds (``padding="max_length"``,
``truncation=True``: what both Qwen processors ask for; a longer clip is cut to its first 30 s), frames it with a
periodic Hann window of ``n_fft`` every ``hop_length`` samples after reflect-padding ``n_fft // 2`` on each side
(``torch.stft(center=True)``), drops the last frame, takes the power through Slaney mel filters up to 8 kHz, and
maps ``log10(max(mel, 1e-10))`` to ``(max(x, x.max() - 8) + 4) / 4``. Its attention mask marks the frames
whose hop starts on a sample of the clip. It runs that in torch (float32) when torch is installed, else in numpy
(float64). This module computes in float64 like the numpy path and matches it to a float32 rounding; the torch
path differs from both by its float32 STFT (tests/media/test_audio.py bounds each; docs/benchmarks.md has the
numbers). Frames that cover padding only are all zero, so their value is known without a transform.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from packer.core.types import AudioRef
from packer.errors import RecordError
from packer.models.rules import AudioPlan, AudioRule, audio_info


class LogMel(NamedTuple):
    """Features and the frame mask a Whisper-fronted encoder takes."""

    features: np.ndarray
    """(feature_size, frames) float32: the extractor's ``input_features[0]``."""
    attention_mask: np.ndarray | None
    """(frames,) int32, 1 for a frame of the clip, 0 for padding (Qwen's ``feature_attention_mask``)."""


def whisper_log_mel(audio: np.ndarray, *, feature_size: int = 128, sampling_rate: int = 16000,
                    hop_length: int = 160, n_fft: int = 400, chunk_length: int = 30,
                    padding: str | bool | None = "max_length", truncation: bool = True,
                    max_length: int | None = None, pad_to_multiple_of: int | None = None,
                    return_attention_mask: bool = True) -> LogMel:
    """The log-mel features ``WhisperFeatureExtractor(feature_size, sampling_rate, hop_length, chunk_length,
    n_fft)(audio, sampling_rate=sampling_rate, padding=padding, truncation=truncation, max_length=max_length,
    pad_to_multiple_of=pad_to_multiple_of, return_attention_mask=...)`` gives one mono clip.

    ``padding``: "max_length" pads with zeros to ``max_length`` samples (default ``chunk_length`` seconds);
    "longest" (or True) leaves one clip as it is; None (or False, "do_not_pad") never pads. ``truncation`` cuts a
    clip longer than ``max_length`` first (the extractor's default, whatever the padding); ``pad_to_multiple_of``
    rounds both lengths up (Voxtral: 30 s). Frames: padded length // hop_length; a clip needs more than
    ``n_fft // 2`` samples once padded (the reflect padding of torch.stft, which refuses fewer).
    """
    return whisper_log_mel_batch([audio], feature_size=feature_size, sampling_rate=sampling_rate,
                                 hop_length=hop_length, n_fft=n_fft, chunk_length=chunk_length, padding=padding,
                                 truncation=truncation, max_length=max_length,
                                 pad_to_multiple_of=pad_to_multiple_of,
                                 return_attention_mask=return_attention_mask)[0]


def whisper_log_mel_batch(audios: list[np.ndarray], *, feature_size: int = 128, sampling_rate: int = 16000,
                          hop_length: int = 160, n_fft: int = 400, chunk_length: int = 30,
                          padding: str | bool | None = "max_length", truncation: bool = True,
                          max_length: int | None = None, pad_to_multiple_of: int | None = None,
                          return_attention_mask: bool = True) -> list[LogMel]:
    """The extractor called once on several clips (one processor call: one example's clips), row by row.

    With "longest" padding every clip is padded to the call's longest. A shorter clip of n samples then has
    ceil(n / hop_length) frames in its mask, its last one reaching into the zeros, where alone (or as the
    longest) it has n // hop_length: Qwen3-Omni's processor pads this way, so a clip's frame and token count
    depend on the other clips of its call, and encode and reader must group clips as that call does.
    """
    clips = []
    for audio in audios:
        x = np.asarray(audio)
        if x.ndim != 1:
            raise ValueError(f"whisper_log_mel takes mono clips, got shape {x.shape}")
        clips.append(x.astype(np.float32, copy=False))  # the extractor casts float64 to float32 first
    limit, target = _targets([len(x) for x in clips], chunk_length * sampling_rate, padding, truncation,
                             max_length, pad_to_multiple_of)
    if truncation:
        clips = [x[:limit] for x in clips]
    out = []
    for x in clips:
        n = len(x)
        length = n if target is None else max(n, target)
        if n == 0 or length <= n_fft // 2:
            raise ValueError(f"a clip of {n} samples padded to {length} is too short for frames of {n_fft} "
                             f"(reflect padding needs more than {n_fft // 2})")
        frames = length // hop_length
        features = _log_mel(x, length, frames, feature_size, sampling_rate, hop_length, n_fft)
        mask = None
        if return_attention_mask:
            # the sample mask read every hop_length samples, one frame fewer when the length is not a multiple
            mask = np.zeros(frames, np.int32)
            mask[: min(frames, -(-n // hop_length))] = 1
        out.append(LogMel(features, mask))
    return out


def whisper_windows(features: np.ndarray, frames_per_window: int = 3000) -> np.ndarray:
    """(feature_size, k * frames_per_window) features as (k, feature_size, frames_per_window) windows: Voxtral's
    processor, which pads each clip to a multiple of 30 s (``pad_to_multiple_of=480000``, no truncation) and
    hands its encoder one 30 s window per row."""
    size, frames = features.shape
    if frames % frames_per_window:
        raise ValueError(f"{frames} frames are not whole windows of {frames_per_window}")
    return features.reshape(size, -1, frames_per_window).transpose(1, 0, 2)


def feature_frames(num_samples: int | list[int], *, hop_length: int = 160, chunk_length: int = 30,
                   sampling_rate: int = 16000, padding: str | bool | None = "max_length", truncation: bool = True,
                   max_length: int | None = None, pad_to_multiple_of: int | None = None) -> int | list[int]:
    """Frames in the mask (``attention_mask.sum()``) of a clip of num_samples, or of each clip of one extractor call
    (a list): what the families turn into audio tokens, from the sample counts alone (whisper_log_mel_batch's
    rule without the samples)."""
    counts = [num_samples] if isinstance(num_samples, int) else list(num_samples)
    limit, target = _targets(counts, chunk_length * sampling_rate, padding, truncation, max_length,
                             pad_to_multiple_of)
    out = []
    for n in counts:
        n = min(n, limit) if truncation else n
        length = n if target is None else max(n, target)
        out.append(min(length // hop_length, -(-n // hop_length)))
    return out[0] if isinstance(num_samples, int) else out


def _targets(counts: list[int], n_samples: int, padding, truncation: bool, max_length: int | None,
             pad_to_multiple_of: int | None) -> tuple[int, int | None]:
    """(the truncation limit, the padded length or None): SequenceFeatureExtractor.pad's arithmetic."""
    limit = max_length if max_length else n_samples
    if pad_to_multiple_of and limit % pad_to_multiple_of:
        limit = (limit // pad_to_multiple_of + 1) * pad_to_multiple_of
    if padding is True or padding == "longest":
        target: int | None = max(min(n, limit) if truncation else n for n in counts)
    elif padding == "max_length":
        target = limit
    elif padding in (None, False, "do_not_pad"):
        target = None
    else:
        raise ValueError(f"padding must be 'max_length', 'longest' or None, got {padding!r}")
    if target is not None and pad_to_multiple_of and target % pad_to_multiple_of:
        target = (target // pad_to_multiple_of + 1) * pad_to_multiple_of
    return limit, target


def _log_mel(x: np.ndarray, length: int, frames: int, feature_size: int, sampling_rate: int, hop_length: int,
             n_fft: int) -> np.ndarray:
    half = n_fft // 2
    # Frame t covers clip samples [t*hop - half, t*hop + half); past the clip (and its reflection) it sees zeros.
    if length > len(x):
        busy = min(frames, (len(x) + half + hop_length - 1) // hop_length + 1)
        tail = min(length, busy * hop_length + n_fft)  # the last busy frame ends before busy * hop + half
        signal = np.zeros(tail, np.float64)
        signal[: len(x)] = x
        if tail == length:
            padded = np.pad(signal, half, mode="reflect")
        else:  # the reflection at the far end only ever mirrors zeros here
            padded = np.concatenate([signal[half:0:-1], signal, np.zeros(half)])
    else:
        busy = frames
        padded = np.pad(x.astype(np.float64), half, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[: busy * hop_length: hop_length]
    spectrum = np.fft.rfft(windows * _hann(n_fft), axis=-1)
    power = spectrum.real**2 + spectrum.imag**2
    mel = _mel_filters(n_fft, feature_size, sampling_rate).T @ power.T  # (feature_size, busy)
    log_spec = np.log10(np.maximum(mel, 1e-10))
    # A padding frame's power is 0, its log -10: never above the maximum, so it is one constant. Filling it
    # rather than taking logs of 30000 frames keeps a short clip padded to 300 s (Qwen2.5-Omni) as cheap as at 30 s.
    top = max(float(log_spec.max()), -10.0) if busy < frames else float(log_spec.max())
    out = np.empty((feature_size, frames), np.float32)
    out[:, :busy] = (np.maximum(log_spec, top - 8.0) + 4.0) / 4.0
    out[:, busy:] = np.float32((max(-10.0, top - 8.0) + 4.0) / 4.0)
    return out


@lru_cache(maxsize=8)
def _hann(n_fft: int) -> np.ndarray:
    return np.hanning(n_fft + 1)[:-1]  # periodic, as torch.hann_window and window_function("hann")


@lru_cache(maxsize=8)
def _mel_filters(n_fft: int, feature_size: int, sampling_rate: int) -> np.ndarray:
    """transformers.audio_utils.mel_filter_bank(1 + n_fft // 2, feature_size, 0, 8000, sampling_rate,
    norm="slaney", mel_scale="slaney"), as WhisperFeatureExtractor builds it: (bins, feature_size) float64."""
    mel_freqs = np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), feature_size + 2)
    filter_freqs = _mel_to_hz(mel_freqs)
    fft_freqs = np.linspace(0, sampling_rate // 2, 1 + n_fft // 2)
    diff = np.diff(filter_freqs)
    slopes = np.expand_dims(filter_freqs, 0) - np.expand_dims(fft_freqs, 1)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    filters *= np.expand_dims(2.0 / (filter_freqs[2: feature_size + 2] - filter_freqs[:feature_size]), 0)
    return filters


def _hz_to_mel(freq: float) -> float:
    mels = 3.0 * freq / 200.0
    if freq >= 1000.0:
        mels = 15.0 + np.log(freq / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    freq[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_region] - 15.0))
    return freq


@dataclass(frozen=True)
class WhisperAudio(AudioRule):
    """A Whisper-fronted encoder's audio rule (Qwen2-Audio, Qwen2.5-Omni): the extractor's frames of a clip padded
    to and cut at ``chunk_length`` s (``feature_frames``: ceil(n / 160), at most 3000 for 30 s), then the encoder's conv2 and avg pool,
    ``(((L - 1) // 2 + 1) - 2) // 2 + 1`` tokens; a clip of fewer than ``min_tokens`` is refused with ``hint``.

        WhisperAudio(min_tokens=2)   5 s at 16 kHz -> 80000 samples -> 500 frames -> 125 tokens
    """

    min_tokens: int = 1
    """Fewer tokens and the clip is refused (bad_audio)."""
    hint: str = ""
    """What the refusal adds: why the model needs ``min_tokens``, and the shortest clip that has them."""
    chunk_length: int = 30
    """Seconds the extractor pads every clip to and cuts it at: the released preprocessor_config.json's
    ``chunk_length`` (Qwen2-Audio 30, Qwen2.5-Omni 300)."""

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        """-1 for an empty clip, or one stored as padded (the extractor pads every clip to ``chunk_length`` s
        alone)."""
        n = np.asarray(num_samples, dtype=np.int64).reshape(-1)
        frames = np.array(feature_frames([max(int(x), 0) for x in n.tolist()], padding="max_length",
                                         chunk_length=self.chunk_length, sampling_rate=self.sample_rate),
                          dtype=np.int64)
        return np.where((n > 0) & (np.asarray(padded_samples).reshape(-1) < 0), frames, -1)

    def num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """The processor's count; -1 where it gives fewer than ``min_tokens``."""
        f = np.asarray(feature_lengths, dtype=np.int64)
        n = whisper_tokens(f)
        return np.where((f > 0) & (n >= self.min_tokens), n, -1)

    def plan(self, ref: AudioRef) -> AudioPlan:
        plan = super().plan(ref)
        n = int(whisper_tokens(np.array([plan.feature_length]))[0])
        if n < self.min_tokens:
            raise RecordError("bad_audio", f"{audio_info(ref).source}: {plan.num_samples} samples at "
                              f"{self.sample_rate // 1000} kHz ({plan.feature_length} mel frames) make {n} audio "
                              f"token(s); {self.hint}")
        return plan


def whisper_tokens(frames: np.ndarray) -> np.ndarray:
    """``Qwen2AudioProcessor``'s ``(((L - 1) // 2 + 1) - 2) // 2 + 1`` (the encoder's conv2, then its avg pool)."""
    f = np.asarray(frames, dtype=np.int64)
    return ((f - 1) // 2 + 1 - 2) // 2 + 1
