"""Qwen2-VL / Qwen2.5-VL grids, token counts and pixel values against transformers' own image processor, on
every COCO-mini image."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import transformers
from PIL import Image
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

from packer.core.types import ImageRef
from packer.errors import RecordError
from packer.media.images import load_image
from packer.models import get_profile
from packer.models.qwen_vl import QwenVLProfile
from tests.conftest import COCO  # ../shared beside the repo, or $PACKER_SHARED
from tests.models.released import image_processor as released_processor

IMAGE_FILES = sorted(p for d in ("train2017", "val2017", "unlabelled") for p in (COCO / d).glob("*.jpg"))


@pytest.fixture(scope="module")
def decoded() -> list[Image.Image]:
    return [load_image(ImageRef(path=str(p))) for p in IMAGE_FILES]


def _one_per_size(images: list[Image.Image]) -> list[Image.Image]:
    """One image of each distinct (width, height): the grid depends on the size alone."""
    seen: dict[tuple[int, int], Image.Image] = {}
    for im in images:
        seen.setdefault(im.size, im)
    return list(seen.values())


def _check_against(
    profiles: list[QwenVLProfile], processor, images: list[Image.Image], refs: list[ImageRef]
) -> None:
    """Each profile's header-only grid and token count equal the processor's output on the decoded image."""
    hf_grids: list[tuple[int, ...]] = []
    for i in range(0, len(images), 16):  # chunks: all 239 at once would hold 1.5 GB of patches
        # Normalization does not change shapes; skipping it saves a third of the processor's time.
        out = processor(images=images[i : i + 16], return_tensors="np", do_rescale=False, do_normalize=False)
        grids = [tuple(int(x) for x in g) for g in out["image_grid_thw"]]
        assert out["pixel_values"].shape[0] == sum(t * h * w for t, h, w in grids)  # one row per patch
        hf_grids += grids
    hf_tokens = [t * h * w // processor.merge_size**2 for t, h, w in hf_grids]
    sizes = [profiles[0].image.plan(ref) for ref in refs]
    assert sizes == [im.size for im in images]
    for profile in profiles:
        assert [profile.image.grid_thw(*wh) for wh in sizes] == hf_grids, profile.name
        assert [profile.image.num_tokens(*wh) for wh in sizes] == hf_tokens, profile.name


@pytest.mark.slow
def test_qwen2_vl_and_2_5_every_coco_image_match_processor(decoded: list[Image.Image]) -> None:
    # transformers maps both model types to the same image processor class (the PIL backend without
    # torchvision), so one pass over the images checks both profiles.
    names = {IMAGE_PROCESSOR_MAPPING_NAMES[m]["pil"] for m in ("qwen2_vl", "qwen2_5_vl")}
    assert names == {"Qwen2VLImageProcessorPil"}
    # built independently, from the released preprocessor_config.json (tests/models/released/qwen_vl.json)
    processor = released_processor("qwen2-vl")
    profiles = [get_profile("qwen2-vl"), get_profile("qwen2.5-vl")]
    for profile in profiles:
        assert isinstance(profile.reader().image_processor(), transformers.Qwen2VLImageProcessorPil)
        assert (profile.min_pixels, profile.max_pixels) == (
            processor.size["shortest_edge"],
            processor.size["longest_edge"],
        )
    refs = [ImageRef(path=str(p)) for p in IMAGE_FILES]
    _check_against(profiles, processor, decoded, refs)


@pytest.mark.parametrize(
    ("min_pixels", "max_pixels"),
    [
        (4 * 28 * 28, 128 * 28 * 28),  # every COCO image is shrunk: the floor branch
        (512 * 28 * 28, 1024 * 28 * 28),  # every COCO image is enlarged: the ceil branch
        (28 * 28, 28 * 28),  # one token per image
    ],
)
@pytest.mark.slow
def test_qwen2_vl_custom_pixels_match_processor(decoded, min_pixels: int, max_pixels: int) -> None:
    profile = get_profile("qwen2-vl", min_pixels=min_pixels, max_pixels=max_pixels)
    processor = released_processor("qwen2-vl", min_pixels=min_pixels, max_pixels=max_pixels)
    images = _one_per_size(decoded)
    refs = [ImageRef(data=_png_bytes(im)) for im in images]  # inline bytes of the same size
    _check_against([profile], processor, images, refs)


def _png_bytes(im: Image.Image) -> bytes:
    """A tiny PNG of ``im``'s size (solid colour compresses to almost nothing)."""
    buf = io.BytesIO()
    Image.new("RGB", im.size).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("factor_pixels", [(28, 56 * 56, 28 * 28 * 1280), (28, 128 * 28 * 28, 256 * 28 * 28)])
