"""packer.media.audio (probe_audio, loaded_num_samples, decode_audio) and packer.models.shared.audio_features
(whisper_log_mel) against the references the families' users run.

- The loader: ``librosa.load(path, sr=16000, offset=start, duration=end - start)`` (librosa 0.11), the call
  qwen-omni-utils 0.0.9's ``process_audio_info`` makes for an audio part, and for a video's sound track
  ``librosa.load(audioread.ffdec.FFmpegAudioFile(path), ...)`` (``use_audio_in_video``). audioread needs an
  ``ffmpeg`` command: the one the imageio-ffmpeg wheel ships, put on PATH here (so the m4a/aac and video paths
  run the real command, not a stand-in).
- The features: transformers 5.23's ``WhisperFeatureExtractor`` on both of its paths (torch when installed, the
  numpy one otherwise), called as Qwen2-Audio's and Qwen2.5-Omni's processors call it (``padding="max_length"``,
  ``return_attention_mask=True``, feature_size 128 as their preprocessor configs have it).

Every clip is written here (tests/media/audio_clips.py): wav (16-bit and float), flac, mp3, m4a/aac, ogg/opus,
ogg/vorbis at 8 to 96 kHz, mono and stereo, clips shorter than one feature frame, odd lengths.
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import RecordError
from packer.media.audio import AudioInfo, decode_audio, loaded_num_samples, probe_audio
from packer.models.shared.audio_features import feature_frames, whisper_log_mel
from tests.media.audio_clips import signal, write_clip, write_video

librosa = pytest.importorskip("librosa")
audioread = pytest.importorskip("audioread")

SR = 16000
CODECS = ["wav", "wav-float", "flac", "mp3", "m4a", "opus", "ogg"]
RATES = [8000, 11025, 22050, 44100, 48000, 96000]
EXT = {"wav-float": "wav"}


@pytest.fixture(scope="session", autouse=True)
def ffmpeg_on_path(tmp_path_factory):
    """audioread's FFmpegAudioFile runs `ffmpeg`: the imageio-ffmpeg wheel's binary, linked onto PATH."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "ffmpeg").symlink_to(imageio_ffmpeg.get_ffmpeg_exe())
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{old}"
    audioread.available_backends(flush_cache=True)
    assert audioread.ffdec.FFmpegAudioFile in audioread.available_backends()
    yield
    os.environ["PATH"] = old
    audioread.available_backends(flush_cache=True)


@pytest.fixture(scope="session")
def clips(tmp_path_factory):
    """clip(codec, rate, channels, num_samples, kind) -> path, written once per session."""
    root = tmp_path_factory.mktemp("audio")
    made: dict[tuple, str] = {}

    def clip(codec: str, rate: int, channels: int, num_samples: int, kind: str = "speech") -> str:
        key = (codec, rate, channels, num_samples, kind)
        if key not in made:
            path = root / f"{kind}_{rate}_{channels}_{num_samples}_{codec}.{EXT.get(codec, codec)}"
            write_clip(path, signal(kind, rate, num_samples=num_samples, channels=channels, seed=num_samples),
                       rate, codec=codec)
            made[key] = str(path)
        return made[key]

    return clip


def reference_load(source, start=None, end=None, *, video=False) -> np.ndarray:
    """qwen-omni-utils 0.0.9's process_audio_info for one part, transcribed (its module imports torchvision)."""
    audio_start = 0.0 if start is None else start
    duration = (end - audio_start) if end is not None else None
    data = audioread.ffdec.FFmpegAudioFile(source) if video else source
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "PySoundFile failed. Trying audioread instead." for m4a
        return librosa.load(data, sr=SR, offset=audio_start, duration=duration)[0]


def check_equal(source, start=None, end=None, *, video=False) -> AudioInfo:
    info = probe_audio(source, start=start, end=end, video=video)
    ref = reference_load(source, start, end, video=video)
    assert loaded_num_samples(info, SR) == len(ref), (source, start, end, info)
    got = decode_audio(source, target_sr=SR, start=start, end=end, video=video)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(got, ref), (source, start, end, float(np.abs(got - ref).max()))
    return info


