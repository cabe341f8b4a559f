"""COCO annotations -> packer JSONL: caption trees and grounding conversations.

    python scripts/coco_to_jsonl.py --coco ../shared/data/coco-mini --out DIR

writes two files into DIR (deterministic: same input, same bytes):

``coco_caption_trees.jsonl``  one message tree per image: the shared prefix is the user turn (image +
                              "Describe this image."), each of the image's captions is one branch (an
                              assistant turn). ~5 branches share one image's ~300 vision tokens.
``coco_grounding.jsonl``      one multi-turn conversation per image: "Where is the {category}?" answered in
                              Qwen2-VL's grounding format, boxes normalized to [0, 1000):
                              ``<|object_ref_start|>dog<|object_ref_end|><|box_start|>(x1,y1),(x2,y2)<|box_end|>``
                              (several boxes follow each other for several instances).

``coco_video_trees.jsonl``    with ``--videos N``: N slideshow clips written into DIR/videos (three captioned
                              COCO photos, 2 s each, 448x336 at 12 fps, H.264 via PyAV) and one video message
                              tree per clip: the shared prefix holds the clip, each photo's question and
                              caption is one branch (one clip's ~1.2k video tokens shared by three QA branches).

``coco_spoken_qa.jsonl``      with ``--audio N``: a small spoken-QA set over N COCO images, its clips written into
                              DIR/audio: each caption "spoken" as synthetic speech-like audio (voiced bursts on a
                              gliding pitch, one syllable-like burst per word; numpy + soundfile, no TTS: the
                              words are not intelligible, the lengths and rates are speech's), in wav and flac,
                              mono and stereo, 16 to 44.1 kHz. Per image: a transcription turn (the spoken
                              caption -> its text), a spoken question beside the image, and a message tree whose
                              shared prefix is a spoken caption, one branch per other caption.

Image paths are written relative to DIR (packer resolves them against the JSONL file's directory, so the
files work from any working directory); ``--absolute`` writes absolute paths instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

SPLITS = ("train2017", "val2017")
PROMPT = "Describe this image."
MAX_TURNS = 5  # grounding questions per image: the most salient categories (largest box first)
MAX_BOXES = 8  # a category with more instances is skipped rather than answered partially (wrong labels)


def normalize_box(bbox: list[float], width: int, height: int) -> tuple[int, int, int, int]:
    """COCO [x, y, w, h] in pixels -> Qwen2-VL (x1, y1, x2, y2) as integers in [0, 1000)."""
    x, y, w, h = bbox

    def scale(v: float, size: int) -> int:
        return min(999, max(0, int(v / size * 1000)))

    return scale(x, width), scale(y, height), scale(x + w, width), scale(y + h, height)


def box_text(box: tuple[int, int, int, int]) -> str:
    x1, y1, x2, y2 = box
    return f"<|box_start|>({x1},{y1}),({x2},{y2})<|box_end|>"


def image_path(coco: Path, split: str, file_name: str, out: Path, absolute: bool) -> str:
    path = (coco / split / file_name).resolve()
    return str(path) if absolute else os.path.relpath(path, out.resolve())


def user_image_turn(path: str, text: str) -> dict:
    return {"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": text}]}


def caption_records(coco: Path, out: Path, absolute: bool) -> list[dict]:
    """One tree per captioned image, images in (split, file name) order, captions in annotation-id order."""
    records = []
    for split in SPLITS:
        ann_file = coco / "annotations" / f"captions_{split}.json"
        if not ann_file.exists():
            continue
        data = json.loads(ann_file.read_text())
        captions = defaultdict(list)
        for ann in sorted(data["annotations"], key=lambda a: a["id"]):
            captions[ann["image_id"]].append(
                " ".join(ann["caption"].split())
            )  # COCO captions have stray spaces
        for image in sorted(data["images"], key=lambda im: im["file_name"]):
            if not captions[image["id"]] or not (coco / split / image["file_name"]).is_file():
                continue
            path = image_path(coco, split, image["file_name"], out, absolute)
            records.append(
                {
                    "id": f"coco-{split}-{image['id']}-captions",
                    "messages": [user_image_turn(path, PROMPT)],
                    "branches": [[{"role": "assistant", "content": c}] for c in captions[image["id"]]],
                }
            )
    return records


def grounding_records(coco: Path, out: Path, absolute: bool) -> list[dict]:
    """Up to MAX_TURNS "Where is the X?" turns per image, from the instance boxes (crowd boxes excluded)."""
    records = []
    for split in SPLITS:
        ann_file = coco / "annotations" / f"instances_{split}.json"
        if not ann_file.exists():
            continue
        data = json.loads(ann_file.read_text())
        names = {c["id"]: c["name"] for c in data["categories"]}
        boxes = defaultdict(lambda: defaultdict(list))  # image id -> category id -> [annotation]
        for ann in sorted(data["annotations"], key=lambda a: a["id"]):
            if not ann.get("iscrowd") and ann["bbox"][2] >= 1 and ann["bbox"][3] >= 1:
                boxes[ann["image_id"]][ann["category_id"]].append(ann)
        for image in sorted(data["images"], key=lambda im: im["file_name"]):
            by_cat = boxes.get(image["id"])
            if not by_cat or not (coco / split / image["file_name"]).is_file():
                continue
            # most salient first: the category with the largest box, ties by category id
            cats = sorted(
                (c for c, anns in by_cat.items() if len(anns) <= MAX_BOXES),
                key=lambda c: (-max(a["area"] for a in by_cat[c]), c),
            )[:MAX_TURNS]
            if not cats:
                continue
            path = image_path(coco, split, image["file_name"], out, absolute)
            messages = []
            for i, cat in enumerate(cats):
                name = names[cat]
                anns = by_cat[cat]
                question = (
                    f"Where is the {name}?"
                    if len(anns) == 1
                    else f"Where are the {len(anns)} instances of {name}?"
                )
                answer = f"<|object_ref_start|>{name}<|object_ref_end|>" + "".join(
                    box_text(normalize_box(a["bbox"], image["width"], image["height"])) for a in anns
                )
                messages.append(
                    user_image_turn(path, question) if i == 0 else {"role": "user", "content": question}
                )
                messages.append({"role": "assistant", "content": answer})
            records.append({"id": f"coco-{split}-{image['id']}-grounding", "messages": messages})
    return records


def video_records(coco: Path, out: Path, absolute: bool, clips: int) -> list[dict]:
    """``clips`` slideshows of three consecutive caption-tree images each, and one QA tree per clip."""
    import av
    import numpy as np
    from PIL import Image

    photos = []  # (path, first caption), in caption_records' order
    for rec in caption_records(coco, out, absolute=True):
        photos.append((rec["messages"][0]["content"][0]["image"], rec["branches"][0][0]["content"]))
    (out / "videos").mkdir(parents=True, exist_ok=True)
    ordinals = ("first", "second", "third")
    records = []
    for k in range(min(clips, len(photos) // 3)):
        shown = photos[3 * k : 3 * k + 3]
        clip = out / "videos" / f"slideshow{k}.mp4"
        with av.open(str(clip), "w") as container:
            stream = container.add_stream("libx264", rate=12)
            stream.width, stream.height, stream.pix_fmt = 448, 336, "yuv420p"
            for path, _ in shown:
                pixels = np.asarray(Image.open(path).convert("RGB").resize((448, 336), Image.BICUBIC))
                for _ in range(24):  # 2 s at 12 fps
                    for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                        container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        video = str(clip.resolve()) if absolute else os.path.relpath(clip.resolve(), out.resolve())
        records.append({
            "id": f"coco-slideshow-{k}",
            "messages": [
                {"role": "user", "content": [{"type": "video", "video": video},
                                             {"type": "text", "text": "This clip shows three photos, one after another."}]},
                {"role": "assistant", "content": "I see them. Ask me about any of the three."},
            ],
            "branches": [[{"role": "user", "content": f"Describe the {ordinal} photo."},
                          {"role": "assistant", "content": caption}]
                         for ordinal, (_, caption) in zip(ordinals, shown, strict=True)],
        })
    return records


SPOKEN_QUESTION = "What is in this picture?"
RATES = ((22050, 1, "wav"), (16000, 1, "flac"), (44100, 2, "wav"), (24000, 1, "flac"))  # (Hz, channels, format)


def speech_like(words: int, rate: int, channels: int, seed: int):
    """(samples, channels) float32 speech-like audio: one voiced burst per word (harmonics of a gliding pitch under
    a syllable envelope), short pauses between, a little breath noise; ~0.3 s per word."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pieces = [np.zeros(int(0.15 * rate))]
    base = rng.uniform(100, 220)  # a speaker's pitch
    for _ in range(words):
        n = int(rng.uniform(0.18, 0.34) * rate)
        t = np.arange(n) / rate
        f0 = base * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(1, 3) * t + rng.uniform(0, 6)))
        phase = 2 * np.pi * np.cumsum(f0) / rate
        voiced = sum(np.sin(k * phase) / k for k in range(1, 10))
        envelope = np.sin(np.pi * t / t[-1]) ** 2 if n > 1 else np.ones(n)
        pieces += [0.4 * voiced * envelope + 0.01 * rng.standard_normal(n), np.zeros(int(rng.uniform(0.04, 0.12) * rate))]
    mono = np.concatenate(pieces)
    cols = [mono if c == 0 else np.roll(mono, int(0.0007 * rate)) * 0.9 for c in range(channels)]
    return np.clip(np.stack(cols, axis=1), -0.95, 0.95).astype(np.float32)


