"""Molmo2 against transformers 5.23.0's own molmo2 code: token counts from the header, the expansion of each
image placeholder, the reader's pixel inputs and mm_token_type_ids.

References: ``Molmo2ImageProcessor`` (its ``get_image_grid_and_crops`` and its whole ``__call__``; its two
torchvision calls run in torch, see packer/models/molmo2.py, and ``test_same_pixels_as_torchvision`` checks
those against the unmodified class where torchvision is installed) and ``Molmo2Processor`` (input_ids,
mm_token_type_ids). The tokenizer is packer's ``molmo2`` STAND-IN (Qwen2 BPE + Molmo2's special tokens, see
packer/models/molmo2/tokenizers.py): no package ships Molmo2's own.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.config import BuildConfig
from packer.core.types import Example, ImageRef, Message, Node
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.media.images import load_image
from packer.models import get_profile
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.models import released

# (width, height): tiny, below the 112-px overlap margins, one crop exactly, extreme aspect ratios, huge
ODD_SIZES = [(1, 1), (2, 3), (13, 7), (111, 111), (112, 113), (378, 378), (379, 378), (644, 644), (645, 644),
             (1, 1000), (1000, 1), (20, 5000), (5000, 20), (3000, 40), (900, 2700), (1920, 1080), (4032, 3024),
             (10000, 8000), (30000, 30)]


@pytest.fixture(scope="module")
def profile():
    return get_profile("molmo2")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("molmo2")


@pytest.fixture(scope="module")
def processor(profile, tokenizer):
    """The real Molmo2Processor around the profile's image processor and the stand-in tokenizer."""
    from transformers.models.molmo2.processing_molmo2 import Molmo2Processor

    class NoVideo(Molmo2Processor):  # its video processor needs torchvision; no video here
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" and arg is None else super().check_argument_for_proper_class(name, arg)

    return NoVideo(image_processor=released.image_processor("molmo2"), video_processor=None, tokenizer=tokenizer,
                   chat_template=tokenizer.chat_template)


@pytest.fixture(scope="module")
def odd_images(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    paths = []
    for w, h in ODD_SIZES:
        path = root / f"{w}x{h}.png"
        if w * h <= 1 << 20:
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path, compress_level=1)
        elif w * h <= 4096 * 3072:  # large: a gradient (cheap to write, still not constant)
            Image.fromarray(np.add.outer(np.arange(h), np.arange(w)).astype(np.uint8)).convert("RGB").save(path)
        else:  # only its header is read: a 1-bit image is cheap to write
            Image.new("1", (w, h)).save(path, compress_level=1)
        paths.append(path)
    return paths


def _hf_tokens(processor, width: int, height: int) -> tuple[list[int], int]:
    """(image_grids row, tokens) the HF processor gives an image of this size, without pixels."""
    grid, _ = processor.image_processor.get_image_grid_and_crops(height, width)
    (n,) = processor._get_num_multimodal_tokens(image_sizes=[(height, width)])["num_image_tokens"]
    return grid, n


@pytest.mark.slow
def test_token_counts_from_the_header(profile, processor, coco_images, odd_images) -> None:
    """Every COCO-mini image and every odd size: header-only grid and count == the HF processor's rule."""
    assert len(coco_images) >= 200
    for path in [*coco_images, *odd_images]:
        w, h = profile.image.plan(ImageRef(path=str(path)))
        grid, n = _hf_tokens(processor, w, h)
        crops, rows, cols = profile.image.grid_thw(w, h)
        _, crops_hf = processor.image_processor.get_image_grid_and_crops(h, w)
        assert (crops, rows, cols) == (crops_hf, *grid[2:]), path.name
        assert grid[:2] == list(profile.low_res_grid)
        assert profile.image.num_tokens(w, h) == n, path.name
        assert profile.image.grid_num_tokens(np.array([[crops, rows, cols]]))[0] == n


@pytest.mark.slow
def test_token_counts_of_the_processor_output(profile, processor, coco_images, odd_images) -> None:
    """The full processor on decoded pixels (a COCO sample + the odd sizes below 2 MP): its image_grids,
    crops and pooled tokens agree with what packer stored from the header."""
    small = [p for p, (w, h) in zip(odd_images, ODD_SIZES, strict=True) if w * h < 2_000_000]
    for path in [*coco_images[::60], *small]:
        image = load_image(ImageRef(path=str(path)))
        out = released.image_processor("molmo2")(images=[image], return_tensors="pt")
        crops, rows, cols = profile.image.grid_thw(*image.size)
        assert out["image_num_crops"].tolist() == [crops], path.name
        assert out["image_grids"][0, 2:].tolist() == [rows, cols]
        assert out["pixel_values"].shape == (crops, 27 * 27, 14 * 14 * 3)
        rh, rw = profile.low_res_grid
        assert out["image_token_pooling"].shape[0] == rh * rw + rows * cols