def _lengths(rate: int) -> list[int]:
    # shorter than one 10 ms feature frame at 16 kHz, an odd 1.3 s, and just over 2 s
    return [max(1, rate // 200), int(1.3 * rate) + 7, 2 * rate + 1]


def _matrix():
    for codec in CODECS:
        for rate in RATES:
            if codec == "mp3" and rate > 48000:
                continue  # MPEG audio has no 96 kHz
            for channels in (1, 2):
                for n in _lengths(rate):
                    yield codec, rate, channels, n


FAST = {("wav", 22050, 2), ("flac", 44100, 1), ("mp3", 44100, 2), ("m4a", 48000, 1), ("opus", 11025, 2),
        ("ogg", 8000, 1), ("wav-float", 96000, 2)}


@pytest.mark.parametrize("codec,rate,channels,n", [
    pytest.param(*p, marks=() if p[:3] in FAST else pytest.mark.slow) for p in _matrix()])
def test_count_and_samples_equal_the_loader(clips, codec, rate, channels, n):
    """Every codec x rate x channels x length: the header count equals the loader's, and decode is bit-equal."""
    path = clips(codec, rate, channels, n)
    info = check_equal(path)
    assert info.channels == channels
    assert info.loader == ("ffmpeg" if codec == "m4a" else "soundfile")
    if codec in ("wav", "wav-float", "flac", "ogg"):
        assert (info.sample_rate, info.num_samples) == (rate, n)  # lossless or exact-length codecs


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("window", [(0.013, None), (0.25, 1.1), (None, 0.7), (1.0, 1.0001), (0.3, 2.2)])
def test_windows_cut_as_the_loader_cuts(clips, codec, window):
    """audio_start / audio_end: librosa's int(offset * sr) and int(duration * sr) on both decode paths."""
    rate = 22050 if codec != "opus" else 48000
    check_equal(clips(codec, rate, 2, int(1.3 * rate) + 7), *window)


@pytest.mark.parametrize("rate,channels,seconds,window", [
    (44100, 2, 1.5, (None, None)), (16000, 1, 0.7, (0.1, 0.5)), (22050, 2, 2.3, (0.2, 0.6)),
    (48000, 1, 0.05, (None, None)), (8000, 2, 1.2, (0.5, None))])
def test_video_sound_track(tmp_path, rate, channels, seconds, window):
    """use_audio_in_video: the sound track of an mp4 as FFmpegAudioFile + librosa.load give it."""
    path = write_video(tmp_path / "v.mp4", seconds=seconds, sample_rate=rate, channels=channels)
    info = check_equal(str(path), *window, video=True)
    assert info.loader == "ffmpeg" and info.codec == "aac"


@pytest.mark.parametrize("ext,args", [("m4a", ["-c:a", "aac"]), ("mp4", ["-c:a", "aac", "-ac", "1"]),
                                      ("m4a", ["-c:a", "aac", "-ar", "22050", "-b:a", "48k"]),
                                      ("mka", ["-c:a", "flac"]), ("mp3", ["-c:a", "libmp3lame", "-q:a", "7"]),
                                      ("opus", ["-c:a", "libopus", "-ar", "24000"])])
def test_files_the_ffmpeg_command_makes(tmp_path, ext, args):
    """Clips as `ffmpeg -i in.wav out.m4a` makes them (AAC priming in an edit list; FLAC in Matroska, decoded to
    count): the header count and the samples equal the loader's."""
    import subprocess

    wav = write_clip(tmp_path / "in.wav", signal("speech", 44100, num_samples=70_001, channels=2), 44100)
    out = tmp_path / f"out.{ext}"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(wav), *args, str(out)], check=True)
    check_equal(str(out))
    check_equal(str(out), 0.4, 1.2)


@pytest.mark.parametrize("ext,args,exact", [
    ("mov", ["-c:v", "copy", "-c:a", "aac"], True), ("avi", ["-c:v", "mpeg4", "-c:a", "libmp3lame"], True),
    ("mkv", ["-c:v", "copy", "-c:a", "pcm_s16le"], True), ("mp4", ["-c:v", "copy", "-c:a", "libmp3lame"], True),
    ("webm", ["-c:v", "libvpx-vp9", "-c:a", "libopus"], False), ("mkv", ["-c:v", "copy", "-c:a", "libopus"], False)])
