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

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from packer.core.types import AudioRef, EncodedAudio, EncodedVideo, VideoRef
from packer.errors import ConfigError, RecordError
from packer.models.base import AudioPlan, Media, MediaRun, ModelProfile
from packer.models.qwen_omni.rope import (
    Block,
    audio_tokens_from_frames,
    interleave,
    mel_frames,
    omni_position_ids,
)
from packer.models.shared.qwen_resize import smart_resize
from packer.models.shared.qwen_video_pixels import CLIP_MEAN, CLIP_STD

if TYPE_CHECKING:
    from packer.media.audio import AudioInfo
    from packer.media.video import VideoPlan
    from packer.models.proof import Proof
    from packer.models.reader import Reader
    from packer.models.shared.qwen_video_plan import VideoFamily

DEFAULT_FPS = 2.0  # Qwen2_5OmniProcessor._process_videos: "default fps not saved in official ckpt, hardcode"


@dataclass(frozen=True, kw_only=True)
class QwenOmniProfile(ModelProfile):
    """Qwen2.5-Omni (thinker): images, videos (with or without their sound) and audio clips."""

    image_token: str | None = "<|IMAGE|>"
    video_token: str | None = "<|VIDEO|>"
    audio_token: str | None = "<|AUDIO|>"
    vision_start: str | None = "<|vision_bos|>"
    vision_end: str | None = "<|vision_eos|>"
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
    mrope: ClassVar[bool] = True
    audio_in_video: ClassVar[bool] = True
    audio_sample_rate: ClassVar[int] = 16000
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
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ConfigError(f"profile {self.name!r}: need 1 <= 'min_pixels' <= 'max_pixels', "
                              f"got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}")

    # ------------------------------------------------------------------ counts

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """Qwen2VLImageProcessor's ``image_grid_thw``."""
        h, w = smart_resize(height, width, factor=self.patch_size * self.merge_size,
                            min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return (1, h // self.patch_size, w // self.patch_size)

    def num_tokens(self, width: int, height: int) -> int:
        t, h, w = self.grid_thw(width, height)
        return t * h * w // self.merge_size**2

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        m = self.merge_size
        whole = (grids[:, 1] % m == 0) & (grids[:, 2] % m == 0)
        return np.where(whole, grids[:, 0] * (grids[:, 1] // m) * (grids[:, 2] // m), -1)

    def video_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        p, m = self.patch_size, self.merge_size
        return (
            (grids[:, 0] * self.temporal_patch_size != num_frames) | (grids[:, 0] < 1)
            | (grids[:, 1] * p != sizes[:, 0]) | (grids[:, 2] * p != sizes[:, 1])
            | (grids[:, 1] % m != 0) | (grids[:, 2] % m != 0) | (grids[:, 1] < 1) | (grids[:, 2] < 1)
        )

    def audio_feature_lengths(self, num_samples: np.ndarray) -> np.ndarray:
        """``rope.mel_frames``: ceil(n / 160), at most 30000 (``audio_chunk_length`` 300 s); -1 for an empty
        clip."""
        n = np.asarray(num_samples, dtype=np.int64)
        return np.where(n > 0, mel_frames(n, max_frames=self.audio_max_frames), -1)

    @property
    def audio_max_frames(self) -> int:
        """The extractor's ``nb_max_frames``: ``audio_chunk_length`` seconds of 16 kHz in 160-sample hops."""
        return self.audio_chunk_length * self.audio_sample_rate // 160

    def audio_num_tokens(self, feature_lengths: np.ndarray) -> np.ndarray:
        """``rope.audio_tokens_from_frames``; -1 where it gives no token (under 3 frames: the model's
        get_rope_index cannot place an empty clip)."""
        f = np.asarray(feature_lengths, dtype=np.int64)
        n = audio_tokens_from_frames(f)
        return np.where((f > 0) & (n > 0), n, -1)

    def audio_run(self, audio: AudioRef, info: AudioInfo) -> MediaRun:
        plan = self.audio_plan(info)
        return MediaRun((), self._audio_tokens(plan, info), audio=plan)

    def _audio_tokens(self, plan: AudioPlan, info: AudioInfo) -> int:
        n = int(self.audio_num_tokens(np.array([plan.feature_length], dtype=np.int64))[0])
        if n <= 0:
            raise RecordError("bad_audio", f"{info.source}: {plan.num_samples} samples at 16 kHz ({plan.feature_length} "
                              "mel frames) make no audio token; Qwen2.5-Omni needs at least 321 samples (20 ms)")
        return n

    # ------------------------------------------------------------------ video

    def video_family(self) -> VideoFamily:
        from packer.models.shared.qwen_video_plan import get_video_family

        return get_video_family("qwen2.5-vl", min_pixels=self.video_min_pixels, max_pixels=self.video_max_pixels)

    def plan_video(self, video: VideoRef) -> VideoPlan:
        """qwen-omni-utils' frames and the processor's sizes (the shared Qwen rule), with the processor's
        ``video_second_per_grid`` (module docstring)."""
        import packer.models.shared.qwen_video_plan as rules
        from packer.media.video import probe, probe_frame_list

        options = dict(video.options)
        request = rules.VideoRequest.from_part(options)
        if video.frames:
            plan = rules.plan_frame_list(probe_frame_list(video.frames), request, self.video_family())
        else:
            plan = rules.plan_video(probe(video.path), request, self.video_family())
        fps = float(options.get("fps") or DEFAULT_FPS)
        return replace(plan, second_per_grid_t=self.temporal_patch_size / fps)

    def media_runs(self, media: Sequence[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """Images and clips alone; a video followed by its own sound track (``AudioRef.video``) becomes one run
        ``<|audio_bos|>`` + frames and audio interleaved by 2 s chunk + ``<|audio_eos|>`` (the processor's
        placeholder for ``<|VIDEO|>``), the track's entry inside it."""
        clips = self.audio_plans(media, node_parents)
        out: list[MediaRun] = []
        plans: dict[VideoRef, VideoPlan] = {}
        for i, m in enumerate(media):
            ref = m.ref
            if isinstance(ref, AudioRef):
                if not ref.video:  # a sound track is laid out with the video before it
                    out.append(MediaRun((), clips[i][1], audio=clips[i][0]))
            elif isinstance(ref, VideoRef):
                if ref not in plans:
                    plans[ref] = self.plan_video(ref)
                plan = plans[ref]
                track = media[i + 1].ref if i + 1 < len(media) else None
                if isinstance(track, AudioRef) and track.video:
                    out += self.av_runs(plan, *clips[i + 1])
                else:
                    out.append(self.video_run(plan))
            else:
                out.append(self.image_run(*self.image_size(ref)))
        return out

    def audio_plans(self, media: Sequence[Media], node_parents: np.ndarray) -> dict[int, tuple[AudioPlan, int]]:
        """(plan, tokens) of every clip of an example (a video's sound track too), by its index in ``media``:
        each clip alone, from its header (``audio_run``)."""
        runs = {i: self.audio_run(m.ref, self.audio_info(m.ref)) for i, m in enumerate(media)
                if isinstance(m.ref, AudioRef)}
        return {i: (run.audio, run.num_tokens) for i, run in runs.items()}

    def av_runs(self, plan: VideoPlan, audio: AudioPlan, n: int) -> list[MediaRun]:
        """A video with its sound track of ``n`` tokens: the video's run (``<|audio_bos|>``, its frames and the
        sound interleaved as ``av_kinds`` orders them, ``<|audio_eos|>``) and the track's entry inside it."""
        kinds = self.av_kinds(tuple(plan.grid_thw), plan.second_per_grid_t, n)
        names = np.where(kinds == 0, self.video_token, self.audio_token).tolist()
        return [MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), tokens=(self.audio_start, *names, self.audio_end),
                         lead=1, plan=plan),
                MediaRun((), n, lead=1 + int(np.argmax(kinds == 1)), audio=audio, inside=True)]

    def av_kinds(self, grid: tuple[int, int, int], second_per_grid: float, audio_tokens: int) -> np.ndarray:
        """The processor's order of a video's tokens (0) and its sound's (1) between the bos and eos pairs:
        Qwen2.5-Omni's 2 s chunks (``rope.interleave``, which refuses a video the model would chunk otherwise)."""
        return interleave(grid, second_per_grid, audio_tokens, merge=self.merge_size).kinds

    def frames_for_tokens(self, tokens: int) -> int:
        """Feature frames a clip of ``tokens`` tokens alone has (verify's spans of a sound cut by frames):
        ``audio_num_tokens(4 * c) == c``."""
        return 4 * tokens

    def block_positions(self, length: int, node_offsets: np.ndarray, node_parents: np.ndarray,
                        blocks: list[Block]) -> np.ndarray:
        """(3, length) positions of a tree from its media blocks (``rope.omni_position_ids``)."""
        return omni_position_ids(np.zeros(length, np.int32), node_offsets, node_parents, blocks, merge=self.merge_size)

    # ------------------------------------------------------------------ positions

    def extra_positions(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        grids: list[tuple[int, int, int]],
        *,
        token_ids: dict[str, int | None],
        videos: Sequence[EncodedVideo] = (),
        audios: Sequence[EncodedAudio] = (),
    ) -> np.ndarray:
        """(3, L) int32 (float32 for a ``fractional_positions`` family): ``block_positions`` over the example's
        images, videos (with their sound where they have it) and clips, each root-to-leaf path as get_rope_index
        gives it alone."""
        if not grids and not videos:  # text and audio alone: get_rope_index's 1-D branch
            dtype = np.float32 if self.fractional_positions else np.int32
            row = np.ascontiguousarray(positions, dtype=dtype)
            out = np.ndarray((3, row.shape[0]), dtype, row, 0, (0, row.itemsize))
            out.flags.writeable = False
            return out
        return self.block_positions(len(ids), node_offsets, node_parents,
                                    self.blocks(ids, grids, videos, audios, token_ids))

    def blocks(
        self,
        ids: np.ndarray,
        grids: Sequence[tuple[int, int, int]],
        videos: Sequence[EncodedVideo],
        audios: Sequence[EncodedAudio],
        token_ids: dict[str, int | None],
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

    def verify_spans(
        self, what: str, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, fields: dict[str, np.ndarray],
        token_id: int | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
        """A video with its sound as the runs verify can check: its frames' runs (whole frames, (k, h, w) each)
        and its sound's runs (``feature_length`` 4 * tokens, which the count rule maps back to the run's tokens),
        the runs of its tokens from its offset until its tokens are all found. ``expected_extra_positions`` then
        rebuilds the video from its adjacent runs and checks their order against the processor's layout. An entry
        whose runs do not add up gets offset -1 (a bad span)."""
        if what not in ("video", "audio") or not len(fields["offset"]) or token_id is None:
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
                per = (int(entry["grid_h"]) // self.merge_size) * (int(entry["grid_w"]) // self.merge_size)
            for off, size in runs:
                span = {**entry, "offset": off, "num_tokens": size}
                if len(runs) > 1 and what == "video":
                    span["grid_t"] = size // per if size % per == 0 else 0  # a split frame: a bad grid
                elif len(runs) > 1:
                    span["feature_length"] = self.frames_for_tokens(size)  # a sound's chunk, as a clip alone
                for key, value in span.items():
                    out[key].append(value)
            per_row[row_of[i]] += len(runs)
        spans = {k: np.asarray(v, dtype=fields[k].dtype) for k, v in out.items()}
        return np.concatenate([[0], np.cumsum(per_row)]), spans, True

    def expected_extra_positions(
        self,
        length: int,
        node_offsets: np.ndarray,
        node_parents: np.ndarray,
        image_offsets: np.ndarray,
        image_grids: np.ndarray,
        *,
        video_offsets: np.ndarray | None = None,
        video_grids: np.ndarray | None = None,
        video_seconds: np.ndarray | None = None,
        audio_offsets: np.ndarray | None = None,
        audio_feature_lengths: np.ndarray | None = None,
        audio_num_tokens: np.ndarray | None = None,
        audio_in_video: np.ndarray | None = None,
    ) -> np.ndarray:
        """``omni_position_ids`` of a forest (verify's check) from the spans ``verify_spans`` gives: each root
        starts at 0. A clip alone is a block of its own (consecutive positions, but Qwen3-Omni's float32 sums
        round per block); a video with its sound is the adjacent spans of its frames' and its sound's chunks."""
        m = self.merge_size
        blocks = []
        for off, g in zip(np.asarray(image_offsets).tolist(), np.asarray(image_grids).reshape(-1, 3).tolist(),
                          strict=True):
            blocks.append(Block(off, off + g[0] * (g[1] // m) * (g[2] // m), "image", tuple(g)))
        # verify's spans: a video with its sound comes as adjacent spans (its frames' chunks, its sound's chunks)
        spans = []  # (start, end, kind, grid, seconds)
        if video_offsets is not None:
            for off, g, sec in zip(np.asarray(video_offsets).tolist(), np.asarray(video_grids).reshape(-1, 3).tolist(),
                                   np.asarray(video_seconds).tolist(), strict=True):
                spans.append((off, off + g[0] * (g[1] // m) * (g[2] // m), "video", tuple(g), sec))
        if audio_offsets is not None and audio_in_video is not None:
            for off, n, v in zip(np.asarray(audio_offsets).tolist(), np.asarray(audio_num_tokens).tolist(),
                                 np.asarray(audio_in_video).tolist(), strict=True):
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

    # ------------------------------------------------------------------ reader, proof

    def reader(self) -> Reader:
        from packer.models.qwen_omni.reader import QwenOmniReader

        return QwenOmniReader(self)

    def proof(self) -> Proof:
        from packer.models.qwen_omni.proof import QwenOmniProof

        return QwenOmniProof(self)

