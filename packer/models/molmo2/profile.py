"""Molmo2: one low-res view plus up to 8 overlapping high-res crops, 2x2-pooled, laid out row by row.

    640x480 -> tiling 2x2 of 378-px crops (overlap 4 patches) on a 644x644 canvas + the 378x378 view
            -> grid (t, h, w) = (5 crops, 23, 23): the canvas' 46x46 patches pooled 2x2
            -> <low_res_im_start> (<im_patch>*14 <im_col>)*14 <im_end>
               <im_start> (<im_patch>*23 <im_col>)*23 <im_end>               = 212 + 554 = 766 tokens

The template's one ``<|image|>`` per image becomes that whole run (``image_token_names``); all of it is what
Molmo2Processor marks ``mm_token_type_ids == 1``, and Molmo2Model lets those tokens attend to each other
in both directions: ALL image tokens of a sequence form one block (``block_sequence_ids`` 0), so two images of
one example see each other, the text between them stays causal. ``image_spans`` gives each image the group
of its chain of image nodes (an example's images, in a linear one); spans of a group see each other on every
backend (``PackedLayout.span_plan`` runs a group as one varlen segment).

Stored per image (docs/format.md, "Molmo2"): grid_t = crops (tiling_h * tiling_w + 1, the low-res view
included), grid_h / grid_w = the high-res pooled grid (``image_grids[2:]``); the low-res grid is the profile's
constant 14x14. Exact against transformers 5.23.0's ``Molmo2ImageProcessor`` / ``Molmo2Processor``
(tests/models/test_molmo2.py). That processor is torchvision-backed; ``make_image_processor`` runs its own code
with the two torchvision calls it makes (a bilinear float resize without antialias, normalize) done by the
torch functions torchvision runs for them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import VideoRef
from packer.errors import RecordError
from packer.models.base import ModelProfile

if TYPE_CHECKING:
    import torch

    from packer.media.video import VideoPlan

# Every token an image's run may hold (Molmo2Processor.image_token_ids): mm_token_type_ids 1, bidirectional.
IMAGE_RUN_TOKENS = ("<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<im_end>")
FRAME_TOKENS = ("<frame_start>", "<frame_end>")  # a video frame's run: the same, around <im_patch> only


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

    expanded_images: ClassVar[bool] = True
    video_alone: ClassVar[bool] = True
    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_token_pooling", "image_grids", "image_num_crops",
        "mm_token_type_ids",
    )  # a batch's videos reach the model as image inputs (join_vision)

    # ------------------------------------------------------------------ geometry

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

    def check_image_nodes(self, node_parents: np.ndarray, image_nodes: list[int]) -> None:
        """An image node's tokens see every image of their path (the block): exact only if each image below
        it lies on every path through it, i.e. no branch point between the two nodes."""
        parents = np.asarray(node_parents).tolist()
        children = np.bincount([p for p in parents if p >= 0], minlength=len(parents))
        has_image = {int(n) for n in image_nodes}
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

    def image_token_names(self, grid: tuple[int, int, int]) -> tuple[str, ...]:
        """``Molmo2Processor.replace_image_token``: the low-res view, then the high-res one, row by row."""
        return _image_layout(self.low_res_grid, (grid[1], grid[2]), self.col_tokens)

    # ------------------------------------------------------------------ video

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """A clip's frames and tokens from its header (``packer.models.molmo2.video.plan``)."""
        from packer.models.molmo2.video import plan

        return plan(self, video)

    def video_text(self, plan: VideoPlan) -> str:
        """``Molmo2Processor.get_video_string``: per frame its time, then <frame_start> <im_patch>*81 <frame_end>."""
        from packer.models.molmo2.video import video_text

        return video_text(plan)

    def video_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t, every frame at the crop size, its pooled grid that of the crop."""
        side = self.crop_px // self.patch_size
        rows, cols = -(-side // self.video_pooling[0]), -(-side // self.video_pooling[1])
        return ((grids[:, 0] != num_frames) | (grids[:, 0] < 1) | (grids[:, 1] != rows) | (grids[:, 2] != cols)
                | (sizes[:, 0] != self.crop_px) | (sizes[:, 1] != self.crop_px))

    def video_runs(self, ids: np.ndarray, video: dict[str, Any]) -> list[tuple[int, int]]:
        """Each frame's <frame_start> <im_patch>*81 <frame_end> in the row (``molmo2_video.frame_runs``)."""
        from packer.models.molmo2.video import frame_runs

        return frame_runs(ids, offset=int(video["offset"]), grid=(video["grid_t"], video["grid_h"], video["grid_w"]))

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``pixel_values_videos`` (frames, 729, 588), ``video_token_pooling`` (tokens, 9), ``video_grids``
        (V, 3) of the shards' videos: the planned frames decoded, then Molmo2VideoProcessor's own code."""
        from packer.models.molmo2.video import video_pixel_values

        return video_pixel_values(self, videos)

    def video_grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """<im_patch> tokens of stored (frames, rows, cols): frames * rows * cols, -1 unless (rows, cols) is
        the pooled frame grid (9, 9)."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        side = self.crop_px // self.patch_size
        ok = (grids[:, 0] >= 1) & (grids[:, 1] == -(-side // self.video_pooling[0]))
        ok &= grids[:, 2] == -(-side // self.video_pooling[1])
        return np.where(ok, grids.prod(axis=1), -1)

    def join_vision(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Videos given as images where a batch has both (``molmo2_video.join_vision``)."""
        from packer.models.molmo2.video import join_vision

        return join_vision(batch)

    # ------------------------------------------------------------------ read

    def make_image_processor(self) -> Any:
        return _processor_class()(
            size={"height": self.crop_px, "width": self.crop_px},
            max_crops=self.max_crops,
            overlap_margins=list(self.overlap_margins),
            patch_size=self.patch_size,
            pooling_size=list(self.pooling),
        )

    def row_inputs(self, num_tokens: int, images: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        """``mm_token_type_ids`` (1, T): 1 on every token of an image's run, as Molmo2Processor marks them."""
        import torch

        out = torch.zeros((1, num_tokens), dtype=torch.int64)
        for offset, n in images:
            out[0, offset : offset + n] = 1
        return {"mm_token_type_ids": out}

    def image_spans(
        self, images: list[dict[str, Any]], *, node_offsets: np.ndarray | None = None,
        node_parents: np.ndarray | None = None,
    ) -> list[tuple[int, int, int]]:
        """(start, end, group) per image; group = the highest node with images on the image's path.

        Molmo2 makes all image tokens of a sequence one block; ``check_image_nodes`` admits only trees whose
        image nodes form chains without a branch point between them, so each chain is the block of every
        path through it (two branches' own images: two chains, two groups)."""
        starts = [int(im["offset"]) for im in images]
        if node_offsets is None or len(node_offsets) <= 1:
            return [(s, s + int(im["num_tokens"]), 0) for s, im in zip(starts, images, strict=True)]
        parents = np.asarray(node_parents).tolist()
        nodes = (np.searchsorted(np.asarray(node_offsets), starts, side="right") - 1).tolist()
        has_image = set(nodes)
        out = []
        for s, im, node in zip(starts, images, nodes, strict=True):
            top, n = node, parents[node]
            while n >= 0:
                top = n if n in has_image else top
                n = parents[n]
            out.append((s, s + int(im["num_tokens"]), top))
        return out

    # ------------------------------------------------------------------ train

    hf_model_class: ClassVar[str | None] = "Molmo2ForConditionalGeneration"

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> Any:
        """A tiny random fp32 ``Molmo2ForConditionalGeneration`` (2+2 layers, width 64, vision width 32),
        whose image token ids are ``token_ids`` by token name (``<im_patch>``, ``<im_start>``,
        ``<low_res_im_start>``, ``<im_end>``; the frame tokens default to ``<im_start>`` / ``<im_end>``'s).

        The vision tower keeps the real 378-px / 14-px geometry (729 position embeddings): the processor's
        crops must fit it. ``kw`` overrides Molmo2Config fields (e.g. ``attn_implementation``). Train mode;
        the key biases are frozen (see below).
        """
        from transformers import Molmo2Config, Molmo2ForConditionalGeneration

        side = self.crop_px // self.patch_size
        config = Molmo2Config(
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                           "image_size": [self.crop_px, self.crop_px], "patch_size": self.patch_size,
                           "num_position_embeddings": side * side},
            adapter_config={"vision_feature_layer": [-1, -2], "hidden_size": 32, "num_attention_heads": 2,
                            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "text_hidden_size": 64},
            text_config={"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                         "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": vocab_size,
                         "additional_vocab_size": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
            image_patch_id=token_ids["<im_patch>"],
            image_start_token_id=token_ids["<im_start>"],
            low_res_image_start_token_id=token_ids["<low_res_im_start>"],
            image_end_token_id=token_ids["<im_end>"],
            frame_start_token_id=token_ids.get("<frame_start>", token_ids["<im_start>"]),
            frame_end_token_id=token_ids.get("<frame_end>", token_ids["<im_end>"]),
            **{"attn_implementation": "sdpa", **kw},
        )
        model = Molmo2ForConditionalGeneration(config).float().train()
        for name, param in model.named_parameters():
            # a key bias shifts all of a query's scores alike, which softmax ignores: its gradient is 0 but
            # for ~1e-17 of rounding noise, which no relative comparison of gradients can take
            if name.endswith("k_proj.bias"):
                param.requires_grad_(False)
        return model

    def model_tokens(self) -> tuple[str, ...]:
        """The tokens ``tiny_model``'s config names by id (and the image run's <im_col>, kept distinct)."""
        return (*IMAGE_RUN_TOKENS, *FRAME_TOKENS, "<|image|>", "<|video|>")

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """The batch's image inputs cut per image: its crops' ``pixel_values``, its pooled tokens'
        ``image_token_pooling`` (re-based to its own crops), its ``image_grids`` and ``image_num_crops`` rows."""
        crops = batch["image_num_crops"].tolist()
        grids = batch["image_grids"]
        pooled = (grids[:, 0] * grids[:, 1] + grids[:, 2] * grids[:, 3]).tolist()
        patches = batch["pixel_values"].shape[1]
        out, c0, p0 = [], 0, 0
        for i, (c, p) in enumerate(zip(crops, pooled, strict=True)):
            pool = batch["image_token_pooling"][p0 : p0 + p]
            out.append({
                "pixel_values": batch["pixel_values"][c0 : c0 + c],
                "image_token_pooling": pool.where(pool < 0, pool - c0 * patches),
                "image_grids": grids[i : i + 1],
                "image_num_crops": batch["image_num_crops"][i : i + 1],
            })
            c0, p0 = c0 + c, p0 + p
        return out

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """One path as Molmo2Processor gives it: the images' inputs joined (pooling indices offset by the crops
        before; a video: its frames as crops, ``join_vision``), ``mm_token_type_ids`` 1 on the image and frame run
        tokens; the model's own attention and positions."""
        import torch

        run_ids = torch.tensor([token_ids[t] for t in (*IMAGE_RUN_TOKENS, *FRAME_TOKENS) if t in token_ids],
                               device=input_ids.device)
        out: dict[str, Any] = {"input_ids": input_ids, "use_cache": False,
                               "mm_token_type_ids": torch.isin(input_ids, run_ids).long()}
        if images:
            pools, patches = [], 0
            for im in images:
                pool = im["image_token_pooling"]
                pools.append(pool.where(pool < 0, pool + patches))
                patches += im["pixel_values"].shape[0] * im["pixel_values"].shape[1]
            out["image_token_pooling"] = torch.cat(pools)
            for key in ("pixel_values", "image_grids", "image_num_crops"):
                out[key] = torch.cat([im[key] for im in images])
        return out

    # ------------------------------------------------------------------ report

    def image_units(self, grids: np.ndarray) -> tuple[str, np.ndarray]:
        """("crops", crops per stored grid): the vision tower's work per image, low-res view included."""
        return "crops", np.asarray(grids, dtype=np.int64).reshape(-1, 3)[:, 0]

    # ------------------------------------------------------------------ verify

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


@lru_cache(maxsize=1)
def _processor_class() -> type:
    """transformers' ``Molmo2ImageProcessor`` with its two torchvision calls done in torch (no torchvision)."""
    import torch
    import torch.nn.functional as F
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    class Molmo2ImageProcessorTorch(Molmo2ImageProcessor):
        def resize(self, image, size, resample=None, antialias=True, **kwargs):
            # torchvision's tensor resize of a float image: this very interpolate call (bilinear is the only
            # mode Molmo2 uses; it passes antialias=False)
            return F.interpolate(
                image, size=(size.height, size.width), mode="bilinear", align_corners=False, antialias=antialias
            )

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            return image.sub_(mean).div_(std) if inplace else (image - mean) / std

    return Molmo2ImageProcessorTorch