def test_video_containers(tmp_path, ext, args, exact):
    """Sound tracks in the containers videos come in: counts exact; Opus within one 16-bit step of the loader's
    ffmpeg 7.0 (PyAV's FFmpeg 8 decoder rounds a few samples the other way)."""
    import subprocess

    src = write_video(tmp_path / "in.mp4", seconds=1.6, sample_rate=44100)
    out = tmp_path / f"out.{ext}"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(src), *args, str(out)], check=True)
    if exact:
        check_equal(str(out), video=True)
        return
    info = probe_audio(str(out), video=True)
    ref = reference_load(str(out), video=True)
    got = decode_audio(str(out), target_sr=SR, video=True)
    assert loaded_num_samples(info, SR) == len(ref) == len(got)
    assert np.abs(got - ref).max() <= 1 / 32768


@pytest.mark.parametrize("codec", ["aac", "ac3"])
def test_matroska_codec_delay_refused(tmp_path, codec):
    """AAC / AC-3 in Matroska: ffmpeg 7.0 (the loader's here) and 8 (PyAV's) disagree on the length by the codec
    delay, so the count is refused rather than guessed."""
    import subprocess

    src = write_clip(tmp_path / "in.wav", signal("tone", 44100, num_samples=50_000, channels=2), 44100)
    out = tmp_path / "out.mka"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(src), "-c:a", codec, str(out)], check=True)
    with pytest.raises(RecordError, match="differs between ffmpeg versions") as e:
        probe_audio(str(out))
    assert e.value.reason == "bad_audio"


@pytest.mark.parametrize("codec", ["wav", "flac", "mp3", "opus", "ogg", "m4a"])
def test_bytes(clips, codec):
    """Audio bytes (a Parquet / datasets.Audio column, a data: URI): librosa.load(BytesIO) for what libsndfile
    reads; m4a bytes, which librosa cannot take from memory, decode as the same file does."""
    path = clips(codec, 44100 if codec != "opus" else 48000, 2, 30011)
    data = open(path, "rb").read()
    info = probe_audio(data, start=0.1, end=0.5)
    assert info.source == f"<{len(data)} bytes>"
    got = decode_audio(data, target_sr=SR, start=0.1, end=0.5)
    ref = reference_load(path, 0.1, 0.5)
    if codec != "m4a":
        ref_bytes = librosa.load(io.BytesIO(data), sr=SR, offset=0.1, duration=0.5 - 0.1)[0]
        assert np.array_equal(ref_bytes, ref)
    assert loaded_num_samples(info, SR) == len(ref) and np.array_equal(got, ref)


def test_rejects(tmp_path, clips):
    def reason(source, **kw):
        with pytest.raises(RecordError) as e:
            probe_audio(source, **kw)
        return e.value.reason

    assert reason(str(tmp_path / "nope.wav")) == "missing_audio"
    assert reason(str(tmp_path)) == "bad_audio"  # a directory
    (tmp_path / "empty.wav").write_bytes(b"")
    assert reason(str(tmp_path / "empty.wav")) == "bad_audio"
    (tmp_path / "junk.mp3").write_bytes(os.urandom(3000))
    assert reason(str(tmp_path / "junk.mp3")) == "bad_audio"
    assert reason(b"not audio at all" * 20) == "bad_audio"
    silent = write_video(tmp_path / "silent.mp4", audio=False)
    assert reason(str(silent), video=True) == "bad_audio"  # no sound track
    wav = clips("wav", 16000, 1, 16000)  # 1 s
    assert reason(wav, start=1.5) == "bad_audio"  # starts after the clip
    assert reason(wav, start=0.5, end=0.5) == "bad_audio"
    assert reason(wav, start=-0.1) == "bad_audio"
    assert reason(wav, start=0.2, end=2.01) == "bad_audio"  # more than 1 s past the end: the wrong clip?
    assert probe_audio(wav, start=0.2, end=1.99).num_samples == 12800  # within: read to the end, as librosa does
    assert reason(wav, start=0.5, end=0.5000001) == "bad_audio"  # int(duration * sr) == 0: the loader yields nothing
    assert reason(wav, end=float("nan")) == "bad_audio"
    # truncated: the first half of an mp4 (its moov atom at the end is gone)
    full = write_video(tmp_path / "v.mp4", seconds=1.0)
    (tmp_path / "cut.mp4").write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    assert reason(str(tmp_path / "cut.mp4"), video=True) == "bad_audio"
    assert "nope.wav" in str(RecordError("missing_audio", f"audio file not found: {tmp_path / 'nope.wav'}"))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200_000), rate=st.sampled_from([8000, 11025, 12000, 22050, 24000, 32000, 44100, 48000,
                                                         88200, 96000, 16000]))
