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
``FFmpegAudioFile``). librosa takes one of two decode paths:

- ``soundfile`` (libsndfile: wav, flac, mp3, ogg/vorbis, ogg/opus, aiff, ...): float32 samples as libsndfile
  decodes them; the window starts at ``int(start * sr)`` and holds ``int((end - start) * sr)`` samples.
  libsndfile's own header count (``soundfile.info(...).frames``) is what it then reads (mp3 after its LAME
  gapless trim, Opus after its pre-skip, at 48 kHz unless the header's input rate is one Opus runs at): the
  count is read, not decoded, except an mp3 whose header only estimates it (no Xing/LAME frame count, or a cut
  file), which is decoded to count (``_probe_soundfile``).
- ``ffmpeg`` (what libsndfile refuses: m4a/aac, and every video's sound track): the ``ffmpeg -i FILE -f s16le -``
  output audioread reads, i.e. the decoded samples after the container's priming skip, converted to 16-bit
  and back to float (x / 32768); the window is cut at the same sample counts. packer runs the same
  libavformat/libavcodec/libswresample through PyAV. The header's duration is not this count (AAC's priming and
  padding, the edit list): AAC-LC in mp4/m4a/mov is counted from its sample table (``_aac_mp4_count``);
  other codecs on this path (rare: what libsndfile does not read) are decoded to count.

Both paths then average the channels (``librosa.to_mono``) and resample with soxr at its "HQ" quality
(``res_type="soxr_hq"``), fixing the length to ``ceil(n * target / source)``. transformers' own ``load_audio``
(what a processor does with a path, e.g. Qwen2AudioProcessor) is the same soundfile + soxr steps when torchcodec
is not installed; with torchcodec it decodes and resamples with that instead, which packer does not follow.
"""

from __future__ import annotations

import io
import math
import os
import stat
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from packer.errors import RecordError

Source = str | bytes
END_SLACK_S = 1.0
"""An end this far past the clip reads to its end, as the loader does; further is taken for a record naming the
wrong clip (the video rule's slack, packer.models.qwen_vl.video_plan.END_SLACK_S)."""


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
    no audio stream, or a window that does not fit: start < 0, end <= start, no sample left after start, or an
    end more than END_SLACK_S past the clip's end; within that, the window reads to the end as the loader does).
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
    n = _window(total, sr, start, end)
    if n <= 0:
        raise RecordError("bad_audio", f"{name}: the window start={start!r} end={end!r} holds no sample of a "
                          f"{total / sr:.3f} s clip")
    if end is not None and end > total / sr + END_SLACK_S:
        raise RecordError("bad_audio", f"{name}: audio end {end!r} s is more than {END_SLACK_S} s past the clip's "
                          f"end ({total / sr:.3f} s)")
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


def _window(total: int, sr: int, start: float | None, end: float | None) -> int:
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
    """libsndfile's header read, or None where it cannot open the source (librosa then takes the ffmpeg path).

    The header's count is what the loader reads except where the header guesses: an mp3 without a Xing/Info/VBRI
    frame count (libmpg123 estimates from the file size) or shorter than the stream size that tag names (cut),
    which is counted by decoding as the loader decodes it (``_mp3_count_in_header``), and a FLAC cut short
    (STREAMINFO keeps the full count), which is refused when its last sample does not read (libsndfile raises
    mid-read, where librosa would retry the file through ffmpeg and yield a part of it). Ogg keeps its count in the last page's
    granule position and WAV's is the data size, both what libsndfile then reads, cut or not.
    """
    sf = _sf()
    try:
        with sf.SoundFile(source if isinstance(source, str) else io.BytesIO(source)) as f:
            sr, channels, frames = f.samplerate, f.channels, f.frames
            codec = _SF_CODECS.get(f.subtype, f.subtype.lower())
            if f.format == "FLAC" and frames > 0 and not _last_sample_reads(f, frames):
                raise RecordError("bad_audio", f"{name}: the FLAC stream ends before the {frames} samples its "
                                  "header lists (a truncated file)")
            if f.format == "MP3" and not _mp3_count_in_header(source):
                f.seek(0)
                frames = len(f.read(frames=-1, dtype="float32", always_2d=True))  # decoded to count
    except sf.SoundFileRuntimeError:
        return None
    except (RuntimeError, ValueError, OSError) as e:
        raise RecordError("bad_audio", f"{name}: {e}") from None
    if channels < 1 or sr < 1 or frames < 1:
        raise RecordError("bad_audio", f"{name}: no audio samples")
    return sr, channels, frames, codec, "soundfile"


def _mp3_count_in_header(source: Source) -> bool:
    """Whether an mp3's first frame carries a Xing/Info or VBRI tag with a frame count, and the file holds the
    stream size the tag names (so libmpg123's count is the tag's, not an estimate, and the file is whole)."""
    if isinstance(source, str):
        size = os.stat(source).st_size
        with open(source, "rb") as fh:
            head = fh.read(10)
            start = _id3v2_size(head)
            fh.seek(start)
            buf = fh.read(4096)
    else:
        size, start = len(source), _id3v2_size(source[:10])
        buf = source[start:start + 4096]
    i = next((k for k in range(min(len(buf) - 1, 2048)) if buf[k] == 0xFF and buf[k + 1] & 0xE0 == 0xE0), None)
    if i is None:
        return False
    frame = buf[i:i + 200]
    for tag in (b"Xing", b"Info"):
        x = frame.find(tag, 4, 64)
        if x >= 0:
            flags = int.from_bytes(frame[x + 4:x + 8], "big")
            if not flags & 1:
                return False
            if flags & 2:
                stream_bytes = int.from_bytes(frame[x + 12:x + 16], "big")
                return size - start - i >= stream_bytes
            return True
    v = frame.find(b"VBRI", 4, 64)
    if v >= 0:
        return size - start - i >= int.from_bytes(frame[v + 10:v + 14], "big")
    return False


def _id3v2_size(head: bytes) -> int:
    if len(head) < 10 or head[:3] != b"ID3":
        return 0
    body = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]
    return 10 + body + (10 if head[5] & 0x10 else 0)


