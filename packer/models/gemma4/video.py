"""Gemma 4 video: frames sampled from the container's header, each frame resized by the image rule with its own
budget (70 soft tokens), each written after its time stamp in a block of its own.

    a 10 s clip at 30 fps, 640x480 (300 frames); defaults (32 frames, 70 tokens a frame)
        -> frames arange(32) * 300 // 32 = 0, 9, 18, ..., 290; each resized to 336x432 px -> 7 x 9 = 63 tokens
        -> "00:00 <|image>" + "<|video|>" * 63 + "<image|> 00:00 <|image>..." ... "00:09 <|image>...<image|>"

Exact against transformers 5.23.0: ``BaseVideoProcessor.sample_frames`` with Gemma4VideoProcessor's
``num_frames`` = 32 (``video_utils.default_sample_indices_fn``: ``arange(n) * total // n``; a clip of fewer frames,
where the processor's default raises, gives all its frames, as ``num_frames`` = its frame count does),
``VideoMetadata.timestamps`` (index / fps),
``Gemma4Processor.replace_video_token`` (mm:ss of each frame, then ``<|image>``, the frame's soft tokens and
``<image|>``, frames joined by a space) and ``Gemma4VideoProcessor._preprocess`` (every frame resized by
``get_aspect_ratio_preserving_size`` with ``max_soft_tokens`` 70: ``resize.target_size``). Only the clip's header
is read (``packer.media.video.probe``: the frame count and average rate the processor's decoders report).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.core.types import VideoRef
from packer.errors import RecordError
from packer.media.video import VideoPlan, probe
from packer.models.gemma4.resize import target_size, tokens_within
from packer.models.rules import Entries, MediaRun, Spans, VideoRule, frame_spans

OPTIONS = ("nframes",)
"""What a Gemma 4 video part may carry: ``nframes``, the frames to sample (the processor's ``num_frames``)."""


def sample_indices(total_frames: int, num_frames: int) -> np.ndarray:
    """``default_sample_indices_fn`` with ``num_frames``: int64 (num_frames,) frame indices, uniform from 0.

        sample_indices(300, 32)  ->  [0, 9, 18, 28, ..., 290]
    """
    if num_frames > total_frames:
        raise RecordError(
            "bad_video",
            f"\"nframes\" {num_frames} asks more frames than the clip's {total_frames} (Gemma 4's video processor "
            f"raises there): give \"nframes\" <= {total_frames}",
        )
    return np.arange(num_frames, dtype=np.int64) * total_frames // num_frames


def timestamp(seconds: float) -> str:
    """``replace_video_token``'s mm:ss of a frame's time: ``f"{int(s // 60):02d}:{int(s % 60):02d}"``."""
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


@dataclass(frozen=True)
class Gemma4Video(VideoRule):
    """Gemma 4's video processor: ``num_frames`` frames sampled uniformly, each resized within ``max_soft_tokens``
    (``resize.target_size``), written frame by frame with its mm:ss (``video_text``)."""

    token: str
    boi: str
    eoi: str
    patch_size: int = 16
    pooling: int = 3
    max_soft_tokens: int = 70
    num_frames: int = 32

    def plan(self, ref: VideoRef) -> VideoPlan:
        """Frames, grid (frames, rows, cols) and ``<|video|>`` count of one clip, from its header alone.

        ``video_num_frames`` (32) frames, or the part's ``nframes``; a clip with fewer frames than the default gives
        all of them: the processor's output with ``num_frames`` = the clip's frame count (its default raises there).
        Refused (RecordError bad_video): a frame list (the processor samples frames only from a clip, and raises
        for a list of images with ``do_sample_frames``), any option but ``nframes`` (``fps`` with the processor's
        default ``num_frames`` is its ValueError; the Qwen options mean nothing to it), an ``nframes`` past the
        clip's frame count (the processor's ValueError).
        """
        video = ref
        if video.frames:
            raise RecordError("bad_video", "Gemma 4's video processor samples frames from a clip, not from a list of frame "
                                           "images (transformers raises there); give the video as a file")
        options = dict(video.options)
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise RecordError("bad_video", f"Gemma 4's video processor takes no {', '.join(unknown)}: it samples "
                                           f"\"nframes\" frames uniformly ({self.num_frames} by default)")
        asked = options.get("nframes")
        if asked is not None and (asked != int(asked) or int(asked) < 1):
            raise RecordError("bad_video", f"video option \"nframes\" must be a positive integer, got {asked!r}")
        info = probe(video.path)
        # a clip shorter than the default: all its frames, what the processor gives with num_frames = its frame
        # count (its default raises there); an "nframes" the clip cannot give is refused as the processor refuses it
        num_frames = int(asked) if asked is not None else min(self.num_frames, info.num_frames)
        indices = sample_indices(info.num_frames, num_frames)
        height, width = target_size(info.height, info.width, patch_size=self.patch_size,
                                    max_soft_tokens=self.max_soft_tokens, pooling=self.pooling)
        side = self.patch_size * self.pooling
        grid = (int(indices.shape[0]), height // side, width // side)
        return VideoPlan(
            frame_indices=tuple(indices.tolist()),
            video_fps=info.fps,
            total_frames=info.num_frames,
            sample_fps=indices.shape[0] / info.num_frames * info.fps,  # VideoMetadata.sampled_fps
            utils_size=(info.height, info.width),  # the decoded frames, as the processor gets them
            size=(height, width),
            grid_thw=grid,
            num_tokens=grid[0] * grid[1] * grid[2],
            second_per_grid_t=info.num_frames / indices.shape[0] / info.fps,  # seconds between sampled frames
            timestamps=tuple(i / info.fps for i in indices.tolist()),
        )

    def run(self, plan: VideoPlan) -> MediaRun:
        """``Gemma4Processor.replace_video_token``: per frame its mm:ss, then ``<|image>`` + its soft tokens +
        ``<image|>``, frames joined by a space (tokenized alone: the template puts "\\n\\n" around it)."""
        text = video_text(plan, video_token=self.token, boi=self.boi, eoi=self.eoi)
        return MediaRun(tuple(plan.grid_thw), int(plan.num_tokens), text=text, plan=plan)

    def grid_num_tokens(self, grids: np.ndarray) -> np.ndarray:
        """frames * rows * cols of stored (frames, rows, cols), -1 unless 1 <= rows * cols <= the frame budget."""
        return tokens_within(grids, self.max_soft_tokens, image=False)

    def plan_faults(self, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
        """Frames = grid_t, and the stored frame size (height, width) is the grid's: rows, cols * 48 px."""
        side = self.patch_size * self.pooling
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        return ((grids[:, 0] != num_frames) | (sizes[:, 0] != grids[:, 1] * side)
                | (sizes[:, 1] != grids[:, 2] * side) | (self.grid_num_tokens(grids) < 0))

    def spans(self, ids: np.ndarray, row_starts: np.ndarray, lists: np.ndarray, entries: Entries,
              token_id: int | None) -> Spans:
        """A video as spans of its frames (``rules.frame_spans``): its time stamps and ``<|image>`` /
        ``<image|>`` lie between the runs of ``<|video|>``."""
        return frame_spans(ids, row_starts, lists, entries, token_id)


def video_text(plan: VideoPlan, *, video_token: str, boi: str, eoi: str) -> str:
    """``Gemma4Processor.replace_video_token`` of a plan: what the template's ``<|video|>`` becomes.

        two frames at 0 s and 61 s of 1x2 tokens  ->  "00:00 <|image><|video|><|video|><image|> 01:01 <|image>..."
    """
    _, rows, cols = plan.grid_thw
    frame = boi + video_token * (rows * cols) + eoi
    return " ".join(f"{timestamp(t)} {frame}" for t in plan.timestamps)
