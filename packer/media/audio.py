"""Audio, the third medium: read a clip's headers, decode it as the families' own loader does.

The build needs every clip's token count before any sample is decoded. A family's tokens follow from the
number of samples its loader yields at the model's rate (16 kHz for the Whisper-based families), so
``probe_audio`` reads that count from the headers and ``loaded_num_samples`` turns it into the loaded count;
the reader later calls ``decode_audio``, which yields exactly those samples.

    clip.mp3: 1.3 s, 22,050 Hz stereo -> probe_audio: AudioInfo(sample_rate=22050, channels=2, num_samples=28665, ...)
    loaded_num_samples(info, 16000) -> 20800 == len(librosa.load("clip.mp3", sr=16000)[0])
    decode_audio("clip.mp3", target_sr=16000) -> (20800,) float32, bit-equal to librosa.load

The loader packer matches is the one the families' users run: ``librosa.load(path, sr=16000)`` (librosa 0.11),
which qwen-omni-utils' ``process_audio_info`` calls for every audio part (with ``offset=audio_start`` and
``duration=audio_end - audio_start``) and for a video's sound track (``use_audio_in_video``, through audioread's
``FFmpegAudioFile``). librosa takes one of two decode paths, and the window is cut differently on each:

- ``soundfile`` (libsndfile: wav, flac, mp3, ogg/vorbis, ogg/opus, aiff, ...): float32 samples as libsndfile
  decodes them; the window starts at ``int(start * sr)`` and holds ``int((end - start) * sr)`` samples.
  libsndfile's own header count (``soundfile.info(...).frames``) is what it reads, mp3 encoder delay and
  padding (LAME/Xing gapless info) and Opus pre-skip already removed, and Opus at 48 kHz unless the header's
  input rate is one Opus runs at. So the count is read, not decoded.
- ``ffmpeg`` (what libsndfile refuses: m4a/aac, and every video's sound track): the ``ffmpeg -i FILE -f s16le -``
  output audioread reads, i.e. the decoded samples after the container's priming skip, converted to 16-bit
  and back to float (x / 32768); the window is cut at the same sample counts. packer runs the same libavformat/libavcodec/libswresample through
  PyAV. The count of this path needs the packets: the demuxer's packet durations and skip-samples side data
  give it without decoding any audio (see ``_ffmpeg_count``).

Both paths then average the channels (``librosa.to_mono``) and resample with soxr at its "HQ" quality
(``res_type="soxr_hq"``), fixing the length to ``ceil(n * target / source)``.
"""

from __future__ import annotations

import io
import math
import os
import stat
from dataclasses import dataclass

import numpy as np

from packer.errors import RecordError

Source = str | bytes


def _av():
    """PyAV, imported on first use: only builds with audio in m4a/aac or video need it."""
    import av

    return av


def _sf():
    """soundfile (libsndfile), imported on first use."""
    import soundfile

    return soundfile


@dataclass(frozen=True)
class AudioInfo:
    """What ``probe_audio`` reads from a clip's headers (no sample is decoded)."""

    source: str
    """The file probed (``"<N bytes>"`` for bytes)."""
    sample_rate: int
    """The rate the loader decodes at (Hz): the stream's, or 48 kHz for Opus whose input rate Opus does not run at."""
    channels: int
    """Channels decoded (averaged to mono by the loader)."""
    num_samples: int
    """Samples per channel the loader reads at ``sample_rate`` inside the start/end window."""
    duration: float
    """Seconds in the window: num_samples / sample_rate."""
    codec: str
    """Codec name (pcm_s16le, flac, mp3, vorbis, opus, aac, ...)."""
    loader: str = "soundfile"
    """The decode path the reference loader takes: "soundfile" (libsndfile) or "ffmpeg" (audioread's ffmpeg)."""
    start: float | None = None
    """The window's start in seconds as given (None: the clip's start)."""
    end: float | None = None
    """The window's end in seconds as given (None: the clip's end)."""


# --------------------------------------------------------------------------------------------- probing


