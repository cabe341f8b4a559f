"""Qwen2.5-Omni's thinker: Qwen2.5-VL's images and videos, Whisper-feature audio, and a video's sound track
interleaved with its frames by time chunk; time-aligned mRoPE (``rope.py``).

    image 640x480      smart_resize -> grid (1, 34, 46) -> 391 <|IMAGE|>   (as Qwen2.5-VL; max_pixels 12845056)
    audio 3.2 s 44.1k  qwen-omni-utils' librosa.load at 16 kHz -> 51200 samples -> 320 mel frames
                       -> ((320 - 1) // 2 + 1 - 2) // 2 + 1 = 80 <|AUDIO|>        (at most 300 s: 7500 tokens)
    video with sound   <|vision_bos|><|audio_bos|> [frames 0-1][audio 0-49][frames 2-3][audio 50-99]...
                       <|audio_eos|><|vision_eos|>: 2 s chunks (Qwen2_5OmniProcessor.replace_video_with_audio_token)

Counts from headers: images as ``Qwen2VLImageProcessor`` with the released checkpoint's preprocessor_config
(min_pixels 3136, max_pixels 12845056); videos as qwen-omni-utils 0.0.9 samples them (its vision_process.py is
qwen-vl-utils 0.0.14's, import order aside) and ``Qwen2VLVideoProcessor`` resizes them (the processor's
videos_kwargs: 128..768 * 28 * 28 per frame), i.e. the shared ``qwen_video_plan`` rule; audio from the samples
the loader yields (``media.audio.loaded_num_samples`` at 16 kHz): ``mel_frames`` (WhisperFeatureExtractor,
padded to and truncated at the released ``chunk_length``, 300 s, as the processor asks: a longer clip counts,
and is featurized, as its first 4,800,000 samples) then ``audio_tokens_from_frames``.

A video's ``second_per_grid`` is what ``Qwen2_5OmniProcessor`` gives it: ``temporal_patch_size / fps``, fps the
video part's ``fps`` option (the value a user passes on to the processor), else the processor's hard-coded 2.0.
It sets the video's temporal positions (25 per second) and, with sound, which frames share a 2 s chunk with
which audio tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.types import AudioRef, EncodedAudio, EncodedVideo, VideoRef
from packer.errors import ConfigError, RecordError
from packer.media.video import VideoPlan
from packer.models.base import ModelProfile
from packer.models.qwen_omni.rope import (
    Block,
    interleave,
    omni_position_ids,
)
from packer.models.rules import (
    Entries,
    Media,
    MediaRun,
    Positions,
    Spans,
    flat_mrope,
)
from packer.models.shared.audio_features import WhisperAudio
from packer.models.shared.qwen_resize import check_pixel_bounds
from packer.models.shared.qwen_rules import QwenImage, QwenVideo
from packer.models.shared.qwen_video_pixels import CLIP_MEAN, CLIP_STD

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader

DEFAULT_FPS = 2.0  # Qwen2_5OmniProcessor._process_videos: "default fps not saved in official ckpt, hardcode"


# ---------------------------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class OmniVideo(QwenVideo):
    """The shared Qwen video rule with the processor's ``video_second_per_grid`` (``temporal_patch_size / fps``,
    fps the part's option, else ``default_fps``); verify sees a video with its sound as its frames' runs."""

    default_fps: float = DEFAULT_FPS

    def plan(self, ref: VideoRef) -> VideoPlan:
        """qwen-omni-utils' frames and the processor's sizes (the shared Qwen rule), with the processor's
        ``video_second_per_grid`` (module docstring)."""
        fps = float(dict(ref.options).get("fps") or self.default_fps)
        return replace(super().plan(ref), second_per_grid_t=self.temporal_patch_size / fps)

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        return split_runs("video", ids, row_starts, lists, entries, token_id, merge=self.merge_size,
                          frames_for_tokens=None)


@dataclass(frozen=True)
class OmniAudio(WhisperAudio):
    """Qwen2.5-Omni's audio: the shared Whisper rule (``rope.mel_frames``'s frames, ``rope.audio_tokens_from_frames``'s
    tokens), at least one token a clip; each clip alone (``plan_example``), and a video's sound track may lie in
    its video's run."""

    in_video = True
    min_tokens: int = 1
    hint: str = "no audio token: Qwen2.5-Omni needs at least 321 samples (20 ms)"

    def frames_for_tokens(self, tokens: int) -> int:
        """Feature frames a clip of ``tokens`` tokens alone has (verify's spans of a sound cut by frames):
        ``num_tokens(4 * c) == c``."""
        return 4 * tokens

    def plan_example(self, media: Sequence[Media], node_parents: np.ndarray) -> dict[int, MediaRun]:
        """The run of every clip of an example (a video's sound track too), by its index in ``media``: each
        clip alone, from its header."""
        return {i: self.run(self.plan(m.ref)) for i, m in enumerate(media) if isinstance(m.ref, AudioRef)}

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        return split_runs("audio", ids, row_starts, lists, entries, token_id, merge=0,
                          frames_for_tokens=self.frames_for_tokens)


