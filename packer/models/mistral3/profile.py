"""Mistral 3 (Mistral Small 3.1 / 3.2: ``Mistral3ForConditionalGeneration``, the Pixtral vision tower): variable
resolution, one ``[IMG]`` per merged patch, ``[IMG_BREAK]`` after every row, ``[IMG_END]`` in place of the last.

    640x480 -> no resize (longest edge 640 <= 1540), each side rounded UP to whole merged patches of 28 px
            (patch 14 x spatial merge 2): 644x504 -> 18 rows x 23 cols of [IMG]
            -> ([IMG] * 23 [IMG_BREAK]) * 17  [IMG] * 23 [IMG_END]        414 [IMG] in a run of 432 tokens
    2000x1000 -> longest edge down to 1540 (floor): 1540x770 -> 1540x784 -> 28 rows x 55 cols

The chat template writes one ``[IMG]`` per image; ``image_run`` is the run PixtralProcessor writes in its place
(``replace_image_token``), token by token. Positions are 1-D; the LM attends to image tokens causally, like text;
the vision tower attends within each image (a block mask over the batch's patches) with 2-D rope positions of
its own grid, so images of one packed batch stay apart (docs/models/mistral3.md).

Stored per image (docs/models/mistral3.md, "In the shards"): grid (t, h, w) = (1, rows, cols) of merged patches,
``num_tokens`` = rows * cols, the ``[IMG]`` tokens the model replaces with image features (the count after
merging); ``offset`` is the run's first token (an ``[IMG]``); the run is ``rows`` tokens longer
(``[IMG_BREAK]`` x rows - 1, ``[IMG_END]``). verify checks each row of ``[IMG]`` tokens (the image rule's ``spans``).

Counts from the header alone (width, height): transformers 5.23.0's ``get_resize_output_image_size`` of
``image_processing_pil_pixtral`` with PixtralProcessor's patch size (patch_size * spatial_merge_size), exact on
every COCO-mini image and odd sizes (tests/models/test_mistral3.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core import arrays
from packer.errors import ConfigError, RecordError
from packer.models.base import ModelProfile
from packer.models.mistral3.tokens import IMAGE_BREAK, IMAGE_END
from packer.models.rules import Entries, ImageRule, MediaRun, Spans

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True)
class PixtralImage(ImageRule):
    """Pixtral's image processor: scaled to fit ``longest_edge``, one ``[IMG]`` per merged 28 px patch, rows
    ended by ``[IMG_BREAK]`` and the last by ``[IMG_END]`` (``image_tokens``)."""

    token: str = "[IMG]"
    longest_edge: int = 1540
    patch_size: int = 14
    spatial_merge_size: int = 2

    @property
    def unit(self) -> int:
        """Pixels of one token along a side: patch_size * spatial_merge_size (28)."""
        return self.patch_size * self.spatial_merge_size

    @property
    def max_side(self) -> int:
        """Most tokens along a side: the resized image's longer side is at most ``longest_edge``, rounded up to
        whole tokens (55 for 1540 px of 28)."""
        return -(-self.longest_edge // self.unit)

    def token_grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of ``[IMG]`` tokens (``token_grid`` of the module); RecordError for an image the
        processor cannot take (a side that scales down to no pixel)."""
        return token_grid(width, height, longest_edge=self.longest_edge, unit=self.unit)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, rows, cols) of merged patches."""
        return (1, *self.token_grid(width, height))

    def num_tokens(self, width: int, height: int) -> int:
        """The image's ``[IMG]`` tokens: rows * cols."""
        rows, cols = self.token_grid(width, height)
        return rows * cols

    def run(self, size: tuple[int, int]) -> MediaRun:
        """PixtralProcessor's run for the image (``replace_image_token``): rows of ``[IMG]`` * cols, each row ended
        by ``[IMG_BREAK]``, the last by ``[IMG_END]``; the entry starts at its first token and counts its ``[IMG]``."""
        rows, cols = self.token_grid(*size)
        return MediaRun((1, rows, cols), rows * cols, tokens=image_tokens(rows, cols, self.token))

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("patches", rows * cols * spatial_merge_size**2): the patches the vision tower attends over per image
        (its cost grows with their square: each image is one block of full attention)."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        return "patches", grids[:, 1] * grids[:, 2] * self.spatial_merge_size**2

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """``[IMG]`` tokens of stored grids: rows * cols for (1, rows, cols) with 1 <= rows, cols <= ``max_side``
        (a row of 1 x cols: one row's span, ``spans``), else -1."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        t, r, c = grids[:, 0], grids[:, 1], grids[:, 2]
        ok = (t == 1) & (r >= 1) & (c >= 1) & (r <= self.max_side) & (c <= self.max_side)
        return np.where(ok, r * c, -1)

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """An image as the spans of its rows: row k a (1, 1, cols) span of cols tokens at offset + k * (cols + 1),
        and the ``[IMG]`` tokens lie exactly on the rows (placed). One token lies between two rows and after the
        last (``[IMG_BREAK]``, ``[IMG_END]``: not ``[IMG]``, so outside every span), so a grid whose rows and
        cols are swapped, a short or long row, or an entry off its run fails the placement check.

        An entry whose grid and num_tokens disagree stays one span as stored (verify names its grid). Which ids
        the breaks and the end have is the tokenizer's and verify does not know them (the manifest records the
        placeholder's only): that they are not ``[IMG]`` is what is checked.
        """
        fields = entries
        if not len(fields["offset"]):
            return lists, fields, True
        n = fields["num_tokens"]
        grids = np.stack([fields["grid_t"], fields["grid_h"], fields["grid_w"]], axis=1)
        good = (self.grid_num_tokens(grids) == n) & (n > 0)
        rows = np.where(good, fields["grid_h"], 1)  # (I,) spans per entry
        cols = fields["grid_w"]
        entry = np.repeat(np.arange(len(n)), rows)  # (S,) the entry of each span
        k = arrays.ranges(rows)  # (S,) the row's index in its image
        kept = ~good[entry]  # a bad entry as stored
        spans = {
            "offset": np.where(kept, fields["offset"][entry], fields["offset"][entry] + k * (cols[entry] + 1)),
            "num_tokens": np.where(kept, n[entry], cols[entry]),
            "grid_t": np.where(kept, fields["grid_t"][entry], 1),
            "grid_h": np.where(kept, fields["grid_h"][entry], 1),
            "grid_w": cols[entry],
        }
        row_of = np.repeat(np.arange(len(lists) - 1), np.diff(lists))  # (I,) the row of each entry
        per_row = np.bincount(row_of, weights=rows, minlength=len(lists) - 1).astype(np.int64)
        return np.concatenate([[0], np.cumsum(per_row)]), spans, True


@dataclass(frozen=True, kw_only=True)
class Mistral3Profile(ModelProfile):
    """Mistral 3: the settings of mistralai/Mistral-Small-3.1-24B-Instruct-2503 by default (preprocessor ``size``
    longest_edge 1540; processor ``patch_size`` 14, ``spatial_merge_size`` 2: one token per 28x28 px).

    ``pixel_values`` gives {"pixel_values": (images, 3, H, W) float32, each image at the top left of the
    batch's largest height and width (zeros elsewhere), "image_sizes": (images, 2) int64 (height, width) of
    each image's own pixels}, as PixtralImageProcessorPil gives a list of images.
    """

    image_token: str | None = "[IMG]"
    default_tokenizer: str | None = "mistral3"
    longest_edge: int = 1540
    """``size["longest_edge"]``: an image whose longer side exceeds it is scaled down (floor) to fit."""
    patch_size: int = 14
    """The vision tower's patch size (``vision_config.patch_size``, the processor's ``patch_size``)."""
    spatial_merge_size: int = 2
    """``Mistral3Config.spatial_merge_size``: merge x merge patches become one token (the processor's too)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values", "image_sizes")
    overridable: ClassVar[tuple[str, ...]] = (
        "longest_edge", "patch_size", "spatial_merge_size", *ModelProfile.overridable,
    )

    def __post_init__(self) -> None:
        if self.longest_edge < 1 or self.patch_size < 1 or self.spatial_merge_size < 1:
            raise ConfigError(f"profile {self.name!r}: longest_edge, patch_size and spatial_merge_size must be >= 1")

    @cached_property
    def image(self) -> PixtralImage:
        return PixtralImage(self.image_token, self.longest_edge, self.patch_size, self.spatial_merge_size, bidirectional=self.bidirectional_images)

    # ------------------------------------------------------------------ read / proof

    def reader(self) -> Reader:
        from packer.models.mistral3.reader import Mistral3Reader

        return Mistral3Reader(self)

    def proof(self) -> Proof:
        from packer.models.mistral3.proof import Mistral3Proof

        return Mistral3Proof(self)


@lru_cache(maxsize=4096)
def token_grid(width: int, height: int, *, longest_edge: int, unit: int) -> tuple[int, int]:
    """(rows, cols) of ``[IMG]`` tokens of a ``width`` x ``height`` image: transformers 5.23.0's
    ``get_resize_output_image_size`` (``image_processing_pil_pixtral``, the same in the torchvision module) with
    ``size`` (longest_edge, longest_edge) and ``patch_size`` unit = patch_size * spatial_merge_size, as
    PixtralProcessor calls it:

    1. ratio = max(height / longest_edge, width / longest_edge); if ratio > 1, each side becomes
       floor(side / ratio) (not round: the processor's comment);
    2. each side rounded up to whole units: tokens = (side - 1) // unit + 1.

    A side that scales down to 0 px gives 0 tokens, which the processor cannot resize to nor lay out (its run
    would be empty): RecordError. mistral-common (Mistral's own inference code) rounds in step 1 instead of
    flooring, which gives one token more along a side for a few sizes; packer follows transformers.

        token_grid(640, 480, longest_edge=1540, unit=28)     # (18, 23)
    """
    if width < 1 or height < 1:
        raise RecordError("bad_image", f"image of {width}x{height} px has no pixels")
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height = int(math.floor(height / ratio))
        width = int(math.floor(width / ratio))
    rows, cols = (height - 1) // unit + 1, (width - 1) // unit + 1
    if rows < 1 or cols < 1:
        raise RecordError(
            "bad_image",
            f"an image scaled to fit {longest_edge} px is {width}x{height} px: a side with no pixel, which the Pixtral "
            "processor cannot take (aspect ratio too extreme)",
        )
    return rows, cols


@lru_cache(maxsize=1024)
def image_tokens(rows: int, cols: int, image_token: str = "[IMG]") -> tuple[str, ...]:
    """PixtralProcessor.replace_image_token's run: (``[IMG]`` * cols + ``[IMG_BREAK]``) * rows, the last token
    ``[IMG_END]``."""
    run = ((image_token,) * cols + (IMAGE_BREAK,)) * rows
    return run[:-1] + (IMAGE_END,)