def test_grid_num_tokens_refuses_impossible_grids(profile) -> None:
    good = profile.image.grid_thw(640, 480)
    grids = np.array([good, (4, *good[1:]), (5, 24, 23), (10, 42, 14), (2, 14, 14)])
    assert profile.image.grid_num_tokens(grids).tolist() == [766, -1, -1, -1, 212 + 212]
    assert profile.image.units(grids[:1])[0] == "crops" and profile.image.units(grids[:1])[1].tolist() == [5]


def _example(parts_and_answers: list, image_dir: Path) -> Example:
    messages = []
    for role, parts in parts_and_answers:
        messages.append(Message(role=role, parts=[ImageRef(path=str(image_dir / p)) if p.endswith(".jpg") else p
                                                  for p in parts]))
    return Example(root=Node(messages=messages), kind="messages", path="t.jsonl", line=1)


def _hf_messages(example: Example) -> list[dict]:
    return [{"role": m.role, "content": [{"type": "image"} if isinstance(p, ImageRef) else {"type": "text", "text": p}
                                         for p in m.parts]} for m in example.root.messages]


@pytest.mark.slow
def test_expansion_equals_the_processor(profile, processor, tokenizer, coco_images) -> None:
    """Encoder input_ids == Molmo2Processor's input_ids (images of several sizes, two in one turn, a later
    turn with one more); the reader's mm_token_type_ids == the processor's."""
    encoder = Encoder(tokenizer, profile)
    d = coco_images[0].parent
    names = [p.name for p in coco_images if p.parent == d][:3]
    cases = [
        [("user", [names[0], "Describe the image."]), ("assistant", ["A picture."])],
        [("user", ["Compare ", names[1], " and ", names[2], "."]), ("assistant", ["They differ."]),
         ("user", [names[0], "And this?"]), ("assistant", ["Same."])],
    ]
    for case in cases:
        example = _example(case, d)
        enc = encoder.encode(example)
        text = tokenizer.apply_chat_template(_hf_messages(example), tokenize=False)
        images = [load_image(p) for m in example.root.messages for p in m.parts if isinstance(p, ImageRef)]
        ref = processor(text=text, images=images, return_tensors="np")
        assert enc.input_ids.tolist() == ref["input_ids"][0].tolist()
        row = {"input_ids": enc.input_ids, "images": [{"offset": im.offset, "num_tokens": im.num_tokens}
                                                      for im in enc.images]}
        types = profile.reader().batch_inputs([row], np.array([0, len(enc.input_ids)]),
                                              load_media=False)["mm_token_type_ids"]
        assert types[0].tolist() == ref["mm_token_type_ids"][0].tolist()


@pytest.mark.slow
def test_reader_gives_the_processor_output(tmp_path, profile, processor, tokenizer, coco_images) -> None:
    """A build's rows collate to the processor's own pixel_values / image_token_pooling / image_grids /
    image_num_crops for the row's images (several images per row, pooling offsets across images), and
    verify accepts the build."""
    img = coco_images[:4]
    recs = [{"messages": [{"role": "user", "content": [{"type": "image", "image": str(p)}, {"type": "text", "text": f"Image {i}?"}]},
                          {"role": "assistant", "content": f"Answer {i}."}]} for i, p in enumerate(img)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    config = BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="molmo2", max_length=4096)
    build(config, progress=False)
    assert verify_build(tmp_path / "out").ok
    rows = list(PackedDataset(tmp_path / "out", shuffle=False))
    assert any(len(r["images"]) > 1 for r in rows)
    for row in rows:
        batch = collate([row])
        images = [load_image(ImageRef(path=im["source"])) for im in row["images"]]
        ref = processor.image_processor(images=images, return_tensors="pt")
        for key in ("pixel_values", "image_token_pooling", "image_grids", "image_num_crops"):
            assert batch[key].dtype == ref[key].dtype and bool((batch[key] == ref[key]).all()), key
        ids = batch["input_ids"][0]
        assert batch["mm_token_type_ids"][0].tolist() == np.isin(ids.numpy(), processor.image_token_ids).astype(int).tolist()
        # linear examples: each image's group is its example's root node, so one example's images join
        roots = np.searchsorted(row["node_offsets"], [im["offset"] for im in row["images"]], side="right") - 1
        assert batch["bidirectional_spans"][:, 2].tolist() == roots.tolist()


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_same_pixels_as_torchvision(profile, coco_images, odd_images) -> None:
    """The unmodified (torchvision-backed) Molmo2ImageProcessor gives the same tensors bit for bit."""
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    real = Molmo2ImageProcessor()
    for path in [*coco_images[::8], *odd_images[:-2]]:
        image = load_image(ImageRef(path=str(path)))
        ours = profile.reader().image_processor()(images=[image], return_tensors="pt")
        theirs = real(images=[image], return_tensors="pt")
        for key in theirs:
            assert bool((ours[key] == theirs[key]).all()), (path.name, key)