def test_count_is_librosas_resampled_length(n, rate):
    """loaded_num_samples == the length librosa.resample(res_type="soxr_hq") gives n samples at rate."""
    info = AudioInfo(source="x", sample_rate=rate, channels=1, num_samples=n, duration=n / rate, codec="pcm")
    y = np.zeros(n, np.float32)
    assert loaded_num_samples(info, SR) == len(librosa.resample(y, orig_sr=rate, target_sr=SR, res_type="soxr_hq"))


# --------------------------------------------------------------------------------------------- features


@pytest.fixture(scope="module")
def extractors():
    from transformers import WhisperFeatureExtractor

    return {128: WhisperFeatureExtractor(feature_size=128), 80: WhisperFeatureExtractor(feature_size=80)}


def hf_features(extractor, audio, *, torch_path: bool, **kw):
    import transformers.models.whisper.feature_extraction_whisper as W

    saved = W.is_torch_available
    W.is_torch_available = (lambda: True) if torch_path else (lambda: False)
    try:
        out = extractor(audio, sampling_rate=SR, return_attention_mask=True, return_tensors="np", **kw)
    finally:
        W.is_torch_available = saved
    return out["input_features"][0], out["attention_mask"][0]


TORCH_TOL = 1e-4  # measured 3.6e-5: the torch path's float32 STFT (it differs from the numpy path as much)
NUMPY_TOL = 2.4e-7  # measured 1.2e-7: one float32 rounding


FEATURE_FAST = {(128, "speech", 37), (128, "speech", 401), (128, "noise", 480_001), (128, "silence", 16077),
                (80, "speech", 16077)}


@pytest.mark.parametrize("feature_size,kind,n", [
    pytest.param(f, k, n, marks=() if (f, k, n) in FEATURE_FAST else pytest.mark.slow)
    for f in (128, 80) for k in ("speech", "noise", "silence")
    for n in (1, 37, 159, 160, 201, 399, 400, 401, 16077, 160 * 100, 479_999, 480_000, 480_001, 35 * SR + 7)])
def test_features_equal_the_extractor_padded_to_30s(extractors, n, kind, feature_size):
    """Qwen2-Audio's and Qwen2.5-Omni's call: padding="max_length" (30 s; a longer clip truncated), the mask."""
    audio = signal(kind, SR, num_samples=n, seed=n)[:, 0]
    got = whisper_log_mel(audio, feature_size=feature_size, padding="max_length")
    for torch_path, tol in ((True, TORCH_TOL), (False, NUMPY_TOL)):
        ref, mask = hf_features(extractors[feature_size], audio, torch_path=torch_path, padding="max_length")
        assert got.features.shape == ref.shape == (feature_size, 3000)
        assert np.abs(got.features - ref).max() <= tol
        assert np.array_equal(got.attention_mask, mask)
    assert int(got.attention_mask.sum()) == feature_frames(n)


@pytest.mark.parametrize("n", [201, 401, 33333, pytest.param(480_000, marks=pytest.mark.slow),
                               pytest.param(480_001, marks=pytest.mark.slow)])
