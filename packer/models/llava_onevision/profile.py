"""LLaVA-OneVision: SigLIP crops of 384 px, anyres tiling (``anyres_max_9``), unpadding and a newline per row.

An example's ONE image is tiled; every image of an example with several is not (the processor's and the
model's ``batch_num_images`` rule, "only single image patching is supported"). In a message tree the example
the model sees is one root-to-leaf path: an image is tiled when every path through its node holds it alone,
untiled when every such path holds others too, and the record is refused (``image_tree``) when they differ:

    one image, 640x480 -> best pinpoint (h, w) = (768, 768): 1 base crop + 2x2 tiles of 384 px = 5 crops
        tiles' features 54x54 (27 per tile side), unpadded to the image's aspect: 40 x 54 (7 rows of
        padding cut each side), under 9 crops' worth of features (ratio 0.57 <= 1.1), so not downscaled
        -> 729 base + 40 rows x (54 + 1 newline) = 729 + 40*55 = 2929 tokens of <image>
    two images in one example -> each 384x384 padded to square, 1 crop: 729 + 1 newline = 730 tokens

Stored grid (t, h, w) = (crops, feature rows, feature columns): (5, 40, 54) above, (1, 27, 27) for an
untiled image, so ``grid_num_tokens`` re-derives every count from the shards alone. Positions stay 1-D.

Exact against transformers 5.23.0: counts against ``LlavaOnevisionProcessor`` on every COCO-mini image and
odd sizes, tokens against its ``input_ids``, feature lengths against ``LlavaOnevisionModel.
pack_image_features``, and packed == unpacked on ``LlavaOnevisionForConditionalGeneration``
(tests/models/test_llava_onevision.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import ImageRef
from packer.errors import ConfigError, RecordError
from packer.media.images import load_image
from packer.models.base import ModelProfile

if TYPE_CHECKING:
    import torch


def anyres_pinpoints(crop_px: int, max_tiles_per_side: int = 6) -> tuple[tuple[int, int], ...]:
    """OneVision's ``image_grid_pinpoints`` (h, w): every 1..6 x 1..6 grid of crops, rows outer.

        anyres_pinpoints(384)[:2] == ((384, 384), (384, 768))
    """
    sides = range(1, max_tiles_per_side + 1)
    return tuple((crop_px * i, crop_px * j) for i in sides for j in sides)


@dataclass(frozen=True, kw_only=True)
class LlavaOnevisionProfile(ModelProfile):
    """LLaVA-OneVision (llava-hf/llava-onevision-qwen2-*-ov-hf): SigLIP 384/14, ``anyres_max_9``.

    ``pixel_inputs`` gives {"pixel_values": (sum(crops), 3, px, px) float32, "image_sizes": (N, 2) int64 (h, w),
    "batch_num_images": (G,) int64}: groups of one (tiled) or several (untiled) images, as the model reads them.
    """

    image_token: str | None = "<image>"
    default_tokenizer: str = "llava-onevision"
    crop_px: int = 384
    """The side of every crop the vision tower sees (SigLIP's image_size)."""
    patch_size: int = 14
    """Vision transformer patch side in pixels: 384 // 14 = 27 features per crop side, 729 per crop."""
    max_tiles: int = 9
    """``anyres_max_<n>``: above 1.1x this many crops' worth of features, the unpadded map is downscaled."""
    pinpoints: tuple[tuple[int, int], ...] = field(default_factory=lambda: anyres_pinpoints(384))
    """The (h, w) resolutions a tiled image is resized and padded to (the processor's image_grid_pinpoints)."""

    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_sizes", "batch_num_images"
    )
    hf_model_class: ClassVar[str | None] = "LlavaOnevisionForConditionalGeneration"

    def __post_init__(self) -> None:
        if self.crop_px < self.patch_size or any(h % self.crop_px or w % self.crop_px for h, w in self.pinpoints):
            raise ConfigError(
                f"profile {self.name!r}: every pinpoint must be a multiple of 'crop_px' ({self.crop_px}) and "
                f"'crop_px' at least 'patch_size' ({self.patch_size})"
            )

    @property
    def side(self) -> int:
        """Features per crop side (27)."""
        return self.crop_px // self.patch_size

    # ------------------------------------------------------------------ encode

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """(crops, feature rows, feature columns) of an image tiled alone (its example's one image)."""
        best_h, best_w = select_best_resolution(height, width, self.pinpoints)
        rows, cols = best_h // self.crop_px, best_w // self.crop_px
        feat_h, feat_w = unpadded_features(height, width, self.side * rows, self.side * cols)
        ratio = math.sqrt(feat_h * feat_w / (self.max_tiles * self.side**2))
        if ratio > 1.1:  # both the processor and the model's interpolate floor each side
            feat_h, feat_w = int(feat_h // ratio), int(feat_w // ratio)
        return (1 + rows * cols, feat_h, feat_w)

    def num_tokens(self, width: int, height: int) -> int:
        return int(self.grid_num_tokens(np.array([self.grid_thw(width, height)]))[0])

    def example_images(
        self, sizes: list[tuple[int, int]], *, image_nodes: np.ndarray | None = None,
        node_parents: np.ndarray | None = None,
    ) -> list[tuple[tuple[int, int, int], int]]:
        """Tiled if every path through the image's node holds it alone; else one crop: side**2 + 1 tokens.

        The model sees each root-to-leaf path as its own example (``tiled_alone``)."""
        nodes = np.zeros(len(sizes), dtype=np.int64) if image_nodes is None else np.asarray(image_nodes)
        parents = np.array([-1]) if node_parents is None else np.asarray(node_parents)
        untiled = ((1, self.side, self.side), self.side**2 + 1)
        return [
            (self.grid_thw(w, h), self.num_tokens(w, h)) if alone else untiled
            for (w, h), alone in zip(sizes, tiled_alone(nodes, parents), strict=True)
        ]

    # ------------------------------------------------------------------ read

    def make_image_processor(self) -> Any:
        # The PIL backend: torchvision is not a dependency. llava-hf's preprocessor_config.json for OneVision
        # is the class defaults (384 px, bicubic, CLIP mean/std, the 36 anyres pinpoints).
        from transformers import LlavaOnevisionImageProcessorPil

        return LlavaOnevisionImageProcessorPil(
            size={"height": self.crop_px, "width": self.crop_px},
            image_grid_pinpoints=[list(p) for p in self.pinpoints],
            do_pad=False,  # crops are concatenated (4-D), not padded to the batch's most crops
        )

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Each image as its example's only one (tiled): any grid with t > 1 says so."""
        return self.pixel_inputs(images, [(2, 0, 0)] * len(images))

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """Tiled images (t > 1) go to the processor alone, each run of untiled ones (t == 1) together, so its
        ``batch_num_images`` and the model's pick the same crops. An untiled image always has company: the
        other images on its paths, next to it in token order and kept in its row (the encoder refuses a cut
        that would part them)."""
        import torch

        groups: list[list[int]] = []  # image indices, one processor "sample" each
        for i, (t, _, _) in enumerate(grids):
            if t == 1 and groups and grids[groups[-1][-1]][0] == 1:
                groups[-1].append(i)
            else:
                groups.append([i])
        if any(len(g) == 1 and grids[g[0]][0] == 1 for g in groups):
            raise ConfigError(
                f"profile {self.name!r}: an untiled image without its example's other images; the model would "
                "tile it (batch_num_images 1). Collate whole examples"
            )
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=[[decoded[i] for i in g] for g in groups], return_tensors=None)
        return {
            "pixel_values": torch.from_numpy(np.concatenate(out["pixel_values"])),  # (sum(crops), 3, px, px)
            "image_sizes": torch.tensor(np.array(out["image_sizes"]), dtype=torch.int64),  # (N, 2) (h, w)
            "batch_num_images": torch.tensor([len(g) for g in groups], dtype=torch.int64),  # (G,)
        }

    # ------------------------------------------------------------------ verify

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """side**2 base features + h rows of (w + 1 newline) for a tiled image; side**2 + 1 untiled."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        t, h, w = grids[:, 0], grids[:, 1], grids[:, 2]
        base = self.side**2
        untiled = (t == 1) & (h == self.side) & (w == self.side)
        tiled = (t > 1) & (h > 0) & (w > 0)
        return np.where(untiled, base + 1, np.where(tiled, base + h * (w + 1), -1))

    # ------------------------------------------------------------------ the reference model

    def model_tokens(self) -> tuple[str, ...]:
        """``<image>`` and ``<video>``: the config names both, so a renumbered vocabulary keeps them apart."""
        return (self.image_token or "<image>", "<video>")

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, hidden: int = 32) -> Any:
        """A random-weight fp32 ``LlavaOnevisionForConditionalGeneration`` shaped like this profile's crops:
        a 1-layer SigLIP of ``crop_px`` / ``patch_size``, a 2-layer Qwen2 of width ``hidden``; ``token_ids``
        maps ``model_tokens()`` to ids in ``vocab_size``. SigLIP's key bias is frozen: softmax ignores it, so
        its exact gradient is 0 and both sides hold only rounding noise that no tolerance compares."""
        from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

        image, video = self.model_tokens()
        config = LlavaOnevisionConfig(
            text_config=dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=hidden,
                             intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=1, num_attention_heads=2, image_size=self.crop_px,
                               patch_size=self.patch_size),
            image_token_index=token_ids[image],
            video_token_index=token_ids[video],
            image_grid_pinpoints=[list(p) for p in self.pinpoints],
            vision_aspect_ratio=f"anyres_max_{self.max_tiles}",
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            attn_implementation="sdpa",
        )
        model = LlavaOnevisionForConditionalGeneration(config).float().train()
        for name, param in model.named_parameters():
            if name.endswith("k_proj.bias"):
                param.requires_grad_(False)
        return model

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each image's crops and size: ``side**2 + 1`` tokens mark an untiled image (one crop; a tiled one has
        at least side**2 + 2), else its crops are the base one plus its pinpoint's tiles."""
        out, row = [], 0
        for i, n in enumerate(num_tokens):
            h, w = batch["image_sizes"][i].tolist()
            best_h, best_w = select_best_resolution(h, w, self.pinpoints)
            crops = 1 if n == self.side**2 + 1 else 1 + (best_h // self.crop_px) * (best_w // self.crop_px)
            out.append({"pixel_values": batch["pixel_values"][row : row + crops],
                        "image_sizes": batch["image_sizes"][i : i + 1]})
            row += crops
        return out

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """One path as the processor gives it alone: its images are one sample (``batch_num_images`` = how
        many), so the model itself decides which to tile; the model's own positions and attention."""
        import torch

        out = super().reference_inputs(input_ids, images, token_ids=token_ids)
        if images:
            out["batch_num_images"] = torch.tensor([len(images)], dtype=torch.int64)
        return out


def tiled_alone(image_nodes: np.ndarray, node_parents: np.ndarray) -> list[bool]:
    """Per image (in node ``image_nodes``), True if every root-to-leaf path through its node holds exactly one
    image (the processor and model tile it), False if every such path holds several; RecordError
    ``image_tree`` if they disagree, as no one token count is right for every path.

    A root image with two branches that each add one is untiled (2 on every path); an image in each of
    two branches and none in the root is tiled (1 on each); a root image with one branch that adds one and
    one that does not is refused (1 on one path, 2 on the other):

        tiled_alone(np.array([1, 2]), np.array([-1, 0, 0])) == [True, True]
    """
    parents = np.asarray(node_parents).tolist()  # parents before children (depth-first order)
    count = np.bincount(np.asarray(image_nodes, dtype=np.int64), minlength=len(parents)).tolist()
    on_path = list(count)  # images from the root down to each node
    for n, p in enumerate(parents):
        if p >= 0:
            on_path[n] += on_path[p]
    has_child = {p for p in parents if p >= 0}
    low = [math.inf if n in has_child else on_path[n] for n in range(len(parents))]  # fewest/most images on
    high = [-1 if n in has_child else on_path[n] for n in range(len(parents))]  # a path through each node
    for n in range(len(parents) - 1, 0, -1):
        if parents[n] >= 0:
            low[parents[n]], high[parents[n]] = min(low[parents[n]], low[n]), max(high[parents[n]], high[n])
    out = []
    for n in np.asarray(image_nodes).tolist():
        if low[n] == 1 < high[n]:
            raise RecordError(
                "image_tree",
                f"tree node {n}'s image is the only image on one path through it but has {high[n] - 1} more on "
                "another: LLaVA-OneVision tiles an example's one image and not several, so no one token count "
                "fits both; give every branch below it an image, or none",
            )
        out.append(high[n] == 1)
    return out


def select_best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The pinpoint (h, w) that keeps most of the image's pixels, then wastes least: transformers'
    ``image_processing_utils.select_best_resolution``, same arithmetic, first of equals wins.

        select_best_resolution(480, 640, anyres_pinpoints(384)) == (768, 768)
    """
    best, most, least = (0, 0), 0, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = ph * pw - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (ph, pw), effective, wasted
    return best


def unpadded_features(height: int, width: int, feat_h: int, feat_w: int) -> tuple[int, int]:
    """The (rows, columns) of a (feat_h, feat_w) tile feature map left once the padding the resize to the
    pinpoint added is cut away: the processor's ``_get_unpadded_features`` and the model's ``unpad_image``.

        unpadded_features(480, 640, 54, 54) == (40, 54)   # 54 * 480/640 = 40.5 -> 40, 7 rows cut each side
    """
    if width / height > feat_w / feat_h:
        padding = (feat_h - int(round(height * (feat_w / width), 7))) // 2
        return feat_h - 2 * padding, feat_w
    padding = (feat_w - int(round(width * (feat_h / height), 7))) // 2
    return feat_h, feat_w - 2 * padding
