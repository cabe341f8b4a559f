"""Audio at build time and in the reader: counting from headers against decoding, Whisper features in numpy
against transformers' WhisperFeatureExtractor.

    python scripts/bench_audio.py            # 6 clips of 10 s per codec, best of 3, ~1 min
    python scripts/bench_audio.py --quick    # 2 clips per codec, best of 1

The clips are written first (not timed) into a temp dir: speech-like bursts, 10 s, stereo, 44.1 kHz (Opus
48 kHz), in wav, flac, mp3, m4a/aac, ogg/opus, ogg/vorbis, and mp4 videos with an AAC sound track. Every
contender runs in this one process on one thread (BLAS and torch pinned to one), on the same files, warm in the
page cache; CPU counts this process and its children (librosa runs the ffmpeg command for m4a and video):

- ``probe``: what the build does per clip (probe_audio + loaded_num_samples: libsndfile's header, or for
  m4a/aac and a video's sound track the ffmpeg path, which decodes to count);
- ``decode``: packer's reader, decode_audio to 16 kHz (counting by decoding and resampling);
- ``librosa``: the reference loader, librosa.load(path, sr=16000) (FFmpegAudioFile for a video).

Then features per clip of 2, 10 and 30 s at 16 kHz, padded to 30 s (Qwen2-Audio / Qwen2.5-Omni): whisper_log_mel
against the extractor's torch path (what runs when torch is installed) and its numpy path.
Prints markdown tables and a JSON line.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.media.audio import decode_audio, loaded_num_samples, probe_audio  # noqa: E402
from packer.models.shared.audio_features import whisper_log_mel  # noqa: E402
from tests.media.audio_clips import signal, write_clip, write_video  # noqa: E402

CODECS = ["wav", "flac", "mp3", "m4a", "opus", "ogg", "mp4"]


def cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best(fn, items, repeats: int) -> tuple[float, float]:
    """(wall, cpu) seconds per item, the best pass of ``repeats``."""
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), cpu()
        for item in items:
            fn(item)
        walls.append((time.perf_counter() - w0) / len(items))
        cpus.append((cpu() - c0) / len(items))
    return min(walls), min(cpus)


def ffmpeg_on_path(tmp: Path) -> None:
    import audioread
    import imageio_ffmpeg

    (tmp / "bin").mkdir()
    (tmp / "bin" / "ffmpeg").symlink_to(imageio_ffmpeg.get_ffmpeg_exe())
    os.environ["PATH"] = f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}"
    audioread.available_backends(flush_cache=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    per_codec, repeats = (2, 1) if args.quick else (6, 3)
    import audioread
    import librosa
    import torch
    import transformers.models.whisper.feature_extraction_whisper as W
    from transformers import WhisperFeatureExtractor

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    out: dict = {"counting": {}, "features": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ffmpeg_on_path(tmp)
        clips: dict[str, list[str]] = {}
        for codec in CODECS:
            rate = 48000 if codec == "opus" else 44100
            clips[codec] = []
            for i in range(per_codec):
                path = tmp / f"c{i}.{codec}"
                if codec == "mp4":
                    write_video(path, seconds=10.0, sample_rate=rate, channels=2, fps=5, size=(64, 48))
                else:
                    write_clip(path, signal("speech", rate, 10.0 + 0.37 * i, channels=2, seed=i), rate)
                clips[codec].append(str(path))

        print("| codec | probe ms CPU | clips / CPU-s | decode + resample ms CPU | librosa.load ms CPU | "
              "decode / probe |")
        print("| --- | --- | --- | --- | --- | --- |")
        for codec, paths in clips.items():
            video = codec == "mp4"
            for p in paths:  # the counts agree (the tests prove it on every codec; this guards the bench)
                ref = (librosa.load(audioread.ffdec.FFmpegAudioFile(p), sr=16000)[0] if video
                       else librosa.load(p, sr=16000)[0])
                assert loaded_num_samples(probe_audio(p, video=video), 16000) == len(ref)
            _, probe_cpu = best(lambda p, v=video: loaded_num_samples(probe_audio(p, video=v), 16000), paths,
                                repeats)
            _, decode_cpu = best(lambda p, v=video: decode_audio(p, target_sr=16000, video=v), paths, repeats)
            if video:
                _, librosa_cpu = best(lambda p: librosa.load(audioread.ffdec.FFmpegAudioFile(p), sr=16000), paths,
                                      repeats)
            else:
                _, librosa_cpu = best(lambda p: librosa.load(p, sr=16000), paths, repeats)
            out["counting"][codec] = {"probe_ms": probe_cpu * 1e3, "decode_ms": decode_cpu * 1e3,
                                      "librosa_ms": librosa_cpu * 1e3}
            print(f"| {codec} | {probe_cpu * 1e3:.2f} | {1 / probe_cpu:,.0f} | {decode_cpu * 1e3:.1f} | "
                  f"{librosa_cpu * 1e3:.1f} | {decode_cpu / probe_cpu:.0f}x |")

    fe = WhisperFeatureExtractor(feature_size=128)

    def hf(audio, torch_path: bool):
        saved = W.is_torch_available
        W.is_torch_available = (lambda: True) if torch_path else (lambda: False)
        try:
            return fe(audio, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                      return_tensors="np")
        finally:
            W.is_torch_available = saved

    print()
    print("| clip | whisper_log_mel ms CPU | extractor, torch path | extractor, numpy path | torch / ours | "
          "numpy / ours |")
    print("| --- | --- | --- | --- | --- | --- |")
    for seconds in (2, 10, 30):
        audios = [signal("speech", 16000, seconds + 0.01 * i, seed=i)[:, 0] for i in range(5)]
        _, ours = best(lambda a: whisper_log_mel(a), audios, repeats)
        _, torch_cpu = best(lambda a: hf(a, True), audios, repeats)
        _, numpy_cpu = best(lambda a: hf(a, False), audios, repeats)
        out["features"][f"{seconds}s"] = {"ours_ms": ours * 1e3, "torch_ms": torch_cpu * 1e3,
                                          "numpy_ms": numpy_cpu * 1e3}
        print(f"| {seconds} s | {ours * 1e3:.1f} | {torch_cpu * 1e3:.1f} | {numpy_cpu * 1e3:.1f} | "
              f"{torch_cpu / ours:.1f}x | {numpy_cpu / ours:.1f}x |")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
