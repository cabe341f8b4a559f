"""Molmo2: one low-res view plus up to 8 overlapping high-res crops, 2x2-pooled, laid out row by row.

    640x480 -> tiling 2x2 of 378-px crops (overlap 4 patches) on a 644x644 canvas + the 378x378 view
            -> grid (t, h, w) = (5 crops, 23, 23): the canvas' 46x46 patches pooled 2x2
            -> <low_res_im_start> (<im_patch>*14 <im_col>)*14 <im_end>
               <im_start> (<im_patch>*23 <im_col>)*23 <im_end>               = 212 + 554 = 766 tokens

The template's one ``<|image|>`` per image becomes that whole run (``image_run``); all of it is what
Molmo2Processor marks ``mm_token_type_ids == 1``, and Molmo2Model lets those tokens attend to each other
in both directions: ALL image tokens of a sequence form one block (``block_sequence_ids`` 0), so two images of
one example see each other, the text between them stays causal. ``bidirectional_spans`` gives each image the group
of its chain of image nodes (an example's images, in a linear one); spans of a group see each other on every
backend (``PackedLayout.span_plan`` runs a group as one varlen segment).

Stored per image (docs/models/molmo2.md, "In the shards"): grid_t = crops (tiling_h * tiling_w + 1, the low-res view
included), grid_h / grid_w = the high-res pooled grid (``image_grids[2:]``); the low-res grid is the profile's
constant 14x14. Exact against transformers 5.23.0's ``Molmo2ImageProcessor`` / ``Molmo2Processor``
(tests/models/test_molmo2.py). That processor is torchvision-backed; the reader runs its own code
with the two torchvision calls it makes (a bilinear float resize without antialias, normalize) done by the
torch functions torchvision runs for them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.tree import ancestor_matrix
from packer.core.types import VideoRef
from packer.errors import RecordError
from packer.models.base import ModelProfile
from packer.models.molmo2.video import Molmo2Video, frame_runs
from packer.models.rules import Entries, ImageRule, Media, MediaRun, Spans

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True)
class Molmo2Image(ImageRule):
    """Molmo2's image processor: a low-res view and up to ``max_crops`` overlapping high-res crops, pooled
    ``pooling``, laid out in tokens of their own (``_image_layout``)."""

    crop_px: int = 378
    patch_size: int = 14
    max_crops: int = 8
    overlap_margins: tuple[int, int] = (4, 4)
    pooling: tuple[int, int] = (2, 2)
    col_tokens: bool = True

    @property
    def low_res_grid(self) -> tuple[int, int]:
        """The low-res view's pooled grid (rows, cols): ceil(27 / 2) = 14 each by default."""
        side = self.crop_px // self.patch_size
        return math.ceil(side / self.pooling[0]), math.ceil(side / self.pooling[1])

    def tiling(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(tiling_h, tiling_w, canvas_h, canvas_w): ``compute_crop_geometry`` of transformers' molmo2."""
        if width < 1 or height < 1:
            raise RecordError("bad_image", f"image of {width}x{height} px has no pixels")
        margin_patches = sum(self.overlap_margins)
        window = (self.crop_px // self.patch_size - margin_patches) * self.patch_size
        margin = margin_patches * self.patch_size
        th, tw = _select_tiling(height - margin, width - margin, window, self.max_crops)
        return th, tw, th * window + margin, tw * window + margin

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(crops incl. the low-res view, high-res pooled rows, high-res pooled cols)."""
        th, tw, ch, cw = self.tiling(width, height)
        ph, pw = self.pooling
        return th * tw + 1, math.ceil(ch // self.patch_size / ph), math.ceil(cw // self.patch_size / pw)

    def _run_length(self, rows: np.ndarray | int, cols: np.ndarray | int) -> np.ndarray | int:
        return rows * (cols + int(self.col_tokens)) + 2  # start, rows of patches (+ <im_col>), end

    def num_tokens(self, width: int, height: int) -> int:
        _, h, w = self.grid_thw(width, height)
        return int(self._run_length(*self.low_res_grid) + self._run_length(h, w))

    def run(self, size: tuple[int, int]) -> MediaRun:
        """``Molmo2Processor.replace_image_token``: the low-res view, then the high-res one, row by row."""
        grid = self.grid_thw(*size)
        tokens = _image_layout(self.low_res_grid, (grid[1], grid[2]), self.col_tokens)
        return MediaRun(grid, len(tokens), tokens=tokens)

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("crops", crops per stored grid): the vision tower's work per image, low-res view included."""
        return "crops", np.asarray(grids, dtype=np.int64).reshape(-1, 3)[:, 0]

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """Tokens of stored (crops, rows, cols); -1 unless rows/cols are pooled canvases of some tiling with
        tiling_h * tiling_w + 1 == crops and at most ``max_crops`` crops."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        side = self.crop_px // self.patch_size - sum(self.overlap_margins)  # window patches per crop
        tiles = np.arange(1, self.max_crops + 1)
        pooled = {p: -(-(side * tiles + sum(self.overlap_margins)) // p) for p in self.pooling}
        rows = np.searchsorted(pooled[self.pooling[0]], grids[:, 1])  # index of the tiling_h giving that many
        cols = np.searchsorted(pooled[self.pooling[1]], grids[:, 2])
        ok = (rows < len(tiles)) & (cols < len(tiles))
        ok &= pooled[self.pooling[0]][np.minimum(rows, len(tiles) - 1)] == grids[:, 1]
        ok &= pooled[self.pooling[1]][np.minimum(cols, len(tiles) - 1)] == grids[:, 2]
        ok &= (rows + 1) * (cols + 1) + 1 == grids[:, 0]
        ok &= (rows + 1) * (cols + 1) <= self.max_crops
        total = self._run_length(*self.low_res_grid) + self._run_length(grids[:, 1], grids[:, 2])
        return np.where(ok, total, -1)

    def bidirectional_spans(self, row: Mapping) -> list[tuple[int, ...]]:
        """(start, end, group) per image run and per video frame run; group = the highest node with media on
        the run's path.

        Molmo2 makes all image tokens of a sequence one block (a video's frames too); the profile's ``media_runs`` admits
        only trees whose media nodes form chains without a branch point between them, so each chain is the
        block of every path through it (two branches' own images: two chains, two groups)."""
        runs = [(int(im["offset"]), int(im["offset"]) + int(im["num_tokens"])) for im in row["images"]]
        for v in row.get("videos") or ():
            runs += frame_runs(row["input_ids"], offset=int(v["offset"]), grid=(v["grid_t"], v["grid_h"], v["grid_w"]))
        node_offsets = row.get("node_offsets")
        if node_offsets is None or len(node_offsets) <= 1:
            return [(a, b, 0) for a, b in runs]
        parents = np.asarray(row["node_parents"]).tolist()
        nodes = (np.searchsorted(np.asarray(node_offsets), [a for a, _ in runs], side="right") - 1).tolist()
        has_media = set(nodes)
        out = []
        for (a, b), node in zip(runs, nodes, strict=True):
            top, n = node, parents[node]
            while n >= 0:
                top = n if n in has_media else top
                n = parents[n]
            out.append((a, b, top))
        return out

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """Laid out in tokens of its own: the placeholder appears nowhere in a row."""
        return lists, entries, False


@dataclass(frozen=True, kw_only=True)
class Molmo2Profile(ModelProfile):
    """Molmo2 (allenai/Molmo2-*): the processor defaults of transformers 5.23.0.

    ``pixel_values`` gives Molmo2ForConditionalGeneration's image inputs: {"pixel_values": (crops, 729, 588),
    "image_token_pooling": (tokens, 4) int32, "image_grids": (N, 4), "image_num_crops": (N,)}.
    """

    image_token: str | None = "<|image|>"
    bidirectional_images: bool = True
    default_tokenizer: str = "molmo2"
    crop_px: int = 378
    """Side of the low-res view and of every high-res crop."""
    patch_size: int = 14
    max_crops: int = 8
    """Most high-res crops per image."""
    overlap_margins: tuple[int, int] = (4, 4)
    """Patches shared by neighbouring crops (left/top, right/bottom)."""
    pooling: tuple[int, int] = (2, 2)
    """Patches pooled into one token (rows, cols)."""
    col_tokens: bool = True
    """``image_use_col_tokens``: an <im_col> after every row of tokens (low-res and high-res views)."""
    video_token: str | None = "<|video|>"
    video_max_frames: int = 64
    """``Molmo2VideoProcessor.num_frames``: most frames sampled from a clip."""
    video_max_fps: float = 2.0
    """``Molmo2VideoProcessor.max_fps``: a clip faster than this samples at most duration * max_fps frames."""
    video_pooling: tuple[int, int] = (3, 3)
    """``Molmo2VideoProcessor.pooling_size``: a frame's 27x27 patches pooled 3x3 into 9x9 tokens."""

    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_token_pooling", "image_grids", "image_num_crops",
        "mm_token_type_ids",
    )  # a batch's videos reach the model as image inputs (join_vision)

    @cached_property
    def image(self) -> Molmo2Image:
        return Molmo2Image(self.crop_px, self.patch_size, self.max_crops, self.overlap_margins, self.pooling,
                           self.col_tokens, bidirectional=self.bidirectional_images)

    @cached_property
    def video(self) -> Molmo2Video:
        return Molmo2Video(self.crop_px, self.patch_size, self.video_max_frames, self.video_max_fps,
                           self.video_pooling)

    @property
    def low_res_grid(self) -> tuple[int, int]:
        return self.image.low_res_grid

    def media_runs(self, media: list[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """Each image as its own layout of tokens, each video as its frames' text (the rules' ``run``); refused (RecordError) where the model cannot take the example's media together: two
        videos, or a video and an image, on one root-to-leaf path (its processor takes one video per sample, its
        forward no images beside a video), or media above a branch point whose block would differ per branch."""
        if any(isinstance(m.ref, VideoRef) for m in media):
            check_video_alone(media, node_parents, self.name)
        if len(node_parents) > 1 and media:
            check_media_nodes(node_parents, [m.node for m in media])
        return super().media_runs(media, node_parents)

    # ------------------------------------------------------------------ read

    def reader(self) -> Reader:
        from packer.models.molmo2.reader import Molmo2Reader

        return Molmo2Reader(self)

    def proof(self) -> Proof:
        from packer.models.molmo2.proof import Molmo2Proof

        return Molmo2Proof(self)


def _select_tiling(height: int, width: int, window: int, max_crops: int) -> tuple[int, int]:
    """``select_tiling`` of transformers' molmo2 in float32 numpy (its torch float32 maths, ties and all):
    the fewest crops that cover the image without downscaling, else the one that downscales least."""
    tilings = _tilings(max_crops)
    candidates = np.asarray(tilings, dtype=np.float32) * np.float32(window)  # (K, 2) (h, w) in pixels
    with np.errstate(divide="ignore"):  # an image smaller than the margins: torch gives inf/negatives too
        scales = (candidates / np.asarray([height, width], dtype=np.float32)).min(axis=1)  # (K,)
    if (scales < 1).all():
        return tilings[int(scales.argmax())]
    return tilings[int(np.where(scales < 1.0, np.float32(10e9), scales).argmin())]


@lru_cache(maxsize=8)
def _tilings(max_crops: int) -> list[tuple[int, int]]:
    tilings = [(h, w) for h, w in itertools.product(range(1, max_crops + 1), repeat=2) if h * w <= max_crops]
    return sorted(tilings, key=lambda x: (x[0] * x[1], x[0]))


@lru_cache(maxsize=256)
def _image_layout(low: tuple[int, int], high: tuple[int, int], col_tokens: bool) -> tuple[str, ...]:
    col = ("<im_col>",) if col_tokens else ()
    low_run = ("<low_res_im_start>", *(("<im_patch>",) * low[1] + col) * low[0], "<im_end>")
    high_run = ("<im_start>", *(("<im_patch>",) * high[1] + col) * high[0], "<im_end>")
    return low_run + high_run


def check_media_nodes(node_parents: np.ndarray, media_nodes: list[int]) -> None:
    """A media node's tokens see every image of their path (the block): exact only if each image below it
    lies on every path through it, i.e. no branch point between the two nodes."""
    parents = np.asarray(node_parents).tolist()
    children = np.bincount([p for p in parents if p >= 0], minlength=len(parents))
    has_image = {int(n) for n in media_nodes}
    for node in has_image:
        between, n = [], parents[node]
        while n >= 0:
            between.append(n)
            if n in has_image and (children[between] > 1).any():
                raise RecordError(
                    "image_tree",
                    f"tree node {n} holds an image and branches before node {node}'s image: Molmo2's image "
                    "block would differ per branch; put the images in the shared prefix or in the branches only",
                )
            n = parents[n]


def check_video_alone(media: list[Media], node_parents: np.ndarray, profile: str) -> None:
    """RecordError when a root-to-leaf path holds two videos, or a video and an image."""
    anc = ancestor_matrix(np.asarray(node_parents))
    leaves = np.setdiff1d(np.arange(len(node_parents)), node_parents)
    videos = np.zeros(len(node_parents), dtype=np.int64)
    images = np.zeros(len(node_parents), dtype=np.int64)
    for m in media:
        (videos if isinstance(m.ref, VideoRef) else images)[m.node] += 1
    per_path_videos, per_path_images = anc[leaves] @ videos, anc[leaves] @ images
    if (per_path_videos > 1).any():
        raise RecordError("bad_video", f"profile {profile!r} takes at most one video per example (path); "
                                       f"one holds {int(per_path_videos.max())}: split them into separate records")
    if ((per_path_videos > 0) & (per_path_images > 0)).any():
        raise RecordError("bad_video", f"profile {profile!r} takes no image beside a video in one example (path): "
                                       "its model refuses pixel_values with pixel_values_videos; split the record")