def _last_sample_reads(f, frames: int) -> bool:
    try:
        f.seek(frames - 1)
        return len(f.read(1, dtype="float32", always_2d=True)) == 1
    except (RuntimeError, ValueError):  # LibsndfileError is a RuntimeError
        return False


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
        sr, channels, codec = ctx.sample_rate, ctx.channels, ctx.name
        if not sr or not channels:
            raise RecordError("bad_audio", f"{name}: the audio stream has no sample rate or channels")
        if "matroska" in container.format.name and codec in _MATROSKA_DELAYED:
            # FFmpeg 7.0 drops this codec delay in Matroska and FFmpeg 8 does not (1,024 samples of AAC): the loader's
            # count depends on the ffmpeg it runs, so packer cannot promise it
            raise RecordError("bad_audio", f"{name}: {codec} audio in Matroska/WebM decodes to a length that differs "
                              "between ffmpeg versions; remux it to mp4/m4a (ffmpeg -i IN -c copy OUT.m4a)")
        total = _aac_mp4_count(source, container, stream, name)
    if total is None:
        container, stream = _open_av(source, name, video)
        with container:
            total = _decoded_count(container, stream, name)
    return sr, channels, total, codec, "ffmpeg"


_MATROSKA_DELAYED = frozenset({"aac", "ac3", "eac3"})


def _aac_mp4_count(source: Source, container, stream, name: str) -> int | None:
    """The decoded count of AAC-LC in an mp4/m4a/mov from its sample table, or None where that rule is not known
    to hold. Every packet decodes to 1,024 samples; the decoder drops the priming the edit list names (the first
    packet's negative pts, -1,024 from FFmpeg's encoder); the end padding is kept (neither FFmpeg's decoder nor
    the ffmpeg command trims it). Nothing is decoded: the header and one demuxed packet. A file cut short (its
    header lists packets past the end) is refused, as the video probe refuses it (its box check)."""
    from packer.media.video import _isobmff_truncation

    ctx = stream.codec_context
    if not (isinstance(source, str) and "mp4" in container.format.name and ctx.name == "aac"
            and ctx.profile == "LC" and ctx.frame_size == 1024 and stream.frames > 0
            and stream.time_base == Fraction(1, ctx.sample_rate)):
        return None
    truncated = _isobmff_truncation(source, os.stat(source).st_size)
    if truncated:
        raise RecordError("bad_audio", f"{name} is truncated: {truncated}")
    try:
        first = next(iter(container.demux(stream)), None)
    except _av().error.FFmpegError as e:
        raise RecordError("bad_audio", f"{name}: the container is corrupt ({e})") from None
    if first is None or first.pts is None or not -1024 <= first.pts <= 0:
        return None
    return stream.frames * 1024 + first.pts


def _decoded_count(container, stream, name: str) -> int:
    """Samples ``ffmpeg -i FILE`` decodes from the stream, decoded to count (see docs/benchmarks.md for the cost)."""
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
    """The clip's window as float32 mono at target_sr: ``librosa.load(source, sr=target_sr, offset=start,
    duration=end - start)``, bit-equal on the libsndfile path and on the ffmpeg path for AAC, MP3, PCM, FLAC, AC-3
    and WMA (tests/media/test_audio.py); Opus in a video container differs by at most one 16-bit step
    (1/32768) before resampling where the loader's ffmpeg (7.0) and PyAV's (8) round differently."""
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
