"""The rules a family is composed from: one object per medium (``ImageRule``, ``VideoRule``, ``AudioRule``) and one
for positions (``Positions``). A profile holds them as ``profile.image`` / ``profile.video`` / ``profile.audio``
(None where the family lacks the medium; the media table, ``core/media.py``, names these attributes) and
``profile.positions``; the encoder, verify and stats call them and nothing else of a medium.

Every medium's rule answers the same questions with the same signatures, so a caller loops over the media:

    plan(ref)                       what a reference is, from its header (an image's size, a VideoPlan, an AudioPlan)
    run(plan) -> MediaRun           what that becomes in an example's tokens, alone
    tokens(entries) -> (n,) int64   the num_tokens stored entries must have (-1: no entry of this rule has them)
    faults(entries) -> (n,) bool    stored entries whose plan disagrees under the rule (besides their tokens)
    spans(ids, row_starts, lists, entries, token_id)
                                    the spans verify checks and which id lies exactly on them

``entries`` are a medium's stored entries column by column (the shards' struct fields: offset, num_tokens,
grid_t/h/w, num_samples, ...; docs/format.md). The shared rules are classes a family instantiates with its constants
(``QwenImage(patch_size=14, merge_size=2, ...)``, ``QwenVideo``, ``WhisperAudio``, ``MRoPE``); a family with a rule
of its own subclasses one of these bases. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar, NamedTuple

import numpy as np

from packer.core import arrays
from packer.core.types import AudioRef, EncodedAudio, EncodedVideo, ImageRef, VideoRef
from packer.errors import RecordError
from packer.media.audio import AudioInfo, loaded_num_samples, probe_audio
from packer.media.images import image_size
from packer.media.video import VideoPlan

Entries = Mapping[str, np.ndarray]
"""A medium's stored entries, one array per column (``offset``, ``num_tokens``, ``grid_t``, ...), all of one length."""

Spans = tuple[np.ndarray, Entries, "bool | int | None"]


class AudioPlan(NamedTuple):
    """What a family makes of one audio clip, from its header: the stored entry's numbers (``EncodedAudio``).

        5 s at 44.1 kHz, Whisper features  ->  AudioPlan(sample_rate=16000, num_samples=80000, feature_length=500)
    """

    sample_rate: int
    """The rate the family's loader resamples to (Hz)."""
    num_samples: int
    """Mono samples the loader yields at that rate for the clip's window (``media.audio.loaded_num_samples``)."""
    feature_length: int
    """The feature frames the model reads (Whisper: log-mel frames)."""
    padded_samples: int | None = None
    """Samples the clip's features were computed over, zero-padded beside the other clips of its example (Qwen3-Omni's
    processor pads every clip of one call to the longest: the features of a clip depend on that length); None
    where the features are the clip's alone (padded to a fixed length or not at all)."""


class MediaRun(NamedTuple):
    """What one media placeholder becomes in an example's tokens, and the entry the shards store for it.

    The run is ``tokens`` (token names), else ``text`` (tokenized alone: the encoder checks that tokenizing it in
    place would give the same tokens), else the placeholder repeated ``num_tokens`` times. The stored entry
    (its offset, ``grid``, ``num_tokens``) starts ``lead`` tokens into the run.

        Qwen2-VL image 640x480  MediaRun((1, 34, 46), 391)                       391 x <|image_pad|>
        InternVL image          MediaRun((1, 3, 4), 3328, tokens=("<img>", *ctx, "</img>"), lead=1)
        Qwen3-VL video          MediaRun((4, 30, 40), 1200, text="<0.5 seconds><|vision_start|>...", plan=plan)
    """

    grid: tuple[int, int, int]
    """The stored grid (t, h, w): the image rule's ``tokens`` of it is ``num_tokens``."""
    num_tokens: int
    """The model's media tokens of this entry (stored ``num_tokens``)."""
    tokens: tuple[str, ...] | None = None
    """The whole run, token by token, by name (Molmo2's layout of an image, InternVL's <img>...</img>)."""
    text: str | None = None
    """The whole run as text (timestamps between a video's frames)."""
    lead: int = 0
    """Tokens of the run before its entry's first token."""
    plan: VideoPlan | None = None
    """A video's plan (frames, sizes, seconds): what the shards store of it."""
    audio: AudioPlan | None = None
    """An audio clip's plan (samples, features): what the shards store of it."""
    inside: bool = False
    """The run lies inside the previous placeholder's run and has no placeholder of its own: a video's sound
    track (``AudioRef.video``) that the family interleaves with its frames (Qwen-Omni). Its entry starts ``lead``
    tokens into that run; ``tokens`` / ``text`` are unset (the video's run holds them)."""


