"""Shared by the tests of packer/formats: real COCO images under relative paths."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import COCO  # ../shared beside the repo, or $PACKER_SHARED

IMG_A = COCO / "val2017" / "000000397133.jpg"
IMG_B = COCO / "train2017" / "000000000790.jpg"


@pytest.fixture()
def imgdir(tmp_path: Path) -> Path:
    """A directory holding two real COCO images as a.jpg and sub/b.jpg."""
    (tmp_path / "sub").mkdir()
    shutil.copy(IMG_A, tmp_path / "a.jpg")
    shutil.copy(IMG_B, tmp_path / "sub" / "b.jpg")
    return tmp_path
