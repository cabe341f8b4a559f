"""``Reader``: the reader side of a family (``ModelProfile.reader()``): a batch of shard rows -> the model's media
inputs (pixels, grids, the family's own keys). ``packer.train.collate`` builds everything a row says about tokens
and boundaries, then asks the profile's reader for the rest with ONE call, ``batch_inputs``.

The default serves the common case: every image through the family's HF image processor
(``make_image_processor``), videos through ``video_pixel_values``, and ``image_offsets`` / ``video_offsets`` (the
first token of each, in the batch). A family overrides the part that differs (LLaVA-OneVision's image groups,
Gemma 3's pan-and-scan blocks, Molmo2's token types and videos-as-images). Imported only when a reader is asked
for: torch and transformers load here, never at build time.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from packer.core.types import ImageRef
from packer.media.images import load_image

if TYPE_CHECKING:
    from packer.models.base import ModelProfile


def image_ref(image: dict[str, Any]) -> ImageRef:
    """A stored image entry's reference (inline bytes, else its path)."""
    if image["data"] is not None:
        return ImageRef(data=image["data"])
    return ImageRef(path=image["source"])


class Reader:
    """Turns one profile's rows into its model's media inputs."""

    def __init__(self, profile: ModelProfile):
        self.profile = profile

    # ------------------------------------------------------------------ the one call collate makes

    def batch_inputs(self, rows: list[dict[str, Any]], row_starts: np.ndarray, *, load_media: bool = True) -> dict[str, Any]:
        """The media inputs of a batch of ``rows`` laid end to end: row r spans ``row_starts[r]`` to
        ``row_starts[r + 1]`` of the batch's tokens (``row_starts`` (R+1,)).

        ``load_media`` False: no pixel is decoded (``PackedDataset(load_images=False)``), only the offsets.
        """
        out: dict[str, Any] = {}
        images = [im for r in rows for im in r["images"]]
        if images:
            if load_media:
                grids = [(im["grid_t"], im["grid_h"], im["grid_w"]) for im in images]
                out.update(self.pixel_inputs([image_ref(im) for im in images], grids))
            out["image_offsets"] = torch.tensor(_offsets(rows, row_starts, "images"), dtype=torch.int64)
        videos = [v for r in rows for v in r.get("videos", ())]
        if videos:  # only each video's sampled frames are decoded
            if load_media:
                out.update(self.video_pixel_values(videos))
            out["video_offsets"] = torch.tensor(_offsets(rows, row_starts, "videos"), dtype=torch.int64)
        return out

    # ------------------------------------------------------------------ images

    def image_processor(self) -> Any:
        """The HF image processor configured like the profile (built offline, cached per profile)."""
        return _image_processor(type(self), self.profile)

    def make_image_processor(self) -> Any:
        """A new HF image processor for the profile (``image_processor`` caches it)."""
        raise self.profile._no_vision()

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Decode ``images`` (RGB) and run the processor; keep the outputs the model's forward takes."""
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=decoded, return_tensors="pt")
        return {k: out[k] for k in self.profile.forward_keys if k in out}

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """What a batch's images give the model, knowing their stored grids too: ``pixel_values`` by default.

        A family whose model needs more than the pixels (which images were tiled) overrides it.
        """
        return self.pixel_values(images)

    # ------------------------------------------------------------------ videos

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The model's video inputs for ``videos`` (rows of the shards' ``videos`` column), decoding only the
        planned frames."""
        raise self.profile._no_vision()


def _offsets(rows: list[dict[str, Any]], row_starts: np.ndarray, key: str) -> list[int]:
    """The batch offset of every entry of ``key`` ("images", "videos"), rows in order."""
    return [int(e["offset"]) + int(s) for r, s in zip(rows, row_starts, strict=False) for e in r.get(key, ())]


@lru_cache(maxsize=16)
def _image_processor(reader: type[Reader], profile: ModelProfile) -> Any:
    return reader(profile).make_image_processor()
