"""Videos in a build: records encoded per CPU-second from headers vs decoding each clip to count, and packing
on a mixed video/image/text corpus.

    python scripts/bench_video.py             # 9 clips, ~2-3 min on a busy 2-core machine
    python scripts/bench_video.py --clips 3   # quicker

Part 1, in this one process, single-threaded, on the same clips (made first, not timed: bench_video_probe's
panned COCO photos, 10 s 640x360 mp4, 5 s 1280x720 mp4, 10 s 640x360 Matroska):

- ``encode from headers``: what the build does per video record: ``Encoder.encode_batch`` on chat records
  naming each clip (parse, template, tokenizer, header probe, frame plan, <|video_pad|> expansion, Qwen2.5-VL
  mRoPE); the probe cache is cleared each pass, so every clip's header is read;
- ``decode to count``: decode every frame of the clip (what a pipeline that runs the processor to count does;
  one decoder thread), nothing else.

Part 2: ``packer build`` (qwen2.5-vl) of a mixed corpus: the clips under several sampling options (fps 1/2,
windows, pixel caps), COCO caption records and lognormal text, with a vision budget; prints packing
efficiency and the spread of image, video and vision tokens per pack, without and with ``balance_vision``
(the planner spreads vision tokens evenly over packs). Prints markdown tables and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_video_probe import COCO, count_by_decode, make_clips  # noqa: E402

from packer.config import BuildConfig  # noqa: E402
from packer.encode.encoder import Encoder  # noqa: E402
from packer.encode.tokenizers import load_tokenizer  # noqa: E402
from packer.formats import parse_record  # noqa: E402
from packer.media import video  # noqa: E402
from packer.models import get_profile  # noqa: E402
from packer.pipeline.build import build  # noqa: E402


def record(clip: str, **options) -> dict:
    return {"messages": [
        {"role": "user", "content": [{"type": "video", "video": clip, **options}, {"type": "text", "text": "What happens?"}]},
        {"role": "assistant", "content": "A photograph pans slowly upward."}]}


def best(fn, repeats: int) -> tuple[float, float]:
    """(best wall s, best CPU s) of ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        video._probe_file.cache_clear()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def mixed_corpus(root: Path, clips: list[str], rng: np.random.Generator) -> Path:
    photos = sorted(COCO.glob("*/*.jpg"))
    options = [{}, {"fps": 1}, {"video_start": 2.0, "video_end": 6.0}, {"max_pixels": 160 * 28 * 28}]
    words = "a the cat dog bus red street people kitchen table sitting near two with".split()
    recs = [record(c, **o) for c in clips for o in options]
    for i, photo in enumerate(photos[:120]):
        recs.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": str(photo)}, {"type": "text", "text": "Caption it."}]},
            {"role": "assistant", "content": " ".join(rng.choice(words, size=8 + i % 20))}]})
    for n in np.clip(rng.lognormal(5.5, 1.0, size=300), 8, 3000).astype(int):
        recs.append({"messages": [{"role": "user", "content": " ".join(rng.choice(words, size=n // 2))},
                                  {"role": "assistant", "content": " ".join(rng.choice(words, size=n // 2))}]})
    order = rng.permutation(len(recs))
    data = root / "mixed.jsonl"
    data.write_text("".join(json.dumps(recs[i]) + "\n" for i in order))
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--max-vision-tokens", type=int, default=6144)
    args = parser.parse_args(argv)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clips = [str(p) for p in make_clips(root, args.clips)]
        frames = sum(count_by_decode(c) for c in clips)  # warms the page cache
        encoder = Encoder(load_tokenizer("qwen2-vl"), get_profile("qwen2.5-vl"))
        examples = [parse_record(record(c), path="bench.jsonl", line=i + 1, base_dir=tmp) for i, c in enumerate(clips)]
        encoded = encoder.encode_batch(examples)
        assert not any(isinstance(e, Exception) for e in encoded), encoded
        tokens = sum(e.num_video_tokens for e in encoded)
        enc_wall, enc_cpu = best(lambda: encoder.encode_batch(examples), args.repeats * 10)
        dec_wall, dec_cpu = best(lambda: [count_by_decode(c) for c in clips], max(1, args.repeats // 2))
        n = len(clips)
        out["count"] = {
            "clips": n, "frames": frames, "video_tokens": tokens,
            "encode_from_headers": {"ms_per_video_cpu": 1e3 * enc_cpu / n, "videos_per_cpu_s": n / enc_cpu,
                                    "ms_per_video_wall": 1e3 * enc_wall / n},
            "decode_to_count": {"ms_per_video_cpu": 1e3 * dec_cpu / n, "videos_per_cpu_s": n / dec_cpu,
                                "ms_per_video_wall": 1e3 * dec_wall / n},
        }
        data = mixed_corpus(root, clips, np.random.default_rng(0))
        for balance in (False, True):
            config = BuildConfig.from_inputs([str(data)], str(root / f"out-{balance}"), profile="qwen2.5-vl",
                                             max_length=args.max_length, max_vision_tokens=args.max_vision_tokens,
                                             max_pixels=512 * 28 * 28, balance_vision=balance)
            stats = build(config, progress=False).stats
            key = "pack_balanced" if balance else "pack"
            out[key] = {k: stats[k] for k in ("examples", "packs", "efficiency", "lower_bound_packs", "tokens",
                                              "vision_tokens", "video_tokens", "image_tokens", "rejected")}
            for k in ("vision_tokens_per_pack", "video_tokens_per_pack", "image_tokens_per_pack"):
                out[key][k] = stats[k]
    c = out["count"]
    print(f"{n} clips, {frames} frames, {tokens} video tokens (qwen2.5-vl defaults), best of {args.repeats * 10} "
          f"(encode) / {max(1, args.repeats // 2)} (decode)\n")
    print("| contender | CPU per video | wall per video | videos per CPU-second |")
    print("| --- | ---: | ---: | ---: |")
    for name, key in (("encode from headers (probe + plan + render + tokenize + mRoPE)", "encode_from_headers"),
                      ("decode every frame to count", "decode_to_count")):
        r = c[key]
        print(f"| {name} | {r['ms_per_video_cpu']:.2f} ms | {r['ms_per_video_wall']:.2f} ms | {r['videos_per_cpu_s']:,.0f} |")
    p = out["pack"]
    print(f"\nmixed corpus: {p['examples']} examples ({p['rejected']} rejected), {p['tokens']:,} tokens of which "
          f"{p['video_tokens']:,} video and {p['image_tokens']:,} image; packs of {args.max_length}, vision budget "
          f"{args.max_vision_tokens}, lower bound {p['lower_bound_packs']} packs\n")
    print("| planner | packs | efficiency | vision / pack: mean, std, max | video / pack: std | image / pack: std |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, key in (("dual budget (tokens + vision)", "pack"), ("dual budget + balance_vision", "pack_balanced")):
        q = out[key]
        v = q["vision_tokens_per_pack"]
        print(f"| {name} | {q['packs']} | {100 * q['efficiency']:.2f}% | {v['mean']:,.0f}, {v['std']:,.0f}, {v['max']:,} "
              f"| {q['video_tokens_per_pack']['std']:,.0f} | {q['image_tokens_per_pack']['std']:,.0f} |")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
