"""Real audio clips for the audio tests: signals (tones, noise, speech-like bursts) written in each codec a dataset
brings (wav, flac, mp3, m4a/aac, ogg/opus, ogg/vorbis) and mp4 videos with a sound track, with PyAV and soundfile.

    path = write_clip(tmp_path / "a.mp3", signal("speech", 22050, 1.3, channels=2), 22050)
    path = write_video(tmp_path / "v.mp4", seconds=1.5, sample_rate=44100, channels=2)

Everything is seeded: the same arguments give the same bytes.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

# extension -> (writer, codec): soundfile writes the lossless ones as datasets usually carry them, PyAV (FFmpeg's
# encoders, as `ffmpeg -i x.wav y.mp3` would) the lossy ones.
CODECS: dict[str, tuple[str, str]] = {
    "wav": ("soundfile", "PCM_16"),
    "wav-float": ("soundfile", "FLOAT"),
    "flac": ("soundfile", "PCM_24"),
    "mp3": ("av", "libmp3lame"),
    "m4a": ("av", "aac"),
    "opus": ("av", "libopus"),
    "ogg": ("soundfile", "VORBIS"),
}
RATES = (8000, 11025, 16000, 22050, 44100, 48000, 96000)
# Opus encodes only at these rates; FFmpeg's libopus wrapper refuses others, so a clip at 44.1 kHz becomes 48 kHz
# (the header keeps the input rate; decoders output 48 kHz or that rate, which the tests find out).
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def signal(kind: str, sample_rate: int, seconds: float | None = None, *, channels: int = 1,
           num_samples: int | None = None, seed: int = 0) -> np.ndarray:
    """A (num_samples, channels) float32 signal in [-0.9, 0.9]: "tone", "noise", "speech" (voiced bursts with
    pitch glides and pauses) or "silence"; stereo channels differ (other phase, other seed)."""
    n = num_samples if num_samples is not None else int(round(seconds * sample_rate))
    t = np.arange(n) / sample_rate
    rng = np.random.default_rng(seed)
    cols = []
    for c in range(channels):
        if kind == "tone":
            x = 0.5 * np.sin(2 * np.pi * (440.0 + 110 * c) * t + c) + 0.2 * np.sin(2 * np.pi * 1250.0 * t)
        elif kind == "noise":
            x = 0.3 * rng.standard_normal(n)
        elif kind == "speech":
            f0 = 120 + 40 * np.sin(2 * np.pi * 1.7 * t + c)  # a gliding pitch
            phase = 2 * np.pi * np.cumsum(f0) / sample_rate
            voiced = sum(np.sin(k * phase) / k for k in range(1, 12))  # harmonics
            envelope = np.clip(np.sin(2 * np.pi * 3.1 * t + 0.5 * c), 0, None) ** 2  # syllables and pauses
            x = 0.5 * voiced * envelope + 0.02 * rng.standard_normal(n)
        elif kind == "silence":
            x = np.zeros(n)
        else:
            raise ValueError(kind)
        cols.append(x)
    out = np.stack(cols, axis=1) if n else np.zeros((0, channels))
    return np.clip(out, -0.9, 0.9).astype(np.float32)


def write_clip(path: str | Path, samples: np.ndarray, sample_rate: int, *, codec: str | None = None) -> Path:
    """Write (num_samples, channels) float samples at sample_rate; the codec is CODECS[codec or the extension]."""
    path = Path(path)
    key = codec or path.suffix.lstrip(".")
    writer, name = CODECS[key]
    if writer == "soundfile":
        import soundfile as sf

        fmt = {"wav": "WAV", "wav-float": "WAV", "flac": "FLAC", "ogg": "OGG"}[key]
        sf.write(str(path), samples, sample_rate, subtype=name, format=fmt)
        return path
    _write_av(path, samples, sample_rate, name, container_format={"m4a": "ipod", "opus": "ogg"}.get(key))
    return path


def write_four_clips(root: Path) -> Path:
    """The audio tests' clips in four codecs and rates under ``root``: speech.wav (22.05 kHz stereo, 1.3 s),
    tone.mp3 (44.1 kHz, 0.7 s), noise.flac (16 kHz, 2.05 s), short.m4a (48 kHz stereo, 0.45 s)."""
    write_clip(root / "speech.wav", signal("speech", 22050, 1.3, channels=2), 22050)
    write_clip(root / "tone.mp3", signal("tone", 44100, 0.7), 44100)
    write_clip(root / "noise.flac", signal("noise", 16000, 2.05), 16000)
    write_clip(root / "short.m4a", signal("speech", 48000, 0.45, channels=2), 48000)
    return root


def _write_av(path: Path, samples: np.ndarray, sample_rate: int, codec: str, container_format: str | None) -> None:
    import av

    channels = samples.shape[1]
    layout = {1: "mono", 2: "stereo"}[channels]
    rate = sample_rate
    if codec == "libopus" and rate not in OPUS_RATES:
        rate = 48000
    with av.open(str(path), "w", format=container_format) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        _encode_audio(out, stream, samples, sample_rate, rate, layout)


def _encode_audio(out, stream, samples: np.ndarray, sample_rate: int, rate: int, layout: str) -> None:
    import av

    fmt = stream.codec_context.codec.audio_formats[0].name
    resampler = av.AudioResampler(format=fmt, layout=layout, rate=rate,
                                  frame_size=stream.codec_context.frame_size or None)
    step = 4096
    pts = 0
    for i in range(0, max(len(samples), 1), step):
        block = np.ascontiguousarray(samples[i:i + step].T)
        if block.shape[1] == 0:
            break
        frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=layout)
        frame.sample_rate = sample_rate
        frame.pts = pts
        frame.time_base = Fraction(1, sample_rate)
        pts += block.shape[1]
        for f in resampler.resample(frame):
            for packet in stream.encode(f):
                out.mux(packet)
    for f in resampler.resample(None):
        for packet in stream.encode(f):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)


def write_video(path: str | Path, *, seconds: float = 1.0, sample_rate: int = 44100, channels: int = 2,
                fps: int = 10, size: tuple[int, int] = (64, 48), audio_codec: str = "aac",
                kind: str = "speech", audio: bool = True) -> Path:
    """An mp4 (h264) of ``seconds`` with a sound track of the same length (or none with ``audio=False``)."""
    import av

    path = Path(path)
    layout = {1: "mono", 2: "stereo"}[channels]
    frames = int(round(seconds * fps))
    with av.open(str(path), "w") as out:
        vs = out.add_stream("libx264", rate=fps)
        vs.width, vs.height = size
        vs.pix_fmt = "yuv420p"
        astream = out.add_stream(audio_codec, rate=sample_rate, layout=layout) if audio else None
        rng = np.random.default_rng(1)
        for i in range(frames):
            img = np.full((size[1], size[0], 3), (i * 23) % 256, np.uint8)
            img[:, : (i % size[0])] = rng.integers(0, 255, 3, dtype=np.uint8)
            vf = av.VideoFrame.from_ndarray(img, format="rgb24")
            vf.pts = i
            vf.time_base = Fraction(1, fps)
            for packet in vs.encode(vf):
                out.mux(packet)
        for packet in vs.encode(None):
            out.mux(packet)
        if astream is not None:
            _encode_audio(out, astream, signal(kind, sample_rate, seconds, channels=channels),
                          sample_rate, sample_rate, layout)
    return path