def test_features_unpadded(extractors, n):
    """padding="longest" on one clip (its own length, still truncated to 30 s) and None (the same)."""
    audio = signal("speech", SR, num_samples=n, seed=n)[:, 0]
    for torch_path, tol in ((True, TORCH_TOL), (False, NUMPY_TOL)):
        ref, mask = hf_features(extractors[128], audio, torch_path=torch_path, padding="longest")
        for padding in ("longest", None):
            got = whisper_log_mel(audio, padding=padding)
            assert got.features.shape == ref.shape == (128, min(n, 480_000) // 160)
            assert np.abs(got.features - ref).max() <= tol and np.array_equal(got.attention_mask, mask)


def test_features_without_truncation(extractors):
    """truncation=False: a 31 s clip keeps every frame (a family that windows long audio itself)."""
    audio = signal("speech", SR, num_samples=31 * SR + 5)[:, 0]
    ref, mask = hf_features(extractors[128], audio, torch_path=True, padding="max_length", truncation=False)
    got = whisper_log_mel(audio, truncation=False)
    assert got.features.shape == ref.shape == (128, 3100)
    assert np.abs(got.features - ref).max() <= TORCH_TOL and np.array_equal(got.attention_mask, mask)


def test_short_clip_unpadded_refused():
    """torch.stft's reflect padding needs more than n_fft // 2 samples: refused loudly, as the extractor does."""
    with pytest.raises(ValueError, match="too short"):
        whisper_log_mel(np.zeros(200, np.float32), padding="longest")


@pytest.mark.parametrize("codec,rate,channels", [("mp3", 44100, 2), ("m4a", 22050, 1), ("opus", 48000, 2),
                                                 ("flac", 11025, 1)])
def test_file_to_features(clips, extractors, codec, rate, channels):
    """The whole reader path: decode_audio then whisper_log_mel == the extractor on librosa.load's samples, and the
    Qwen2-Audio token count from the header alone equals the processor's formula on its mask."""
    path = clips(codec, rate, channels, int(2.7 * rate) + 3)
    info = probe_audio(path)
    got = whisper_log_mel(decode_audio(path, target_sr=SR))
    ref, mask = hf_features(extractors[128], reference_load(path), torch_path=True, padding="max_length")
    assert np.abs(got.features - ref).max() <= TORCH_TOL and np.array_equal(got.attention_mask, mask)
    frames = feature_frames(loaded_num_samples(info, SR))
    assert frames == int(mask.sum())
    assert (((frames - 1) // 2 + 1) - 2) // 2 + 1 == (((int(mask.sum()) - 1) // 2 + 1) - 2) // 2 + 1


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 600_000))
def test_feature_frames_is_the_mask_sum(n):
    """feature_frames(n) == the mask's sum, for any clip length (the rule a family's token count rests on)."""
    limit = 480_000
    kept = min(n, limit)
    mask = np.zeros(limit, np.int32)
    mask[:kept] = 1
    assert feature_frames(n) == int(mask[::160].sum())


@settings(max_examples=40, deadline=None)
@given(ns=st.lists(st.integers(201, 40_000), min_size=1, max_size=4),
       padding=st.sampled_from(["max_length", "longest", None]), truncation=st.booleans(),
       multiple=st.sampled_from([None, 16000]))
def test_feature_frames_is_the_extractors_mask(extractors, ns, padding, truncation, multiple):
    """feature_frames(counts, ...) == the mask sums WhisperFeatureExtractor returns for one call (max_length 1 s
    here, so truncation and padding both happen)."""
    audios = [np.zeros(n, np.float32) for n in ns]
    kw = {"padding": padding if padding else "do_not_pad", "truncation": truncation, "max_length": 16000,
          "pad_to_multiple_of": multiple}
    ref = extractors[128].pad({"input_features": [a[:, None] for a in audios]}, return_attention_mask=True, **kw)
    masks = ref["attention_mask"]
    expected = []
    for m in masks:  # the extractor's rescale: every 160th sample, one fewer when the length is not a multiple
        m = np.asarray(m)[::160][: len(m) // 160]
        expected.append(int(m.sum()))
    got = feature_frames(ns, padding=padding, truncation=truncation, max_length=16000, pad_to_multiple_of=multiple)
    assert got == expected


def test_features_batch_padded_to_longest(extractors):
    """Qwen3-Omni's call (padding=True, truncation=False) on one example's clips: each row padded to the longest,
    which gives a shorter clip one more frame than it has alone."""
    from packer.models.shared.audio_features import whisper_log_mel_batch

    audios = [signal("speech", SR, num_samples=n, seed=n)[:, 0] for n in (16077, 40_003, 3_333)]
    import transformers.models.whisper.feature_extraction_whisper as W

    for torch_path, tol in ((True, TORCH_TOL), (False, NUMPY_TOL)):
        saved = W.is_torch_available
        W.is_torch_available = (lambda: True) if torch_path else (lambda: False)
        try:
            ref = extractors[128](audios, sampling_rate=SR, padding=True, truncation=False,
                                  return_attention_mask=True, return_tensors="np")
        finally:
            W.is_torch_available = saved
        got = whisper_log_mel_batch(audios, padding=True, truncation=False)
        assert feature_frames([16077, 40_003, 3_333], padding=True, truncation=False) == [
            int(m.sum()) for m in ref["attention_mask"]]
        for row, mel in enumerate(got):
            assert mel.features.shape == ref["input_features"][row].shape == (128, 250)
            assert np.abs(mel.features - ref["input_features"][row]).max() <= tol
            assert np.array_equal(mel.attention_mask, ref["attention_mask"][row])
    # Alone (or longest in its call) a clip of 16,077 samples has 16077 // 160 = 100 frames; padded by a longer
    # neighbour its mask holds ceil(16077 / 160) = 101, the 101st frame half over zeros: one more frame to encode.
    alone = whisper_log_mel(audios[0], padding=True, truncation=False)
    assert alone.features.shape == (128, 100) and int(alone.attention_mask.sum()) == 100
    assert int(got[0].attention_mask.sum()) == 101
    assert np.abs(alone.features - got[0].features[:, :100]).max() <= NUMPY_TOL


@pytest.mark.slow
def test_features_voxtral_windows(extractors):
    """Voxtral's call: no truncation, padded to a multiple of 30 s, split into 30 s windows of 3,000 frames."""
    from packer.models.shared.audio_features import whisper_windows

    audio = signal("speech", SR, num_samples=31 * SR + 7)[:, 0]
    kw = {"padding": True, "truncation": False, "pad_to_multiple_of": 480_000}
    ref, mask = hf_features(extractors[128], audio, torch_path=True, **kw)
    got = whisper_log_mel(audio, **kw)
    assert got.features.shape == ref.shape == (128, 6000)
    assert np.abs(got.features - ref).max() <= TORCH_TOL and np.array_equal(got.attention_mask, mask)
    windows = whisper_windows(got.features)
    expected = ref.reshape(128, -1, 3000).transpose(1, 0, 2)  # VoxtralProcessor._retrieve_input_features
    assert windows.shape == (2, 128, 3000) and np.abs(windows - expected).max() <= TORCH_TOL


def test_headers_that_guess(tmp_path):
    """An mp3 without a Xing/LAME frame count (libmpg123 estimates it from the size) and a cut mp3 are counted by
    decoding and still equal the loader, windows too; a cut FLAC (its header keeps the full count, libsndfile
    fails mid-read) is refused; cut WAV and Ogg files report what they hold."""
    import subprocess

    wav = write_clip(tmp_path / "in.wav", signal("speech", 44100, num_samples=145_553, channels=2), 44100)
    plain = tmp_path / "plain.mp3"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(wav), "-c:a", "libmp3lame", "-write_xing", "0",
                    str(plain)], check=True)
    import soundfile as sf

    assert sf.info(str(plain)).frames != len(sf.read(str(plain))[0])  # the header guesses
    for path in [plain, *(_cut(write_clip(tmp_path / f"c.{ext}", signal("speech", 22050, 2.0, channels=2), 22050))
                          for ext in ("mp3", "wav", "ogg", "opus"))]:
        check_equal(str(path))
        check_equal(str(path), 0.3, 0.9)
    with pytest.raises(RecordError, match="truncated") as e:
        probe_audio(str(_cut(write_clip(tmp_path / "c.flac", signal("speech", 22050, 2.0), 22050))))
    assert e.value.reason == "bad_audio"


