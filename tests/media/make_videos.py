"""Test videos, written with PyAV in a few seconds: no downloads, nothing stored in the repo.

Frame i of every clip is one flat grey level, ``level(i)``, so a decoded frame says which frame it is (flat
frames survive H.264 within a few levels). ``make_test_videos`` writes the whole set used by
tests/media/test_video.py and scripts/bench_video_probe.py.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image


def level(i: int) -> int:
    """Grey level of frame i: 16..239, and consecutive frames differ by 67 (mod 224)."""
    return 16 + (i * 67) % 224


def _flat(i: int, width: int, height: int) -> np.ndarray:
    return np.full((height, width, 3), level(i), np.uint8)  # (H, W, 3)


def write_clip(
    path: Path, *, fps: Fraction | int, frames: int, width: int, height: int, codec: str = "libx264",
    pix_fmt: str = "yuv420p", gop: int | None = None, options: dict | None = None, images=None,
) -> Path:
    """A constant-rate clip of ``frames`` frames (flat levels, or ``images``: (H, W, 3) arrays in order)."""
    with av.open(str(path), "w", options=options or {}) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if gop:
            stream.codec_context.gop_size = gop
        for i in range(frames):
            pixels = _flat(i, width, height) if images is None else images[i]
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def write_vfr(path: Path, *, gaps_ms: list[int], width: int = 64, height: int = 48) -> Path:
    """A variable-frame-rate mp4: frame i+1 comes gaps_ms[i] milliseconds after frame i."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        pts = 0
        for i, gap in enumerate([*gaps_ms, 0]):
            frame = av.VideoFrame.from_ndarray(_flat(i, width, height), format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
            pts += gap
        for packet in stream.encode():
            out.mux(packet)
    return path


def write_audio_first(path: Path, *, fps: int, frames: int, width: int, height: int) -> Path:
    """A clip whose first stream is audio: the video is stream 1, found by av_find_best_stream."""
    with av.open(str(path), "w") as out:
        audio = out.add_stream("aac", rate=16000)
        video = out.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            for packet in video.encode(av.VideoFrame.from_ndarray(_flat(i, width, height), format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        _silence(out, audio, chunks=frames * 16000 // fps // 1024)
    return path


def _silence(out, stream, chunks: int = 10) -> None:
    frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
    frame.sample_rate = 16000
    for i in range(chunks):
        frame.pts = i * 1024
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)


def write_audio_only(path: Path) -> Path:
    """An AAC file (.m4a): a readable container without a video stream."""
    with av.open(str(path), "w") as out:
        _silence(out, out.add_stream("aac", rate=16000))
    return path


def write_audio_with_cover(path: Path) -> Path:
    """An mp3 with album art: its only video stream is a cover image (disposition attached_pic)."""
    with av.open(str(path), "w") as out:
        audio = out.add_stream("mp3", rate=44100)
        cover = out.add_stream("mjpeg", rate=1)
        cover.width, cover.height, cover.pix_fmt = 64, 64, "yuvj420p"
        cover.disposition = av.stream.Disposition.attached_pic
        for packet in cover.encode(av.VideoFrame.from_ndarray(_flat(0, 64, 64), format="rgb24")):
            out.mux(packet)
        for packet in cover.encode():
            out.mux(packet)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1152), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 44100
        for i in range(10):
            frame.pts = i * 1152
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode():
            out.mux(packet)
    return path


def write_without_frames(path: Path) -> Path:
    """A Matroska file whose video stream has no packets (the audio stream carries the file)."""
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=30)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        _silence(out, out.add_stream("aac", rate=16000))
    return path


def truncate(src: Path, dst: Path, fraction: float = 0.5) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


def slideshow_frames(images: list[Path], *, width: int, height: int) -> list[np.ndarray]:
    """COCO photos resized to one frame size, RGB (H, W, 3) each."""
    return [np.asarray(Image.open(p).convert("RGB").resize((width, height), Image.BICUBIC)) for p in images]


# name -> how it is made; GOOD clips are probed and planned, the rest are rejects.
GOOD = (
    "24fps_2s_320x240.mp4",
    "25fps_0.5s_176x144.mp4",
    "30fps_20s_96x64.mp4",
    "29.97fps_3s_321x241.mp4",
    "30fps_1s_99x57.mkv",
    "24fps_1.5s_160x90.webm",
    "vfr_4s_64x48.mp4",
    "vfr_4s_64x48.mkv",
    "30fps_1s_80x60_mjpeg.avi",
    "audio_first_25fps_2s_64x48.mp4",
    "slideshow_coco_1fps_6s_320x240.mp4",
)


def make_test_videos(root: Path, coco_images: list[Path]) -> dict[str, Path]:
    """Every test video, written under ``root`` (about 2 s, 1.5 MB)."""
    root.mkdir(parents=True, exist_ok=True)
    v = {}
    v["24fps_2s_320x240.mp4"] = write_clip(root / "24fps_2s_320x240.mp4", fps=24, frames=48, width=320, height=240)
    v["25fps_0.5s_176x144.mp4"] = write_clip(root / "25fps_0.5s_176x144.mp4", fps=25, frames=12, width=176, height=144)
    # 600 frames, a keyframe every 30: decode_frames has GOPs to seek between
    v["30fps_20s_96x64.mp4"] = write_clip(root / "30fps_20s_96x64.mp4", fps=30, frames=600, width=96, height=64, gop=30)
    # NTSC 30000/1001 fps at an odd size (4:4:4, since 4:2:0 needs even sides)
    v["29.97fps_3s_321x241.mp4"] = write_clip(
        root / "29.97fps_3s_321x241.mp4", fps=Fraction(30000, 1001), frames=90, width=321, height=241, pix_fmt="yuv444p"
    )
    # Matroska and WebM carry no frame count: probe counts packets
    v["30fps_1s_99x57.mkv"] = write_clip(root / "30fps_1s_99x57.mkv", fps=30, frames=30, width=99, height=57, pix_fmt="yuv444p")
    v["24fps_1.5s_160x90.webm"] = write_clip(root / "24fps_1.5s_160x90.webm", fps=24, frames=36, width=160, height=90, codec="libvpx-vp9")
    # 21 frames 33 ms apart, then 19 more 167 ms apart; the mp4 header says 40 frames at 11.1 fps on average
    v["vfr_4s_64x48.mp4"] = write_vfr(root / "vfr_4s_64x48.mp4", gaps_ms=[33] * 20 + [167] * 19)
    # in Matroska the header's rate is the nominal 30 fps whatever the gaps; decord and packer both use it
    v["vfr_4s_64x48.mkv"] = write_vfr(root / "vfr_4s_64x48.mkv", gaps_ms=[33] * 20 + [167] * 19)
    v["30fps_1s_80x60_mjpeg.avi"] = write_clip(
        root / "30fps_1s_80x60_mjpeg.avi", fps=30, frames=30, width=80, height=60, codec="mjpeg", pix_fmt="yuvj420p"
    )
    v["audio_first_25fps_2s_64x48.mp4"] = write_audio_first(
        root / "audio_first_25fps_2s_64x48.mp4", fps=25, frames=50, width=64, height=48
    )
    photos = slideshow_frames(coco_images[:6], width=320, height=240)
    v["slideshow_coco_1fps_6s_320x240.mp4"] = write_clip(
        root / "slideshow_coco_1fps_6s_320x240.mp4", fps=1, frames=6, width=320, height=240, images=photos
    )
    # rejects
    v["one_frame.mp4"] = write_clip(root / "one_frame.mp4", fps=30, frames=1, width=64, height=48)
    v["ratio_225_900x4.mp4"] = write_clip(root / "ratio_225_900x4.mp4", fps=10, frames=4, width=900, height=4, pix_fmt="yuv444p")
    v["audio_only.m4a"] = write_audio_only(root / "audio_only.m4a")
    v["audio_with_cover.mp3"] = write_audio_with_cover(root / "audio_with_cover.mp3")
    v["no_frames.mkv"] = write_without_frames(root / "no_frames.mkv")
    faststart = write_clip(
        root / "faststart.mp4", fps=30, frames=60, width=64, height=48, options={"movflags": "+faststart"},
        images=[np.random.default_rng(i).integers(0, 256, (48, 64, 3), np.uint8) for i in range(60)],
    )
    v["truncated_faststart.mp4"] = truncate(faststart, root / "truncated_faststart.mp4")
    v["truncated_moov_last.mp4"] = truncate(v["24fps_2s_320x240.mp4"], root / "truncated_moov_last.mp4")
    (root / "text.mp4").write_text("not a video\n")
    v["text.mp4"] = root / "text.mp4"
    (root / "empty.mp4").write_bytes(b"")
    v["empty.mp4"] = root / "empty.mp4"
    return v