class Media(NamedTuple):
    """One media reference of an example, as ``ModelProfile.media_runs`` sees it."""

    ref: ImageRef | VideoRef | AudioRef
    node: int
    """The tree node whose messages name it (0 in a linear example)."""


class ImageBlocks(NamedTuple):
    """One image that the processor writes as several placeholder blocks with text between them, BEFORE
    tokenizing (Gemma 3's pan-and-scan: the whole image, then its crops), each block a stored entry of its own.

        rendered  "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"   what the chat template writes
        text      "Here is the original image " + rendered + " and here are ..." + rendered + " " + rendered
        runs      (MediaRun((1, 16, 16), 256), MediaRun((2, 16, 16), 256), MediaRun((3, 16, 16), 256))
    """

    rendered: str
    """The chat template's rendering of the image: one ``image_token``."""
    text: str
    """What the processor tokenizes instead: one ``image_token`` per block."""
    runs: tuple[MediaRun, ...]
    """Each block's run, in token order."""


def grids_of(entries: Entries) -> np.ndarray:
    """(n, 3) int64 grids (t, h, w) of stored entries."""
    return np.stack([entries["grid_t"], entries["grid_h"], entries["grid_w"]], axis=1).astype(np.int64).reshape(-1, 3)


# ---------------------------------------------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageRule:
    """An image's size -> its grid and tokens; stored grids -> their tokens. Subclasses give ``grid_thw`` and
    ``grid_num_tokens`` (and ``num_tokens`` where it is not the grid's)."""

    start: str | None = field(default=None, kw_only=True)
    """The token before an image's run (Qwen's ``<|vision_start|>``), or None; truncation never leaves it
    without its image."""
    end: str | None = field(default=None, kw_only=True)
    """The token after an image's run (Qwen's ``<|vision_end|>``), or None."""
    bidirectional: bool = field(default=False, kw_only=True)
    """An image's tokens see each other (the profile's ``bidirectional_images``)."""

    def plan(self, ref: ImageRef) -> tuple[int, int]:
        """(width, height) from the file header, cached per file (``packer.media.images.image_size``)."""
        return image_size(ref)

    def run(self, size: tuple[int, int]) -> MediaRun:
        """One image alone: ``num_tokens`` placeholders over ``grid_thw``, by default."""
        return MediaRun(self.grid_thw(*size), self.num_tokens(*size))

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) an image of this size becomes: what the model's processor reports."""
        raise NotImplementedError

    def num_tokens(self, width: int, height: int) -> int:
        """Vision tokens one image of this size becomes in the LLM sequence: those of its grid, by default."""
        return int(self.grid_num_tokens(np.array([self.grid_thw(width, height)], dtype=np.int64))[0])

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """Vision tokens of each stored grid ((I, 3) int64 -> (I,) int64), -1 where no image has that grid."""
        raise NotImplementedError

    def blocks(self, size: tuple[int, int]) -> ImageBlocks | None:
        """How the processor rewrites an image of this size in the text before tokenizing (``ImageBlocks``), or
        None (the default): the template's one placeholder, expanded after tokenizing by ``run``."""
        return None

    def units(self, grids: np.ndarray) -> tuple[str, np.ndarray] | None:
        """The unit the vision tower works in per image, for ``packer stats``: (name, count per stored grid), or
        None (the default) when tokens say it all (InternVL: ("tiles", rows * cols + thumbnail))."""
        return None

    def bidirectional_spans(self, row: Mapping) -> list[tuple[int, ...]]:
        """The [start, end) token ranges of one shard row (docs/format.md) whose tokens all see each other: each
        image's run where ``bidirectional``, else none. A family may give (start, end, group) rows instead: the
        spans of one group see each other too (Molmo2); a group's spans lie on one root-to-leaf path.

            images = [{"offset": 5, "num_tokens": 4}]  ->  [(5, 9)] when bidirectional, else []
        """
        if not self.bidirectional:
            return []
        return [(int(im["offset"]), int(im["offset"]) + int(im["num_tokens"])) for im in row["images"]]

    def tokens(self, entries: Entries) -> np.ndarray:
        return self.grid_num_tokens(grids_of(entries))

    def faults(self, entries: Entries) -> np.ndarray:
        """Nothing besides the tokens of its grid: an image's size is not stored."""
        return np.zeros(len(entries["offset"]), dtype=bool)

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """The spans verify checks for a row group's stored entries and which id lies exactly on them: True for
        the placeholder (``token_id``), another id (GLM-4.6V's video frames hold its image placeholder), or
        False / None where the family's runs hold other tokens. ``ids`` are the row group's flat tokens,
        ``row_starts`` (R,) each row's first, ``lists`` (R+1,) each row's entries. The entries themselves by
        default; Qwen3-VL gives a video's temporal patches, each a run of its own."""
        return lists, entries, True


