"""What the image families' model tests share: the test images, the record set their builds pack, a record's
root-to-leaf conversations, each path's positions in a row, and a corrupted shard for verify to find. The
references these are compared against (each family's processor) stay in the family's own test."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from packer.config import BuildConfig
from packer.pipeline.build import build
from packer.shards.io import read_shard, write_json_atomic, write_shard
from packer.train.dataset import PackedDataset
from tests.helpers import leaf_chains, record_paths, stored_table


def png(w: int, h: int, seed: int = 0) -> bytes:
    """A ``w`` x ``h`` PNG of seeded random pixels."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_images(root: Path, coco: Path, sizes: dict[str, tuple[int, int]]) -> None:
    """``coco`` as ``coco.jpg`` and one random PNG per name in ``sizes`` (w, h; seeded by its place) under root."""
    shutil.copy(coco, root / "coco.jpg")
    for i, (name, (w, h)) in enumerate(sizes.items()):
        (root / name).write_bytes(png(w, h, seed=i))


def image_records(*, pair: tuple[str, str] = ("wide.png", "line.png"), tree: str = "tile.png",
                  nested: str = "small.png", later: str = "small.png") -> list[dict]:
    """The image families' six records: a COCO image, two images in one turn (``pair``), a tree with its image in
    the prefix (``tree``) and one in a nested branch (``nested``), a system prompt and an image in a later turn
    (``later``), a LLaVA record over wide.png, and text."""
    img = lambda *names: [{"type": "image", "image": n} for n in names]  # noqa: E731
    text = lambda t: [{"type": "text", "text": t}]  # noqa: E731
    return [
        {"messages": [{"role": "user", "content": [*img("coco.jpg"), *text("What is shown?")]},
                      {"role": "assistant", "content": "A scene."}]},
        {"messages": [{"role": "user", "content": [*text("Compare "), *img(*pair), *text(" please.")]},
                      {"role": "assistant", "content": "A band and a line."}]},
        {"messages": [{"role": "user", "content": [*img(tree), *text("Write a caption.")]}],
         "branches": [[{"role": "assistant", "content": "Static."}],
                      {"messages": [{"role": "assistant", "content": "Noise"}],
                       "branches": [[{"role": "user", "content": "Shorter?"}, {"role": "assistant", "content": "No."}],
                                    [{"role": "user", "content": [*text("And this? "), *img(nested)]},
                                     {"role": "assistant", "content": "Also noise."}]]}]},
        {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi."},
                      {"role": "assistant", "content": "Hello."},
                      {"role": "user", "content": [*img(later), *text("And now?")]},
                      {"role": "assistant", "content": f"A {Path(later).stem} image."}]},
        {"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"}, {"from": "gpt", "value": "Pixels."}],
         "image": "wide.png"},
        {"messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "1 2 3."}]},
    ]


def build_records(root: Path, records: list[dict], *, out: str = "out", rows_per_shard: int = 2,
                  **config) -> dict:
    """Build ``records`` (written to root/data.jsonl) into root/``out``: root, data, out, records, the build's
    result and the rows as PackedDataset reads them."""
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = BuildConfig.from_inputs([str(data)], str(root / out), rows_per_shard=rows_per_shard, **config)
    result = build(config, progress=False)
    return {"root": root, "data": data, "out": root / out, "records": records, "result": result,
            "rows": list(PackedDataset(root / out, shuffle=False))}


def chat_paths(record: dict, *, image_name: bool = False, text_parts: bool = False) -> list[list[dict]]:
    """Each root-to-leaf path's messages of a record (packer's node order); a LLaVA record's turns as chat
    messages, its ``<image>`` turn an image part (naming the record's image when ``image_name``) then its text,
    its other turns strings (text parts when ``text_parts``)."""
    if "conversations" not in record:
        return record_paths(record)
    role = {"human": "user", "gpt": "assistant"}
    image = {"type": "image", "image": record["image"]} if image_name else {"type": "image"}
    msgs = []
    for turn in record["conversations"]:
        text = turn["value"]
        content = [image, {"type": "text", "text": text[len("<image>"):]}] if text.startswith("<image>") \
            else [{"type": "text", "text": text}] if text_parts else text
        msgs.append({"role": role[turn["from"]], "content": content})
    return [msgs]


def leaf_positions(row: dict, e: int) -> list[np.ndarray]:
    """Row positions of each root-to-leaf path of example ``e`` of ``row``, leaves in node order."""
    cu, offs, parents = row["cu_seqlens"], row["node_offsets"].tolist(), row["node_parents"].tolist()
    nodes = [n for n, o in enumerate(offs) if cu[e] <= o < cu[e + 1]]
    ends = {n: (offs[n + 1] if n + 1 < len(offs) and offs[n + 1] < cu[e + 1] else int(cu[e + 1])) for n in nodes}
    return leaf_chains(offs, parents, ends, nodes)


def each_path(rows: list[dict], records: list[dict], paths: Callable[[dict], list]
              ) -> Iterator[tuple[dict, str, dict, np.ndarray, list[dict]]]:
    """(row, example id, record, row positions, messages) of every root-to-leaf path of every example in
    ``rows``; each example has as many paths as ``paths(record)`` gives."""
    for row in rows:
        for e, example_id in enumerate(row["example_ids"]):
            record = records[int(example_id.rsplit(":", 1)[1]) - 1]
            got, want = leaf_positions(row, e), paths(record)
            assert len(got) == len(want), example_id
            for positions, path in zip(got, want, strict=True):
                yield row, example_id, record, positions, path


def oblong_image(row: dict, *, min_side: int = 1) -> dict | None:
    """The row's first image whose grid has rows != cols (both at least ``min_side``), or None."""
    return next((im for im in row["images"]
                 if im["grid_h"] != im["grid_w"] and min(im["grid_h"], im["grid_w"]) >= min_side), None)


def rewrite_first(out: Path, pick: Callable[[dict], dict | None], change: Callable[[dict, dict], None], *,
                  missing: str = "no image with rows != cols") -> None:
    """Apply ``change(row, item)`` to the first row for which ``pick(row)`` gives an item, rewrite its shard and
    record the shard's new checksum: a corrupted build for verify to find."""
    manifest = json.loads((out / "manifest.json").read_text())
    for s, entry in enumerate(manifest["shards"]):
        rows = read_shard(out / entry["file"]).to_pylist()
        for row in rows:
            item = pick(row)
            if item is not None:
                change(row, item)
                new = write_shard(stored_table(rows), out / entry["file"], rows_per_row_group=2)
                manifest["shards"][s] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
                write_json_atomic(out / "manifest.json", manifest)
                return
    raise AssertionError(missing)


def break_image(row: dict, im: dict, fault: str, image_id: int) -> None:
    """The faults verify must find in every image family's rows: a stray image token (the row's first token, no
    image's), rows and cols swapped (the same count, not the run's layout), a grid no image gives, an entry off
    its run."""
    if fault == "stray image token":
        row["input_ids"][0] = image_id
    elif fault == "rows and cols swapped":
        im["grid_h"], im["grid_w"] = im["grid_w"], im["grid_h"]
    elif fault == "grid":
        im["grid_h"] += 1
    elif fault == "offset":
        im["offset"] += 1
    else:
        raise KeyError(fault)