def probe_audio(source: Source | os.PathLike, *, start: float | None = None, end: float | None = None,
                video: bool = False) -> AudioInfo:
    """Read a clip's rate, channels and sample count in the window [start, end) from its headers.

    ``video=True`` reads a video file's own sound track as ``use_audio_in_video`` does (always the ffmpeg path).
    RecordError reasons: ``missing_audio`` (no such file), ``bad_audio`` (a directory or empty file, unreadable,
    no audio stream, or a window that does not fit: start < 0, end <= start, or no sample left after start).
    An end past the clip's end reads to the end, as the loader does.
    """
    source = _fspath(source)
    name = _name(source)
    if start is not None and (not math.isfinite(start) or start < 0):
        raise RecordError("bad_audio", f"{name}: audio start {start!r} is not a time >= 0")
    if end is not None and (not math.isfinite(end) or end <= (start or 0.0)):
        raise RecordError("bad_audio", f"{name}: audio end {end!r} is not after the start {start or 0.0!r}")
    if isinstance(source, str):
        _check_file(source, video)
    info = None if video else _probe_soundfile(source, name)
    if info is None:
        info = _probe_ffmpeg(source, name, video)
    sr, channels, total, codec, loader = info
    n = _window(total, sr, start, end, loader)
    if n <= 0:
        raise RecordError("bad_audio", f"{name}: the window start={start!r} end={end!r} holds no sample of a "
                          f"{total / sr:.3f} s clip")
    return AudioInfo(source=name, sample_rate=sr, channels=channels, num_samples=n, duration=n / sr,
                     codec=codec, loader=loader, start=start, end=end)


def loaded_num_samples(info: AudioInfo, target_sr: int) -> int:
    """Samples the loader yields after resampling ``info``'s window to target_sr: librosa.resample's fixed length,
    ``ceil(n * (target / source))`` in float64 exactly as it computes it (unchanged when the rates agree)."""
    if info.sample_rate == target_sr:
        return info.num_samples
    return int(np.ceil(info.num_samples * (float(target_sr) / info.sample_rate)))


def _fspath(source: Source | os.PathLike) -> Source:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    return os.fspath(source)


def _name(source: Source) -> str:
    return source if isinstance(source, str) else f"<{len(source)} bytes>"