# ---------------------------------------------------------------------------------------------------- video


class VideoRule:
    """A video's header -> its plan (frames, grid, tokens); stored plans -> their tokens and faults."""

    def plan(self, ref: VideoRef) -> VideoPlan:
        """The frames, grid and token count of one video, from its header alone (``packer.media.video``);
        RecordError for a video the family cannot use."""
        raise NotImplementedError

    def run(self, plan: VideoPlan) -> MediaRun:
        """One planned video: its ``num_tokens`` placeholders, by default."""
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), plan=plan)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """``num_tokens`` of stored video grids ((V, 3) -> (V,)), -1 where no video has that grid."""
        raise NotImplementedError

    def plan_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """(V,) bool: a stored video whose grid, frame size (V, 2: height, width) or sampled frame count
        disagree under this family."""
        raise NotImplementedError

    def tokens(self, entries: Entries) -> np.ndarray:
        return self.grid_num_tokens(grids_of(entries))

    def faults(self, entries: Entries) -> np.ndarray:
        sizes = np.stack([entries["height"], entries["width"]], axis=1).reshape(-1, 2)
        return self.plan_faults(grids_of(entries), sizes, entries["num_frames"]) | ~(entries["second_per_grid_t"] > 0)

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        return lists, entries, True


def frame_spans(ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
                token_id: int | None) -> Spans:
    """Videos as spans of their temporal patches (frames), for a family that writes text between them (Qwen3-VL's
    timestamps, Gemma 4's mm:ss and frame delimiters): patch k a (1, h, w) span over the k-th run of
    ``token_id`` from its video's offset; a patch whose run is missing gets offset -1 (a bad span)."""
    if not len(entries["offset"]):
        return lists, entries, True
    rows = len(lists) - 1
    row_of_vid = np.repeat(np.arange(rows), np.diff(lists))  # (V,)
    t = np.maximum(entries["grid_t"], 0)  # (V,)
    edges = np.diff(np.concatenate([[0], (ids == token_id).astype(np.int8), [0]]))
    runs = np.flatnonzero(edges == 1)  # flat starts of every run of video tokens
    first = np.searchsorted(runs, row_starts[row_of_vid] + entries["offset"])  # (V,) each video's first run
    video_of = np.repeat(np.arange(len(t)), t)  # (F,) the video of each patch
    run = first[video_of] + arrays.ranges(t)
    found = run < len(runs)
    flat = np.append(runs, -1)[np.where(found, run, len(runs))]  # (F,) -1 where the run is missing
    patches = {"offset": np.where(found, flat - row_starts[row_of_vid[video_of]], -1),
               "grid_t": np.ones(len(video_of), dtype=np.int64), "grid_h": entries["grid_h"][video_of],
               "grid_w": entries["grid_w"][video_of],
               "num_tokens": entries["num_tokens"][video_of] // np.maximum(t[video_of], 1),
               "second_per_grid_t": entries["second_per_grid_t"][video_of]}
    per_row = np.bincount(row_of_vid, weights=t, minlength=rows).astype(np.int64)
    return np.concatenate([[0], np.cumsum(per_row)]), patches, True


# ---------------------------------------------------------------------------------------------------- audio


@lru_cache(maxsize=4096)
def _probe_file(path: str, start: float | None, end: float | None, video: bool) -> AudioInfo:
    return probe_audio(path, start=start, end=end, video=video)


def audio_info(audio: AudioRef) -> AudioInfo:
    """An audio clip's header after its window (``packer.media.audio.probe_audio``): rate, channels, samples;
    RecordError ``missing_audio`` / ``bad_audio`` for a clip nothing can load."""
    if audio.data is None:  # a file: its header read once per window (a tree's branches name a clip twice)
        return _probe_file(audio.path, audio.start, audio.end, audio.video)
    return probe_audio(audio.data, start=audio.start, end=audio.end, video=audio.video)


