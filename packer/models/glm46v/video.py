"""GLM-4.6V video: frames sampled from the container's header, resized as one clip, one timestamped image run per
temporal patch.

    a 10 s clip at 30 fps (300 frames), 640x480
      sample  duration 10 s <= 30 s: 3 fps per temporal patch pair -> extract_t = int(10 * 3 * 2) = 60 frames, one
              whenever the frame's time reaches the next multiple of 1/6 s: 0, 5, 10, ..., 295
      resize  smart_resize(60 frames, 480, 640): 60 * 476 * 644 <= 47040000 -> 476x644
      grid    (60 / 2, 476 / 14, 644 / 14) = (30, 34, 46) -> 30 * 17 * 23 = 11730 <|image|> tokens
      text    per temporal patch: <|begin_of_image|> <|image|> * 391 <|end_of_image|> "{t:.1f} seconds", t the
              time of the patch's first frame: 0.0, 0.3, 0.7, 1.0, ... (timestamps[::2])

Exact against transformers 5.23.0: ``Glm46VVideoProcessor.sample_frames`` (on the ``VideoMetadata`` its PyAV loader
reads: ``stream.frames``, ``float(average_rate)``, duration = frames / average_rate), its ``smart_resize`` (frames x
area bounded) and patchify grid, and ``Glm46VProcessor.replace_video_token`` / ``replace_frame_token_id`` (the
text above). Only a clip's header is read (``packer.media.video.probe``).

What the sampling cannot take, it refuses (RecordError ``bad_video``): a frame list (GLM's processor samples by
the clip's rate and duration, which a list of images has not: it falls back to 24 fps with a warning), and any
sampling option (``fps``, ``nframes``, ``video_start`` ...: ``Glm46VVideoProcessor.sample_frames`` has none and
ignores what it is given, so honouring one would pack what the processor does not make).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from packer.core import arrays
from packer.core.types import VideoRef
from packer.errors import RecordError
from packer.media.video import VideoInfo, VideoPlan, probe
from packer.models.glm46v.resize import smart_resize
from packer.models.rules import Entries, MediaRun, Spans, VideoRule

VIDEOS_OFF = "GLM-4.6V videos are off in this build (--profile-option videos=false); drop it to pack them"

# video_processing_glm46v.py, Glm46VVideoProcessor.sample_frames: the names are theirs
DYNAMIC_FPS_THRES = {30: 3, 300: 1, 2400: 0.5}
MAX_FRAME_COUNT_DYNAMIC = 640
MAX_DURATION = 2400


@lru_cache(maxsize=4096)
def sample_frames(total_frames: int, fps: float, duration: float, temporal_patch_size: int = 2) -> tuple[int, ...]:
    """``Glm46VVideoProcessor.sample_frames`` (transformers 5.23.0), line by line: the frame indices sampled from a
    clip of ``total_frames`` at ``fps`` lasting ``duration`` seconds (``VideoMetadata.duration``).

    The rate per temporal patch pair falls with the duration (3 up to 30 s, 1 up to 300 s, then 0.5, the clip cut
    to 2400 s), at most 640 frames; a frame is taken each time its time reaches the next step, then the count is
    made ``extract_t`` by linspace, repeats dropped, and an odd count padded with its last index.

        sample_frames(300, 30.0, 10.0)  ->  (0, 5, 10, ..., 295)   # 60 frames
    """
    max_frame_idx = total_frames - 1
    duration = duration or round(max_frame_idx / fps) + 1
    effective_duration = min(duration, MAX_DURATION)
    if effective_duration <= 30:
        target_fps = DYNAMIC_FPS_THRES[30]
    elif effective_duration <= 300:
        target_fps = DYNAMIC_FPS_THRES[300]
    else:
        target_fps = DYNAMIC_FPS_THRES[2400]
    extract_t = int(effective_duration * target_fps * temporal_patch_size)
    extract_t = min(extract_t, MAX_FRAME_COUNT_DYNAMIC)

    duration_per_frame = 1 / fps
    max_second = int(duration)
    if total_frames < extract_t:
        frame_indices = np.linspace(0, total_frames - 1, extract_t, dtype=int).tolist()
    else:
        frame_indices = []
        current_second = 0
        inv_fps = 1 / (temporal_patch_size * target_fps)
        for frame_index in range(total_frames):
            if frame_index * duration_per_frame >= current_second:
                current_second += inv_fps
                frame_indices.append(frame_index)
                if current_second >= max_second:
                    break
    if len(frame_indices) < extract_t:
        if len(frame_indices) == 0:
            start, end = 0, max(total_frames - 1, 0)
        else:
            start, end = frame_indices[0], frame_indices[-1]
        frame_indices = np.linspace(start, end, extract_t, dtype=int).tolist()
    elif len(frame_indices) > extract_t:
        frame_indices = np.linspace(0, total_frames - 1, extract_t, dtype=int).tolist()
    uniq = list(dict.fromkeys(frame_indices))
    if len(uniq) & 1:
        uniq.append(uniq[-1])
    return tuple(int(i) for i in uniq)


def pyav_duration(info: VideoInfo) -> float:
    """The ``VideoMetadata.duration`` transformers' PyAV loader gives the clip: ``float(frames / average_rate)``,
    computed on the rational rate. The probe keeps the rate as a float; ``limit_denominator`` gets the rational
    back exactly for every rate whose denominator is at most 10**6 (25, 30000/1001, 24000/1001, ...)."""
    rate = Fraction(info.fps).limit_denominator(10**6)
    return float(Fraction(info.num_frames) / rate)


@dataclass(frozen=True)
class GlmVideo(VideoRule):
    """Glm46VVideoProcessor: frames sampled by the clip's duration (``sample_frames``), resized together
    (``smart_resize``), written per temporal patch as an image with its time (``video_text``); the frames hold the
    image placeholder, so verify's spans claim it (``spans``)."""

    image_token: str
    begin: str
    end: str
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 112 * 112
    max_pixels: int = 28 * 28 * 2 * 30000
    enabled: bool = True
    """False: every video refused with ``VIDEOS_OFF`` (``--profile-option videos=false``)."""

    def plan(self, ref: VideoRef) -> VideoPlan:
        """Frames, grid and tokens of one clip from its header: ``sample_frames``, then ``smart_resize`` of the sampled
        frames together, then the patchify grid (frames / 2, height / 14, width / 14)."""
        video = ref
        if not self.enabled:
            raise RecordError("bad_video", VIDEOS_OFF)
        if video.frames:
            raise RecordError(
                "bad_video", "GLM-4.6V takes a video file, not a list of frame images: its processor samples frames by "
                "the clip's rate and duration, which a frame list has not",
            )
        if video.options:
            names = ", ".join(name for name, _ in video.options)
            raise RecordError(
                "bad_video", f"GLM-4.6V's video processor takes no sampling options ({names}): it samples every clip by "
                "its own duration rule and ignores them; drop them from the video part",
            )
        info = probe(video.path)
        indices = sample_frames(info.num_frames, info.fps, pyav_duration(info), self.temporal_patch_size)
        n = len(indices)
        if n < self.temporal_patch_size:
            raise RecordError(
                "bad_video", f"{video.path}: GLM-4.6V samples {n} frames from this {info.num_frames}-frame clip; its "
                f"processor needs at least {self.temporal_patch_size}",
            )
        factor = self.patch_size * self.merge_size
        h, w = smart_resize(n, info.height, info.width, temporal_factor=self.temporal_patch_size, factor=factor,
                            min_pixels=self.min_pixels, max_pixels=self.max_pixels, what="video")
        p, tps = self.patch_size, self.temporal_patch_size
        grid = ((n + -n % tps) // tps, h // p, w // p)
        times = [i / info.fps for i in indices]  # VideoMetadata.timestamps of the sampled frames
        return VideoPlan(
            frame_indices=indices,
            video_fps=info.fps,
            total_frames=info.num_frames,
            sample_fps=n / info.num_frames * info.fps,
            utils_size=(h, w),  # no resize before the processor's
            size=(h, w),
            grid_thw=grid,
            num_tokens=grid[0] * grid[1] * grid[2] // self.merge_size**2,
            second_per_grid_t=tps / (n / info.num_frames * info.fps),
            timestamps=tuple(frame_timestamps(times, grid[0])),
        )

    def run(self, plan: VideoPlan) -> MediaRun:
        """``Glm46VProcessor.replace_video_token``'s text (``video_text``), tokenized alone; the entry starts at its
        first ``<|image|>`` (lead 1) and counts the ``<|image|>`` tokens of all its temporal patches."""
        text = video_text(plan, image_token=self.image_token, begin=self.begin, end=self.end)
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), text=text, lead=1, plan=plan)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """t * h * w / 4 of a video's (t, h, w) (and of each temporal patch's (1, h, w) span)."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        m = self.merge_size
        ok = (grids[:, 0] >= 1) & (grids[:, 1] >= m) & (grids[:, 2] >= m) & (grids[:, 1] % m == 0) & (grids[:, 2] % m == 0)
        return np.where(ok, grids[:, 0] * grids[:, 1] * grids[:, 2] // m**2, -1)

    def plan_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t * 2 (the sampled count is made even), frame size = grid (h, w) * patch_size."""
        p = self.patch_size
        return ((grids[:, 0] * self.temporal_patch_size != num_frames) | (grids[:, 0] < 1)
                | (grids[:, 1] * p != sizes[:, 0]) | (grids[:, 2] * p != sizes[:, 1]))

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """A video as spans of its temporal patches, each a (1, h, w) span over the k-th run of its frame token from
        the video's offset (the timestamp and ``<|end_of_image|><|begin_of_image|>`` lie between the runs); the frame
        token is the one at the first video's offset (``<|image|>``: the manifest records only ``<|video|>``'s id),
        a video whose offset holds another gets offset -1. The spans hold that token, which verify checks against
        the images' spans and these together; the ``<|video|>`` placeholder appears nowhere."""
        fields = entries
        if not len(fields["offset"]):
            return lists, fields, False
        rows = len(lists) - 1
        row_of_vid = np.repeat(np.arange(rows), np.diff(lists))
        start = row_starts[row_of_vid] + fields["offset"]  # (V,) flat first token of each video
        inside = (fields["offset"] >= 0) & (start < len(ids))
        frame_tok = ids[np.where(inside, start, 0)]
        token = int(frame_tok[np.argmax(inside)]) if inside.any() else -1
        t = np.maximum(fields["grid_t"], 0)
        edges = np.diff(np.concatenate([[0], (ids == token).astype(np.int8), [0]]))
        runs = np.flatnonzero(edges == 1)  # flat starts of every run of the frame token
        first = np.searchsorted(runs, start)  # (V,) each video's first run
        video_of = np.repeat(np.arange(len(t)), t)  # (F,) the video of each temporal patch
        run = first[video_of] + arrays.ranges(t)
        found = (run < len(runs)) & inside[video_of] & (frame_tok[video_of] == token)
        flat = np.append(runs, -1)[np.where(found, run, len(runs))]
        offset = np.where(found, flat - row_starts[row_of_vid[video_of]], -1)
        grid_h, grid_w = fields["grid_h"][video_of], fields["grid_w"][video_of]
        patches = {"offset": offset, "grid_t": np.ones_like(grid_h), "grid_h": grid_h, "grid_w": grid_w,
                   "num_tokens": fields["num_tokens"][video_of] // np.maximum(t[video_of], 1),
                   "second_per_grid_t": fields["second_per_grid_t"][video_of]}
        per_row = np.bincount(row_of_vid, weights=t, minlength=rows).astype(np.int64)
        return np.concatenate([[0], np.cumsum(per_row)]), patches, (token if token >= 0 else None)


def frame_timestamps(times: list[float], grid_t: int) -> list[float]:
    """The seconds ``replace_video_token`` prints after each temporal patch: every other sampled frame's time
    (``metadata.timestamps[::2]``), the first ``grid_t`` of them, the last repeated where fewer."""
    selected = list(times[::2])[:grid_t]
    while len(selected) < grid_t:
        selected.append(selected[-1] if selected else 0)
    return selected


def video_text(plan: VideoPlan, *, image_token: str, begin: str, end: str) -> str:
    """``Glm46VProcessor.replace_video_token`` of a plan: per temporal patch ``replace_frame_token_id``,
    ``<|begin_of_image|>`` + ``<|image|>`` * (h * w / 4) + ``<|end_of_image|>`` + f"{t:.1f} seconds"."""
    tokens = image_token * plan.tokens_per_frame
    return "".join(f"{begin}{tokens}{end}{t:.1f} seconds" for t in plan.timestamps)
