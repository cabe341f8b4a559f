"""InternVL against transformers 5.23.0's own code: tile counts (GotOcr2's ``get_optimal_tiled_canvas`` and the
PIL image processor), the processor's ``input_ids`` and pixel values. Packed == unpacked on the real model:
tests/models/test_conformance.py.

The tokenizer is the builtin ``internvl3`` (packer/models/internvl/tokenizers.py): Qwen2.5's real BPE plus InternVL's
special tokens with InternVL3's ids and the conversion script's chat template, built offline; its ``<video>``
id is a stand-in. The reference processor is ``InternVLProcessor`` without its video processor, which needs
torchvision (not installed): ``_ImageOnlyProcessor`` only drops that attribute; images go through the real
code.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.media.images import load_image
from packer.models import get_profile
from packer.models.internvl import tile_layout
from packer.models.internvl.tokenizers import INTERNVL_CHAT_TEMPLATE
from packer.pipeline.build import build
from packer.report.stats import format_stats
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.models import released

# odd sizes: 1 px, extreme aspect ratios, exact tile multiples (ties between layouts), just off them
ODD_SIZES = [(1, 1), (2, 3), (1, 700), (700, 1), (5000, 10), (10, 5000), (447, 449), (448, 448), (449, 448),
             (896, 448), (448, 896), (1344, 448), (1343, 449), (900, 450), (1792, 1344), (4000, 3000), (224, 672)]


class _ImageOnlyProcessor(transformers.InternVLProcessor):
    """InternVLProcessor with no video processor (its class needs torchvision): image code unchanged."""

    @classmethod
    def get_attributes(cls) -> list[str]:
        return ["image_processor", "tokenizer"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("internvl3")


@pytest.fixture(scope="module")
def processor(tokenizer):
    # InternVL3-hf's files (tests/models/released/internvl.json), built independently of the profile
    seq = released.file_values(released.entry_of("internvl"), "processor_config.json")["image_seq_length"]
    return _ImageOnlyProcessor(image_processor=released.image_processor("internvl"), tokenizer=tokenizer,
                               video_processor=None, image_seq_length=seq, chat_template=INTERNVL_CHAT_TEMPLATE)


def _png(w: int, h: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_tokenizer_ids_are_internvl3s(tokenizer) -> None:
    config = transformers.InternVLConfig()
    assert tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>") == config.image_token_id == 151667
    assert (tokenizer.start_image_token_id, tokenizer.end_image_token_id) == (151665, 151666)
    assert tokenizer("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE


def test_tile_layout_equals_got_ocr2_on_a_sweep() -> None:
    sides = [1, 7, 100, 223, 224, 300, 447, 448, 449, 500, 640, 672, 895, 896, 897, 1000, 1344, 1792, 3000]
    for lo, hi in [(1, 12), (1, 6), (2, 4), (1, 1), (3, 40)]:
        for w in sides:
            for h in sides:
                want = get_optimal_tiled_canvas((h, w), (448, 448), lo, hi)
                assert tile_layout(w, h, tile_px=448, min_tiles=lo, max_tiles=hi) == want, (w, h, lo, hi)


@pytest.mark.slow
def test_every_coco_image_and_odd_sizes_match_processor(coco_images: list[Path], processor) -> None:
    """Counts from the header equal the processor's rule on every COCO-mini image, and its real output
    (tiles of pixel values) on one COCO image per distinct tile layout and on every odd size."""
    profile = get_profile("internvl")
    refs = [ImageRef(path=str(p)) for p in coco_images] + [ImageRef(data=_png(w, h)) for w, h in ODD_SIZES]
    sizes = [profile.image.plan(r) for r in refs]
    assert sizes[len(coco_images):] == ODD_SIZES
    rule = processor._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes])
    assert [2 + profile.image.num_tokens(w, h) for w, h in sizes] == rule["num_image_tokens"]  # + <img>, </img>
    assert len(coco_images) > 200
    per_layout = {profile.image.grid_thw(*s): (s, r) for s, r in zip(sizes[: len(coco_images)], refs, strict=False)}
    run = list(per_layout.values()) + list(zip(ODD_SIZES, refs[len(coco_images):], strict=True))
    for (w, h), ref in run:
        image = load_image(ref)
        assert image.size == (w, h)
        out = processor.image_processor(images=[image], crop_to_patches=True, do_rescale=False,
                                        do_normalize=False, return_tensors="np")
        tiles = int(out["num_patches"][0])
        assert tiles * 256 == profile.image.num_tokens(w, h), (w, h)
        _, rows, cols = profile.image.grid_thw(w, h)
        assert profile.image.grid_num_tokens(np.array([[1, rows, cols]])).tolist() == [tiles * 256]


@pytest.mark.slow
def test_expansion_and_pixels_equal_the_processor(tmp_path: Path, tokenizer, processor, coco_images) -> None:
    """Every example's tokens equal the processor's input_ids for its rendered chat, and collate's pixel values
    equal the processor's, bit for bit (one COCO image, odd sizes, two images in one turn, text only)."""
    images = {"a.png": (900, 450), "b.png": (1, 700), "c.png": (448, 448)}
    for i, (name, (w, h)) in enumerate(images.items()):
        (tmp_path / name).write_bytes(_png(w, h, seed=i))
    coco = coco_images[0]
    img = lambda *names: [{"type": "image", "image": str(n)} for n in names]  # noqa: E731
    records = [
        {"messages": [{"role": "user", "content": [*img("a.png"), {"type": "text", "text": "Describe it."}]},
                      {"role": "assistant", "content": "Noise, twice as wide as high."}]},
        {"messages": [{"role": "user", "content": [*img("b.png", "c.png"), {"type": "text", "text": "Compare."}]},
                      {"role": "assistant", "content": "A line and a square."}]},
        {"messages": [{"role": "user", "content": [*img(coco), {"type": "text", "text": "What is shown?"}]},
                      {"role": "assistant", "content": "A kitchen."}]},
        {"messages": [{"role": "user", "content": "No image here."}, {"role": "assistant", "content": "Fine."}]},
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = build(BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="internvl", max_length=8192),
                   progress=False)
    rows = list(PackedDataset(tmp_path / "out", shuffle=False))
    seen, processor_tiles = 0, []
    for row in rows:
        batch = collate([row])
        cu = batch["cu_seqlens"].tolist()
        tiles = 0
        for e, example_id in enumerate(batch["example_ids"]):
            rec = records[int(example_id.rsplit(":", 1)[1]) - 1]  # ids are path:line, lines from 1
            msgs = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], list)
                     else [{"type": "text", "text": m["content"]}]} for m in rec["messages"]]
            pics = [load_image(ImageRef(path=str(tmp_path / p["image"]) if not Path(p["image"]).is_absolute()
                                        else p["image"])) for m in msgs for p in m["content"] if p["type"] == "image"]
            text = processor.apply_chat_template(msgs, tokenize=False)
            want = processor(images=pics or None, text=[text], return_tensors="pt")
            got = batch["input_ids"][0, cu[e] : cu[e + 1]]
            assert got.tolist() == want["input_ids"][0].tolist(), example_id
            if pics:
                n = want["pixel_values"].shape[0]
                processor_tiles.append(n)
                assert torch.equal(batch["pixel_values"][tiles : tiles + n], want["pixel_values"])
                tiles += n
            seen += 1
        if tiles:
            assert batch["pixel_values"].shape[0] == tiles
    assert seen == len(records)
    # packer stats: tiles per pack and per image, from the stored grids, equal the processor's tiles
    units = result.stats["image_units"]
    assert units["name"] == "tiles" and units["total"] == sum(processor_tiles)
    assert units["per_pack"]["max"] <= units["total"] and units["per_image"]["max"] == 13  # the 1x700 line
    assert "tiles / pack" in format_stats(result.stats) and "tiles / image" in format_stats(result.stats)


def test_truncation_drops_a_cut_image_with_its_delimiters(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(_png(900, 450))  # 3 tiles: 768 tokens
    rec = {"messages": [{"role": "user", "content": "Hello there, " * 20},
                        {"role": "assistant", "content": "Hi."},
                        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "?"}]},
                        {"role": "assistant", "content": "Noise."}]}
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(rec) + "\n")
    build(BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="internvl", max_length=200,
                                  overlong="truncate"), progress=False)
    (row,) = list(PackedDataset(tmp_path / "out", shuffle=False))
    tok = load_tokenizer("internvl3")
    ids = row["input_ids"].tolist()
    assert row["images"] == [] or len(row["images"]) == 0
    assert tok.convert_tokens_to_ids("<img>") not in ids and tok.convert_tokens_to_ids("<IMG_CONTEXT>") not in ids
