"""Gemma 4's audio, as transformers 5.23's ``Gemma4AudioFeatureExtractor`` and ``Gemma4Processor`` make it: 128
log-mel bins every 10 ms over 20 ms windows (16 kHz), the frames whose window holds only real samples marked
valid, and one soft token per 4 frames (the audio tower's two stride-2 convolutions keep every 4th frame's mask).

    1 s at 16 kHz  -> 16,000 samples -> 99 valid frames (101 computed, the last 2 reaching past the clip)
                   -> ceil(99 / 4) = 25 soft tokens: "<|audio>" + "<|audio|>" * 25 + "<audio|>"
    over 30 s      -> cut to its first 480,000 samples (the extractor's max_length) -> 2,999 frames -> 750 tokens
    under 161 samples (about 10 ms) -> no valid frame: the processor writes no soft token; packer refuses the clip

``log_mel`` is the extractor's own numpy code for one clip (its defaults, which google/gemma-4-E2B-it and -E4B-it
use: no preemphasis, dither or per-bin normalization), so it is bit-equal to the extractor's output; a batch of
clips is each clip's frames padded with zero frames that are masked, which is what the extractor gives a batch
(it zeroes every frame it masks).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from packer.models.rules import AudioPlan, AudioRule, MediaRun

SAMPLE_RATE = 16000
FRAME_LENGTH = 320
"""Samples per analysis window (20 ms); the extractor unfolds FRAME_LENGTH + 1 and drops the last."""
HOP = 160
"""Samples between frames (10 ms)."""
PAD_LEFT = FRAME_LENGTH // 2
"""Zeros before the clip, so the first window is centered at its first sample ("semicausal")."""
FFT_LENGTH = 512
MEL_BINS = 128
MEL_FLOOR = 1e-3
MAX_SAMPLES = 480_000
"""The extractor's ``max_length`` with ``truncation=True``: a longer clip is cut to its first 30 s."""
PAD_TO_MULTIPLE = 128
"""The extractor's ``pad_to_multiple_of``: a clip's samples are zero-padded to a multiple of it first."""
FRAMES_PER_TOKEN = 4
"""Two stride-2 convolutions (``Gemma4AudioSubSampleConvProjection``): a soft token per 4 frames."""


class AudioFeatures(NamedTuple):
    features: np.ndarray
    """(T, 128) float32, zero on masked frames."""
    mask: np.ndarray
    """(T,) bool: the frames whose window lies on real samples."""