@dataclass(frozen=True)
class AudioRule:
    """A clip's header -> its samples, feature frames and tokens; stored clips -> the same, vectorised.
    Subclasses give ``feature_lengths`` and ``num_tokens``."""

    sample_rate: int = 16000
    """The rate the family's loader resamples every clip to (Whisper-style encoders: 16 kHz)."""
    in_video: ClassVar[bool] = False
    """True where the family lays a video's sound track (``AudioRef.video``) out with its frames (Qwen-Omni's
    ``media_runs``)."""

    def plan(self, ref: AudioRef) -> AudioPlan:
        """The samples the family's loader yields for the clip's window and the feature frames they make."""
        info = audio_info(ref)
        n = int(loaded_num_samples(info, self.sample_rate))
        length = int(self.feature_lengths(np.array([n], dtype=np.int64), np.full(1, -1, dtype=np.int64))[0])
        if length <= 0:
            raise RecordError("bad_audio", f"{info.source}: {n} samples at {self.sample_rate} Hz make no feature frame")
        return AudioPlan(self.sample_rate, n, length)

    def run(self, plan: AudioPlan) -> MediaRun:
        """One clip alone: ``num_tokens`` placeholders over its plan."""
        return MediaRun((), int(self.num_tokens(np.array([plan.feature_length], dtype=np.int64))[0]), audio=plan)

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        """Feature frames of clips of ``num_samples`` samples at ``sample_rate`` ((A,) int64 -> (A,) int64), -1 where
        none. ``padded_samples`` (A,) are the samples each clip's features were computed over, -1 where the
        features are the clip's alone (``AudioPlan.padded_samples`` None); a family that never pads gives -1 where
        they are set."""
        raise NotImplementedError

    def num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """Audio tokens of clips of ``feature_lengths`` frames ((A,) int64 -> (A,) int64), -1 where none."""
        raise NotImplementedError

    def tokens(self, entries: Entries) -> np.ndarray:
        return self.num_tokens(entries["feature_length"])

    def faults(self, entries: Entries) -> np.ndarray:
        """A clip whose rate, samples or feature length disagree under the rule, or whose padded_samples (where
        set) are fewer than its samples."""
        n, padded = entries["num_samples"], entries["padded_samples"]
        return ((self.feature_lengths(n, padded) != entries["feature_length"]) | ((padded >= 0) & (padded < n))
                | (entries["sample_rate"] != self.sample_rate) | (n < 1))

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        return lists, entries, True


# ---------------------------------------------------------------------------------------------------- positions


class Positions:
    """Positions beyond the 1-D row: per example at encode time (``extra``) and, for verify, vectorised over a
    row group's flattened forest (``expected``). The base is the flat rule: none."""

    mrope: bool = False
    """True when ``extra`` gives 3-D mRoPE rows (the shards' ``mrope_position_ids``)."""
    fractional: bool = False
    """True where ``extra`` returns float32 positions that may be fractional (Qwen3-Omni's video time positions
    are ``t * second_per_grid * 13``): ``collate`` then gives float32 ``position_ids``; else int64, and a stored
    position that is not a whole number is a ShardError."""

    def extra(self, ids: np.ndarray, positions: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray,
              images: Sequence[tuple[int, int, int]], *, token_ids: Mapping[str, int | None],
              videos: Sequence[EncodedVideo] = (), audios: Sequence[EncodedAudio] = ()) -> np.ndarray | None:
        """One encoded example's positions beyond ``positions`` (L,), or None: (3, L) int32, or float32 where
        ``fractional``. ``ids`` (L,) are the expanded tokens, ``images`` its images' grids in token order,
        ``videos`` / ``audios`` its entries in token order, ``token_ids`` the ids the encoder resolved for
        "image_token", "video_token", "audio_token", "vision_start" and "vision_end" (None where unset)."""
        return None

    def expected(self, length: int, node_offsets: np.ndarray, node_parents: np.ndarray, *, images: Entries,
                 videos: Entries, audios: Entries) -> np.ndarray | None:
        """``extra`` of a forest of nodes (a row group's examples, flattened), without a loop.

        ``node_offsets``/``node_parents`` (N,) index the flat stream of ``length`` tokens, -1 at each root; each
        medium's entries carry ``offset`` (their first token in that stream) besides their stored columns."""
        return None


def flat_mrope(positions: np.ndarray, dtype: type = np.int32) -> np.ndarray:
    """get_rope_index on text alone: three rows equal to the 1-D positions, (3, L) int32 (or ``dtype``).

    One row seen three times (row stride 0), read-only: no copy until the cache stores it token-major
    (np.broadcast_to gives the same view, slower)."""
    row = np.ascontiguousarray(positions, dtype=dtype)
    out = np.ndarray((3, row.shape[0]), dtype, row, 0, (0, row.itemsize))
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class FixedImage(ImageRule):
    """Every image resized (and cropped) to one square of ``side_px``, one token per ``patch_px`` patch, whatever
    its size (LLaVA-1.5: 336 / 14 -> (1, 24, 24), 576 tokens); any stored grid has that count."""

    side_px: int
    patch_px: int

    @property
    def tokens_per_image(self) -> int:
        return (self.side_px // self.patch_px) ** 2

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        side = self.side_px // self.patch_px
        return (1, side, side)

    def num_tokens(self, width: int, height: int) -> int:
        return self.tokens_per_image

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        return np.full(len(grids), self.tokens_per_image, dtype=np.int64)
