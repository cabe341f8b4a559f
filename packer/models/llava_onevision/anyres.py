"""LLaVA-OneVision's anyres rule as transformers 5.23.0 computes it, in plain Python: the pinpoint grid, the best
resolution for an image, the unpadded feature map, and which images a path tiles (``tiled_alone``). Shared by the
profile (counts) and the proof (per-image crops)."""

from __future__ import annotations

import math

import numpy as np

from packer.errors import RecordError


def anyres_pinpoints(crop_px: int, max_tiles_per_side: int = 6) -> tuple[tuple[int, int], ...]:
    """OneVision's ``image_grid_pinpoints`` (h, w): every 1..6 x 1..6 grid of crops, rows outer.

        anyres_pinpoints(384)[:2] == ((384, 384), (384, 768))
    """
    sides = range(1, max_tiles_per_side + 1)
    return tuple((crop_px * i, crop_px * j) for i in sides for j in sides)


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