def audio_records(coco: Path, out: Path, absolute: bool, images: int) -> list[dict]:
    """A spoken-QA set over the first ``images`` caption-tree images (see the module docstring)."""
    import soundfile as sf

    (out / "audio").mkdir(parents=True, exist_ok=True)

    def clip(name: str, text: str, k: int) -> str:
        rate, channels, fmt = RATES[k % len(RATES)]
        path = out / "audio" / f"{name}.{fmt}"
        sf.write(str(path), speech_like(len(text.split()), rate, channels, seed=k), rate,
                 subtype="PCM_16", format=fmt.upper())
        return str(path.resolve()) if absolute else os.path.relpath(path.resolve(), out.resolve())

    records = []
    for k, rec in enumerate(caption_records(coco, out, absolute)[:images]):
        image = rec["messages"][0]["content"][0]
        captions = [b[0]["content"] for b in rec["branches"]]
        stem = rec["id"].removesuffix("-captions")
        spoken = clip(f"{stem}-caption0", captions[0], 3 * k)
        records.append({"id": f"{stem}-transcribe", "messages": [
            {"role": "user", "content": [{"type": "audio", "audio": spoken},
                                         {"type": "text", "text": "Transcribe the recording."}]},
            {"role": "assistant", "content": captions[0]}]})
        question = clip(f"{stem}-question", SPOKEN_QUESTION, 3 * k + 1)
        records.append({"id": f"{stem}-spoken-question", "messages": [
            {"role": "user", "content": [image, {"type": "audio", "audio": question}]},
            {"role": "assistant", "content": captions[-1]}]})
        if len(captions) > 1:
            said = clip(f"{stem}-caption1", captions[1], 3 * k + 2)
            records.append({"id": f"{stem}-spoken-tree", "messages": [
                {"role": "user", "content": [{"type": "audio", "audio": said, "audio_start": 0.1},
                                             {"type": "text", "text": "Someone said this about a photo. Say it "
                                                                      "another way."}]}],
                "branches": [[{"role": "assistant", "content": c}] for c in captions[2:] or captions[:1]]})
    return records