def _check_file(path: str, video: bool) -> None:
    what = "video" if video else "audio"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RecordError("missing_audio", f"{what} file not found: {path}") from None
    except OSError as e:
        raise RecordError("bad_audio", f"{what} file cannot be read: {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RecordError("bad_audio", f"{what} path is not a file: {path}")
    if st.st_size == 0:
        raise RecordError("bad_audio", f"{what} file is empty: {path}")


def _window(total: int, sr: int, start: float | None, end: float | None, loader: str) -> int:
    """Samples per channel the loader keeps of ``total`` for librosa.load(offset=start, duration=end - start)."""
    offset = 0.0 if start is None else start
    duration = None if end is None else end - offset  # qwen-omni-utils: audio_end - audio_start
    # __soundfile_load seeks to int(offset * sr) and reads int(duration * sr) frames; __audioread_load skips and
    # keeps the same counts of interleaved samples
    first = int(offset * sr) if offset else 0
    if first > total:
        return 0  # libsndfile refuses the seek (librosa then retries through audioread, which yields nothing)
    left = total - first
    return left if duration is None else min(left, int(duration * sr))


def _probe_soundfile(source: Source, name: str) -> tuple[int, int, int, str, str] | None:
    """libsndfile's header read, or None where it cannot open the source (librosa then takes the ffmpeg path)."""
    sf = _sf()
    try:
        with sf.SoundFile(source if isinstance(source, str) else io.BytesIO(source)) as f:
            sr, channels, frames = f.samplerate, f.channels, f.frames
            codec = _SF_CODECS.get(f.subtype, f.subtype.lower())
            if f.format == "MPEG":
                codec = "mp3"
    except sf.SoundFileRuntimeError:
        return None
    except (RuntimeError, ValueError, OSError) as e:
        raise RecordError("bad_audio", f"{name}: {e}") from None
    if channels < 1 or sr < 1:
        raise RecordError("bad_audio", f"{name}: no audio stream")
    return sr, channels, frames, codec, "soundfile"


_SF_CODECS = {"PCM_16": "pcm_s16le", "PCM_24": "pcm_s24le", "PCM_32": "pcm_s32le", "PCM_U8": "pcm_u8",
              "PCM_S8": "pcm_s8", "FLOAT": "pcm_f32le", "DOUBLE": "pcm_f64le", "VORBIS": "vorbis", "OPUS": "opus",
              "ULAW": "pcm_mulaw", "ALAW": "pcm_alaw", "MPEG_LAYER_III": "mp3"}


def _open_av(source: Source, name: str, video: bool):
    av = _av()
    try:
        container = av.open(source if isinstance(source, str) else io.BytesIO(source))
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise RecordError("bad_audio", f"{name}: not a readable {'video' if video else 'audio'} file ({e})") from None
    try:
        stream = container.streams.best("audio")
    except Exception:  # noqa: BLE001  (PyAV raises its own error types here)
        stream = None
    if stream is None:
        container.close()
        raise RecordError("bad_audio", f"{name}: no audio stream" + (" in the video" if video else ""))
    return container, stream


def _probe_ffmpeg(source: Source, name: str, video: bool) -> tuple[int, int, int, str, str]:
    container, stream = _open_av(source, name, video)
    with container:
        ctx = stream.codec_context
        sr, channels = ctx.sample_rate, ctx.channels
        if not sr or not channels:
            raise RecordError("bad_audio", f"{name}: the audio stream has no sample rate or channels")
        total = _ffmpeg_count(container, stream, name)
        return sr, channels, total, ctx.name, "ffmpeg"


def _ffmpeg_count(container, stream, name: str) -> int:
    """Samples ``ffmpeg -i FILE`` decodes from the stream: decoded to count (see docs/benchmarks.md for the cost;
    the header's duration is not it: AAC's priming and padding, and the muxer's edit list, move it)."""
    av = _av()
    n = 0
    try:
        for frame in container.decode(stream):
            n += frame.samples
    except av.error.FFmpegError as e:
        raise RecordError("bad_audio", f"{name}: the audio stream cannot be decoded ({e})") from None
    if n == 0:
        raise RecordError("bad_audio", f"{name}: the audio stream has no samples")
    return n


# --------------------------------------------------------------------------------------------- decoding


def decode_audio(source: Source | os.PathLike, *, target_sr: int, start: float | None = None, end: float | None = None,
                 video: bool = False) -> np.ndarray:
    """The clip's window as float32 mono at target_sr, bit-equal to ``librosa.load(source, sr=target_sr,
    offset=start, duration=end - start)`` (the ffmpeg path: to the same loader reading ffmpeg's s16 output)."""
    source = _fspath(source)
    info = probe_audio(source, start=start, end=end, video=video)
    name = info.source
    offset = 0.0 if start is None else start
    duration = None if end is None else end - offset
    if info.loader == "soundfile":
        y = _read_soundfile(source, offset, duration)
    else:
        y = _read_ffmpeg(source, name, offset, duration, video)
    if y.ndim > 1:
        y = np.mean(y, axis=tuple(range(y.ndim - 1)))  # librosa.to_mono on (channels, n)
    return _resample(y, info.sample_rate, target_sr)


def _read_soundfile(source: Source, offset: float, duration: float | None) -> np.ndarray:
    sf = _sf()
    with sf.SoundFile(source if isinstance(source, str) else io.BytesIO(source)) as f:
        sr = f.samplerate
        if offset:
            f.seek(int(offset * sr))
        frames = -1 if duration is None else int(duration * sr)
        return f.read(frames=frames, dtype="float32", always_2d=False).T


def _read_ffmpeg(source: Source, name: str, offset: float, duration: float | None, video: bool) -> np.ndarray:
    """audioread's FFmpegAudioFile + librosa's __audioread_load: ffmpeg's s16le output, interleaved, to float."""
    av = _av()
    container, stream = _open_av(source, name, video)
    with container:
        ctx = stream.codec_context
        channels, sr = ctx.channels, ctx.sample_rate
        resampler = av.AudioResampler(format="s16", layout=ctx.layout.name, rate=sr)
        chunks = []
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(-1))
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(-1))
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    first = int(sr * offset) * channels
    last = pcm.size if duration is None else first + int(sr * duration) * channels
    y = (1.0 / 32768) * pcm[first:last].astype(np.float32)  # librosa.util.buf_to_float
    if channels > 1:
        y = y.reshape((-1, channels)).T
    return y


def _resample(y: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """librosa.resample(y, orig_sr, target_sr, res_type="soxr_hq"): soxr, then the length fixed to ceil(n*ratio)."""
    if orig_sr == target_sr:
        return y
    import soxr

    n = int(np.ceil(y.shape[-1] * (float(target_sr) / orig_sr)))
    out = soxr.resample(y, orig_sr, target_sr, quality="soxr_hq")
    if out.shape[-1] > n:
        out = out[:n]
    elif out.shape[-1] < n:
        out = np.pad(out, (0, n - out.shape[-1]))
    return np.asarray(out, dtype=y.dtype)
