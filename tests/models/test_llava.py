"""LLaVA-1.5: 576 tokens of a 336 px crop whatever the image size, pixel values from LlavaImageProcessorPil."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import transformers
from PIL import Image

from packer.core.types import ImageRef
from packer.models import get_profile
from tests.models import released


def test_llava_is_576_tokens_of_336px(coco_images: list[Path]) -> None:
    profile = get_profile("llava")
    refs = [ImageRef(path=str(p)) for p in coco_images[:3]]
    for ref in refs:
        w, h = profile.image.plan(ref)
        assert profile.image.num_tokens(w, h) == 576
        assert profile.image.grid_thw(w, h) == (1, 24, 24)
    out = profile.reader().pixel_values(refs)
    assert set(out) == {"pixel_values"}
    assert tuple(out["pixel_values"].shape) == (3, 3, 336, 336)
    assert isinstance(profile.reader().image_processor(), transformers.LlavaImageProcessorPil)


def test_pixel_values_match_processor(coco_images: list[Path]) -> None:
    """The llava-hf/llava-1.5-7b-hf preprocessing: shortest edge 336, centre crop, CLIP mean/std."""

    refs = [ImageRef(path=str(p)) for p in coco_images[:2]]
    expected = released.image_processor("llava")(images=[Image.open(r.path).convert("RGB") for r in refs], return_tensors="pt")
    out = get_profile("llava").reader().pixel_values(refs)
    assert (out["pixel_values"] == expected["pixel_values"]).all()


def test_verify_hooks() -> None:
    profile = get_profile("llava")
    assert profile.image.grid_num_tokens(np.array([(1, 24, 24), (1, 2, 2)])).tolist() == [576, 576]
    assert profile.positions.extra(np.zeros(3), np.arange(3), np.zeros(1), np.full(1, -1), [], token_ids={}) is None
    assert not profile.positions.mrope
