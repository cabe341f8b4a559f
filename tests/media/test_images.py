"""Image headers: sizes without decoding, truncation checks, the per-file cache, inline bytes."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from PIL import Image

from packer.core.types import ImageRef
from packer.errors import RecordError
from packer.media.images import image_size, load_image, read_image_size


def test_coco_mini_is_all_there(coco_images: list[Path]) -> None:
    assert len(coco_images) == 239


def _reason(ref: ImageRef) -> str:
    with pytest.raises(RecordError) as e:
        image_size(ref)
    return e.value.reason


def test_bad_and_missing_files(tmp_path: Path, coco_images: list[Path]) -> None:
    good = coco_images[0].read_bytes()
    assert good.endswith(b"\xff\xd9")
    (tmp_path / "half.jpg").write_bytes(good[: len(good) // 2])
    (tmp_path / "no_eoi.jpg").write_bytes(good[:-2])
    (tmp_path / "header_only.jpg").write_bytes(good[:600])
    (tmp_path / "text.jpg").write_text("this is not an image\n")
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "dir.jpg").mkdir()
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (1, 2, 3)).save(buf, format="PNG")
    png = buf.getvalue()
    (tmp_path / "cut.png").write_bytes(png[:-20])
    (tmp_path / "trailer.jpg").write_bytes(good + b"\0" * 10_000)  # bytes after EOI (camera trailers)

    assert _reason(ImageRef(path=str(tmp_path / "missing.jpg"))) == "missing_image"
    for name in ("half.jpg", "no_eoi.jpg", "header_only.jpg", "text.jpg", "empty.jpg", "dir.jpg", "cut.png"):
        assert _reason(ImageRef(path=str(tmp_path / name))) == "bad_image", name
    assert _reason(ImageRef(data=good[: len(good) // 2])) == "bad_image"
    assert _reason(ImageRef(data=b"")) == "bad_image"

    assert image_size(ImageRef(data=png)) == (64, 48)
    assert image_size(ImageRef(path=str(tmp_path / "trailer.jpg"))) == Image.open(coco_images[0]).size
    with pytest.raises(RecordError, match="truncated"):
        image_size(ImageRef(path=str(tmp_path / "no_eoi.jpg")))
    with pytest.raises(RecordError, match="does not exist"):
        image_size(ImageRef(path=str(tmp_path / "missing.jpg")))
    with pytest.raises(RecordError, match="bad_image"):
        load_image(ImageRef(path=str(tmp_path / "text.jpg")))


def test_inline_bytes_same_as_path(coco_images: list[Path]) -> None:
    path = coco_images[5]
    inline = ImageRef(data=path.read_bytes())
    assert image_size(inline) == image_size(ImageRef(path=str(path))) == Image.open(path).size
    assert load_image(inline).tobytes() == load_image(ImageRef(path=str(path))).tobytes()


def test_image_size_cache_sees_rewrites(coco_images, tmp_path):
    path = tmp_path / "x.jpg"
    shutil.copy(coco_images[0], path)
    ref = ImageRef(path=str(path))
    first = image_size(ref)
    assert first == read_image_size(ref) == Image.open(coco_images[0]).size
    assert image_size(ref) == first  # cached
    Image.open(coco_images[0]).resize((33, 21)).save(path)  # a new file at the same path
    assert image_size(ref) == (33, 21)
    path.write_bytes(path.read_bytes()[:100])  # truncated: an error every time, never a cached size
    for _ in range(2):
        with pytest.raises(RecordError, match="bad_image"):
            image_size(ref)
    path.unlink()
    with pytest.raises(RecordError, match="missing_image"):
        image_size(ref)
