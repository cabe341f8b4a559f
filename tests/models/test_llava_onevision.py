"""LLaVA-OneVision against transformers 5.23.0's own code: the processor's token counts (every COCO-mini image
and odd sizes), its input_ids and pixel values, the model's packed feature lengths; packed == unpacked on
``LlavaOnevisionForConditionalGeneration`` is tests/train/test_llava_onevision_equivalence.py.

Tokenizer: the builtin ``llava-onevision`` (the real Qwen2 ranks + OneVision's added tokens at their real ids,
151643-151647); the processor runs the same tokenizer, so the comparison is of the image expansion itself.
The processor is built without its video processor (torchvision), which images do not use.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from packer.core.types import ImageRef
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError, RecordError
from packer.formats import parse_record
from packer.models import get_profile
from packer.models.base import Media
from tests.models import released

IMAGE = 151646  # <image>
ODD_SIZES = [(w, h) for w in (1, 2, 13, 100, 383, 384, 385, 767, 769, 1000, 2304, 3000, 5000)
             for h in (1, 7, 50, 384, 500, 1153, 2305, 4000)]


class _Processor(transformers.LlavaOnevisionProcessor):
    """The real processor minus its video processor, whose class check needs torchvision."""

    def check_argument_for_proper_class(self, name, arg):
        return None if arg is None else super().check_argument_for_proper_class(name, arg)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("llava-onevision")


@pytest.fixture(scope="module")
def processor(tok):
    # llava-hf/llava-onevision-qwen2-*-ov-hf: SigLIP 384/14 -> 729 features, strategy "full", anyres_max_9
    return _Processor(image_processor=released.image_processor("llava-onevision"), tokenizer=tok,
                      num_image_tokens=729, vision_feature_select_strategy="full")


def _sizes(coco_images: list[Path]) -> list[tuple[int, int]]:
    profile = get_profile("llava-onevision")
    return [profile.image.plan(ImageRef(path=str(p))) for p in coco_images] + ODD_SIZES


@pytest.mark.slow
def test_every_coco_image_and_odd_sizes_match_the_processor(coco_images, processor) -> None:
    profile = get_profile("llava-onevision")
    sizes = _sizes(coco_images)
    assert len(sizes) == len(coco_images) + len(ODD_SIZES) > 300
    want = processor._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes])["num_image_tokens"]
    assert [profile.image.num_tokens(w, h) for w, h in sizes] == want
    grids = np.array([profile.image.grid_thw(w, h) for w, h in sizes])
    assert profile.image.grid_num_tokens(grids).tolist() == want
    assert {int(t) for t in grids[:, 0]} >= {2, 3, 5, 37}  # 1x1 ... 6x6 tiles, plus the base crop


@pytest.mark.slow
def test_feature_lengths_match_the_model(coco_images) -> None:
    """``LlavaOnevisionModel.pack_image_features`` (unpad, downscale, newlines, base) on features of the right
    shape gives each image exactly ``num_tokens`` rows, tiled and untiled."""
    profile = get_profile("llava-onevision")
    model = profile.proof().tiny_model(token_ids={"<image>": 5, "<video>": 6}, vocab_size=64, hidden=8).model
    sizes = sorted(set(_sizes(coco_images)))
    for w, h in sizes:
        crops = profile.image.grid_thw(w, h)[0]
        feats, lens = model.pack_image_features(
            [torch.zeros(crops, 729, 8)], torch.tensor([[h, w]]), image_newline=model.image_newline
        )
        assert int(lens[0]) == profile.image.num_tokens(w, h), (w, h)
    feats, lens = model.pack_image_features([torch.zeros(1, 729, 8)] * 2, torch.tensor([[480, 640]] * 2),
                                            image_newline=model.image_newline)
    assert lens.tolist() == [730, 730] == [run.num_tokens for run in profile.media_runs(_two_images(), np.array([-1]))]


def test_worked_example_640x480() -> None:
    profile = get_profile("llava-onevision")
    assert profile.image.grid_thw(640, 480) == (5, 40, 54)
    assert profile.image.num_tokens(640, 480) == 729 + 40 * 55 == 2929
    assert [(run.grid, run.num_tokens) for run in profile.media_runs(_two_images(), np.array([-1]))] == [((1, 27, 27), 730)] * 2
    assert len(profile.pinpoints) == 36 and profile.pinpoints[:2] == ((384, 384), (384, 768))


def _png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _two_images() -> list[Media]:
    """Two images of one linear example (node 0): whatever their sizes, neither is its path's only image."""
    return [Media(ImageRef(data=_png(640, 480)), 0), Media(ImageRef(data=_png(10, 10)), 0)]