def test_smart_resize_sweep_matches_transformers(factor_pixels) -> None:
    factor, lo, hi = factor_pixels
    profile = get_profile("qwen2-vl", min_pixels=lo, max_pixels=hi)
    rng = np.random.default_rng(0)
    sizes = [(1, 1), (1, 200), (200, 1), (28, 28), (27, 29), (3000, 4000), (10_000, 50)]
    sizes += [tuple(int(x) for x in rng.integers(1, 4000, 2)) for _ in range(3000)]
    for w, h in sizes:
        if max(w, h) / min(w, h) > 200:
            continue
        rh, rw = hf_smart_resize(h, w, factor=factor, min_pixels=lo, max_pixels=hi)
        assert profile.image.grid_thw(w, h) == (1, rh // 14, rw // 14), (w, h)


def test_aspect_ratio_above_200_is_a_bad_image() -> None:
    with pytest.raises(RecordError, match="aspect ratio") as e:
        get_profile("qwen2-vl").image.grid_thw(201, 1)
    assert e.value.reason == "bad_image"


def test_pixel_values_match_processor_exactly() -> None:
    profile = get_profile("qwen2-vl")
    refs = [ImageRef(path=str(p)) for p in IMAGE_FILES[:2]]
    out = profile.reader().pixel_values(refs)
    expected = released_processor("qwen2-vl")(
        images=[Image.open(r.path).convert("RGB") for r in refs], return_tensors="pt"
    )
    assert set(out) == {"pixel_values", "image_grid_thw"}
    assert out["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert out["image_grid_thw"].tolist() == [list(profile.image.grid_thw(*profile.image.plan(r))) for r in refs]
    assert (out["pixel_values"] == expected["pixel_values"]).all()
    assert out["pixel_values"].shape == (int(expected["image_grid_thw"].prod(-1).sum()), 3 * 2 * 14 * 14)


def test_worked_example_640x480() -> None:
    profile = get_profile("qwen2-vl")
    assert profile.image.grid_thw(640, 480) == (1, 34, 46)  # smart_resize: 644x476
    assert profile.image.num_tokens(640, 480) == 391


def test_inline_bytes_give_the_same_pixels() -> None:
    profile = get_profile("qwen2-vl")
    path = IMAGE_FILES[5]
    out = profile.reader().pixel_values([ImageRef(data=path.read_bytes()), ImageRef(path=str(path))])
    n = out["pixel_values"].shape[0] // 2
    assert (out["pixel_values"][:n] == out["pixel_values"][n:]).all()


def test_pixel_values_of_a_bad_file_is_a_bad_image(tmp_path: Path) -> None:
    (tmp_path / "text.jpg").write_text("this is not an image\n")
    with pytest.raises(RecordError, match="bad_image"):
        get_profile("qwen2-vl").reader().pixel_values([ImageRef(path=str(tmp_path / "text.jpg"))])


def test_verify_hooks() -> None:
    profile = get_profile("qwen2-vl")
    grids = np.array([(1, 34, 46), (1, 2, 2), (2, 4, 6), (1, 3, 4)])
    assert profile.image.grid_num_tokens(grids).tolist() == [391, 1, 12, -1]  # 3 rows of patches do not merge
    assert profile.forward_keys[:4] == ("input_ids", "position_ids", "pixel_values", "image_grid_thw")
