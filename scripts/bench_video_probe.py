"""Build-time video counting: videos/s per core from headers (packer.media.video.probe) against decoding.

    python scripts/bench_video_probe.py                 # 12 clips, best of 5, ~1 min
    python scripts/bench_video_probe.py --quick         # 4 clips, best of 2

The clips are written first (not timed) into a temp dir: natural content (a COCO photo panned under a
640x360 window, or the same scaled to 1280x720), H.264 in mp4 (frame count in the header) and in Matroska
(no count: probe demuxes packets). Every contender runs in this one process, single-threaded, on the same
files, warm in the page cache:

- ``probe``: what the build does per video (os.stat, open, headers; the per-file cache is cleared each pass);
- ``demux``: open and count the video packets without decoding (decord's frame index);
- ``decode``: open and decode every frame to count it (what a pipeline that runs the processor does; one
  decoder thread, so per core).

Prints a markdown table (wall and CPU per video, videos/s) and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.media import video  # noqa: E402

SHARED = Path(os.environ.get("PACKER_SHARED", Path(__file__).resolve().parents[2] / "shared"))
COCO = SHARED / "data" / "coco-mini"


def write_pan(path: Path, photo: Path, *, seconds: float, fps: int, width: int, height: int) -> Path:
    """A clip of a photo slowly panned under a width x height window (realistic content, cheap to make)."""
    image = np.asarray(Image.open(photo).convert("RGB").resize((width, height * 4 // 3), Image.BICUBIC))
    frames = int(seconds * fps)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            top = (i * (image.shape[0] - height)) // max(frames - 1, 1)
            pixels = np.ascontiguousarray(image[top : top + height])  # (H, W, 3)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def make_clips(root: Path, n: int) -> list[Path]:
    photos = sorted((COCO / "val2017").glob("*.jpg")) or sorted(COCO.glob("*/*.jpg"))
    specs = [  # (suffix, seconds, fps, width, height)
        (".mp4", 10, 30, 640, 360),
        (".mp4", 5, 30, 1280, 720),
        (".mkv", 10, 30, 640, 360),
    ]
    clips = []
    for i in range(n):
        suffix, seconds, fps, width, height = specs[i % len(specs)]
        clips.append(write_pan(root / f"clip{i:02d}{suffix}", photos[i % len(photos)],
                               seconds=seconds, fps=fps, width=width, height=height))
    return clips


def count_by_demux(path: str) -> int:
    with av.open(path) as container:
        stream = container.streams.best("video")
        return sum(1 for packet in container.demux(stream) if packet.size > 0)


def count_by_decode(path: str) -> int:
    with av.open(path) as container:
        stream = container.streams.best("video")
        stream.codec_context.thread_count = 1  # one core
        return sum(1 for _ in container.decode(stream))


def probe_uncached(path: str) -> int:
    return video.probe(path).num_frames


def timed(fn, paths: list[str], repeats: int) -> tuple[float, float, list[int]]:
    """(best wall s, best CPU s) over ``repeats`` passes of fn over every path, and the counts."""
    best_wall = best_cpu = float("inf")
    counts: list[int] = []
    for _ in range(repeats):
        video._probe_file.cache_clear()
        wall, cpu = time.perf_counter(), time.process_time()
        counts = [fn(p) for p in paths]
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best_wall, best_cpu, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 clips, 2 repeats")
    args = parser.parse_args(argv)
    n, repeats = (4, 2) if args.quick else (args.clips, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        paths = [str(p) for p in make_clips(Path(tmp), n)]
        made = time.perf_counter() - t0
        frames = sum(count_by_decode(p) for p in paths)  # also warms the page cache
        size_mb = sum(os.path.getsize(p) for p in paths) / 2**20
        results = {}
        mp4 = [p for p in paths if p.endswith(".mp4")]
        mkv = [p for p in paths if p.endswith(".mkv")]
        for name, fn, subset, r in [
            ("probe", probe_uncached, paths, repeats * 20),
            ("probe, mp4 only (header count)", probe_uncached, mp4, repeats * 20),
            ("probe, mkv only (packet count)", probe_uncached, mkv, repeats * 20),
            ("demux", count_by_demux, paths, repeats),
            ("decode", count_by_decode, paths, max(1, repeats // 2)),
        ]:
            if not subset:
                continue
            wall, cpu, counts = timed(fn, subset, r)
            if subset is paths:
                assert sum(counts) == frames, (name, sum(counts), frames)  # every contender counts the same frames
            k = len(subset)
            results[name] = {"wall_s_per_video": wall / k, "cpu_s_per_video": cpu / k,
                             "videos_per_s_wall": k / wall, "videos_per_cpu_s": k / cpu if cpu else float("inf")}
    print(f"{n} clips ({frames} frames, {size_mb:.1f} MiB; made in {made:.0f} s), best of {repeats}\n")
    print("| contender | wall per video | CPU per video | videos/s (wall) | videos per CPU-second | vs probe (CPU) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base = results["probe"]["cpu_s_per_video"]
    for name, r in results.items():
        print(f"| {name} | {r['wall_s_per_video'] * 1e3:.2f} ms | {r['cpu_s_per_video'] * 1e3:.2f} ms | "
              f"{r['videos_per_s_wall']:,.0f} | {r['videos_per_cpu_s']:,.0f} | {r['cpu_s_per_video'] / base:,.1f}x |")
    print(json.dumps({"clips": n, "frames": frames, "repeats": repeats, **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
