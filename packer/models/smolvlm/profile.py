"""SmolVLM (SmolVLM / SmolVLM2, Idefics3's image splitting): an image becomes square tiles plus a global view,
each ``image_seq_len`` ``<image>`` tokens, the tiles named by ``<row_i_col_j>`` tokens.

    640x480 -> the longest edge resized to 1536 (4 * 384): 1536x1152 -> rounded up to whole tiles of 384 px:
            1536x1152 = 3 rows x 4 cols, + the whole image resized to 384x384 (the global view) = 13 tiles
            -> <fake_token_around_image><row_1_col_1><image>*81 <fake_token_around_image><row_1_col_2>... \\n
               ... (row 3) \\n \\n<fake_token_around_image><global-img><image>*81<fake_token_around_image>
    an image that fits one tile after the resize (only with a longest edge of at most one tile) is not split:
            <fake_token_around_image><global-img><image>*81<fake_token_around_image>

The chat template writes one ``<image>`` per image; ``image_run`` gives the text SmolVLMProcessor writes in its
place (``prompt_string``, transformers' ``get_image_prompt_string``), tokenized alone: it begins and ends with
``<fake_token_around_image>``, a special token, so splicing it after tokenizing equals tokenizing it in place.

Stored per image (docs/models/smolvlm.md, "In the shards"): grid (t, h, w) = (1, rows, cols) of the split,
(1, 0, 0) for an image that is not split; ``num_tokens`` = the ``<image>`` tokens, (rows * cols + 1) *
image_seq_len, or image_seq_len unsplit (``grid_num_tokens``): the tokens the model replaces with image
features. ``offset`` is the run's first token (its first ``<fake_token_around_image>``); the run is longer than
``num_tokens`` by its ``<fake_token_around_image>``, ``<row_i_col_j>``, ``<global-img>`` and newline tokens.
verify checks each tile's ``<image>`` run (the image rule's ``spans``).

Counts from the header alone (width, height): the resize and split arithmetic of transformers 5.23.0's
``SmolVLMImageProcessorPil`` (``tile_grid``), exact on every COCO-mini image and odd sizes
(tests/models/test_smolvlm.py).
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
from packer.models.rules import Entries, ImageRule, MediaRun, Spans

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader

FAKE_TOKEN = "<fake_token_around_image>"
"""Around every tile (the processor's ``fake_image_token``, the tokenizer's ``fake_image_token``)."""
GLOBAL_TOKEN = "<global-img>"
"""Before the global view's ``<image>`` tokens (``global_image_token``)."""
MAX_IMAGE_SIZE = 4096
"""``image_processing_pil_smolvlm.MAX_IMAGE_SIZE``: no side is resized beyond it."""
MAX_SIDE_TILES = 6
"""SmolVLM's tokenizers have ``<row_i_col_j>`` for i, j in 1..6: no split may have more rows or columns."""


