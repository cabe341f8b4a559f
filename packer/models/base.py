"""``ModelProfile``: what packer asks a model family, answered by one subclass in one file per family.

The encoder counts each image's tokens from its header size alone, before any pixel is decoded; the reader
runs the family's own HF processor; verify re-derives what the encoder wrote. A family answers all three:

    encode   image_size(ref) -> (w, h)           the header (media/images.py), shared by every family
             grid_thw(w, h) -> (t, h, w)         the family's resize rule, stored per image
             num_tokens(w, h) -> int             placeholder tokens one image becomes
             example_images(sizes)               (grid, tokens) of one example's images (default: each alone)
             extra_positions(...) -> (3, L)|None  positions beyond the 1-D row (mRoPE), per example
    read     pixel_values(refs) -> {key: Tensor} the model's image inputs (torch imported lazily)
             pixel_inputs(refs, grids)           the same for collate, which also has the stored grids
             forward_keys                        batch keys the model's forward takes
             image_spans(images) -> [(a, b)]     token ranges that attend bidirectionally (collate, rowview)
    verify   grid_num_tokens(grids) -> (I,)      num_tokens of stored grids, vectorized
             expected_extra_positions(...)       extra_positions of a whole row group, vectorized

The base class is a model without vision (the ``text`` family); a vision family overrides the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.media.images import image_size, load_image

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """One model family's profile under one name (``packer.models.get_profile``)."""

    name: str
    """Profile name, as given to ``--profile``."""
    image_token: str | None = None
    """The placeholder token repeated once per vision token; None for a model without vision."""
    vision_start: str | None = None
    """Token before an image's placeholders (Qwen), or None; truncation never leaves it without its image."""
    vision_end: str | None = None
    """Token after an image's placeholders (Qwen), or None."""
    bidirectional_images: bool = False
    """True when tokens of one image attend to each other in both directions (Molmo-style)."""
    default_tokenizer: str = "qwen2-vl"
    """Tokenizer used when the build names none."""

    mrope: ClassVar[bool] = False
    """True when ``extra_positions`` gives 3-D mRoPE rows (the shards' ``mrope_position_ids``)."""
    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids")
    """The collated batch keys the model's forward takes (``packer.train`` passes these and no others)."""
    overridable: ClassVar[tuple[str, ...]] = ("image_token", "bidirectional_images", "default_tokenizer")
    """Fields ``get_profile(name, **overrides)`` may change."""

    @property
    def has_vision(self) -> bool:
        return self.image_token is not None

    # ------------------------------------------------------------------ encode

    def image_size(self, image: ImageRef) -> tuple[int, int]:
        """(width, height) from the file header, cached per file (``packer.media.images.image_size``)."""
        return image_size(image)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) an image of this size becomes: what the model's processor reports."""
        raise self._no_vision()

    def num_tokens(self, width: int, height: int) -> int:
        """Vision tokens one image of this size becomes in the LLM sequence."""
        raise self._no_vision()

    def example_images(self, sizes: list[tuple[int, int]]) -> list[tuple[tuple[int, int, int], int]]:
        """(grid_thw, num_tokens) of each image of one example, in token order, from their (w, h) sizes.

        Each image alone by default; a family whose rule looks at the example's other images overrides it
        (LLaVA-OneVision tiles an image only when it is its example's one image).
        """
        return [(self.grid_thw(w, h), self.num_tokens(w, h)) for w, h in sizes]

    def extra_positions(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        grids: list[tuple[int, int, int]],
        *,
        token_ids: dict[str, int | None],
    ) -> np.ndarray | None:
        """Positions the model takes beyond the 1-D ``positions`` of one encoded example, or None.

        ``ids`` (L,) are the expanded tokens, ``grids`` the example's images in token order, ``token_ids`` the
        ids the encoder resolved for "image_token", "vision_start" and "vision_end" (None where unset).
        """
        return None

    # ------------------------------------------------------------------ read

    def image_processor(self) -> Any:
        """The HF image processor configured like this profile (built offline, cached per profile)."""
        return _image_processor(self)

    def make_image_processor(self) -> Any:
        """A new HF image processor for this profile (``image_processor`` caches it)."""
        raise self._no_vision()

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Decode ``images`` (RGB) and run the processor; keep the outputs the model's forward takes."""
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=decoded, return_tensors="pt")
        return {k: out[k] for k in self.forward_keys if k in out}

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """What ``collate`` adds for a batch's images, given their stored grids too: ``pixel_values`` by default.

        A family whose model needs more than the pixels (which images were tiled) overrides it.
        """
        return self.pixel_values(images)

    def image_spans(self, images: list[dict[str, Any]]) -> list[tuple[int, int]]:
        """The [start, end) token ranges of one row whose tokens all see each other, relative to the row.

        ``images`` are the row's image entries (docs/format.md: ``offset``, ``num_tokens``, ...). The default is
        each image's placeholder run when ``bidirectional_images`` is set, else none; a family whose block
        differs (e.g. includes its start/end tokens) overrides it. ``collate`` emits these as the batch's
        ``bidirectional_spans`` and ``packer inspect --mask`` draws them, so both follow this one rule.

            images = [{"offset": 5, "num_tokens": 4}]  ->  [(5, 9)] with bidirectional_images, else []
        """
        if not self.bidirectional_images:
            return []
        return [(int(im["offset"]), int(im["offset"]) + int(im["num_tokens"])) for im in images]

    # ------------------------------------------------------------------ verify

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """Vision tokens of each stored grid ((I, 3) int64 -> (I,) int64), -1 where no image has that grid.

        verify checks every image's ``num_tokens`` against it; without vision every image is wrong.
        """
        return np.full(len(grids), -1, dtype=np.int64)

    def expected_extra_positions(
        self,
        length: int,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        image_offsets: np.ndarray,
        image_grids: np.ndarray,
    ) -> np.ndarray | None:
        """``extra_positions`` of a forest of nodes (a row group's examples, flattened), without a loop.

        ``node_offsets``/``node_parents`` (N,) index the flat stream of ``length`` tokens, -1 at each root;
        ``image_offsets`` (I,) are the images' first tokens and ``image_grids`` (I, 3) their grids.
        """
        return None

    def _no_vision(self) -> ConfigError:
        from packer.models import get_profile, profile_names  # the registry imports this module

        names = [n for n in profile_names() if get_profile(n).has_vision]
        choices = " or ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))  # "a, b or c"
        return ConfigError(f"profile {self.name!r} has no vision encoder; use {choices}")


@lru_cache(maxsize=16)
def _image_processor(profile: ModelProfile) -> Any:
    return profile.make_image_processor()