def write_jsonl(records: list[dict], path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--coco", type=Path, required=True, help="COCO root with annotations/ and train2017/, val2017/"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory (created)")
    parser.add_argument("--absolute", action="store_true", help="write absolute image paths")
    parser.add_argument("--videos", type=int, default=0, metavar="N",
                        help="also write N slideshow clips and coco_video_trees.jsonl (video QA trees)")
    parser.add_argument("--audio", type=int, default=0, metavar="N",
                        help="also write coco_spoken_qa.jsonl: spoken-QA records over N images, clips in DIR/audio")
    args = parser.parse_args(argv)
    if not (args.coco / "annotations").is_dir():
        parser.error(f"{args.coco}/annotations not found; --coco must be a COCO root")
    args.out.mkdir(parents=True, exist_ok=True)
    captions = caption_records(args.coco, args.out, args.absolute)
    grounding = grounding_records(args.coco, args.out, args.absolute)
    write_jsonl(captions, args.out / "coco_caption_trees.jsonl")
    write_jsonl(grounding, args.out / "coco_grounding.jsonl")
    branches = sum(len(r["branches"]) for r in captions)
    turns = sum(len(r["messages"]) // 2 for r in grounding)
    print(f"{args.out / 'coco_caption_trees.jsonl'}: {len(captions)} images, {branches} caption branches")
    print(f"{args.out / 'coco_grounding.jsonl'}: {len(grounding)} images, {turns} grounding turns")
    if args.videos:
        videos = video_records(args.coco, args.out, args.absolute, args.videos)
        write_jsonl(videos, args.out / "coco_video_trees.jsonl")
        print(f"{args.out / 'coco_video_trees.jsonl'}: {len(videos)} slideshow clips, {3 * len(videos)} QA branches")
    if args.audio:
        spoken = audio_records(args.coco, args.out, args.absolute, args.audio)
        write_jsonl(spoken, args.out / "coco_spoken_qa.jsonl")
        clips = len(list((args.out / "audio").iterdir()))
        print(f"{args.out / 'coco_spoken_qa.jsonl'}: {len(spoken)} spoken-QA records, {clips} clips")
    return 0


if __name__ == "__main__":
    sys.exit(main())
