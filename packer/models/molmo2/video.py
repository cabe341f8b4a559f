"""Molmo2 video: frames sampled from the container's header, each frame one 378-px crop pooled 3x3 to 9x9 tokens.

    a 10 s clip at 30 fps (300 frames), defaults (64 frames at most, max_fps 2)
        -> target min(64, int(10 * 2)) = 20 frames: arange(0, 300, 15) = 0, 15, ..., 285
        -> "0.0 <frame_start><im_patch>*81<frame_end> 0.5 <frame_start>...<frame_end> ... 9.5 <frame_start>..."

Exact against transformers 5.23.0: ``Molmo2VideoProcessor.sample_frames`` (the frame indices, from the
``VideoMetadata`` its PyAV loader reads: ``stream.frames``, ``average_rate``, duration = frames / rate),
``Molmo2Processor.get_video_string`` / ``replace_video_token`` (a timestamp index / fps with one decimal before
each frame; ``video_use_col_tokens`` False, ``use_frame_special_tokens`` True) and the video processor's
pooled grid (frames, ceil(27 / 3), ceil(27 / 3)). Only a clip's header is read (``packer.media.video.probe``).

Why one module apart from molmo2.py: images and videos share the vision tower but nothing of their layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from packer.core.types import VideoRef
from packer.errors import RecordError
from packer.media.video import VideoPlan, probe
from packer.models.rules import Entries, MediaRun, Spans, VideoRule

# the options a Molmo2 video part may carry: the processor's sample_frames arguments
OPTIONS = ("fps", "max_frames", "max_fps")


def sample_indices(*, total_frames: int, video_fps: float, fps: float | None = None, num_frames: int = 64,
                   max_fps: float | None = 2.0) -> np.ndarray:
    """``Molmo2VideoProcessor.sample_frames``: int64 (n,) frame indices.

    ``torch.arange(0, total, total / target).int()``: float32 values of i * step (computed in double), truncated.

        sample_indices(total_frames=300, video_fps=30.0)  ->  [0, 15, 30, ..., 285]  (20 frames)
    """
    duration = total_frames / video_fps
    if fps is not None:
        target = int(duration * fps)
    else:
        target = num_frames
        if max_fps is not None and video_fps > max_fps:
            target = min(target, int(duration * max_fps))
    target = max(min(target, total_frames), 1)
    step = total_frames / target
    count = math.ceil(total_frames / step)
    return (np.arange(count, dtype=np.float64) * step).astype(np.float32).astype(np.int64)


@dataclass(frozen=True)
class Molmo2Video(VideoRule):
    """Molmo2VideoProcessor: at most ``max_frames`` frames at ``max_fps`` (``sample_indices``), every frame a crop
    pooled ``pooling`` into 9x9 ``<im_patch>``, written per frame with its time (``video_text``)."""

    crop_px: int = 378
    patch_size: int = 14
    max_frames: int = 64
    max_fps: float = 2.0
    pooling: tuple[int, int] = (3, 3)

    @property
    def frame_grid(self) -> tuple[int, int]:
        """A frame's pooled grid (rows, cols): ceil(27 / 3) = 9 each."""
        side = self.crop_px // self.patch_size
        return -(-side // self.pooling[0]), -(-side // self.pooling[1])

    def plan(self, ref: VideoRef) -> VideoPlan:
        """Frames, grid (frames, 9, 9) and ``<im_patch>`` count of one clip, from its header alone.

        A frame list, ``video_start``/``video_end`` or a Qwen-only option is refused (RecordError bad_video):
        Molmo2's processor takes a whole clip and only the sampling options in ``OPTIONS``.
        """
        video = ref
        options = dict(video.options)
        if video.frames:
            raise RecordError("bad_video", "Molmo2 takes a video file, not a list of frame images")
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise RecordError("bad_video", f"Molmo2's video processor takes no {', '.join(unknown)}; use {', '.join(OPTIONS)}")
        for name, value in options.items():
            if not value > 0:
                raise RecordError("bad_video", f"video option {name!r} must be > 0, got {value!r}")
        info = probe(video.path)
        indices = sample_indices(
            total_frames=info.num_frames, video_fps=info.fps, fps=options.get("fps"),
            num_frames=int(options.get("max_frames", self.max_frames)),
            max_fps=options.get("max_fps", self.max_fps),
        )
        side = self.crop_px // self.patch_size
        grid = (int(indices.shape[0]), -(-side // self.pooling[0]), -(-side // self.pooling[1]))
        return VideoPlan(
            frame_indices=tuple(indices.tolist()),
            video_fps=info.fps,
            total_frames=info.num_frames,
            sample_fps=indices.shape[0] / info.num_frames * info.fps,
            utils_size=(info.height, info.width),
            size=(self.crop_px, self.crop_px),
            grid_thw=grid,
            num_tokens=grid[0] * grid[1] * grid[2],
            second_per_grid_t=1.0 / info.fps,  # a frame's own time step (verify requires > 0; the model reads none)
            timestamps=tuple(i / info.fps for i in indices.tolist()),
        )

    def run(self, plan: VideoPlan) -> MediaRun:
        """``Molmo2Processor.get_video_string``: per frame its time, then <frame_start> <im_patch>*81 <frame_end>."""
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), text=video_text(plan), plan=plan)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """<im_patch> tokens of stored (frames, rows, cols): frames * rows * cols, -1 unless (rows, cols) is
        the pooled frame grid (9, 9)."""
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        rows, cols = self.frame_grid
        ok = (grids[:, 0] >= 1) & (grids[:, 1] == rows) & (grids[:, 2] == cols)
        return np.where(ok, grids.prod(axis=1), -1)

    def plan_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t, every frame at the crop size, its pooled grid that of the crop."""
        rows, cols = self.frame_grid
        return ((grids[:, 0] != num_frames) | (grids[:, 0] < 1) | (grids[:, 1] != rows) | (grids[:, 2] != cols)
                | (sizes[:, 0] != self.crop_px) | (sizes[:, 1] != self.crop_px))

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """Laid out in tokens of its own: the placeholder appears nowhere in a row."""
        return lists, entries, False


def video_text(plan: VideoPlan) -> str:
    """``Molmo2Processor.get_video_string`` of a plan: what the ``<|video|>`` placeholder becomes.

        frames at 0.0 s and 0.5 s of 1x2 tokens  ->  "0.0 <frame_start><im_patch><im_patch><frame_end> 0.5 <frame_start>..."
    """
    _, rows, cols = plan.grid_thw
    frame = "<frame_start>" + "<im_patch>" * (rows * cols) + "<frame_end>"
    return " ".join(f"{t:.1f} " + frame for t in plan.timestamps)


def frame_runs(ids: np.ndarray, *, offset: int, grid: tuple[int, int, int]) -> list[tuple[int, int]]:
    """[start, end) of each frame's run in a row's ``ids``, the video's text starting at ``offset``.

    The text opens with the first frame's time ("0.0 ": no two equal tokens in a row), then <frame_start> and
    its <im_patch> run: the first repeated token is <im_patch>, the token before it <frame_start>, and every
    later frame starts at the next <frame_start> (a special token, which text never becomes).

        ids "0 . 0 _ S P P E _ 0 . 5 _ S P P E", offset 0, grid (2, 1, 2)  ->  [(4, 8), (13, 17)]
    """
    frames, rows, cols = (int(x) for x in grid)
    ids = np.asarray(ids)
    tail = ids[offset:]
    first_patch = int(np.flatnonzero(tail[1:] == tail[:-1])[0])
    starts = np.flatnonzero(tail == tail[first_patch - 1])[:frames]
    return [(offset + int(a), offset + int(a) + rows * cols + 2) for a in starts]