@dataclass(frozen=True)
class SmolVLMImage(ImageRule):
    """SmolVLM's image processor: resized so its longest edge is ``longest_edge``, split into ``tile_px`` tiles
    (``tile_grid``) plus the global view, ``image_seq_len`` ``<image>`` tokens each, written as the processor's
    ``prompt_string`` (tokenized alone)."""

    token: str = "<image>"
    tile_px: int = 384
    longest_edge: int = 1536
    patch_size: int = 14
    scale_factor: int = 3
    do_image_splitting: bool = True

    @property
    def image_seq_len(self) -> int:
        """``<image>`` tokens per tile: ((tile_px // patch_size) / scale_factor)**2, SmolVLMProcessor's
        ``image_seq_len`` as SmolVLMModel computes it from its config (384 // 14 = 27 patches a side, 81 tokens
        for SmolVLM2-2.2B; the vision tower's stride-14 convolution leaves the last 6 px out)."""
        return (self.tile_px // self.patch_size // self.scale_factor) ** 2

    def tile_grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of the split, (0, 0) when not split (``tile_grid`` of the module)."""
        return tile_grid(width, height, tile_px=self.tile_px, longest_edge=self.longest_edge,
                         do_image_splitting=self.do_image_splitting)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, rows, cols) of the split; (1, 0, 0) for an image that is not split."""
        return (1, *self.tile_grid(width, height))

    def num_tokens(self, width: int, height: int) -> int:
        """The image's ``<image>`` tokens: image_seq_len per tile, the global view included."""
        rows, cols = self.tile_grid(width, height)
        return (rows * cols + 1) * self.image_seq_len

    def run(self, size: tuple[int, int]) -> MediaRun:
        """SmolVLMProcessor's text for the image (``prompt_string``), tokenized alone; the entry starts at its first
        token and counts its ``<image>`` tokens."""
        rows, cols = self.tile_grid(*size)
        return MediaRun((1, rows, cols), (rows * cols + 1) * self.image_seq_len,
                        text=prompt_string(rows, cols, self.image_seq_len, image_token=self.token))

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("tiles", rows * cols + the global view, or 1 unsplit): the vision tower's inputs per image."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        return "tiles", grids[:, 1] * grids[:, 2] + 1

    @property
    def side_tiles(self) -> int:
        """Tiles along a split image's longest side: its longest edge is resized to ``longest_edge`` (at most
        4096), then rounded up to whole tiles."""
        return -(-min(self.longest_edge, MAX_IMAGE_SIZE) // self.tile_px)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """``<image>`` tokens of stored grids: (1, 0, 0) -> image_seq_len (an unsplit image, and one tile in
        ``spans``); (1, rows, cols) -> (rows * cols + 1) * image_seq_len when splitting is on and the
        grid is one the resize can give (the longest side ``side_tiles`` tiles, the other 1..that many); else -1."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        t, r, c = grids[:, 0], grids[:, 1], grids[:, 2]
        k = self.side_tiles
        single = (t == 1) & (r == 0) & (c == 0)
        split = (t == 1) & (r >= 1) & (c >= 1) & (np.maximum(r, c) == k) & (self.do_image_splitting and k > 1)
        return np.where(single, self.image_seq_len, np.where(split, (r * c + 1) * self.image_seq_len, -1))

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """An image as spans of its tiles: tile k (k < rows * cols + 1) a (1, 0, 0) span of image_seq_len tokens
        over the k-th run of ``<image>`` tokens from the image's offset, and the ``<image>`` tokens lie exactly on
        the tiles (placed): a missing, extra, short or long tile run, or one that is another image's, fails.

        The layout is checked by token counts the tokenizer cannot change: 2 tokens (``<fake_token_around_image>``
        and ``<row_i_col_j>`` or ``<global-img>``) from the image's offset to its first tile and between two tiles
        of a row, more after a row's last tile (the newline the processor writes), so rows and cols are the run's.
        An entry whose grid and num_tokens disagree stays one span as stored (verify names its grid); a tile
        whose run is missing or laid out otherwise gets offset -1 (a bad span). Which ids those other tokens
        have is the tokenizer's and verify does not know them (the manifest records the placeholder's only).
        """
        fields = entries
        if not len(fields["offset"]) or token_id is None:
            return lists, fields, True
        seq = self.image_seq_len
        n = fields["num_tokens"]
        grids = np.stack([fields["grid_t"], fields["grid_h"], fields["grid_w"]], axis=1)
        good = (self.grid_num_tokens(grids) == n) & (n > 0)
        tiles = np.where(good, n // seq, 1)  # (I,)
        row_of = np.repeat(np.arange(len(lists) - 1), np.diff(lists))  # (I,) the row of each entry
        edges = np.diff(np.concatenate([[0], (ids == token_id).astype(np.int8), [0]]))
        runs = np.flatnonzero(edges == 1)  # flat starts of every run of <image> tokens
        first = np.searchsorted(runs, row_starts[row_of] + fields["offset"])  # (I,) each entry's first run
        entry = np.repeat(np.arange(len(n)), tiles)  # (S,) the entry of each span
        k = arrays.ranges(tiles)  # (S,) the tile's index in its image
        run = first[entry] + k
        found = run < len(runs)
        flat = np.append(runs, -1)[np.where(found, run, len(runs))]
        # the layout between tiles, in tokens the tokenizer cannot change: <fake_token_around_image> and
        # <row_i_col_j> (or <global-img>) before each tile, so 2 tokens from the image's offset to its first tile
        # and between two tiles of a row; more after a row's last tile (a newline, then those two)
        gap = flat - np.where(k == 0, row_starts[row_of[entry]] + fields["offset"][entry], np.roll(flat, 1) + seq)
        cols = np.maximum(fields["grid_w"][entry], 1)
        laid = np.where((k == 0) | (k % cols != 0), gap == 2, gap > 2)
        offset = np.where(found & laid, flat - row_starts[row_of[entry]], -1)
        kept = ~good[entry]  # a bad entry as stored
        spans = {
            "offset": np.where(kept, fields["offset"][entry], offset),
            "num_tokens": np.where(kept, n[entry], seq),
            "grid_t": np.where(kept, fields["grid_t"][entry], 1),
            "grid_h": np.where(kept, fields["grid_h"][entry], 0),
            "grid_w": np.where(kept, fields["grid_w"][entry], 0),
        }
        per_row = np.bincount(row_of, weights=tiles, minlength=len(lists) - 1).astype(np.int64)
        return np.concatenate([[0], np.cumsum(per_row)]), spans, True


@dataclass(frozen=True, kw_only=True)
class SmolVLMProfile(ModelProfile):
    """SmolVLM: the settings of HuggingFaceTB/SmolVLM2-2.2B-Instruct by default (preprocessor: ``size``
    longest_edge 1536, ``max_image_size`` longest_edge 384; model: SigLIP 384 px, patch 14, ``scale_factor`` 3:
    81 tokens per tile). SmolVLM-256M / -500M: ``tile_px=512, longest_edge=2048, patch_size=16, scale_factor=4``
    (64 tokens per tile).

    ``pixel_values`` gives {"pixel_values": (1, tiles, 3, tile_px, tile_px) float32, "pixel_attention_mask":
    (1, tiles, tile_px, tile_px) int64}: a batch's images' tiles in token order, as one processor sample.
    """

    image_token: str | None = "<image>"
    default_tokenizer: str | None = "smolvlm"
    tile_px: int = 384
    """``max_image_size["longest_edge"]``: the side of a tile and of the global view (the vision tower's input)."""
    longest_edge: int = 1536
    """``size["longest_edge"]``: every image is first resized (up or down) so its longest edge is this."""
    patch_size: int = 14
    """The vision tower's patch size (``vision_config.patch_size``)."""
    scale_factor: int = 3
    """The connector's pixel shuffle (``SmolVLMConfig.scale_factor``): scale_factor**2 patches per token."""
    do_image_splitting: bool = True
    """``do_image_splitting``: False gives every image as the global view alone (image_seq_len tokens)."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values", "pixel_attention_mask")
    overridable: ClassVar[tuple[str, ...]] = (
        "tile_px", "longest_edge", "patch_size", "scale_factor", "do_image_splitting", *ModelProfile.overridable,
    )

    def __post_init__(self) -> None:
        side = self.tile_px // self.patch_size
        if self.tile_px < 1 or self.longest_edge < 1 or self.patch_size < 1 or self.scale_factor < 1:
            raise ConfigError(f"profile {self.name!r}: tile_px, longest_edge, patch_size and scale_factor must be >= 1")
        if side < 1 or side % self.scale_factor:  # the connector's pixel shuffle regroups side x side patches
            raise ConfigError(
                f"profile {self.name!r}: the {side} patches along a tile (tile_px {self.tile_px} // patch_size "
                f"{self.patch_size}) must be a positive multiple of scale_factor ({self.scale_factor})"
            )
        if self.do_image_splitting and self.side_tiles > MAX_SIDE_TILES:
            raise ConfigError(
                f"profile {self.name!r}: longest_edge {self.longest_edge} splits an image into {self.side_tiles} "
                f"tiles of {self.tile_px} px a side; SmolVLM's tokenizer names rows and columns up to {MAX_SIDE_TILES} "
                "(<row_6_col_6>)"
            )

    @cached_property
    def image(self) -> SmolVLMImage:
        return SmolVLMImage(self.image_token, self.tile_px, self.longest_edge, self.patch_size, self.scale_factor,
                            self.do_image_splitting, bidirectional=self.bidirectional_images)

    @property
    def image_seq_len(self) -> int:
        return self.image.image_seq_len

    @property
    def side_tiles(self) -> int:
        return self.image.side_tiles

    # ------------------------------------------------------------------ read / proof

    def reader(self) -> Reader:
        from packer.models.smolvlm.reader import SmolVLMReader

        return SmolVLMReader(self)

    def proof(self) -> Proof:
        from packer.models.smolvlm.proof import SmolVLMProof

        return SmolVLMProof(self)


def _rescale_to_max_len(height: int, width: int, max_len: int) -> tuple[int, int]:
    """``_resize_output_size_rescale_to_max_len`` (min_len 1): the longest side to ``max_len``, the other
    scaled (truncated) and rounded up to even."""
    aspect_ratio = width / height
    if width >= height:
        width = max_len
        height = int(width / aspect_ratio)
        if height % 2 != 0:
            height += 1
    else:
        height = max_len
        width = int(height * aspect_ratio)
        if width % 2 != 0:
            width += 1
    return max(height, 1), max(width, 1)


def _scale_below_upper_bound(height: int, width: int, max_len: int) -> tuple[int, int]:
    """``_resize_output_size_scale_below_upper_bound``: the longest side down to ``max_len`` if above it."""
    aspect_ratio = width / height
    if width >= height and width > max_len:
        width = max_len
        height = int(width / aspect_ratio)
    elif height > width and height > max_len:
        height = max_len
        width = int(height * aspect_ratio)
    return max(height, 1), max(width, 1)


def _vision_encoder_size(height: int, width: int, tile_px: int) -> tuple[int, int]:
    """``SmolVLMImageProcessorPil.resize_for_vision_encoder``: the longest side up to whole tiles, the other
    from the aspect ratio (truncated), then up to whole tiles."""
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / tile_px) * tile_px
        height = int(width / aspect_ratio)
        height = math.ceil(height / tile_px) * tile_px
    else:
        height = math.ceil(height / tile_px) * tile_px
        width = int(height * aspect_ratio)
        width = math.ceil(width / tile_px) * tile_px
    return height, width


@lru_cache(maxsize=4096)
def tile_grid(width: int, height: int, *, tile_px: int, longest_edge: int, do_image_splitting: bool = True) -> tuple[int, int]:
    """(rows, cols) of SmolVLMImageProcessorPil's split of a ``width`` x ``height`` image, (0, 0) when it is not
    split; the processor's own arithmetic (transformers 5.23.0, ``_preprocess`` with ``do_resize``):

    1. resize: the longest edge to ``longest_edge`` (up or down), the other side scaled, truncated and made
       even; then no side beyond 4096;
    2. ``resize_for_vision_encoder``: the longest side rounded up to whole tiles, the other side scaled from it
       (truncated) and rounded up to whole tiles;
    3. ``split_images``: rows = height / tile_px, cols = width / tile_px if either side exceeds one tile, else
       not split.

    This is the path the pixels take; ``get_number_of_image_patches`` (SmolVLMProcessor's token count without
    pixels) rounds the short side from the step-1 size instead of from the step-2 width, which agrees on every
    size tried (tests/models/test_smolvlm.py).

        tile_grid(640, 480, tile_px=384, longest_edge=1536)    # (3, 4)
    """
    if width < 1 or height < 1:
        raise RecordError("bad_image", f"image of {width}x{height} px has no pixels")
    if not do_image_splitting:
        return 0, 0
    h, w = _rescale_to_max_len(height, width, longest_edge)
    h, w = _scale_below_upper_bound(h, w, MAX_IMAGE_SIZE)
    h, w = _vision_encoder_size(h, w, tile_px)
    if h > tile_px or w > tile_px:
        return (h - tile_px) // tile_px + 1, (w - tile_px) // tile_px + 1
    return 0, 0


@lru_cache(maxsize=256)
def prompt_string(rows: int, cols: int, image_seq_len: int, *, image_token: str = "<image>") -> str:
    """What SmolVLMProcessor writes for one image (transformers' ``processing_smolvlm.get_image_prompt_string``):
    per tile ``<fake_token_around_image><row_i_col_j>`` + ``<image>`` * image_seq_len, a newline after each row,
    then a newline and the global view ``<fake_token_around_image><global-img>`` + ``<image>`` * image_seq_len +
    ``<fake_token_around_image>``; an unsplit image (0, 0) is the global view alone."""
    tile = image_token * image_seq_len
    whole = f"{FAKE_TOKEN}{GLOBAL_TOKEN}{tile}{FAKE_TOKEN}"
    if rows == 0 and cols == 0:
        return whole
    text = "".join(
        "".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{tile}" for c in range(cols)) + "\n" for r in range(rows)
    )
    return f"{text}\n{whole}"
