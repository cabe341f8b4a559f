"""InternVL (2.5 / 3): dynamic 448-px tiles plus a thumbnail, 256 tokens per tile, ``<img>``...``</img>`` around.

    640x480 -> aspect 1.33: of the tile layouts with 1..12 tiles, (cols, rows) = (4, 3) is closest (ties go
            to more tiles while the image covers more than half of them) -> resized to 1792x1344, cut into
            12 tiles of 448 px, + a 448x448 thumbnail of the whole image = 13 tiles
            -> <img> + <IMG_CONTEXT> x 13*256 + </img>; positions stay 1-D
    a layout of one tile gets no thumbnail: 1 tile, 256 tokens

Stored grid (t, h, w) = (1, rows, cols) of the tile layout; the thumbnail is implied (one more tile whenever
rows * cols > 1), so ``num_tokens`` = (rows * cols + [rows * cols > 1]) * 256.

Exact against transformers 5.23.0's ``InternVLProcessor`` with ``GotOcr2ImageProcessorPil`` (the PIL backend:
torchvision is not a dependency; the torchvision ``GotOcr2ImageProcessor`` shares the same
``get_optimal_tiled_canvas``): tile counts on every COCO-mini image and odd sizes, expansions against the
processor's ``input_ids`` (tests/models/test_internvl.py). The chat template writes one ``<IMG_CONTEXT>`` per
image and the *processor* writes ``<img>``/``</img>`` around its run (``image_run``: the run's tokens, the entry after ``<img>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.errors import ConfigError
from packer.models.base import ModelProfile
from packer.models.rules import ImageRule, MediaRun

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True)
class TiledImage(ImageRule):
    """InternVL's dynamic tiling: the layout of ``min_tiles``..``max_tiles`` tiles closest to the image's aspect
    (``tile_layout``), plus a thumbnail when there are several, ``tokens_per_tile`` each, written
    ``start`` + ``token`` * n + ``end``."""

    token: str = "<IMG_CONTEXT>"
    tile_px: int = 448
    tokens_per_tile: int = 256
    min_tiles: int = 1
    max_tiles: int = 12

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, rows, cols) of the tile layout, as the processor's ``get_optimal_tiled_canvas`` picks it."""
        cols, rows = tile_layout(width, height, tile_px=self.tile_px, min_tiles=self.min_tiles,
                                 max_tiles=self.max_tiles)
        return (1, rows, cols)

    def num_tokens(self, width: int, height: int) -> int:
        _, rows, cols = self.grid_thw(width, height)
        return num_tiles(rows * cols) * self.tokens_per_tile

    def run(self, size: tuple[int, int]) -> MediaRun:
        """``<img>`` + ``<IMG_CONTEXT>`` * num_tokens + ``</img>``: the chat template writes one ``<IMG_CONTEXT>``
        and the processor the rest, the delimiters included (the entry starts after ``<img>``)."""
        grid = self.grid_thw(*size)
        n = self.num_tokens(*size)
        return MediaRun(grid, n, tokens=_wrapped(self.start, self.token, self.end, n), lead=1)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """(rows * cols + thumbnail) * 256 for a layout of min..max tiles, else -1."""
        tiles = grids[:, 1] * grids[:, 2]
        ok = (grids[:, 0] == 1) & (tiles >= self.min_tiles) & (tiles <= self.max_tiles)
        return np.where(ok, (tiles + (tiles > 1)) * self.tokens_per_tile, -1)

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("tiles", rows * cols + the thumbnail): the 448-px crops the vision tower runs on, per image."""
        tiles = grids[:, 1] * grids[:, 2]
        return "tiles", tiles + (tiles > 1)


@dataclass(frozen=True, kw_only=True)
class InternVLProfile(ModelProfile):
    """InternVL: an image becomes 1..``max_tiles`` tiles of ``tile_px`` (+ a thumbnail), 256 tokens each.

    ``pixel_values`` gives {"pixel_values": (sum of tiles, 3, 448, 448) float32}, images' tiles in order.
    """

    image_token: str | None = "<IMG_CONTEXT>"
    vision_start: str | None = "<img>"
    vision_end: str | None = "</img>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    default_tokenizer: str | None = "internvl3"
    tile_px: int = 448
    """Tile side in pixels (the vision tower's input)."""
    tokens_per_tile: int = 256
    """(448 / 14)**2 patches, pixel-shuffled by 0.5: 256 tokens per tile."""
    min_tiles: int = 1
    """Fewest tiles of a layout (``min_patches`` of the image processor)."""
    max_tiles: int = 12
    """Most tiles of a layout (``max_patches``; InternVL3's default), the thumbnail not counted."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values")
    overridable: ClassVar[tuple[str, ...]] = ("min_tiles", "max_tiles", *ModelProfile.overridable)

    def __post_init__(self) -> None:
        if not 1 <= self.min_tiles <= self.max_tiles:
            raise ConfigError(
                f"profile {self.name!r}: need 1 <= 'min_tiles' <= 'max_tiles', "
                f"got min_tiles={self.min_tiles}, max_tiles={self.max_tiles}"
            )

    @cached_property
    def image(self) -> TiledImage:
        return TiledImage(self.image_token, start=self.vision_start, end=self.vision_end, bidirectional=self.bidirectional_images, tile_px=self.tile_px,
                          tokens_per_tile=self.tokens_per_tile, min_tiles=self.min_tiles, max_tiles=self.max_tiles)

    def reader(self) -> Reader:
        from packer.models.internvl.reader import InternVLReader

        return InternVLReader(self)

    def proof(self) -> Proof:
        from packer.models.internvl.proof import InternVLProof

        return InternVLProof(self)


def num_tiles(layout_tiles: int) -> int:
    """Tiles of an image whose layout has ``layout_tiles``: plus the thumbnail when there are several."""
    return layout_tiles + (layout_tiles > 1)


@lru_cache(maxsize=64)
def _layouts(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """(cols, rows) with min <= cols * rows <= max, by tile count (stable: cols-major within a count)."""
    grids = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1) if min_tiles <= c * r <= max_tiles]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def tile_layout(width: int, height: int, *, tile_px: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(cols, rows): the layout whose aspect ratio is closest to the image's, as transformers 5.23.0's
    ``got_ocr2.get_optimal_tiled_canvas`` (and InternVL's ``dynamic_preprocess``) pick it.

    A tie (the same ratio difference) goes to the later layout (more tiles) while the image's area exceeds
    half of that layout's pixel area.

        tile_layout(640, 480, tile_px=448, min_tiles=1, max_tiles=12)   # (4, 3)
    """
    aspect = width / height
    area = width * height
    best_diff, best = float("inf"), (1, 1)
    for cols, rows in _layouts(min_tiles, max_tiles):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best_diff, best = diff, (cols, rows)
        elif diff == best_diff and area > 0.5 * tile_px * tile_px * cols * rows:
            best = (cols, rows)
    return best


@lru_cache(maxsize=64)
def _wrapped(start: str, token: str, end: str, n: int) -> tuple[str, ...]:
    return (start, *(token,) * n, end)
