"""Encoders shared by the encode tests (built once: each runs the template probes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

from packer.encode.encoder import Encoder
from packer.models import get_profile
from tests.encode.helpers import IMAGES


@pytest.fixture(scope="session")
def tok(qwen_tokenizer):
    return qwen_tokenizer


@pytest.fixture(scope="session")
def qwen(tok) -> Encoder:
    return Encoder(tok, get_profile("qwen2-vl"))


@pytest.fixture(scope="session")
def img(coco_dir: Path) -> Path:
    return coco_dir / "val2017" / "000000397133.jpg"  # 640x427


@pytest.fixture(scope="session")
def encoders(tok) -> dict[str, Encoder]:
    small = get_profile("qwen2-vl", max_pixels=64 * 28 * 28)
    return {
        "qwen2-vl": Encoder(tok, small),
        "qwen2-vl-truncate": Encoder(tok, small, max_length=60, overlong="truncate"),
        "qwen2-vl-drop": Encoder(tok, small, max_length=90),
        "llava": Encoder(tok, get_profile("llava")),
        "text": Encoder(tok, get_profile("text")),
        "qwen3-vl": Encoder(tok, get_profile("qwen3-vl", max_pixels=65536)),  # MRoPE's subclass: per-frame videos
    }


@pytest.fixture(scope="session")
def image_root(coco_images, tmp_path_factory) -> Path:
    """img/a.jpg, img/b.jpg (COCO) and img/c.png (100x60) under one root."""
    root = tmp_path_factory.mktemp("fast")
    (root / "img").mkdir()
    shutil.copy(coco_images[0], root / "img" / IMAGES[0])
    shutil.copy(coco_images[1], root / "img" / IMAGES[1])
    Image.open(coco_images[2]).convert("RGB").resize((100, 60)).save(root / "img" / IMAGES[2])  # a PNG
    return root
