"""Image files: (width, height) from the header alone, with truncation checks, and full RGB decoding.

The encoder needs each image's token count before any pixel is decoded, so a model family counts tokens from
``image_size`` (the header) and its own resize rule; ``load_image`` decodes pixels only at training time.
Images are decoded with Pillow and converted to RGB; EXIF orientation is *not* applied, as in HF's
processors, so the header size is the size the processor sees.
"""

from __future__ import annotations

import io
import os
from functools import lru_cache

from PIL import Image, UnidentifiedImageError

from packer.core.location import file_version, is_url, open_file
from packer.core.types import ImageRef
from packer.errors import RecordError

# A JPEG's entropy-coded data never holds 0xFFD9 (0xFF is stuffed as 0xFF00), so EOI after the scan start
# means the scan data ended; the tail is searched, not just the last 2 bytes, because cameras append trailers.
_JPEG_EOI = b"\xff\xd9"
_TAIL_BYTES = 4096


def image_size(image: ImageRef) -> tuple[int, int]:
    """(width, height) read from the image header without decoding pixels.

    Raises RecordError("missing_image") for a file that does not exist, RecordError("bad_image") for an
    empty, non-image, or truncated file (JPEG without EOI marker, PNG failing chunk/CRC verification).

    A file's answer is cached in the process by (path, inode, size, mtime, ctime): datasets name one image
    in many records, and a header read with its truncation check costs ~1 ms against ~5 us for the
    ``stat``. Errors are not cached. Inline bytes are always read (caching them would hold the bytes). A file
    rewritten in place within one file-time tick (~4 ms) at the same size is not re-read.
    """
    if image.data is not None:
        return read_image_size(image)
    if is_url(image.path):  # an input on a store: its version is the object's size and ETag
        try:
            size, version = file_version(image.path)
        except OSError:
            return read_image_size(image)
        return _file_image_size(image.path, 0, size, version, 0)
    try:
        st = os.stat(image.path)
    except OSError:
        return read_image_size(image)  # raises the matching RecordError (missing, not a file, ...)
    return _file_image_size(image.path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_image_size(ref: ImageRef) -> tuple[int, int]:
    """(width, height) from the header, with cheap truncation checks, uncached; see ``image_size``."""
    with _open(ref) as f:
        try:
            if f.seek(0, io.SEEK_END) == 0:
                raise RecordError("bad_image", f"image {ref.source} is an empty file")
            f.seek(0)
            with Image.open(f) as im:
                fmt = im.format
                width, height = im.size
                if fmt == "PNG":
                    im.verify()  # walks every chunk and checks CRCs up to IEND; decodes no pixels
                    complete = True
                elif fmt == "JPEG":
                    complete = bool(im.tile) and _jpeg_has_eoi(
                        f, im.tile[0][2]
                    )  # tile: (codec, box, offset, args)
                else:
                    complete = True  # other formats: header checks only
        except RecordError:
            raise
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
            # PIL reports a broken PNG chunk as SyntaxError and a short read as OSError.
            raise RecordError("bad_image", f"{ref.source} is not a readable image: {e}") from e
    if not complete:
        raise RecordError(
            "bad_image", f"JPEG {ref.source} is truncated (no end-of-image marker after the scan)"
        )
    if width < 1 or height < 1:
        raise RecordError("bad_image", f"image {ref.source} has size {width}x{height}")
    return width, height


def load_image(ref: ImageRef) -> Image.Image:
    """Decode ``ref`` fully to an RGB PIL image; RecordError on a missing or undecodable file."""
    with _open(ref) as f:
        try:
            with Image.open(f) as im:
                return im.convert("RGB")
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
            raise RecordError("bad_image", f"cannot decode image {ref.source}: {e}") from e


@lru_cache(maxsize=8192)  # ~2 MB of keys at most: memory does not grow with the corpus
def _file_image_size(path: str, inode: int, size: int, mtime_ns: int | str, ctime_ns: int) -> tuple[int, int]:
    """``read_image_size`` of a file, memoized by its identity and version (see ``image_size``)."""
    return read_image_size(ImageRef(path=path))


def _open(ref: ImageRef):
    """A binary file object for ``ref``; RecordError("missing_image") if the path does not exist."""
    if ref.data is not None:
        return io.BytesIO(ref.data)
    try:
        return open_file(ref.path, block_size=1 << 20)  # a local file, or an object read in ranged GETs
    except FileNotFoundError as e:
        raise RecordError(
            "missing_image", f"image file {ref.path!r} does not exist; check the path or --image-root"
        ) from e
    except OSError as e:  # a directory, no permission, ...
        raise RecordError("bad_image", f"cannot open image {ref.path!r}: {e}") from e


def _jpeg_has_eoi(f, scan_start: int) -> bool:
    """True when an EOI marker follows the first scan's start (so the scan data is complete).

    The tail is checked first (the usual case, one small read); files with a long trailer after EOI (a
    motion photo's appended video) fall back to one pass over the rest of the file. EOI bytes inside an
    EXIF thumbnail sit before ``scan_start`` and do not count.
    """
    size = f.seek(0, io.SEEK_END)
    tail_start = max(scan_start, size - _TAIL_BYTES)
    f.seek(tail_start)
    if _JPEG_EOI in f.read():
        return True
    f.seek(scan_start)
    return _JPEG_EOI in f.read(max(0, tail_start + 1 - scan_start))  # +1: a marker straddling tail_start
