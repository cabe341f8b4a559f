"""``ModelProfile``: what packer asks a model family, cut by who asks. One family is one package
(``packer/models/<family>/``); its profile subclasses this, and its reader and proof subclass ``Reader``
(reader.py) and ``Proof`` (proof.py).

    encode   (packer.encode: counts from headers, before any pixel is decoded)
             image_size(ref) -> (w, h)            the header (media/images.py), shared by every family
             grid_thw(w, h), num_tokens(w, h)     the family's resize rule
             plan_video(ref) -> VideoPlan         a video's frames, grid and tokens from its header
             audio_info(ref) -> AudioInfo         an audio clip's header (media/audio.py), shared by every family
             audio_run(ref, info) -> MediaRun     what one clip becomes: samples, features, tokens (audio_token)
             image_blocks(w, h) -> ImageBlocks    the processor's rewrite of an image's text BEFORE tokenizing
             media_runs(media, parents) -> runs   what each media placeholder becomes AFTER tokenizing
                                                  (default: image_run / video_run of each, alone)
             extra_positions(...) -> (3, L)|None  positions beyond the 1-D row (mRoPE), per example
    read     bidirectional_spans(row)             token ranges that see each other (collate, packer inspect)
             reader() -> Reader                   rows -> the model's inputs (torch; reader.py)
    report   image_units(grids)                   what an image becomes besides tokens (tiles, crops), or None
    verify   grid_num_tokens, video_grid_num_tokens, video_faults, audio_feature_lengths, audio_num_tokens,
             expected_extra_positions, verify_spans
    proof    proof() -> Proof                     the model class, a tiny model, one path's inputs (proof.py)

The base class is a model without vision or audio (the ``text`` family); a family overrides what it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from packer.core.types import AudioRef, ImageRef, VideoRef
from packer.errors import ConfigError, RecordError
from packer.media.images import image_size
from packer.models.registry import no_medium, profiles_with
from packer.models.rules import (
    AudioPlan,
    AudioRule,
    ImageBlocks,
    ImageRule,
    Media,
    MediaRun,
    Positions,
    VideoRule,
    audio_info,
)

if TYPE_CHECKING:
    from packer.core.types import EncodedAudio, EncodedVideo
    from packer.media.audio import AudioInfo
    from packer.media.video import VideoPlan
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """One model family's profile under one name (``packer.models.get_profile``)."""

    name: str
    """Profile name, as given to ``--profile``."""
    image_token: str | None = None
    """The placeholder the chat template writes once per image; None for a model without vision."""
    vision_start: str | None = None
    """Token before an image's placeholders (Qwen), or None; truncation never leaves it without its image."""
    vision_end: str | None = None
    """Token after an image's placeholders (Qwen), or None."""
    bidirectional_images: bool = False
    """True when tokens of one image attend to each other in both directions (Molmo-style)."""
    default_tokenizer: str | None = "qwen2-vl"
    """Tokenizer used when the build names none; None where no honest default exists (the build must name one)."""
    video_token: str | None = None
    """The placeholder the template writes once per video (Qwen: ``<|video_pad|>``); None without video."""
    audio_token: str | None = None
    """The placeholder the template writes once per audio clip (Qwen-Omni: ``<|AUDIO|>``); None without audio."""

    mrope: ClassVar[bool] = False
    """True when ``extra_positions`` gives 3-D mRoPE rows (the shards' ``mrope_position_ids``)."""
    fractional_positions: ClassVar[bool] = False
    """True where ``extra_positions`` returns float32 positions that may be fractional (e.g. Qwen3-Omni, whose video
    time positions are ``t * second_per_grid * 13``): ``collate`` then gives float32 ``position_ids``; else int64,
    and a stored position that is not a whole number is a ShardError."""
    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids")
    """The collated batch keys the model's forward takes (``packer.train`` passes these and no others)."""
    audio_sample_rate: ClassVar[int] = 16000
    """The rate the family's audio loader resamples every clip to (Whisper-style encoders: 16 kHz)."""
    audio_in_video: ClassVar[bool] = False
    """True when ``media_runs`` lays out a video's sound track (``AudioRef.video``) with its frames (Qwen-Omni)."""
    overridable: ClassVar[tuple[str, ...]] = ("image_token", "bidirectional_images", "default_tokenizer")
    """Fields ``get_profile(name, **overrides)`` may change."""

    @property
    def has_vision(self) -> bool:
        return self.image_token is not None

    @property
    def has_video(self) -> bool:
        return self.video_token is not None

    @property
    def has_audio(self) -> bool:
        return self.audio_token is not None

    # ------------------------------------------------------------------ the rules (packer.models.rules)

    @cached_property
    def image(self) -> ImageRule | None:
        """The image rule, None without vision. TRANSITIONAL: the old hooks behind one adapter until the family
        gives its own rule (each migrated family overrides this)."""
        return _LegacyImage(self) if self.image_token is not None else None

    @cached_property
    def video(self) -> VideoRule | None:
        return _LegacyVideo(self) if self.video_token is not None else None

    @cached_property
    def audio(self) -> AudioRule | None:
        return _LegacyAudio(self) if self.audio_token is not None else None

    @cached_property
    def positions(self) -> Positions:
        return _LegacyPositions(self)

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

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """The frames, grid and token count of one video, from its header alone (``packer.media.video``);
        RecordError for a video the family cannot use."""
        raise RecordError(
            "image_count_mismatch",
            f"profile {self.name!r} takes no videos, but the record names one; use {' or '.join(profiles_with('video'))}",
        )

    def image_blocks(self, width: int, height: int) -> ImageBlocks | None:
        """How the processor rewrites an image of this size in the text before tokenizing (``ImageBlocks``), or
        None (the default): the template's one placeholder, expanded after tokenizing by ``media_runs``."""
        return None

    def media_runs(self, media: list[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """What each of one example's media placeholders becomes, in token order (``MediaRun``); RecordError
        for media this model cannot take together. ``node_parents`` (N,) is the example's tree (-1 at the root).

        Each alone by default (``image_run`` / ``video_run``); a family whose rule looks at the other media of
        a root-to-leaf path (what the model sees as one example) overrides it (LLaVA-OneVision tiles an
        image only when it is its path's one image). A clip named twice (a tree's branches) is planned once.
        """
        plans: dict[VideoRef, VideoPlan] = {}
        out = []
        for m in media:
            if isinstance(m.ref, VideoRef):
                if self.video is None:
                    raise no_medium(self.name, "video")
                if m.ref not in plans:
                    plans[m.ref] = self.video.plan(m.ref)
                out.append(self.video.run(plans[m.ref]))
            elif isinstance(m.ref, AudioRef):
                if self.audio is None:
                    raise no_medium(self.name, "audio")
                if m.ref.video:  # laid out with its video's frames: a family that interleaves them overrides this
                    raise RecordError(
                        "unsupported_medium",
                        f"profile {self.name!r} does not take a video's sound track (use_audio_in_video); "
                        f"drop the option or use {' or '.join(profiles_with('audio_in_video')) or 'an omni profile'}",
                    )
                out.append(self.audio.run(self.audio.plan(m.ref)))
            else:
                if self.image is None:
                    raise no_medium(self.name, "image")
                out.append(self.image.run(self.image.plan(m.ref)))
        return out

    def image_run(self, width: int, height: int) -> MediaRun:
        """One image alone: ``num_tokens`` placeholders over ``grid_thw``, by default."""
        return MediaRun(self.grid_thw(width, height), self.num_tokens(width, height))

    def video_run(self, plan: VideoPlan) -> MediaRun:
        """One planned video: its ``num_tokens`` placeholders, by default."""
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), plan=plan)

    def audio_info(self, audio: AudioRef) -> AudioInfo:
        """An audio clip's header after its window (``packer.models.rules.audio_info``)."""
        return audio_info(audio)

    def audio_plan(self, info: AudioInfo) -> AudioPlan:
        """The samples the family's loader yields (``loaded_num_samples`` at ``audio_sample_rate``) and the
        feature frames they make (``audio_feature_lengths``), from the header."""
        from packer.media.audio import loaded_num_samples

        n = int(loaded_num_samples(info, self.audio_sample_rate))
        length = int(self.audio_feature_lengths(np.array([n], dtype=np.int64))[0])
        if length <= 0:
            raise RecordError("bad_audio", f"{info.source}: {n} samples at {self.audio_sample_rate} Hz make no "
                                           f"feature frame for profile {self.name!r}")
        return AudioPlan(self.audio_sample_rate, n, length)

    def audio_run(self, audio: AudioRef, info: AudioInfo) -> MediaRun:
        """One audio clip alone: ``audio_num_tokens`` placeholders over its plan (``audio_plan``), by default."""
        plan = self.audio_plan(info)
        n = int(self.audio_num_tokens(np.array([plan.feature_length], dtype=np.int64))[0])
        return MediaRun((), n, audio=plan)

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
        audios: list[EncodedAudio] = (),  # type: ignore[assignment]
    ) -> np.ndarray | None:
        """Positions the model takes beyond the 1-D ``positions`` of one encoded example, or None: (3, L) int32, or
        float32 where ``fractional_positions`` (the shards store both as float32, whole numbers exactly).

        ``ids`` (L,) are the expanded tokens, ``grids`` the example's images in token order, ``token_ids`` the
        ids the encoder resolved for "image_token", "video_token", "audio_token", "vision_start" and "vision_end"
        (None where unset), ``videos`` the example's videos in token order (passed only when it has some),
        ``audios`` its audio clips (``EncodedAudio``, token order; passed only to a family with audio, when the
        example has some).
        """
        return None

    # ------------------------------------------------------------------ read

    def bidirectional_spans(self, row: dict[str, Any]) -> list[tuple[int, ...]]:
        """The [start, end) token ranges of one row whose tokens all see each other, relative to the row.

        ``row`` is a shard row (docs/format.md: ``input_ids``, ``images``, ``videos``, ``node_offsets``,
        ``node_parents``). The default is each image's run when ``bidirectional_images`` is set, else none.
        ``collate`` emits these as the batch's ``bidirectional_spans`` and ``packer inspect --mask`` draws them,
        so both follow this one rule. A family may give (start, end, group) rows instead: the spans of one
        group see each other too (Molmo2); a group's spans lie on one root-to-leaf path, and group ids are the
        row's node indices.

            images = [{"offset": 5, "num_tokens": 4}]  ->  [(5, 9)] with bidirectional_images, else []
        """
        if not self.bidirectional_images:
            return []
        return [(int(im["offset"]), int(im["offset"]) + int(im["num_tokens"])) for im in row["images"]]

    def reader(self) -> Reader:
        """What turns this profile's rows into its model's inputs (torch imported there, not here)."""
        from packer.models.reader import Reader

        return Reader(self)

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

    def audio_feature_lengths(self, num_samples: np.ndarray) -> np.ndarray:
        """Feature frames of clips of ``num_samples`` samples at ``audio_sample_rate`` ((A,) int64 -> (A,) int64),
        -1 where none: the encode rule (``audio_plan``) and verify's. Without audio every clip is wrong.

        A family that stores ``padded_samples`` (``AudioPlan``) takes them too, as a keyword:
        ``audio_feature_lengths(num_samples, padded_samples=padded)`` ((A,) int64); verify passes them only
        where the shards hold them."""
        return np.full(len(num_samples), -1, dtype=np.int64)

    def audio_num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """Audio tokens of clips of ``feature_lengths`` frames ((A,) int64 -> (A,) int64), -1 where none: the
        encode rule (``audio_run``) and verify's. Without audio every clip is wrong."""
        return np.full(len(feature_lengths), -1, dtype=np.int64)

    def video_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """(V,) bool: a stored video whose grid, frame size (V, 2: height, width) or sampled frame count
        disagree under this family (verify's check). Without video every video is wrong."""
        return np.ones(len(grids), dtype=bool)

    def verify_spans(
        self, what: str, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, fields: dict[str, np.ndarray],
        token_id: int | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], bool | int | None]:
        """The spans verify checks for the stored ``what`` ("image", "video" or "audio") entries of a row group, and which
        token lies exactly on them: True for the placeholder (``token_id``), another id (GLM-4.6V's video frames hold
        its image placeholder), or False / None where the family's runs hold other tokens. Verify checks every such
        id against all the spans that claim it, images' and videos' together; a placeholder no span claims must
        appear nowhere.

        ``ids`` is the row group's flat tokens, ``row_starts`` (R,) each row's first, ``lists`` (R+1,) each
        row's entries, ``fields`` the entries' columns (offset, grid_t/h/w, num_tokens, ...), ``token_id`` the
        placeholder's id (the manifest's). The entries
        themselves by default; Qwen3-VL gives a video's temporal patches, each a run of its own.
        """
        return lists, fields, True

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
        (second_per_grid_t); an audio family ``audio_offsets``, ``audio_feature_lengths``, ``audio_num_tokens``
        (A,) and ``audio_in_video`` (A,) bool (a video's sound track) when the rows hold clips.
        """
        return None

    # ------------------------------------------------------------------ proof

    def proof(self) -> Proof:
        """What proves this profile exact on its model (``scripts/check_equivalence.py``; torch there)."""
        from packer.models.proof import Proof

        return Proof(self)

    def _no_audio(self) -> RecordError:
        names = profiles_with("audio")
        use = f"use {' or '.join(names)}" if names else "no registered profile takes audio"
        return RecordError("unsupported_medium", f"profile {self.name!r} takes no audio, but the record names some; {use}")

    def _no_vision(self) -> ConfigError:
        names = profiles_with("image")
        choices = " or ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))  # "a, b or c"
        return ConfigError(f"profile {self.name!r} has no vision encoder; use {choices}")


# ---------------------------------------------------------------------------------------------------- TRANSITIONAL
# The old hooks seen as rules, while families move to rules of their own (issue 31); each goes with the last
# family that still needs it.


class _LegacyImage(ImageRule):
    def __init__(self, profile: ModelProfile):
        self.p = profile

    def run(self, size: tuple[int, int]) -> MediaRun:
        return self.p.image_run(*size)

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        return self.p.grid_thw(width, height)

    def num_tokens(self, width: int, height: int) -> int:
        return self.p.num_tokens(width, height)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return self.p.grid_num_tokens(grids)

    def blocks(self, size: tuple[int, int]) -> ImageBlocks | None:
        return self.p.image_blocks(*size)

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray] | None:
        return self.p.image_units(grids)

    def spans(self, ids, row_starts, lists, entries, token_id):  # noqa: ANN001, ANN201
        return self.p.verify_spans("image", ids, row_starts, lists, dict(entries), token_id)


class _LegacyVideo(VideoRule):
    def __init__(self, profile: ModelProfile):
        self.p = profile

    def plan(self, ref: VideoRef) -> VideoPlan:
        return self.p.plan_video(ref)

    def run(self, plan: VideoPlan) -> MediaRun:
        return self.p.video_run(plan)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return self.p.video_grid_num_tokens(grids)

    def plan_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        return self.p.video_faults(grids, sizes, num_frames)

    def spans(self, ids, row_starts, lists, entries, token_id):  # noqa: ANN001, ANN201
        return self.p.verify_spans("video", ids, row_starts, lists, dict(entries), token_id)


class _LegacyAudio(AudioRule):
    def __init__(self, profile: ModelProfile):
        object.__setattr__(self, "p", profile)
        object.__setattr__(self, "sample_rate", profile.audio_sample_rate)

    def plan(self, ref: AudioRef) -> AudioPlan:  # the family's audio_run decides: its run stands in for the plan
        return self.p.audio_run(ref, self.p.audio_info(ref))  # type: ignore[return-value]

    def run(self, plan: AudioPlan) -> MediaRun:
        return plan  # type: ignore[return-value]

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        import inspect

        has = padded_samples >= 0
        want = np.full(len(num_samples), -1, dtype=np.int64)
        if (~has).any():
            want[~has] = self.p.audio_feature_lengths(num_samples[~has])
        if has.any() and "padded_samples" in inspect.signature(self.p.audio_feature_lengths).parameters:
            want[has] = self.p.audio_feature_lengths(num_samples[has], padded_samples=padded_samples[has])
        return want

    def num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        return self.p.audio_num_tokens(feature_lengths)

    def spans(self, ids, row_starts, lists, entries, token_id):  # noqa: ANN001, ANN201
        return self.p.verify_spans("audio", ids, row_starts, lists, dict(entries), token_id)


class _LegacyPositions(Positions):
    def __init__(self, profile: ModelProfile):
        self.p = profile
        self.mrope = profile.mrope
        self.fractional = profile.fractional_positions

    def extra(self, ids, positions, node_offsets, node_parents, images, *, token_ids, videos=(), audios=()):  # noqa: ANN001, ANN201
        kw = {}
        if videos:
            kw["videos"] = videos
        if audios:
            kw["audios"] = audios
        return self.p.extra_positions(ids, positions, node_offsets, node_parents, list(images), token_ids=token_ids, **kw)

    def expected(self, length, node_offsets, node_parents, *, images, videos, audios):  # noqa: ANN001, ANN201
        kw = {}
        if len(videos["offset"]):
            kw.update(video_offsets=videos["offset"], video_grids=videos["grid"], video_seconds=videos["second_per_grid_t"])
        if len(audios["offset"]):
            kw.update(audio_offsets=audios["offset"], audio_feature_lengths=audios["feature_length"],
                      audio_num_tokens=audios["num_tokens"], audio_in_video=audios["video"])
        return self.p.expected_extra_positions(length, node_offsets, node_parents, images["offset"], images["grid"], **kw)


def image_blocks(profile: ModelProfile, ref: ImageRef) -> ImageBlocks | None:
    """The blocks the profile's image rule writes ``ref`` as (Gemma 3's pan-and-scan), or None."""
    rule = profile.image
    return None if rule is None else rule.blocks(rule.plan(ref))
