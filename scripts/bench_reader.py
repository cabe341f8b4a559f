"""Reader throughput: shard rows -> collated torch tensors, in one process (= one DataLoader worker).

Text: a synthetic shard set of real token ids (COCO captions tokenized with the qwen2-vl tokenizer, so
zstd sees realistic data), written by packer's own writer. Images: an existing image build (e.g. the COCO
demo) read with pixel decoding by the profile's HF image processor. Videos (``--videos N``): N H.264 clips
written with PyAV (a moving 640x480 window over COCO photos, 30 fps), built with each ``--video-profiles``
profile at qwen-vl-utils' defaults (2 fps), and read back: sampled frames decoded (PyAV, only the planned
ones) and turned into ``pixel_values_videos`` per worker, with the time split between the two.

    python scripts/bench_reader.py --rows 2000 --row-tokens 8192
    python scripts/bench_reader.py --image-data demo_out/caption_trees
    python scripts/bench_reader.py --rows 0 --videos 8 --video-seconds 10
    python scripts/bench_reader.py --rows 1000 --mrope     # qwen2-vl rows: the same rows as v5 and v6 shards

``--mrope``: the text rows with qwen2-vl's mRoPE positions (t = h = w, and a vision-like stretch of 64-1024
tokens with h, w apart in ~30% of the examples: a patch grid's positions, no pixels), written once as schema v5
(the dense column) and once as v6 (sparse, densified on read), the two read alternately ``--repeat`` times each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.config import BuildConfig  # noqa: E402
from packer.core.types import IGNORE_INDEX, Encoded  # noqa: E402
from packer.shards.assemble import assemble_packs, encoded_table  # noqa: E402
from packer.shards.io import write_json_atomic, write_shard  # noqa: E402
from packer.shards.mrope import to_dense  # noqa: E402
from packer.shards.schema import SCHEMA_VERSION, SCHEMAS, Manifest, ShardEntry  # noqa: E402
from packer.train.data.collate import collate  # noqa: E402
from packer.train.data.dataset import PackedDataset  # noqa: E402


def caption_token_pool(coco: Path) -> np.ndarray:
    from packer.encode.tokenizers import load_tokenizer

    tok = load_tokenizer("qwen2-vl")
    caps = json.loads((coco / "annotations" / "captions_train2017.json").read_text())["annotations"]
    per_caption = tok([c["caption"] for c in caps]).input_ids
    rng = np.random.default_rng(0)
    # captions in random order until the pool is long enough to cut any example from (a plain tile would
    # repeat with a short period and let zstd compress unrealistically well)
    order = rng.integers(0, len(per_caption), size=400_000 // 10)
    return np.concatenate([np.asarray(per_caption[i], dtype=np.int32) for i in order])


def _mrope(length: int, rng: np.random.Generator) -> np.ndarray:
    """(3, length) qwen2-vl-like positions: t = h = w counting up, and in ~30% of examples a stretch of 64-1024
    tokens laid out as a patch grid (t fixed, h and w apart), after which the text continues from its max + 1."""
    pos = np.repeat(np.arange(length, dtype=np.int32)[None], 3, axis=0)
    if length > 80 and rng.random() < 0.3:
        n = int(min(length - 16, rng.integers(64, 1025)))
        w = 16
        a = int(rng.integers(1, length - n))
        k = np.arange(n)
        pos[0, a:a + n] = a
        pos[1, a:a + n] = a + k // w
        pos[2, a:a + n] = a + k % w
        top = int(pos[:, a:a + n].max()) + 1
        pos[:, a + n:] = top + np.arange(length - a - n)
    return pos


def write_text_shards(root: Path, pool: np.ndarray, rows: int, row_tokens: int, seed: int = 0, *,
                      mrope: bool = False, version: int = SCHEMA_VERSION) -> int:
    """Rows of ~row_tokens tokens made of lognormal-length examples cut from the token pool; ``mrope``: with
    qwen2-vl-like positions (``_mrope``), written as schema ``version`` (5: the dense column, 6: sparse)."""
    rng = np.random.default_rng(seed)
    examples, sizes, total = [], [], 0
    for _ in range(rows):
        left, n = row_tokens, 0
        while left > 1:
            length = int(min(left, max(2, rng.lognormal(np.log(300), 1.0))))
            start = int(rng.integers(0, len(pool) - length))
            ids = pool[start : start + length]
            labels = ids.copy()
            labels[0] = IGNORE_INDEX
            examples.append(Encoded(example_id=f"synthetic:{len(examples) + 1}", input_ids=ids, labels=labels,
                                    position_ids=np.arange(length, dtype=np.int32),
                                    node_offsets=np.zeros(1, np.int32), node_parents=np.full(1, -1, np.int32),
                                    images=[], mrope_position_ids=_mrope(length, rng) if mrope else None))
            left -= length
            n += 1
            total += length
        sizes.append(n)
    root.mkdir(parents=True, exist_ok=True)
    entries, start, per_shard = [], 0, 512
    for s, p0 in enumerate(range(0, rows, per_shard)):
        n_ex = sum(sizes[p0 : p0 + per_shard])
        packed = assemble_packs(encoded_table(examples[start : start + n_ex]), np.array(sizes[p0 : p0 + per_shard]))
        if version == 5:  # the same rows as v5 stored them: the dense mRoPE column
            packed = to_dense(packed)
            packed = packed.from_arrays(packed.columns, schema=SCHEMAS[5])
        entries.append(write_shard(packed, root / f"shard-{s:05d}.parquet", rows_per_row_group=64))
        start += n_ex
    write_json_atomic(root / "stats.json", {})
    profile = "qwen2-vl" if mrope else "text"
    manifest = Manifest(schema_version=version, profile=profile, shards=tuple(ShardEntry(**e) for e in entries),
                        config=BuildConfig.from_inputs(["synthetic.jsonl"], str(root), profile=profile))
    write_json_atomic(root / "manifest.json", manifest.to_dict())
    return total


def time_reader(path: Path, *, load_images: bool, limit: int | None = None) -> dict[str, float]:
    ds = PackedDataset(path, shuffle=True, seed=0, load_images=load_images)
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = rows = images = 0
    for row in ds:
        batch = collate([row])
        tokens += batch["input_ids"].shape[1]
        images += len(row["images"])
        rows += 1
        if limit and rows >= limit:
            break
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {"rows": rows, "tokens": tokens, "images": images, "seconds": dt, "tokens_per_cpu_s": tokens / cpu,
            "tokens_per_s": tokens / dt, "rows_per_s": rows / dt, "images_per_s": images / dt}


def write_video_corpus(root: Path, coco: Path, *, videos: int, seconds: float, fps: int = 30) -> Path:
    """``videos`` clips of 640x480 at ``fps`` (a window panning over a COCO photo, a new photo every 2 s) and a
    JSONL of one question per clip; returns the JSONL."""
    import av
    from PIL import Image

    photos = sorted((coco / "val2017").glob("*.jpg"))
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for v in range(videos):
        path = root / f"clip{v}.mp4"
        with av.open(str(path), "w") as out:
            stream = out.add_stream("libx264", rate=fps)
            stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
            for i in range(int(seconds * fps)):
                if i % (2 * fps) == 0:  # a new photo, 800x600, panned across by the 640x480 window
                    photo = np.asarray(Image.open(photos[(v * 7 + i // (2 * fps)) % len(photos)]).convert("RGB")
                                       .resize((800, 600), Image.BICUBIC))
                x, y = (i * 3) % 160, (i * 2) % 120
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(photo[y : y + 480, x : x + 640]), format="rgb24")
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        records.append({"messages": [{"role": "user", "content": [{"type": "video", "video": path.name},
                                                                  {"type": "text", "text": "What happens?"}]},
                                     {"role": "assistant", "content": "A slow pan over a photo."}]})
    data = root / "videos.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    return data


def time_videos(path: Path) -> dict[str, float]:
    """One worker reading video rows: frames decoded (the planned ones only) and the whole collate, timed."""
    from packer.media import video as media

    decode_s = 0.0
    real_decode = media.decode_frames

    def timed_decode(*args, **kwargs):  # the reader's only decoding call, timed in place
        nonlocal decode_s
        t = time.perf_counter()
        try:
            return real_decode(*args, **kwargs)
        finally:
            decode_s += time.perf_counter() - t

    media.decode_frames = timed_decode
    try:
        ds = PackedDataset(path, shuffle=False, load_images=True)
        t0 = time.perf_counter()
        frames = videos = rows = patches = 0
        for row in ds:
            batch = collate([row])
            frames += sum(len(v["frame_indices"]) for v in row["videos"])
            videos += len(row["videos"])
            patches += int(batch["pixel_values_videos"].shape[0]) if "pixel_values_videos" in batch else 0
            rows += 1
        dt = time.perf_counter() - t0
    finally:
        media.decode_frames = real_decode
    return {"rows": rows, "videos": videos, "frames": frames, "patches": patches, "seconds": dt,
            "frames_per_s": frames / dt, "decode_share": decode_s / dt, "decode_frames_per_s": frames / decode_s}


def time_codec_threads(clips: list[Path], *, fps: float = 2.0, rounds: int = 2, passes: int = 3) -> list[dict]:
    """``decode_frames`` of each clip's frames at ``fps`` as it is, and with PyAV's codec threads
    (``thread_type = "AUTO"``) on its stream; interleaved rounds, wall and CPU seconds, pixels checked equal."""
    import av
    import numpy as np

    from packer.media import video as media

    real_stream = media._video_stream

    def threaded_stream(container):  # the one place decode_frames gets its stream
        stream = real_stream(container)
        if stream is not None:
            stream.thread_type = "AUTO"
        return stream

    plans = []
    for clip in clips:
        with av.open(str(clip)) as c:
            s = c.streams.video[0]
            step = max(1, round(float(s.average_rate) / fps))
            plans.append((str(clip), list(range(0, s.frames, step))))
    out = []
    for r in range(rounds):
        for threaded in (False, True):
            media._video_stream = threaded_stream if threaded else real_stream
            try:
                w, c = time.perf_counter(), time.process_time()
                pixels = [media.decode_frames(path, idx) for _ in range(passes) for path, idx in plans]
                out.append({"round": r, "threaded": threaded, "wall_s": time.perf_counter() - w,
                            "cpu_s": time.process_time() - c, "checksum": int(sum(int(np.sum(p)) for p in pixels))})
            finally:
                media._video_stream = real_stream
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--row-tokens", type=int, default=8192)
    ap.add_argument("--coco", type=Path, default=Path(os.environ.get("PACKER_SHARED", "../shared")) / "data" / "coco-mini")
    ap.add_argument("--image-data", type=Path, help="an image build to time with pixel decoding")
    ap.add_argument("--repeat", type=int, default=3, help="text passes; the best is reported")
    ap.add_argument("--videos", type=int, default=0, help="video clips to write, build and read (0: none)")
    ap.add_argument("--video-seconds", type=float, default=10.0)
    ap.add_argument("--video-profiles", nargs="+", default=["qwen2-vl", "qwen3-vl"])
    ap.add_argument("--mrope", action="store_true", help="the text rows with mRoPE positions, as v5 and v6 shards")
    ap.add_argument("--codec-threads", action="store_true",
                    help="with --videos: decode_frames with and without PyAV's codec threads, interleaved")
    args = ap.parse_args()

    if args.videos:
        from packer.pipeline.build import build

        with tempfile.TemporaryDirectory() as tmp:
            data = write_video_corpus(Path(tmp) / "clips", args.coco, videos=args.videos, seconds=args.video_seconds)
            if args.codec_threads:
                for r in time_codec_threads(sorted((Path(tmp) / "clips").glob("*.mp4"))):
                    print(f"decode_frames, round {r['round']}, {'codec threads' if r['threaded'] else 'plain        '}: "
                          f"{r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} CPU-s (pixel checksum {r['checksum']})")
            for profile in args.video_profiles:
                out = Path(tmp) / profile
                build(BuildConfig.from_inputs([str(data)], str(out), profile=profile, max_length=32768), progress=False)
                r = time_videos(out)
                print(json.dumps({"profile": profile, **{k: round(v, 3) if isinstance(v, float) else v
                                                        for k, v in r.items()}}))
                print(f"{profile}: {r['frames_per_s']:.1f} sampled frames/s per worker end to end "
                      f"({r['videos']} clips of {args.video_seconds:g} s, {r['frames']} frames, {r['patches']} patches); "
                      f"decoding alone {r['decode_frames_per_s']:.1f} frames/s, {100 * r['decode_share']:.0f}% of the time")
    if args.rows <= 0:
        return
    if args.mrope:
        pool = caption_token_pool(args.coco)
        with tempfile.TemporaryDirectory() as tmp:
            roots = {v: Path(tmp) / f"v{v}" for v in (5, 6)}
            for v, root in roots.items():
                total = write_text_shards(root, pool, args.rows, args.row_tokens, mrope=True, version=v)
            runs: dict[int, list[dict]] = {5: [], 6: []}
            for _ in range(args.repeat):  # alternated: the box's load falls on both alike
                for v, root in roots.items():
                    runs[v].append(time_reader(root, load_images=False))
            for v, root in roots.items():
                size = sum(f.stat().st_size for f in root.glob("*.parquet"))
                best = max(runs[v], key=lambda r: r["tokens_per_cpu_s"])
                print(f"mrope rows, schema v{v}: {args.rows} rows, {total:,} tokens, {size / 2**20:.1f} MiB; "
                      f"{best['tokens_per_cpu_s'] / 1e6:.2f}M tokens per CPU-s ({best['tokens_per_s'] / 1e6:.2f}M/s "
                      f"wall), {best['rows_per_s']:,.0f} rows/s per worker (best of {args.repeat}; each: "
                      + ", ".join(f"{r['tokens_per_cpu_s'] / 1e6:.2f}" for r in runs[v]) + ")")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "text"
        total = write_text_shards(root, caption_token_pool(args.coco), args.rows, args.row_tokens)
        size = sum(f.stat().st_size for f in root.glob("*.parquet"))
        print(f"text shards: {args.rows} rows, {total:,} tokens, {size / 2**20:.1f} MiB on disk "
              f"({8 * size / total:.1f} bits/token incl. labels and positions)")
        best = max((time_reader(root, load_images=False) for _ in range(args.repeat)), key=lambda r: r["tokens_per_s"])
        print(f"text: {best['tokens_per_s'] / 1e6:.1f}M tokens/s, {best['rows_per_s']:,.0f} rows/s per worker "
              f"(target >= 50M tokens/s)")
    if args.image_data:
        r = time_reader(args.image_data, load_images=True)
        print(f"images ({args.image_data}): {r['images_per_s']:.1f} images/s, {r['tokens_per_s'] / 1e3:.1f}k tokens/s, "
              f"{r['rows']} rows per worker, with the profile's HF image processor")
        m = time_reader(args.image_data, load_images=False)
        print(f"same rows without pixel decoding: {m['tokens_per_s'] / 1e6:.2f}M tokens/s")


if __name__ == "__main__":
    main()