def valid_frames(num_samples: np.ndarray) -> np.ndarray:
    """Valid feature frames of clips of ``num_samples`` samples at 16 kHz ((A,) -> (A,) int64), -1 where none:
    frame i is valid when its window's last sample (i * 160 + 320, 160 zeros before the clip) is a real one."""
    n = np.minimum(np.asarray(num_samples, dtype=np.int64), MAX_SAMPLES)
    last = n + PAD_LEFT - FRAME_LENGTH - 1
    return np.where(last >= 0, last // HOP + 1, -1)


def soft_tokens(frames: np.ndarray) -> np.ndarray:
    """Soft tokens of clips of ``frames`` valid frames ((A,) -> (A,) int64), -1 where none: ``mask[::2][::2].sum()``
    (``Gemma4Processor.replace_audio_token``), i.e. ceil(frames / 4); at most 750 (2,999 frames)."""
    f = np.asarray(frames, dtype=np.int64)
    ok = (f >= 1) & (f <= int(valid_frames(np.array([MAX_SAMPLES]))[0]))
    return np.where(ok, -(-f // FRAMES_PER_TOKEN), -1)


def computed_frames(num_samples: int) -> int:
    """Frames the extractor computes for one clip alone (valid or not): its samples padded to a multiple of 128."""
    n = min(int(num_samples), MAX_SAMPLES)
    padded = -(-n // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE
    return max(0, (padded + PAD_LEFT - (FRAME_LENGTH + 1)) // HOP + 1)


@dataclass(frozen=True)
class Gemma4Audio(AudioRule):
    """Gemma 4's audio: the extractor's valid frames (``valid_frames``), ceil(frames / 4) soft tokens
    (``soft_tokens``), written ``<|audio>`` + the soft tokens + ``<audio|>``."""

    token: str = "<|audio|>"
    boa: str = "<|audio>"
    eoa: str = "<audio|>"

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        """The extractor's valid frames of clips of ``num_samples`` samples at 16 kHz, -1 under 161 samples (a clip
        over 30 s counts its first 30 s, as the extractor cuts it) or where stored as padded (no clip is)."""
        return np.where(np.asarray(padded_samples) < 0, valid_frames(num_samples), -1)

    def num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """ceil(frames / 4), -1 outside 1..2,999 frames."""
        return soft_tokens(feature_lengths)

    def run(self, plan: AudioPlan) -> MediaRun:
        """``Gemma4Processor.replace_audio_token``: ``<|audio>`` + the soft tokens + ``<audio|>``, the entry at the
        first soft token; the plan's ``feature_length`` is the clip's valid frames."""
        n = int(self.num_tokens(np.array([plan.feature_length], dtype=np.int64))[0])
        return MediaRun((), n, tokens=(self.boa, *(self.token,) * n, self.eoa), lead=1, audio=plan)


@lru_cache(maxsize=1)
def _mel_filters() -> np.ndarray:
    """(257, 128) float64: ``mel_filter_bank(257, 128, 0, 8000, 16000, norm=None, mel_scale="htk")``."""
    mel = 2595.0 * np.log10(1.0 + np.array([0.0, 8000.0]) / 700.0)
    filter_freqs = 700.0 * (np.power(10, np.linspace(mel[0], mel[1], MEL_BINS + 2) / 2595.0) - 1.0)
    fft_freqs = np.linspace(0, SAMPLE_RATE // 2, FFT_LENGTH // 2 + 1)
    diff = np.diff(filter_freqs)
    slopes = np.expand_dims(filter_freqs, 0) - np.expand_dims(fft_freqs, 1)
    down, up = -slopes[:, :-2] / diff[:-1], slopes[:, 2:] / diff[1:]
    return np.maximum(np.zeros(1), np.minimum(down, up))


@lru_cache(maxsize=1)
def _window() -> np.ndarray:
    """The periodic Hann window of 320 samples, float32 (``window_function(320)``)."""
    return np.hanning(FRAME_LENGTH + 1)[:-1].astype(np.float32)


def log_mel(samples: np.ndarray) -> AudioFeatures:
    """One clip's features and mask, as ``Gemma4AudioFeatureExtractor()(samples)`` gives them (16 kHz mono)."""
    y = np.asarray(samples, dtype=np.float32)[:MAX_SAMPLES]
    n = len(y)
    padded = -(-n // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE
    wave = np.zeros(PAD_LEFT + padded, dtype=np.float32)
    wave[PAD_LEFT : PAD_LEFT + n] = y
    frames = computed_frames(n)
    if frames == 0:
        return AudioFeatures(np.zeros((0, MEL_BINS), dtype=np.float32), np.zeros(0, dtype=bool))
    windows = np.lib.stride_tricks.as_strided(wave, shape=(frames, FRAME_LENGTH + 1),
                                              strides=(wave.strides[0] * HOP, wave.strides[0]))[:, :-1]
    magnitude = np.abs(np.fft.rfft(windows * _window(), n=FFT_LENGTH, axis=-1))
    features = np.log(magnitude @ _mel_filters() + np.array(MEL_FLOOR, dtype=np.float64)).astype(np.float32)
    mask = np.arange(frames) < max(int(valid_frames(np.array([n]))[0]), 0)
    return AudioFeatures(features * mask[:, None], mask)


def batch_features(clips: list[AudioFeatures]) -> tuple[np.ndarray, np.ndarray]:
    """(A, T, 128) float32 features and (A, T) bool masks of clips, each padded to the longest with masked zero
    frames (the extractor's batch of those clips)."""
    t = max((len(c.mask) for c in clips), default=0)
    features = np.zeros((len(clips), t, MEL_BINS), dtype=np.float32)
    mask = np.zeros((len(clips), t), dtype=bool)
    for i, c in enumerate(clips):
        features[i, : len(c.mask)] = c.features
        mask[i, : len(c.mask)] = c.mask
    return features, mask