def _record(files: list[Path], text: str = "Describe.") -> dict:
    parts = [{"type": "image", "image": str(p)} for p in files] + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "A picture."}]}


@pytest.mark.slow
@pytest.mark.parametrize("n_images", [1, 2])
def test_input_ids_and_pixels_match_the_processor(coco_images, tok, processor, n_images) -> None:
    """One image: tiled; two: each one untiled crop. Same tokens and pixel values as the processor's."""
    files = coco_images[3 : 3 + n_images]
    rec = _record(files)
    enc = Encoder(tok, get_profile("llava-onevision")).encode(parse_record(rec, path="t.jsonl", line=1, base_dir="/"))
    messages = [{"role": m["role"], "content": m["content"]} for m in rec["messages"]]
    for m in messages:  # the template's parts: images by type only
        if isinstance(m["content"], list):
            m["content"] = [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]
    text = tok.apply_chat_template(messages, tokenize=False)
    images = [Image.open(p).convert("RGB") for p in files]
    out = processor(text=[text], images=[images], return_tensors="np")
    assert enc.input_ids.tolist() == out["input_ids"][0].tolist()
    assert [im.num_tokens for im in enc.images] == [int(n) for n in np.diff(
        np.flatnonzero(np.diff(np.r_[0, enc.input_ids == IMAGE, 0]) != 0))[::2]]
    mine = get_profile("llava-onevision").reader().pixel_inputs([ImageRef(path=str(p)) for p in files],
                                                     [im.grid_thw for im in enc.images])
    crops = [im.grid_thw[0] for im in enc.images]
    expected = np.concatenate([out["pixel_values"][i][:c] for i, c in enumerate(crops)])  # unpad, concatenate
    assert np.array_equal(mine["pixel_values"].numpy(), expected)
    assert mine["image_sizes"].tolist() == np.asarray(out["image_sizes"]).reshape(-1, 2).tolist()
    assert mine["batch_num_images"].tolist() == [n_images]


def test_a_cut_that_parts_an_examples_images_is_refused(coco_images, tok) -> None:
    """Cutting the second of two images would leave one untiled image whose count assumed its neighbour."""
    rec = _record(coco_images[:1])
    rec["messages"] += _record(coco_images[1:2], "And this one?")["messages"]
    example = parse_record(rec, path="t.jsonl", line=1, base_dir="/")
    with pytest.raises(RecordError, match="decide how many tokens"):
        Encoder(tok, get_profile("llava-onevision"), max_length=800, overlong="truncate").encode(example)


def test_a_lone_untiled_image_is_refused() -> None:
    with pytest.raises(ConfigError, match="untiled image without"):
        get_profile("llava-onevision").reader().pixel_inputs([ImageRef(path="x.jpg")], [(1, 27, 27)])


