"""``ModelProfile``: what packer asks a model family, answered by one subclass in one file per family.

The encoder counts each image's tokens from its header size alone, before any pixel is decoded; the reader
runs the family's own HF processor; verify re-derives what the encoder wrote. A family answers all three:

    encode   image_size(ref) -> (w, h)           the header (media/images.py), shared by every family
             grid_thw(w, h) -> (t, h, w)         the family's resize rule, stored per image
             num_tokens(w, h) -> int             placeholder tokens one image becomes
             plan_video(ref) -> VideoPlan        a video's frames, grid and tokens from its header (video families)
             example_images(sizes, ...)          (grid, tokens) of an example's images, by tree node (default: alone)
             image_blocks(w, h) -> ImageBlocks   an image written as several blocks with text between (crops)
             image_token_names(grid) -> names    the run one image becomes, where not the placeholder repeated
             video_text(plan) -> str | None      what a video's placeholder becomes, if not repeated (Qwen3-VL)
             extra_positions(...) -> (3, L)|None  positions beyond the 1-D row (mRoPE), per example
    read     pixel_values(refs) -> {key: Tensor} the model's image inputs (torch imported lazily)
             pixel_inputs(refs, grids)           the same for collate, which also has the stored grids
             video_pixel_values(videos)          the model's video inputs, from the planned frames
             row_inputs(T, images) -> {key: T}   inputs derived from a collated batch (Molmo2's token types)
             video_runs(ids, video) -> [(a, b)]  a video's frame runs that count as image runs (Molmo2)
             join_vision(batch) -> batch         images and videos of one batch as the model takes both
             forward_keys                        batch keys the model's forward takes
             image_spans(images) -> [(a, b)]     token ranges that attend bidirectionally (collate, rowview)
    report   image_units(grids) -> (name, (I,))  what an image becomes besides tokens (tiles, crops), or None
    verify   grid_num_tokens(grids) -> (I,)      num_tokens of stored grids, vectorized
             expected_extra_positions(...)       extra_positions of a whole row group, vectorized
    check    hf_model_class, tiny_model(...)     a tiny random-weight model of the family's real HF class
             image_inputs(batch, ...)            a batch's vision inputs cut per image
             reference_inputs(ids, images, ...)  the kwargs that run one path alone with the model's defaults

The base class is a model without vision (the ``text`` family); a vision family overrides the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from packer.core.types import EncodedVideo, ImageRef, VideoRef
from packer.errors import ConfigError, RecordError
from packer.media.images import image_size, load_image
from packer.models.registry import profiles_with

if TYPE_CHECKING:
    import torch

    from packer.media.video import VideoPlan


class ImageBlocks(NamedTuple):
    """One image that the processor writes as several placeholder blocks with text between them, each block a
    stored image entry of its own (Gemma 3's pan-and-scan: the whole image, then its crops).

        rendered  "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"   what the chat template writes
        text      "Here is the original image " + rendered + " and here are ..." + rendered + " " + rendered
        grids     ((1, 16, 16), (2, 16, 16), (3, 16, 16))                     each block's stored grid
    """

    rendered: str
    """The chat template's rendering of the image: one ``image_token``."""
    text: str
    """What the processor tokenizes instead: one ``image_token`` per block."""
    grids: tuple[tuple[int, int, int], ...]
    """Each block's stored grid, in token order (``grid_num_tokens`` gives its tokens)."""


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
    default_tokenizer: str | None = "qwen2-vl"
    """Tokenizer used when the build names none; None where no honest default exists (the build must name one)."""
    video_token: str | None = None
    """The placeholder repeated once per video token (Qwen: ``<|video_pad|>``); None for a family without video."""

    expanded_images: ClassVar[bool] = False
    """True when an image becomes ``image_token_names(grid)`` (several kinds of token, Molmo2), not
    ``image_token`` repeated; the placeholder then never appears in a row."""
    timestamped_video: ClassVar[bool] = False
    """True when each temporal patch of a video is a run of its own among text (Qwen3-VL's timestamps)."""
    video_alone: ClassVar[bool] = False
    """True when an example the model sees (one root-to-leaf path) may hold at most one video and then no
    image (Molmo2: its processor allows one video per sample, its forward refuses images beside videos)."""
    mrope: ClassVar[bool] = False
    """True when ``extra_positions`` gives 3-D mRoPE rows (the shards' ``mrope_position_ids``)."""
    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids")
    """The collated batch keys the model's forward takes (``packer.train`` passes these and no others)."""
    overridable: ClassVar[tuple[str, ...]] = ("image_token", "bidirectional_images", "default_tokenizer")
    """Fields ``get_profile(name, **overrides)`` may change."""
    processor_wraps_images: ClassVar[bool] = False
    """True when the processor, not the chat template, puts ``vision_start``/``vision_end`` around each image's
    placeholder run (InternVL's ``<img>``...``</img>``): the encoder then writes them."""
    hf_model_class: ClassVar[str | None] = None
    """The transformers class of the family's model (``tiny_model`` builds one), or None where none runs."""

    @property
    def has_vision(self) -> bool:
        return self.image_token is not None

    @property
    def has_video(self) -> bool:
        return self.video_token is not None

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

    def example_images(
        self, sizes: list[tuple[int, int]], *, image_nodes: np.ndarray | None = None,
        node_parents: np.ndarray | None = None,
    ) -> list[tuple[tuple[int, int, int], int]]:
        """(grid_thw, num_tokens) of each image of one example, in token order, from their (w, h) sizes.

        ``image_nodes`` (I,) is each image's tree node and ``node_parents`` (N,) the example's tree (-1 at the
        root); None for a linear example (one node). Each image alone by default; a family whose rule looks at
        the other images of the example the model sees (one root-to-leaf path) overrides it: LLaVA-OneVision
        tiles an image only when it is its path's one image.
        """
        return [(self.grid_thw(w, h), self.num_tokens(w, h)) for w, h in sizes]

    @property
    def splits_images(self) -> bool:
        """True when ``image_blocks`` may split an image (the encoder then reads image headers while it renders)."""
        return False

    def image_blocks(self, width: int, height: int) -> ImageBlocks | None:
        """How an image of this size is written when the processor splits it into blocks with text between
        them (``ImageBlocks``), or None (the default): one run of ``num_tokens`` placeholders where the chat
        template put the image. Only asked when ``splits_images``."""
        return None

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """The frames, grid and token count of one video, from its header alone (``packer.media.video``);
        RecordError for a video the family cannot use."""
        video_families = profiles_with("video")
        raise RecordError(
            "image_count_mismatch",
            f"profile {self.name!r} takes no videos, but the record names one; use {' or '.join(video_families)}",
        )

    def image_token_names(self, grid: tuple[int, int, int]) -> tuple[str, ...]:
        """The ``num_tokens`` tokens, by name, one image of this grid becomes (``expanded_images`` only)."""
        raise self._no_vision()

    def check_image_nodes(self, node_parents: np.ndarray, image_nodes: list[int]) -> None:
        """Refuse (RecordError) a tree whose images, in nodes ``image_nodes``, this model cannot pack
        exactly; any layout is fine unless images attend to each other across nodes (Molmo2)."""

    def video_text(self, plan: VideoPlan) -> str | None:
        """The text a video's placeholder token becomes, where the family writes more than the placeholder
        repeated ``plan.num_tokens`` times (Qwen3-VL: a timestamp and start/end tokens around each temporal
        patch); None for the repeat."""
        return None

    def extra_positions(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        grids: list[tuple[int, int, int]],
        *,
        token_ids: dict[str, int | None],
        videos: list[EncodedVideo] = (),  # type: ignore[assignment]
    ) -> np.ndarray | None:
        """Positions the model takes beyond the 1-D ``positions`` of one encoded example, or None.

        ``ids`` (L,) are the expanded tokens, ``grids`` the example's images in token order, ``token_ids`` the
        ids the encoder resolved for "image_token", "video_token", "vision_start" and "vision_end" (None where
        unset), ``videos`` the example's videos in token order (passed only when it has some).
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

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The model's video inputs for ``videos`` (rows of the shards' ``videos`` column), decoding only the
        planned frames."""
        raise self._no_vision()

    def join_vision(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A collated batch's vision inputs as the model takes them when images and videos share it (after
        ``pixel_inputs`` and ``video_pixel_values``): unchanged by default; Molmo2's forward refuses both at
        once, so it gives its videos as images."""
        return batch

    def video_runs(self, ids: np.ndarray, video: dict[str, Any]) -> list[tuple[int, int]]:
        """[start, end) token ranges of one video's frames in its row's ``ids`` that the family treats as image
        runs (Molmo2: each frame's <frame_start>..<frame_end>, for mm_token_type_ids and the bidirectional
        block); none by default."""
        return []

    def row_inputs(self, num_tokens: int, images: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        """Model inputs derived from a collated batch of ``num_tokens`` tokens whose images are
        ``(offset, num_tokens)``: none for most families (Molmo2: ``mm_token_type_ids``)."""
        return {}

    def image_spans(
        self, images: list[dict[str, Any]], *, node_offsets: np.ndarray | None = None,
        node_parents: np.ndarray | None = None,
    ) -> list[tuple[int, ...]]:
        """The [start, end) token ranges of one row whose tokens all see each other, relative to the row.

        ``images`` are the row's image entries (docs/format.md: ``offset``, ``num_tokens``, ...). The default is
        each image's placeholder run when ``bidirectional_images`` is set, else none; a family whose block
        differs (e.g. includes its start/end tokens) overrides it. ``collate`` emits these as the batch's
        ``bidirectional_spans`` and ``packer inspect --mask`` draws them, so both follow this one rule.
        A family may give (start, end, group) rows instead: the spans of one group see each other too
        (Molmo2); a group's spans lie on one root-to-leaf path; ``node_offsets`` / ``node_parents`` are the
        row's tree, and group ids are its node indices.

            images = [{"offset": 5, "num_tokens": 4}]  ->  [(5, 9)] with bidirectional_images, else []
        """
        if not self.bidirectional_images:
            return []
        return [(int(im["offset"]), int(im["offset"]) + int(im["num_tokens"])) for im in images]

    # ------------------------------------------------------------------ report

    def image_units(self, grids: np.ndarray) -> tuple[str, np.ndarray] | None:
        """The unit the vision tower works in per image, for ``packer stats``: (name, count per stored grid).

        ``grids`` (I, 3) int64 as stored; e.g. InternVL ("tiles", rows * cols + thumbnail). None (the default)
        when tokens say it all: stats then show no units.
        """
        return None

    # ------------------------------------------------------------------ verify

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """Vision tokens of each stored grid ((I, 3) int64 -> (I,) int64), -1 where no image has that grid.

        verify checks every image's ``num_tokens`` against it; without vision every image is wrong.
        """
        return np.full(len(grids), -1, dtype=np.int64)

    def video_grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """``num_tokens`` of stored video grids ((V, 3) -> (V,)), -1 where no video has that grid: the image
        rule by default (Qwen's t * h * w / 4 serves both); Molmo2's frames differ from its images."""
        return self.grid_num_tokens(grids)

    def expected_extra_positions(
        self,
        length: int,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        image_offsets: np.ndarray,
        image_grids: np.ndarray,
        **videos: np.ndarray,
    ) -> np.ndarray | None:
        """``extra_positions`` of a forest of nodes (a row group's examples, flattened), without a loop.

        ``node_offsets``/``node_parents`` (N,) index the flat stream of ``length`` tokens, -1 at each root;
        ``image_offsets`` (I,) are the images' first tokens and ``image_grids`` (I, 3) their grids; a video
        family also gets ``video_offsets`` (V,), ``video_grids`` (V, 3) and ``video_seconds`` (V,)
        (second_per_grid_t).
        """
        return None

    # ------------------------------------------------------------------ check (scripts/check_equivalence.py)

    def model_tokens(self) -> tuple[str, ...]:
        """The tokens whose ids ``tiny_model``'s config names: the placeholder and delimiters by default.

        The equivalence check renumbers a build's ids to a small vocabulary and keeps these distinct.
        """
        return tuple(t for t in (self.image_token, self.vision_start, self.vision_end) if t is not None)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny random-weight fp32 model of ``hf_model_class`` (train mode), built from a config offline.

        ``token_ids`` maps each of ``model_tokens()`` to its id in a ``vocab_size`` vocabulary; ``kw`` sizes
        the language model (``tiny_text_config``). The base builds a causal LM: ``model_class="LlamaForCausalLM"``
        picks another. Seed torch first for reproducible weights.

            TextProfile(name="text").tiny_model(token_ids={}, vocab_size=256)   # a 2-layer Qwen2ForCausalLM
        """
        import transformers

        name = kw.pop("model_class", None) or self.hf_model_class
        if name is None:
            raise ConfigError(f"profile {self.name!r} names no transformers model class to check against")
        cls = getattr(transformers, name)
        config = cls.config_class(**tiny_text_config(vocab_size=vocab_size, **kw), attn_implementation="sdpa")
        return cls(config).float().train()

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """The batch's vision inputs cut per image, in batch order: what each image alone gives the model.

        ``num_tokens`` are the images' placeholder counts. The base cuts every vision key of ``forward_keys``
        into one leading entry per image (LLaVA's ``pixel_values`` (N, 3, 336, 336)); a family whose images
        take several entries (patches, tiles) overrides it.
        """
        keys = [k for k in self.forward_keys if k not in ("input_ids", "position_ids") and batch.get(k) is not None]
        return [{k: batch[k][i : i + 1] for k in keys} for i in range(len(num_tokens))]

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """Model kwargs that run ``input_ids`` (1, L), one root-to-leaf path, alone with the model's own defaults
        (its positions, its attention), given the path's images (``image_inputs`` entries, in token order)."""
        import torch

        out: dict[str, Any] = {"input_ids": input_ids, "use_cache": False}
        for key in images[0] if images else ():
            out[key] = torch.cat([im[key] for im in images])
        return out
    def video_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """(V,) bool: a stored video whose grid, frame size (V, 2: height, width) or sampled frame count
        disagree under this family (verify's check). Without video every video is wrong."""
        return np.ones(len(grids), dtype=bool)

    def _no_vision(self) -> ConfigError:
        names = profiles_with("image")
        choices = " or ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))  # "a, b or c"
        return ConfigError(f"profile {self.name!r} has no vision encoder; use {choices}")


def tiny_text_config(
    *, vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2
) -> dict[str, Any]:
    """A tiny language model's config kwargs: hidden 32, 2 layers, 4 heads, 2 KV heads (GQA), untied head.

    Generation ids are None: they are irrelevant to a loss and may not exist in a renumbered vocabulary.
    """
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


@lru_cache(maxsize=16)
def _image_processor(profile: ModelProfile) -> Any:
    return profile.make_image_processor()

