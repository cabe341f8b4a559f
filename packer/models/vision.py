"""Per-model vision profiles: image -> (width, height) -> patch grid -> number of vision tokens.

The encoder needs each image's token count before any pixel is decoded, so the count comes from the file
header alone (``image_size``) and the model's resize rule (``grid_thw``). ``pixel_values`` runs the real HF
image processor at training time; the tests check on every COCO-mini image that both paths agree.

    qwen2-vl, 640x480 -> smart_resize (multiple of 28, min/max pixels) -> 644x476
                      -> grid (t, h, w) = (1, 34, 46) patches of 14 px -> 34*46 // 2**2 = 391 tokens
    llava             -> any size -> 336x336 -> grid (1, 24, 24) -> 576 tokens

Images are decoded with Pillow and converted to RGB; EXIF orientation is *not* applied, as in HF's
processors, so the header size is the size the processor sees.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from PIL import Image, UnidentifiedImageError

from packer.core.types import ImageRef
from packer.errors import ConfigError, RecordError

if TYPE_CHECKING:
    import torch

# A JPEG's entropy-coded data never holds 0xFFD9 (0xFF is stuffed as 0xFF00), so EOI after the scan start
# means the scan data ended; the tail is searched, not just the last 2 bytes, because cameras append trailers.
_JPEG_EOI = b"\xff\xd9"
_TAIL_BYTES = 4096
# Qwen2-VL's smart_resize refuses images whose long side is more than 200x the short side.
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, kw_only=True)
class VisionProfile:
    """How one model family turns an image into vision tokens.

    Qwen2.5-VL vs Qwen2-VL (transformers 5.23.0): the image side is identical. ``Qwen2_5_VLProcessor``
    uses the same ``Qwen2VLImageProcessor`` (same smart_resize, patch 14, merge 2, temporal patch 2, same
    56*56 / 28*28*1280 pixel defaults), so grids and token counts are the same. Window attention lives in
    the vision tower (model), not in the token count. ``get_rope_index`` is the same for images (temporal
    interval 1); it differs only for video, where Qwen2.5-VL spaces temporal positions by
    ``tokens_per_second * second_per_grid_ts``. Released checkpoints' ``preprocessor_config.json`` set
    ``max_pixels=12845056``; the class default (used here) is 1003520 - pass ``max_pixels`` to match a
    checkpoint.
    """

    name: str
    """Profile name: qwen2-vl | qwen2.5-vl | llava | text."""
    image_token: str | None
    """The placeholder token repeated once per vision token; None for text-only."""
    vision_start: str | None
    """Token before an image's placeholders (Qwen), or None."""
    vision_end: str | None
    """Token after an image's placeholders (Qwen), or None."""
    fixed_tokens: int | None
    """Tokens per image for fixed-resolution models (LLaVA: 576); None for dynamic resolution."""
    patch_size: int = 14
    """Vision transformer patch side in pixels."""
    merge_size: int = 2
    """Side of the patch square merged into one LLM token (Qwen2-VL: 2x2 -> 1)."""
    temporal_patch_size: int = 2
    """Frames per temporal patch (a still image is repeated to fill it; its grid_t is 1)."""
    min_pixels: int
    """Smart-resize lower bound on resized height*width."""
    max_pixels: int
    """Smart-resize upper bound on resized height*width."""
    mrope: bool
    """True when the model uses 3-D mRoPE positions (Qwen2-VL family)."""
    bidirectional_images: bool = False
    """True when tokens of one image attend to each other in both directions (Molmo-style)."""
    default_tokenizer: str
    """Tokenizer used when the build names none."""
    image_size_px: int = 336
    """Fixed-resolution models: the square side the processor resizes/crops to (LLaVA-1.5: 336)."""

    def __post_init__(self) -> None:
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ConfigError(
                f"profile {self.name!r}: need 1 <= 'min_pixels' <= 'max_pixels', "
                f"got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}"
            )

    @property
    def has_vision(self) -> bool:
        return self.image_token is not None

    def _require_vision(self) -> None:
        if not self.has_vision:
            raise ConfigError(
                f"profile {self.name!r} has no vision encoder; use qwen2-vl, qwen2.5-vl or llava"
            )

    def image_size(self, image: ImageRef) -> tuple[int, int]:
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
        try:
            st = os.stat(image.path)
        except OSError:
            return read_image_size(image)  # raises the matching RecordError (missing, not a file, ...)
        return _file_image_size(image.path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) before merging, exactly Qwen2VLImageProcessor's ``image_grid_thw``.

        Fixed-resolution profiles (LLaVA) return (1, side/patch, side/patch) = (1, 24, 24) with merge_size 1,
        so ``t*h*w // merge_size**2`` is their fixed token count as well.
        """
        self._require_vision()
        if self.fixed_tokens is not None:
            side = self.image_size_px // self.patch_size
            return (1, side, side)
        resized_h, resized_w = smart_resize(
            height,
            width,
            factor=self.patch_size * self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )
        return (1, resized_h // self.patch_size, resized_w // self.patch_size)

    def num_tokens(self, width: int, height: int) -> int:
        """Vision tokens one image of this size becomes in the LLM sequence."""
        self._require_vision()
        if self.fixed_tokens is not None:
            return self.fixed_tokens
        t, h, w = self.grid_thw(width, height)
        return t * h * w // self.merge_size**2

    def image_processor(self) -> Any:
        """The HF image processor configured like this profile (built offline, cached per profile)."""
        self._require_vision()
        return _build_processor(self)

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Decode ``images`` (RGB) and run the processor.

        Qwen: {"pixel_values": (sum(h*w), 3*2*14*14) float32, "image_grid_thw": (N, 3) int64};
        LLaVA: {"pixel_values": (N, 3, 336, 336) float32}.
        """
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=decoded, return_tensors="pt")
        keys = ("pixel_values", "image_grid_thw") if self.fixed_tokens is None else ("pixel_values",)
        return {k: out[k] for k in keys}


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize target (height, width): multiples of ``factor``, area in [min, max], same aspect.

    Same arithmetic as transformers' ``qwen2_vl.image_processing_qwen2_vl.smart_resize`` (rounding and all),
    but a RecordError instead of a ValueError for an aspect ratio above 200.
    """
    if min(height, width) < 1 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise RecordError(
            "bad_image",
            f"image of {width}x{height} px has an aspect ratio above {MAX_ASPECT_RATIO}, which Qwen2-VL refuses",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _open(ref: ImageRef):
    """A binary file object for ``ref``; RecordError("missing_image") if the path does not exist."""
    if ref.data is not None:
        return io.BytesIO(ref.data)
    try:
        return open(ref.path, "rb")  # noqa: SIM115 - closed by the caller's `with`
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


def read_image_size(ref: ImageRef) -> tuple[int, int]:
    """(width, height) from the header, with cheap truncation checks; see ``VisionProfile.image_size``."""
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


@lru_cache(maxsize=8192)  # ~2 MB of keys at most: memory does not grow with the corpus
def _file_image_size(path: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> tuple[int, int]:
    """``read_image_size`` of a file, memoized by its identity and version (see ``VisionProfile.image_size``)."""
    return read_image_size(ImageRef(path=path))


def load_image(ref: ImageRef) -> Image.Image:
    """Decode ``ref`` fully to an RGB PIL image; RecordError on a missing or undecodable file."""
    with _open(ref) as f:
        try:
            with Image.open(f) as im:
                return im.convert("RGB")
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
            raise RecordError("bad_image", f"cannot decode image {ref.source}: {e}") from e


@lru_cache(maxsize=16)
def _build_processor(profile: VisionProfile) -> Any:
    # The PIL backends: torchvision is not a dependency, and transformers' Qwen2VLImageProcessor itself
    # falls back to Qwen2VLImageProcessorPil without it. Grids are identical in both backends.
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

    if profile.fixed_tokens is None:
        from transformers import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            min_pixels=profile.min_pixels,
            max_pixels=profile.max_pixels,
            patch_size=profile.patch_size,
            temporal_patch_size=profile.temporal_patch_size,
            merge_size=profile.merge_size,
        )
    from transformers import LlavaImageProcessorPil

    # LLaVA-1.5 (llava-hf/llava-1.5-7b-hf preprocessor_config): CLIP ViT-L/14-336 preprocessing, shortest
    # edge resized to 336 then a 336x336 centre crop, no padding to square.
    side = profile.image_size_px
    return LlavaImageProcessorPil(
        size={"shortest_edge": side},
        crop_size={"height": side, "width": side},
        do_center_crop=True,
        do_pad=False,
        resample=PILImageResampling.BICUBIC,
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        do_convert_rgb=True,
    )


_QWEN = dict(
    image_token="<|image_pad|>",
    vision_start="<|vision_start|>",
    vision_end="<|vision_end|>",
    fixed_tokens=None,
    min_pixels=56 * 56,  # Qwen2VLImageProcessor's class default (size["shortest_edge"])
    max_pixels=28 * 28 * 1280,  # class default (size["longest_edge"]): at most 1280 tokens per image
    mrope=True,
    default_tokenizer="qwen2-vl",
)

PROFILES: dict[str, VisionProfile] = {
    "qwen2-vl": VisionProfile(name="qwen2-vl", **_QWEN),
    "qwen2.5-vl": VisionProfile(name="qwen2.5-vl", **_QWEN),
    # LLaVA-1.5 (CLIP ViT-L/14 at 336 px): 24x24 patches, no merging. The placeholder is our qwen
    # tokenizer's <|image_pad|>, so the builtin tokenizer works; a LLaVA tokenizer has its own <image>.
    "llava": VisionProfile(
        name="llava",
        image_token="<|image_pad|>",
        vision_start=None,
        vision_end=None,
        fixed_tokens=576,
        merge_size=1,
        temporal_patch_size=1,
        min_pixels=336 * 336,
        max_pixels=336 * 336,
        mrope=False,
        default_tokenizer="qwen2-vl",
    ),
    "text": VisionProfile(
        name="text",
        image_token=None,
        vision_start=None,
        vision_end=None,
        fixed_tokens=None,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
        mrope=False,
        default_tokenizer="qwen2-vl",
    ),
}

_OVERRIDABLE = ("min_pixels", "max_pixels", "image_token", "bidirectional_images", "default_tokenizer")


def get_profile(name: str, **overrides: Any) -> VisionProfile:
    """The named profile, with ``overrides`` (e.g. min_pixels/max_pixels) applied; None values are ignored."""
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(PROFILES)}")
    profile = PROFILES[name]
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(changes) - set(_OVERRIDABLE))
    if unknown:
        raise ConfigError(
            f"cannot override {unknown} of profile {name!r}; overridable: {', '.join(_OVERRIDABLE)}"
        )
    if profile.fixed_tokens is not None or not profile.has_vision:
        fixed = sorted(set(changes) & {"min_pixels", "max_pixels"})
        if fixed:
            raise ConfigError(
                f"{fixed} only apply to dynamic-resolution profiles (qwen2-vl, qwen2.5-vl), not {name!r}"
            )
    return dataclasses.replace(profile, **changes) if changes else profile