@dataclass(frozen=True)
class OmniPositions(Positions):
    """Time-aligned mRoPE (``rope.omni_position_ids``) over an example's media blocks: images, videos (with their
    sound interleaved by 2 s chunk where they have it) and clips; per example (``extra``) and for verify
    (``expected``, from the runs ``split_runs`` gives)."""

    merge_size: int = 2
    mrope = True

    def av_kinds(self, grid: tuple[int, int, int], second_per_grid: float, audio_tokens: int) -> np.ndarray:
        """The processor's order of a video's tokens (0) and its sound's (1) between the bos and eos pairs:
        Qwen2.5-Omni's 2 s chunks (``rope.interleave``, which refuses a video the model would chunk otherwise)."""
        return interleave(grid, second_per_grid, audio_tokens, merge=self.merge_size).kinds

    def block_positions(self, length: int, node_offsets: np.ndarray, node_parents: np.ndarray,
                        blocks: list[Block]) -> np.ndarray:
        """(3, length) positions of a tree from its media blocks (``rope.omni_position_ids``)."""
        return omni_position_ids(np.zeros(length, np.int32), node_offsets, node_parents, blocks, merge=self.merge_size)

    def extra(self, ids: np.ndarray, positions: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray,
              images: Sequence[tuple[int, int, int]], *, token_ids: Mapping[str, int | None],
              videos: Sequence[EncodedVideo] = (), audios: Sequence[EncodedAudio] = ()) -> np.ndarray:
        """(3, L) int32 (float32 where ``fractional``): ``block_positions`` over the example's images, videos (with
        their sound where they have it) and clips, each root-to-leaf path as get_rope_index gives it alone."""
        if not images and not videos:  # text and audio alone: get_rope_index's 1-D branch
            return flat_mrope(positions, np.float32 if self.fractional else np.int32)
        return self.block_positions(len(ids), node_offsets, node_parents,
                                    self.blocks(ids, images, videos, audios, token_ids))

    def blocks(
        self,
        ids: np.ndarray,
        grids: Sequence[tuple[int, int, int]],
        videos: Sequence[EncodedVideo],
        audios: Sequence[EncodedAudio],
        token_ids: Mapping[str, int | None],
    ) -> list[Block]:
        """The example's media spans in token order, checked against its ids (RecordError
        "image_count_mismatch" where a run is not what its entry says)."""
        ids = np.asarray(ids)
        image_id, video_id, audio_id = token_ids["image_token"], token_ids["video_token"], token_ids["audio_token"]
        out: list[Block] = []
        hits = np.flatnonzero(ids == image_id) if image_id is not None else np.zeros(0, np.int64)
        j = 0
        for g in grids:
            t, h, w = (int(x) for x in g)
            n = t * (h // self.merge_size) * (w // self.merge_size)
            run = hits[j:j + n]
            if len(run) != n or n == 0 or run[-1] - run[0] != n - 1:
                raise RecordError("image_count_mismatch", f"an image of grid {g} has no run of {n} image tokens")
            out.append(Block(int(run[0]), int(run[0]) + n, "image", (t, h, w)))
            j += n
        if j != len(hits):
            raise RecordError("image_count_mismatch", f"{len(hits) - j} image tokens belong to no image")
        tracks = [a for a in audios if a.video]
        for v in videos:
            grid = tuple(int(x) for x in v.grid_thw)
            inside = [a for a in tracks if v.offset <= a.offset < v.offset + v.num_tokens + a.num_tokens]
            if inside:
                a = inside[0]
                want = np.where(self.av_kinds(grid, v.second_per_grid_t, a.num_tokens) == 0, video_id, audio_id)
                block = Block(v.offset, v.offset + len(want), "av", grid, v.second_per_grid_t, a.num_tokens)
            else:
                want = np.full(v.num_tokens, video_id)
                block = Block(v.offset, v.offset + v.num_tokens, "video", grid, v.second_per_grid_t)
            if not np.array_equal(ids[block.start:block.end], want):
                raise RecordError("image_count_mismatch", f"a video's tokens at {v.offset} are not its layout")
            out.append(block)
        for a in audios:
            if a.video:
                continue
            if not (ids[a.offset:a.offset + a.num_tokens] == audio_id).all():
                raise RecordError("image_count_mismatch", f"an audio clip's {a.num_tokens} tokens at {a.offset} "
                                  "are not audio tokens")
            out.append(Block(a.offset, a.offset + a.num_tokens, "audio"))
        out.sort(key=lambda b: b.start)
        return out

    def expected(self, length: int, node_offsets: np.ndarray, node_parents: np.ndarray, *, images: Entries,
                 videos: Entries, audios: Entries) -> np.ndarray:
        """``omni_position_ids`` of a forest (verify's check) from the runs ``split_runs`` gives: each root
        starts at 0. A clip alone is a block of its own (consecutive positions, but Qwen3-Omni's float32 sums
        round per block); a video with its sound is the adjacent spans of its frames' and its sound's chunks."""
        image_offsets, image_grids = images["offset"], images["grid"]
        m = self.merge_size
        blocks = []
        for off, g in zip(np.asarray(image_offsets).tolist(), np.asarray(image_grids).reshape(-1, 3).tolist(),
                          strict=True):
            blocks.append(Block(off, off + g[0] * (g[1] // m) * (g[2] // m), "image", tuple(g)))
        # verify's spans: a video with its sound comes as adjacent spans (its frames' chunks, its sound's chunks)
        spans = []  # (start, end, kind, grid, seconds)
        if len(videos["offset"]):
            for off, g, sec in zip(np.asarray(videos["offset"]).tolist(), np.asarray(videos["grid"]).reshape(-1, 3).tolist(),
                                   np.asarray(videos["second_per_grid_t"]).tolist(), strict=True):
                spans.append((off, off + g[0] * (g[1] // m) * (g[2] // m), "video", tuple(g), sec))
        if len(audios["offset"]):
            for off, n, v in zip(np.asarray(audios["offset"]).tolist(), np.asarray(audios["num_tokens"]).tolist(),
                                 np.asarray(audios["video"]).tolist(), strict=True):
                if v:
                    spans.append((off, off + n, "sound", None, 0.0))
                else:  # a clip alone: a block of its own, as get_rope_index walks it (float32 rounds per block)
                    blocks.append(Block(off, off + n, "audio"))
        spans.sort()
        i = 0
        while i < len(spans):
            start, end, kind, grid, sec = spans[i]
            j = i + 1
            while j < len(spans) and spans[j][0] == spans[j - 1][1]:
                j += 1  # adjacent: the same interleaved block
            group = spans[i:j]
            frames = sum(s[3][0] for s in group if s[2] == "video")
            sound = sum(s[1] - s[0] for s in group if s[2] == "sound")
            if kind != "video":
                raise RecordError("image_count_mismatch", f"a video's sound track at {start} has no video before it")
            if sound:
                block = Block(start, group[-1][1], "av", (frames, grid[1], grid[2]), sec, sound)
                got = np.concatenate([np.full(s[1] - s[0], s[2] == "sound", np.int8) for s in group])
                if not np.array_equal(got, self.av_kinds(block.grid, sec, sound)):  # no position can be right
                    raise RecordError("image_count_mismatch", f"the video with sound at {start} is not laid out "
                                      "as the processor interleaves it")
                blocks.append(block)
            else:
                blocks += [Block(s[0], s[1], "video", s[3], s[4]) for s in group]
            i = j
        blocks.sort(key=lambda b: b.start)
        return self.block_positions(length, node_offsets, node_parents, blocks)



def split_runs(what: str, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
               token_id: int | None, *, merge: int, frames_for_tokens: Callable[[int], int] | None) -> Spans:
    """A video with its sound as the runs verify can check: its frames' runs (whole frames, (k, h, w) each)
    and its sound's runs (``feature_length`` ``frames_for_tokens``, which the count rule maps back to the run's
    tokens), the runs of its tokens from its offset until its tokens are all found. ``OmniPositions.expected``
    then rebuilds the video from its adjacent runs and checks their order against the processor's layout. An
    entry whose runs do not add up gets offset -1 (a bad span)."""
    fields = entries
    if not len(fields["offset"]) or token_id is None:
        return lists, fields, True
    edges = np.diff(np.concatenate([[0], (ids == token_id).astype(np.int8), [0]]))
    run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    rows = len(lists) - 1
    row_of = np.repeat(np.arange(rows), np.diff(lists))
    out: dict[str, list] = {k: [] for k in fields}
    per_row = np.zeros(rows, dtype=np.int64)
    for i in range(len(fields["offset"])):
        entry = {k: v[i] for k, v in fields.items()}
        base, n = int(row_starts[row_of[i]]), int(entry["num_tokens"])
        at = int(np.searchsorted(run_starts, base + int(entry["offset"])))
        runs: list[tuple[int, int]] = []
        if at < len(run_starts) and run_starts[at] == base + int(entry["offset"]):
            found = 0
            while at < len(run_starts) and found < n:
                size = min(int(run_ends[at] - run_starts[at]), n - found)
                runs.append((int(run_starts[at]) - base, size))
                found += size
                at += 1
            if found < n:
                runs = []
        if not runs:
            runs = [(-1, n)]
        if what == "video" and len(runs) > 1:
            per = (int(entry["grid_h"]) // merge) * (int(entry["grid_w"]) // merge)
        for off, size in runs:
            span = {**entry, "offset": off, "num_tokens": size}
            if len(runs) > 1 and what == "video":
                span["grid_t"] = size // per if size % per == 0 else 0  # a split frame: a bad grid
            elif len(runs) > 1:
                span["feature_length"] = frames_for_tokens(size)  # a sound's chunk, as a clip alone
            for key, value in span.items():
                out[key].append(value)
        per_row[row_of[i]] += len(runs)
    spans = {k: np.asarray(v, dtype=fields[k].dtype) for k, v in out.items()}
    return np.concatenate([[0], np.cumsum(per_row)]), spans, True


# ---------------------------------------------------------------------------------------------------- the profile


@dataclass(frozen=True, kw_only=True)
class QwenOmniProfile(ModelProfile):
    """Qwen2.5-Omni (thinker): images, videos (with or without their sound) and audio clips."""

    image_token: str | None = "<|IMAGE|>"
    video_token: str | None = "<|VIDEO|>"
    audio_token: str | None = "<|AUDIO|>"
    vision_start: str | None = "<|vision_bos|>"
    vision_end: str | None = "<|vision_eos|>"
    """With ``vision_start``: the tokens around an image\'s run (its image rule\'s ``start`` / ``end``)."""
    audio_start: str = "<|audio_bos|>"
    audio_end: str = "<|audio_eos|>"
    default_tokenizer: str | None = "qwen2.5-omni"
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 3136
    """The released checkpoint's preprocessor_config.json (Qwen/Qwen2.5-Omni-7B)."""
    max_pixels: int = 12845056
    video_min_pixels: int | None = None
    video_max_pixels: int | None = None
    audio_chunk_length: int = 300
    """Seconds WhisperFeatureExtractor pads every clip to and cuts it at: the released preprocessor_config.json's
    ``chunk_length`` (``n_samples`` 4800000, ``nb_max_frames`` 30000), not Whisper's class default of 30."""

    image_mean: ClassVar[tuple[float, ...]] = CLIP_MEAN
    image_std: ClassVar[tuple[float, ...]] = CLIP_STD
    forward_keys: ClassVar[tuple[str, ...]] = (
        "input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
        "video_second_per_grid", "input_features", "feature_attention_mask",
    )
    overridable: ClassVar[tuple[str, ...]] = (
        "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", "audio_chunk_length",
        *ModelProfile.overridable
    )

    def __post_init__(self) -> None:
        if self.audio_chunk_length < 1:
            raise ConfigError(f"profile {self.name!r}: 'audio_chunk_length' must be >= 1 s, got {self.audio_chunk_length}")
        check_pixel_bounds(self)

    @cached_property
    def image(self) -> QwenImage:
        return QwenImage.of(self)

    @cached_property
    def video(self) -> OmniVideo:
        return OmniVideo("qwen2.5-vl", self.video_min_pixels, self.video_max_pixels, patch_size=self.patch_size,
                         merge_size=self.merge_size, temporal_patch_size=self.temporal_patch_size)

    @cached_property
    def audio(self) -> OmniAudio:
        return OmniAudio(chunk_length=self.audio_chunk_length)

    @cached_property
    def positions(self) -> OmniPositions:
        return OmniPositions(merge_size=self.merge_size)

    def media_runs(self, media: Sequence[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """Images and clips alone; a video followed by its own sound track (``AudioRef.video``) becomes one run
        ``<|audio_bos|>`` + frames and audio interleaved by 2 s chunk + ``<|audio_eos|>`` (the processor's
        placeholder for ``<|VIDEO|>``), the track's entry inside it: the one hook where two media meet."""
        clips = self.audio.plan_example(media, node_parents)
        out: list[MediaRun] = []
        plans: dict[VideoRef, VideoPlan] = {}
        for i, m in enumerate(media):
            ref = m.ref
            if isinstance(ref, AudioRef):
                if not ref.video:  # a sound track is laid out with the video before it
                    out.append(clips[i])
            elif isinstance(ref, VideoRef):
                if ref not in plans:
                    plans[ref] = self.video.plan(ref)
                plan = plans[ref]
                track = media[i + 1].ref if i + 1 < len(media) else None
                if isinstance(track, AudioRef) and track.video:
                    out += self._av_runs(plan, clips[i + 1])
                else:
                    out.append(self.video.run(plan))
            else:
                out.append(self.image.run(self.image.plan(ref)))
        return out

    def _av_runs(self, plan: VideoPlan, track: MediaRun) -> list[MediaRun]:
        """A video with its sound track: the video's run (``<|audio_bos|>``, its frames and the sound interleaved
        as ``av_kinds`` orders them, ``<|audio_eos|>``) and the track's entry inside it."""
        n = track.num_tokens
        kinds = self.positions.av_kinds(tuple(plan.grid_thw), plan.second_per_grid_t, n)
        names = np.where(kinds == 0, self.video_token, self.audio_token).tolist()
        return [MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), tokens=(self.audio_start, *names, self.audio_end),
                         lead=1, plan=plan),
                MediaRun((), n, lead=1 + int(np.argmax(kinds == 1)), audio=track.audio, inside=True)]

    def reader(self) -> Reader:
        from packer.models.qwen_omni.reader import QwenOmniReader

        return QwenOmniReader(self)

    def proof(self) -> Proof:
        from packer.models.qwen_omni.proof import QwenOmniProof

        return QwenOmniProof(self)