def _U(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


def _A(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _leaf_paths(rec: dict) -> list[list[dict]]:
    """The messages of every root-to-leaf path of a record, leaves in depth-first order (the encoder's)."""
    branches = rec.get("branches") or []
    if not branches:
        return [rec["messages"]]
    subs = [b if isinstance(b, dict) else {"messages": b} for b in branches]
    return [rec["messages"] + path for sub in subs for path in _leaf_paths(sub)]


def _tree_records(files: list[Path]) -> list[dict]:
    img = lambda k: {"type": "image", "image": str(files[k])}  # noqa: E731
    return [
        # an image in one branch (1 on its path: tiled), two in another (untiled), none in a third
        {"messages": [_U("Look."), _A("Sure.")],
         "branches": [[_U(img(0), "One?"), _A("One.")], [_U(img(1), img(2), "Two?"), _A("Two.")],
                      [_U("None?"), _A("No image.")]]},
        # a root image and an image in each branch: 2 on every path, all untiled
        {"messages": [_U(img(3), "Caption."), _A("A scene.")],
         "branches": [[_U(img(0), "And this?"), _A("Another.")], [_U(img(1), "This?"), _A("A third.")]]},
        # a root image, branches without images below it (tiled), nested
        {"messages": [_U(img(2), "What?")],
         "branches": [[_A("A thing.")], {"messages": [_A("Hm.")], "branches": [[_U("Sure?"), _A("Yes.")],
                                                                             [_U("Really?"), _A("No.")]]}]},
    ]


def test_tree_paths_match_the_processor_run_on_each_path_alone(coco_images, tok, processor) -> None:
    """Every root-to-leaf path of a tree (the example the model sees) has the tokens, counts and tiling the
    processor gives that path alone: an image is tiled iff each path through it holds it alone."""
    profile = get_profile("llava-onevision")
    encoder = Encoder(tok, profile)
    seen = set()
    for rec in _tree_records(coco_images[10:14]):
        enc = encoder.encode(parse_record(rec, path="t.jsonl", line=1, base_dir="/"))
        offsets = enc.node_offsets.tolist()
        ranges = list(zip(offsets, offsets[1:] + [len(enc.input_ids)], strict=True))
        parents = enc.node_parents.tolist()
        leaves = [n for n in range(len(parents)) if n not in parents]
        paths = _leaf_paths(rec)
        assert len(paths) == len(leaves) > 1
        for leaf, messages in zip(leaves, paths, strict=True):
            nodes, n = [], leaf
            while n >= 0:
                nodes.insert(0, n)
                n = parents[n]
            mine = np.concatenate([enc.input_ids[slice(*ranges[k])] for k in nodes])
            files = [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"]
                     if p["type"] == "image"]
            shown = [{**m, "content": [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
                     if isinstance(m["content"], list) else m for m in messages]
            text = tok.apply_chat_template(shown, tokenize=False)
            images = [[Image.open(f).convert("RGB") for f in files]] if files else None
            out = processor(text=[text], images=images, return_tensors="np")
            assert mine.tolist() == out["input_ids"][0].tolist(), (leaf, len(files))
            inside = [im for im in enc.images if any(a <= im.offset < b for a, b in (ranges[k] for k in nodes))]
            assert [im.grid_thw[0] > 1 for im in inside] == [len(files) == 1] * len(files)
            seen.add(len(files))
    assert seen == {0, 1, 2}  # paths without images, with one (tiled), with several (untiled)


def test_an_image_tiled_on_one_path_and_not_on_another_is_refused(coco_images, tok) -> None:
    """A root image with one branch that adds an image (2 on that path) and one that does not (1): the model
    would tile it on one path only, so no one count is right for the packed tree."""
    img = lambda k: {"type": "image", "image": str(coco_images[k])}  # noqa: E731
    rec = {"messages": [_U(img(0), "Look."), _A("Ok.")],
           "branches": [[_U(img(1), "And?"), _A("Two.")], [_U("Alone?"), _A("One.")]]}
    with pytest.raises(RecordError, match="tree node 0's image is the only image on one path") as e:
        Encoder(tok, get_profile("llava-onevision")).encode(parse_record(rec, path="t.jsonl", line=1, base_dir="/"))
    assert e.value.reason == "image_tree"


def test_a_cut_that_leaves_paths_disagreeing_is_refused(coco_images, tok) -> None:
    """A root image and one more on every path (all untiled); a cut inside the last branch's image leaves a
    path holding only the root image, which the model would tile: untruncatable, not a wrong count."""
    img = lambda k: {"type": "image", "image": str(coco_images[k])}  # noqa: E731
    rec = {"messages": [_U(img(0), "Look."), _A("Ok.")],
           "branches": [[_U(img(1), "And?"), _A("Two.")],
                        {"messages": [_U("Go on."), _A("Sure.")],
                         "branches": [[_U(img(2), "This?"), _A("Three.")], [_U(img(3), "That?"), _A("Four.")]]}]}
    example = parse_record(rec, path="t.jsonl", line=1, base_dir="/")
    profile = get_profile("llava-onevision")
    full = Encoder(tok, profile).encode(example)
    assert [im.grid_thw[0] for im in full.images] == [1, 1, 1, 1]
    cut = Encoder(tok, profile, max_length=full.images[2].offset + 10, overlong="truncate")
    with pytest.raises(RecordError, match="decide how many tokens") as e:
        cut.encode(example)
    assert e.value.reason == "untruncatable"