def _cut(path):
    data = path.read_bytes()
    cut = path.with_name(f"cut-{path.name}")
    cut.write_bytes(data[: len(data) * 6 // 10])
    return cut


@pytest.mark.parametrize("codec", ["wav", "flac", "ogg"])
def test_many_channels(clips, codec):
    """5.1 clips (six channels) average to mono as librosa.to_mono averages them."""
    assert check_equal(clips(codec, 48000, 6, 52_807)).channels == 6


@pytest.mark.parametrize("codec,rate,channels", [("wav", 22050, 2), ("flac", 44100, 1), ("mp3", 48000, 2),
                                                 ("opus", 24000, 1), ("ogg", 11025, 2)])
def test_transformers_load_audio(clips, codec, rate, channels):
    """A processor handed a path (Qwen2AudioProcessor's fetch_audio) loads it with transformers' load_audio; without
    torchcodec that is soundfile + soxr, the samples decode_audio gives. (With torchcodec installed transformers
    decodes with it instead, which packer does not follow: load clips with librosa, as qwen-omni-utils does.)"""
    from transformers.audio_utils import load_audio

    path = clips(codec, rate, channels, int(1.7 * rate) + 11)
    ref = load_audio(path, sampling_rate=SR, backend="soundfile")
    got = decode_audio(path, target_sr=SR)
    assert loaded_num_samples(probe_audio(path), SR) == len(ref) and np.array_equal(got, ref)
