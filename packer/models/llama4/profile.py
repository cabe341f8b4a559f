"""Llama 4 (Scout / Maverick, ``Llama4ForConditionalGeneration``): an image becomes square tiles of a best-fit canvas,
plus a global tile when there are several, 144 ``<|patch|>`` tokens a tile, laid out with tile separators.

    640x480 -> canvases of 1..16 tiles of 336 px; the best fit upscales least: 672x672 (2 x 2 tiles), the image
            put in it as it is (never upscaled past 336 px a side) and padded; + the whole image at 336x336 (the
            global tile)
            -> <|image_start|> (<|patch|>*144 <|tile_x_separator|> <|patch|>*144 <|tile_y_separator|>) x 2 rows
               <|image|> <|patch|>*144 <|image_end|>                  720 <|patch|> in a run of 727 tokens
    a canvas of one tile (an image up to 336 px a side): <|image_start|><|image|><|patch|>*144<|image_end|>

The chat template writes one ``<|image|>`` per image; ``image_run`` is the run ``Llama4Processor`` writes in its
place (``_prompt_split_image``), token by token. The model replaces the ``<|patch|>`` tokens with the tiles'
features (``image_token_index``), in order: each image's tiles row by row, then its global tile, as the image
processor orders ``pixel_values``. Positions are 1-D; images attend causally, like the text. The language model's
chunked-attention layers see keys of their own chunk of positions only: packer counts chunks along each
root-to-leaf path (packer/train/layout.py, ``PackedLayout.chunk_plan``), docs/models/llama4.md.

Stored per image (docs/models/llama4.md, "In the shards"): grid (t, h, w) = (1, rows, cols) of the canvas in tiles;
``num_tokens`` = the ``<|patch|>`` tokens, 144 * (rows * cols, + 1 for the global tile when rows * cols > 1);
``offset`` is the run's first token (``<|image_start|>``). verify checks each image by its ``<|image|>`` token and
the layout around it (the image rule's ``spans``).

Counts from the header alone (width, height): transformers 5.23.0's ``image_processing_llama4`` canvas rule
(``find_supported_resolutions``, ``get_best_fit`` in float32 as it computes it), exact on every COCO-mini image and
odd sizes (tests/models/test_llama4.py). Nothing here imports torch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core import arrays
from packer.errors import ConfigError, RecordError
from packer.models.base import ModelProfile
from packer.models.llama4.tokens import IMAGE_END, IMAGE_START, PATCH, TILE_X, TILE_Y
from packer.models.rules import Entries, ImageRule, MediaRun, Spans

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True)
class Llama4Image(ImageRule):
    """Llama 4's image processor: a canvas of up to ``max_patches`` tiles (``canvas``) plus the global tile,
    ``tokens_per_tile`` ``<|patch|>`` each, written token by token (``image_tokens``)."""

    token: str = "<|image|>"
    tile_px: int = 336
    max_patches: int = 16
    resize_to_max_canvas: bool = False
    patch_size: int = 14
    pixel_shuffle_ratio: float = 0.5

    @property
    def tokens_per_tile(self) -> int:
        """``<|patch|>`` tokens per tile: Llama4Processor's ``(h // patch_size) * (w // patch_size) //
        downsample_ratio`` with ``downsample_ratio = int(round(1 / pixel_shuffle_ratio**2))`` (144 for 336 / 14 / 0.5)."""
        side = self.tile_px // self.patch_size
        return side * side // int(round(1.0 / self.pixel_shuffle_ratio**2))

    def tile_grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of the image's canvas in tiles (``canvas`` of the module, divided by tile_px)."""
        h, w = canvas(width, height, tile_px=self.tile_px, max_patches=self.max_patches,
                      resize_to_max_canvas=self.resize_to_max_canvas)
        return h // self.tile_px, w // self.tile_px

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(1, rows, cols) of the canvas."""
        return (1, *self.tile_grid(width, height))

    def num_tokens(self, width: int, height: int) -> int:
        """The image's ``<|patch|>`` tokens: tokens_per_tile per tile, the global tile included when there are several."""
        rows, cols = self.tile_grid(width, height)
        return self.tokens_per_tile * tiles(rows, cols)

    def run(self, size: tuple[int, int]) -> MediaRun:
        """Llama4Processor's run for the image (``_prompt_split_image``), token by token; the entry starts at its first
        token (``<|image_start|>``) and counts its ``<|patch|>`` tokens."""
        rows, cols = self.tile_grid(*size)
        return MediaRun((1, rows, cols), self.tokens_per_tile * tiles(rows, cols),
                        tokens=image_tokens(rows, cols, self.tokens_per_tile, self.token))

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("tiles", rows * cols, + 1 for the global tile when rows * cols > 1): the vision tower's inputs per image."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        n = grids[:, 1] * grids[:, 2]
        return "tiles", n + (n > 1)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """``<|patch|>`` tokens of stored grids: (1, rows, cols) with 1 <= rows * cols <= max_patches -> tokens_per_tile
        * tiles; (1, 0, 0) -> 1, the one ``<|image|>`` token ``spans`` checks each image by (no stored image has
        that grid: verify refuses it); else -1."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        t, r, c = grids[:, 0], grids[:, 1], grids[:, 2]
        n = r * c
        ok = (t == 1) & (r >= 1) & (c >= 1) & (n <= self.max_patches)
        marker = (t == 1) & (r == 0) & (c == 0)
        return np.where(ok, self.tokens_per_tile * (n + (n > 1)), np.where(marker, 1, -1))

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """Each image as ONE span: its ``<|image|>`` token (grid (1, 0, 0), 1 token), where the run's layout puts it
        (1 + rows * cols * (tokens_per_tile + 1) tokens from the run's offset for a tiled canvas, 1 for one tile), and
        the ``<|image|>`` tokens lie exactly on those spans (placed): a missing, extra or misplaced ``<|image|>``
        fails. The rest of each run is checked by its layout, with ids the manifest does not record read off the
        runs themselves: every tile's tokens_per_tile patches and the global tile's have one id (the ``<|patch|>``
        id, the same in every image of the row group), the separators after each tile, the run's first and last
        tokens are not that id nor ``<|image|>``, each of those positions holds one id across the row group (the
        x-separators one, the y-separators another, ...), and a row holds no ``<|patch|>`` token outside its images'
        runs. A run that breaks any of these gets offset -1 (a bad span); a row with a stray ``<|patch|>`` gets one
        such span more. An entry whose grid is not a canvas or whose num_tokens disagrees keeps its offset and
        num_tokens with grid (0, h, w), which no image has (verify reports a wrong grid).
        """
        fields = entries
        if not len(fields["offset"]):
            return lists, fields, True
        P = self.tokens_per_tile
        n = fields["num_tokens"]
        r, c = fields["grid_h"], fields["grid_w"]
        grids = np.stack([fields["grid_t"], r, c], axis=1)
        good = (self.grid_num_tokens(grids) == n) & (r >= 1) & (c >= 1)
        row_of = np.repeat(np.arange(len(lists) - 1), np.diff(lists))  # (I,) the row of each entry
        row_end = np.append(row_starts[1:], len(ids)) if len(row_starts) else row_starts
        start = row_starts[row_of] + fields["offset"]  # (I,) flat first token of each run
        kinds_of = [run_kinds(int(a), int(b), P) if g else np.zeros(0, np.int8) for a, b, g in zip(r, c, good, strict=True)]
        length = np.array([len(k) for k in kinds_of], dtype=np.int64)
        inside = good & (fields["offset"] >= 0) & (start + length <= row_end[row_of])
        laid = inside.copy()
        marker = np.where(good, start + 1 + np.where(r * c > 1, r * c * (P + 1), 0), -1)
        if inside.any():
            sel = np.flatnonzero(inside)
            kinds = np.concatenate([kinds_of[i] for i in sel])  # (K,) the kind of every token of every sound run
            entry = np.repeat(sel, length[sel])  # (K,) its entry
            pos = arrays.spans(start[sel], length[sel])
            tok = ids[pos]
            ref = {k: int(tok[kinds == k][0]) for k in range(len(KINDS)) if (kinds == k).any()}  # the group's ids
            wrong = np.zeros(len(kinds), dtype=bool)
            for k, want in ref.items():
                wrong |= (kinds == k) & (tok != want)  # one id per kind across the row group
            others = [v for k, v in ref.items() if k != KINDS.index("image")]
            if len(set(others)) != len(others) or token_id in others:
                wrong[:] = True  # two kinds share an id (or one is <|image|>'s): the layout cannot be told apart
            bad = np.bincount(entry[wrong], minlength=len(n)) > 0
            laid &= ~bad
            pid = ref[KINDS.index("patch")]  # every run has patches
            stray = np.bincount(np.searchsorted(row_starts, np.flatnonzero(ids == pid), side="right") - 1,
                                minlength=len(lists) - 1) != np.bincount(row_of, weights=np.where(good, n, 0),
                                                                          minlength=len(lists) - 1)
        else:
            stray = np.zeros(len(lists) - 1, dtype=bool)
        spans = {
            "offset": np.where(good, np.where(laid, marker - row_starts[row_of], -1), fields["offset"]),
            "num_tokens": np.where(good, 1, n),
            "grid_t": np.where(good, 1, 0),
            "grid_h": np.where(good, 0, r),
            "grid_w": np.where(good, 0, c),
        }
        if stray.any():  # one bad span more in each such row
            extra_rows = np.flatnonzero(stray)
            at = lists[1:][extra_rows]  # after the row's own spans
            for key in spans:
                spans[key] = np.insert(spans[key], at, -1 if key == "offset" else 1 if key in ("num_tokens", "grid_t")
                                       else 0)
            per_row = np.diff(lists) + stray
            lists = np.concatenate([[0], np.cumsum(per_row)])
        return lists, spans, True


@dataclass(frozen=True, kw_only=True)
class Llama4Profile(ModelProfile):
    """Llama 4: the settings of meta-llama/Llama-4-Scout-17B-16E-Instruct by default (preprocessor ``size`` 336x336,
    ``max_patches`` 16, ``resize_to_max_canvas`` false; processor ``patch_size`` 14, ``pixel_shuffle_ratio`` 0.5:
    144 tokens a tile).

    ``pixel_values`` gives {"pixel_values": (tiles, 3, tile_px, tile_px) float32}: the batch's images' tiles in token
    order, each image's tiles row by row and then its global tile, holding exactly the image processor's bfloat16
    values (the model does not cast them: a bf16 model takes them after ``.to(torch.bfloat16)``, which is exact).
    """

    image_token: str | None = "<|image|>"
    default_tokenizer: str | None = "llama4"
    tile_px: int = 336
    """``size`` (height = width): the side of a tile and of the global tile (the vision tower's ``image_size``)."""
    max_patches: int = 16
    """``max_patches``: the most tiles of a canvas (the global tile not counted)."""
    resize_to_max_canvas: bool = False
    """``resize_to_max_canvas``: pick the canvas that upscales most instead of the one that resizes least."""
    patch_size: int = 14
    """The vision tower's patch size (``vision_config.patch_size``, the processor's ``patch_size``)."""
    pixel_shuffle_ratio: float = 0.5
    """``vision_config.pixel_shuffle_ratio`` (the processor's): 1 / ratio**2 patches per token."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids", "pixel_values")
    overridable: ClassVar[tuple[str, ...]] = (
        "tile_px", "max_patches", "resize_to_max_canvas", "patch_size", "pixel_shuffle_ratio",
        *ModelProfile.overridable,
    )

    def __post_init__(self) -> None:
        if self.tile_px < 1 or self.max_patches < 1 or self.patch_size < 1 or not 0 < self.pixel_shuffle_ratio <= 1:
            raise ConfigError(f"profile {self.name!r}: tile_px, max_patches and patch_size must be >= 1 and "
                              "pixel_shuffle_ratio in (0, 1]")
        side = self.tile_px // self.patch_size
        shuffled = side * self.pixel_shuffle_ratio
        if side < 1 or shuffled != int(shuffled) or int(shuffled) ** 2 != self.tokens_per_tile:
            raise ConfigError(
                f"profile {self.name!r}: the {side} patches along a tile (tile_px {self.tile_px} // patch_size "
                f"{self.patch_size}) times pixel_shuffle_ratio {self.pixel_shuffle_ratio} must be a whole number of "
                "tokens (the vision adapter's pixel shuffle)"
            )

    @cached_property
    def image(self) -> Llama4Image:
        return Llama4Image(self.image_token, self.tile_px, self.max_patches, self.resize_to_max_canvas,
                           self.patch_size, self.pixel_shuffle_ratio, bidirectional=self.bidirectional_images)

    @property
    def tokens_per_tile(self) -> int:
        return self.image.tokens_per_tile

    # ------------------------------------------------------------------ read / proof

    def reader(self) -> Reader:
        from packer.models.llama4.reader import Llama4Reader

        return Llama4Reader(self)

    def proof(self) -> Proof:
        from packer.models.llama4.proof import Llama4Proof

        return Llama4Proof(self)


KINDS = ("start", "patch", "x", "y", "image", "end")
"""The tokens of an image's run by role (``run_kinds``)."""


@lru_cache(maxsize=1024)
def run_kinds(rows: int, cols: int, tokens_per_tile: int) -> np.ndarray:
    """(L,) int8 index into ``KINDS`` of every token of an image's run (the layout ``image_tokens`` writes)."""
    names = image_tokens(rows, cols, tokens_per_tile)
    code = {IMAGE_START: 0, PATCH: 1, TILE_X: 2, TILE_Y: 3, "<|image|>": 4, IMAGE_END: 5}
    out = np.array([code[t] for t in names], dtype=np.int8)
    out.flags.writeable = False
    return out


def tiles(rows: int, cols: int) -> int:
    """Tiles the vision tower sees for a canvas of rows x cols: those, and the global tile when there are several."""
    return rows * cols + (rows * cols > 1)


@lru_cache(maxsize=1024)
def image_tokens(rows: int, cols: int, tokens_per_tile: int, image_token: str = "<|image|>") -> tuple[str, ...]:
    """Llama4Processor._prompt_split_image's run: ``<|image_start|>``; for a canvas of several tiles, each row's tiles
    (tokens_per_tile ``<|patch|>`` each) with ``<|tile_x_separator|>`` between two and ``<|tile_y_separator|>`` after
    the row; then ``<|image|>``, the global tile's (or the one tile's) patches and ``<|image_end|>``."""
    tile = (PATCH,) * tokens_per_tile
    out: list[str] = [IMAGE_START]
    if rows * cols > 1:
        for _ in range(rows):
            for x in range(cols):
                out += tile
                if x < cols - 1:
                    out.append(TILE_X)
            out.append(TILE_Y)
    out += [image_token, *tile, IMAGE_END]
    return tuple(out)


@lru_cache(maxsize=64)
def supported_canvases(max_patches: int, tile_px: int) -> tuple[tuple[int, int], ...]:
    """(height, width) of every canvas, in ``find_supported_resolutions``'s order (transformers 5.23.0): for chunk
    counts max_patches .. 1, each factor pair (h, w) of it, grouped by aspect ratio h / w in first-seen order."""
    by_ratio: dict[float, list[tuple[int, int]]] = defaultdict(list)
    for count in range(max_patches, 0, -1):
        factors = sorted({f for i in range(1, int(count**0.5) + 1) if count % i == 0 for f in (i, count // i)})
        for h in factors:
            by_ratio[h / (count // h)].append((h, count // h))
    return tuple((h * tile_px, w * tile_px) for pairs in by_ratio.values() for h, w in pairs)


@lru_cache(maxsize=4096)
def canvas(width: int, height: int, *, tile_px: int, max_patches: int, resize_to_max_canvas: bool) -> tuple[int, int]:
    """(height, width) in pixels of the canvas Llama4ImageProcessor resizes a ``width`` x ``height`` image into:
    ``get_best_fit`` over ``supported_canvases``, in float32 as its torch tensors compute it.

    Per canvas, the scale that fits the image without distortion, min(canvas_h / height, canvas_w / width); of the
    scales >= 1 the smallest (the largest with ``resize_to_max_canvas``), else the largest below 1 (downscale
    least); of the canvases with that scale, the first of least area.

        canvas(640, 480, tile_px=336, max_patches=16, resize_to_max_canvas=False)    # (672, 672): 2 x 2 tiles
    """
    if width < 1 or height < 1:
        raise RecordError("bad_image", f"image of {width}x{height} px has no pixels")
    options = np.array(supported_canvases(max_patches, tile_px), dtype=np.int64)  # (K, 2)
    scale_h = options[:, 0].astype(np.float32) / np.float32(height)  # int64 tensor / int: float32, as torch does
    scale_w = options[:, 1].astype(np.float32) / np.float32(width)
    scales = np.where(scale_h > scale_w, scale_w, scale_h)
    up = scales[scales >= 1]
    if len(up):
        chosen = up.max() if resize_to_max_canvas else up.min()
    else:
        chosen = scales[scales < 1].max()
    fits = options[scales == chosen]
    best = fits[np.argmin(fits[:, 0] * fits[:, 1])]  # the first of least area (torch.argmin)
    return int(best[0]), int(best[1])
