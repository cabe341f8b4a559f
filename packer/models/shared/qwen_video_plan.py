"""The Qwen video rules: a probed clip (or frame list) -> sampled frames -> sizes -> video_grid_thw -> tokens.

``plan_video`` applies Qwen's own frame-sampling rule (qwen-vl-utils, what users run beside the model) and the
profile's HF video-processor resize to a clip's header (``packer.media.video.probe``); ``plan_frame_list`` does
the same for a list of frame images. The reader later decodes just the planned frames (``media.video``).
tests/media/test_video.py checks on every generated test clip that the plan equals what qwen-vl-utils'
decoding path and the HF video processor give after decoding every frame.

    clip.mp4: 10 s at 30 fps (300 frames), 640x480, {"type": "video", "video": "clip.mp4"}, qwen2-vl
      frames  smart_nframes: 300 / 30 fps * 2 fps = 20, clamped to [4, min(768, 300)], floored to even
              indices round(linspace(0, 299, 20)) = 0, 16, 31, 47, ..., 283, 299
      resize  qwen-vl-utils: max_pixels = max(min(768*28*28, 0.9*128000*28*28 / 20 * 2), 1.05*128*28*28)
              = 602112; smart_resize(480, 640, factor 28) -> 476x644; the HF processor keeps that size
      grid    (t, h, w) = (20 / 2, 476 / 14, 644 / 14) = (10, 34, 46) -> 10*34*46 / 2**2 = 3910 tokens
      time    sample_fps = 20 / 300 * 30 = 2.0 -> Qwen2.5-VL's second_per_grid_t = 2 / 2.0 = 1.0 s

Sources followed, line by line (cited in each function): qwen-vl-utils 0.0.14,
``qwen_vl_utils/vision_process.py``; transformers 5.23.0, ``models/qwen2_vl/video_processing_qwen2_vl.py``,
``models/qwen3_vl/video_processing_qwen3_vl.py``, ``models/qwen3_vl/processing_qwen3_vl.py``,
``models/qwen2_5_vl/processing_qwen2_5_vl.py`` and ``video_utils.py``.

qwen-vl-utils reads a file with torchcodec, else decord, else torchvision. torchcodec and decord share one
rule (a frame count from the container, ``calculate_video_frame_range`` for video_start/end, then
``linspace(start, end, n)``); torchvision decodes the whole clip and selects frames by timestamp. packer
follows the first rule: it is the default backend's, and the only one computable from headers. Without
video_start/video_end the three agree on every well-formed clip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from packer.errors import ConfigError, RecordError
from packer.media.video import VideoInfo, VideoPlan
from packer.models.shared.qwen_resize import frames_area_resize, short_side_up, smart_resize

# qwen-vl-utils 0.0.14 vision_process.py:24-37. The names are theirs, so a diff against it reads line by line.
MAX_RATIO = 200  # :24, a frame whose long side is > 200x its short side is refused
SPATIAL_MERGE_SIZE = 2  # :25, the resize factor is patch_size * 2 (28 for Qwen2/2.5-VL, 32 for Qwen3-VL)
IMAGE_MIN_TOKEN_NUM = 4  # :26, a frame-list image's default min_pixels is 4 * factor**2
IMAGE_MAX_TOKEN_NUM = 16384  # :27
VIDEO_MIN_TOKEN_NUM = 128  # :28, a video frame's default min_pixels is 128 * factor**2
VIDEO_MAX_TOKEN_NUM = 768  # :29, and its max_pixels at most 768 * factor**2
FPS = 2.0  # :31, frames sampled per second when the record names neither fps nor nframes
FRAME_FACTOR = 2  # :32, sampled frame counts are multiples of the temporal patch (2 frames)
FPS_MIN_FRAMES = 4  # :33
FPS_MAX_FRAMES = 768  # :34
MODEL_SEQ_LEN = 128000  # :37, env MODEL_SEQ_LEN; total_pixels defaults to 0.9 * this many tokens' pixels
# An annotation's video_end may pass the clip's end by up to this many seconds (annotations round to whole
# seconds) and is clamped, as qwen-vl-utils clamps it; further out it names content the file does not have.
END_SLACK_S = 1.0


# ------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True, kw_only=True)
class VideoRequest:
    """A video part's sampling and size options, named as qwen-vl-utils names them (None: its default)."""

    fps: float | None = None
    """Frames to sample per second of the clip (default FPS = 2.0). Exclusive with nframes."""
    nframes: float | None = None
    """Frames to sample, rounded to an even count; overrides fps/min_frames/max_frames."""
    min_frames: float | None = None
    """Lower bound on the fps-derived frame count (default 4)."""
    max_frames: float | None = None
    """Upper bound on the fps-derived frame count (default min(768, frames in the clip))."""
    video_start: float | None = None
    """Seconds: first instant of the clip to sample (a video file only)."""
    video_end: float | None = None
    """Seconds: last instant of the clip to sample (a video file only)."""
    min_pixels: float | None = None
    """Lower bound on a sampled frame's resized area (default 128 * factor**2)."""
    max_pixels: float | None = None
    """Upper bound on a sampled frame's resized area (default 768 * factor**2, less for long clips)."""
    total_pixels: float | None = None
    """Pixel budget of the whole clip, spread over its frames (default 0.9 * 128000 * factor**2)."""
    resized_height: float | None = None
    """With resized_width: resize every frame to about this size instead (smart_resize of these numbers)."""
    resized_width: float | None = None
    """See resized_height."""
    sample_fps: float | None = None
    """A frame list: the rate its frames were taken at (default 2.0). ``fps`` is read as this for a list."""
    raw_fps: float | None = None
    """A frame list: the source clip's rate, for timestamps (default sample_fps)."""

    @classmethod
    def from_part(cls, part: Mapping[str, Any]) -> VideoRequest:
        """The options of one ``{"type": "video", "video": ..., ...}`` part; other keys are ignored.

        RecordError("wrong_type") for an option that is not a number; ``validate`` for the rest.
        """
        values: dict[str, float] = {}
        for f in fields(cls):
            value = part.get(f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RecordError(
                    "wrong_type", f"video option {f.name!r} must be a number, got {type(value).__name__} {value!r}"
                )
            values[f.name] = value
        request = cls(**values)
        request.validate()
        return request

    def validate(self) -> None:
        """RecordError("bad_video") for options qwen-vl-utils fails on, and for a window outside the clip.

        Everything else qwen-vl-utils accepts is accepted with its result, odd or not (fps 0 samples min_frames;
        a lone resized_height is ignored). Only the window is stricter than qwen-vl-utils, which clamps it: a
        negative video_start here, and in ``frame_range`` a start past the clip or an end far past it.
        """
        if self.fps is not None and self.nframes is not None:
            raise RecordError("bad_video", "give a video either 'fps' or 'nframes', not both (qwen-vl-utils asserts it)")
        if self.video_start is not None and self.video_start < 0:
            raise RecordError("bad_video", f"video_start must be >= 0 seconds, got {self.video_start!r}")
        if self.video_end is not None and self.video_end <= (self.video_start or 0.0):
            raise RecordError(
                "bad_video", f"video_end {self.video_end!r} s must be after video_start {self.video_start or 0.0!r} s"
            )
        # qwen-vl-utils divides by these (smart_resize's aspect ratio, the frame list's metadata)
        for name in ("sample_fps", "raw_fps") + (
            ("resized_height", "resized_width") if self.resized_height is not None and self.resized_width is not None else ()
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise RecordError("bad_video", f"video option {name!r} must be > 0, got {value!r}")


# ------------------------------------------------------------------------------------------- families


@dataclass(frozen=True, kw_only=True)
class VideoFamily:
    """How one model family's pipeline turns sampled frames into a grid: qwen-vl-utils, then the HF processor.

    Qwen2-VL and Qwen2.5-VL share ``Qwen2VLVideoProcessor``; their grids are identical, and only Qwen2.5-VL's
    model reads ``second_per_grid_t``. Qwen3-VL's README calls the processor with ``do_resize=False`` after
    qwen-vl-utils (``process_vision_info(..., image_patch_size=16)``), so its grid is qwen-vl-utils' size.
    The processor bounds below are the classes' defaults; checkpoints may set others (Qwen2.5-VL-7B-Instruct's
    preprocessor_config.json, which transformers 5 also loads for video: min_pixels 3136, max_pixels
    12845056): pass ``min_pixels``/``max_pixels`` to ``get_video_family`` to match one.
    """

    name: str
    """qwen2-vl | qwen2.5-vl | qwen3-vl."""
    patch_size: int
    """Vision patch side in pixels (14, Qwen3-VL 16); qwen-vl-utils' ``image_patch_size``."""
    merge_size: int = 2
    """Patches merged per side into one LLM token."""
    temporal_patch_size: int = 2
    """Frames per temporal patch."""
    processor_resize: bool
    """Whether the HF video processor resizes the frames qwen-vl-utils returns (its ``do_resize``)."""
    resize_rule: str
    """Which HF smart_resize: "qwen2" (per frame) or "qwen3" (bounds the whole clip, frames x area)."""
    min_pixels: int
    """The HF processor's ``size["shortest_edge"]``."""
    max_pixels: int
    """The HF processor's ``size["longest_edge"]``."""
    cap_pixels_per_frame: bool = False
    """The HF processor's ``cap_pixels_per_frame`` (None in 5.23 means False, with a warning)."""
    max_video_tokens: int
    """The HF processor's ``max_video_tokens``, read only with cap_pixels_per_frame."""
    timestamps: bool = False
    """Qwen3-VL: the prompt puts ``<t seconds>`` text before each temporal patch's tokens."""
    model_seq_len: int = MODEL_SEQ_LEN
    """qwen-vl-utils' MODEL_SEQ_LEN (environment variable), which sets the default total_pixels."""
    utils_patch_size: int | None = None
    """qwen-vl-utils' ``image_patch_size`` where it is not the model's (Qwen3-Omni: qwen-omni-utils' default 14
    before a 16 px processor); None: ``patch_size``."""

    def __post_init__(self) -> None:
        if self.resize_rule not in ("qwen2", "qwen3"):
            raise ConfigError(f"video family {self.name!r}: 'resize_rule' must be qwen2 or qwen3, got {self.resize_rule!r}")
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ConfigError(
                f"video family {self.name!r}: need 1 <= 'min_pixels' <= 'max_pixels', "
                f"got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}"
            )
        if self.model_seq_len < 1:
            raise ConfigError(f"video family {self.name!r}: 'model_seq_len' must be >= 1, got {self.model_seq_len}")

    @property
    def factor(self) -> int:
        """qwen-vl-utils' ``image_factor`` and the HF processor's ``patch_size * merge_size``."""
        return self.patch_size * self.merge_size

    @property
    def utils_factor(self) -> int:
        """qwen-vl-utils' ``image_factor``: ``utils_patch_size`` (else ``patch_size``) * ``merge_size``."""
        return (self.utils_patch_size or self.patch_size) * self.merge_size


_QWEN2_VIDEO = dict(
    patch_size=14,
    processor_resize=True,
    resize_rule="qwen2",
    min_pixels=128 * 28 * 28,  # Qwen2VLVideoProcessor.size["shortest_edge"] (video_processing_qwen2_vl.py:118)
    max_pixels=28 * 28 * 768,  # size["longest_edge"]
    max_video_tokens=128000,  # :132, the context length the capped budget assumes
)

VIDEO_FAMILIES: dict[str, VideoFamily] = {
    "qwen2-vl": VideoFamily(name="qwen2-vl", **_QWEN2_VIDEO),
    "qwen2.5-vl": VideoFamily(name="qwen2.5-vl", **_QWEN2_VIDEO),
    "qwen3-vl": VideoFamily(
        name="qwen3-vl",
        patch_size=16,
        processor_resize=False,  # Qwen3-VL README: processor(..., do_resize=False) after qwen-vl-utils
        resize_rule="qwen3",
        min_pixels=128 * 32 * 32,  # Qwen3VLVideoProcessor.size (video_processing_qwen3_vl.py:114)
        max_pixels=32 * 32 * 768,
        max_video_tokens=768,  # :128, per-frame token ceiling of the capped rule
        timestamps=True,
    ),
    # Qwen3-Omni: qwen-omni-utils' process_mm_info (image_patch_size 14 by default, as its cookbooks call it),
    # then Qwen3OmniMoeProcessor's Qwen2VLVideoProcessor with 16 px patches and its videos_kwargs size
    # (processing_qwen3_omni_moe.py: shortest_edge 128 * 32 * 32, longest_edge 768 * 32 * 32)
    "qwen3-omni": VideoFamily(
        name="qwen3-omni",
        patch_size=16,
        utils_patch_size=14,
        processor_resize=True,
        resize_rule="qwen2",
        min_pixels=128 * 32 * 32,
        max_pixels=768 * 32 * 32,
        max_video_tokens=128000,
    ),
}

_OVERRIDABLE = ("processor_resize", "min_pixels", "max_pixels", "cap_pixels_per_frame", "model_seq_len")


def get_video_family(name: str, **overrides: Any) -> VideoFamily:
    """The named family with ``overrides`` applied (None values ignored); ConfigError names what is allowed."""
    if name not in VIDEO_FAMILIES:
        raise ConfigError(f"no video rule for profile {name!r}; video works with: {', '.join(VIDEO_FAMILIES)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(changes) - set(_OVERRIDABLE))
    if unknown:
        raise ConfigError(f"cannot override {unknown} of video family {name!r}; overridable: {', '.join(_OVERRIDABLE)}")
    return replace(VIDEO_FAMILIES[name], **changes) if changes else VIDEO_FAMILIES[name]


# ------------------------------------------------------------------------------------------- sampling


def _round_by_factor(number: float, factor: int) -> int:  # vision_process.py:41-43 (round half to even)
    return round(number / factor) * factor


def _ceil_by_factor(number: float, factor: int) -> int:  # :46-48
    return math.ceil(number / factor) * factor


def _floor_by_factor(number: float, factor: int) -> int:  # :51-53
    return math.floor(number / factor) * factor


def smart_nframes(request: VideoRequest, *, total_frames: int, video_fps: float) -> int:
    """How many frames qwen-vl-utils samples from ``total_frames`` at ``video_fps``: vision_process.py:144-181.

    nframes given: rounded to even (``round``, so 5 -> 4 and 7 -> 8). Else total / video_fps * fps, clamped to
    [ceil_even(min_frames), floor_even(max_frames)] and to total_frames, floored to even. RecordError
    ("bad_video") where qwen-vl-utils raises: the count is below 2 or above total_frames.
    """
    if request.nframes is not None:
        nframes = _round_by_factor(request.nframes, FRAME_FACTOR)
    else:
        fps = FPS if request.fps is None else request.fps
        min_frames = _ceil_by_factor(FPS_MIN_FRAMES if request.min_frames is None else request.min_frames, FRAME_FACTOR)
        max_frames = _floor_by_factor(
            min(FPS_MAX_FRAMES, total_frames) if request.max_frames is None else request.max_frames, FRAME_FACTOR
        )
        nframes = total_frames / video_fps * fps
        nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
        nframes = _floor_by_factor(nframes, FRAME_FACTOR)
    if total_frames < FRAME_FACTOR:
        raise RecordError("bad_video", f"the clip holds {total_frames} frame; Qwen samples at least {FRAME_FACTOR}")
    if nframes > total_frames:
        raise RecordError("bad_video", f"{nframes} frames asked of a clip of {total_frames}; lower nframes")
    if nframes < FRAME_FACTOR and request.nframes is not None:
        raise RecordError("bad_video", f"nframes {request.nframes} rounds to {nframes}; Qwen samples at least {FRAME_FACTOR}")
    if nframes < FRAME_FACTOR:
        raise RecordError(
            "bad_video",
            f"fps {request.fps} over {total_frames} frames at {video_fps:g} fps gives {nframes} frames; Qwen samples "
            f"at least {FRAME_FACTOR} (raise fps or min_frames)",
        )
    return nframes


def frame_range(request: VideoRequest, *, total_frames: int, video_fps: float) -> tuple[int, int, int]:
    """(start_frame, end_frame, count) of video_start/video_end: vision_process.py:234-289.

    Start ceil(start * fps), end floor(end * fps) capped at the last frame, both times first clamped to
    [0, total / fps]. packer is stricter than qwen-vl-utils on one side only: a start at or after the clip's
    end, or an end more than END_SLACK_S past it, is a RecordError("bad_video") instead of a silent clamp.
    """
    if request.video_start is None and request.video_end is None:
        return 0, total_frames - 1, total_frames
    max_duration = total_frames / video_fps
    if request.video_start is not None and request.video_start >= max_duration:
        raise RecordError(
            "bad_video",
            f"video_start {request.video_start} s is at or after the clip's end ({max_duration:.3f} s, "
            f"{total_frames} frames at {video_fps:.3f} fps)",
        )
    if request.video_end is not None and request.video_end > max_duration + END_SLACK_S:
        raise RecordError(
            "bad_video",
            f"video_end {request.video_end} s is more than {END_SLACK_S} s past the clip's end ({max_duration:.3f} s, "
            f"{total_frames} frames at {video_fps:.3f} fps)",
        )
    if request.video_start is not None:
        start_frame = math.ceil(max(0.0, min(request.video_start, max_duration)) * video_fps)
    else:
        start_frame = 0
    if request.video_end is not None:
        end_frame = math.floor(max(0.0, min(request.video_end, max_duration)) * video_fps)
        end_frame = min(end_frame, total_frames - 1)
    else:
        end_frame = total_frames - 1
    if start_frame >= end_frame:
        raise RecordError(
            "bad_video",
            f"video_start {request.video_start} s .. video_end {request.video_end} s holds frames "
            f"{start_frame}..{end_frame} of {total_frames}: fewer than 2 to sample",
        )
    return start_frame, end_frame, end_frame - start_frame + 1


def linspace_indices(start: int, end: int, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps).round().long()``, computed bit for bit in numpy. int64 (steps,).

    qwen-vl-utils computes frame indices so (vision_process.py:317, :366). torch 2.13's CPU kernel works in
    float32: step = float32(end - start) / (steps - 1), then each value as one fused multiply-add,
    start + step * i for i < steps // 2 and end - step * (steps - 1 - i) after, rounded once to float32;
    ``round`` is half to even. float64 (numpy's linspace) disagrees with it on ~3.5% of
    (start, end, steps) with values above 2**14 (long clips); the test checks this against torch.
    """
    if steps == 1:
        return np.array([start], dtype=np.int64)
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64(np.float32(np.float32(end32 - start32) / np.float32(steps - 1)))
    i = np.arange(steps, dtype=np.float64)
    # float32 * small int is exact in float64, so one float64 add then the cast to float32 is the fused
    # multiply-add's single rounding.
    low = (np.float64(start32) + step * i).astype(np.float32)
    high = (np.float64(end32) - step * (steps - 1 - i)).astype(np.float32)
    values = np.where(np.arange(steps) < steps // 2, low, high)
    return np.round(values).astype(np.int64)


# ------------------------------------------------------------------------------------------- resizing


def _utils_smart_resize(
    height: float, width: float, factor: int, min_pixels: float | None = None, max_pixels: float | None = None
) -> tuple[int, int]:
    """qwen-vl-utils' smart_resize (vision_process.py:56-81), with RecordError where it raises or asserts."""
    max_pixels = max_pixels if max_pixels is not None else IMAGE_MAX_TOKEN_NUM * factor**2
    min_pixels = min_pixels if min_pixels is not None else IMAGE_MIN_TOKEN_NUM * factor**2
    if max_pixels < min_pixels:
        raise RecordError(
            "bad_video",
            f"max_pixels {max_pixels} is below min_pixels {min_pixels}; lower min_pixels too "
            f"(a video frame's default min_pixels is {VIDEO_MIN_TOKEN_NUM} * {factor}**2)",
        )
    _check_ratio(height, width)
    h_bar = max(factor, _round_by_factor(height, factor))
    w_bar = max(factor, _round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = _floor_by_factor(height / beta, factor)
        w_bar = _floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by_factor(height * beta, factor)
        w_bar = _ceil_by_factor(width * beta, factor)
    if h_bar < factor or w_bar < factor:  # qwen-vl-utils would return 0 here and the processor fail
        raise RecordError("bad_video", f"frames of {width}x{height} px resize to {w_bar}x{h_bar} px under max_pixels {max_pixels}")
    return h_bar, w_bar


def _check_ratio(height: float, width: float) -> None:
    if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_RATIO:
        raise RecordError("bad_video", f"frames of {width}x{height} px have an aspect ratio above {MAX_RATIO}, which Qwen refuses")


def _hf_qwen2_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: float) -> tuple[int, int]:
    """transformers 5.23.0 video_processing_qwen2_vl.py:44-70: the image processor's ``smart_resize``
    (``qwen_vl.smart_resize``), refusing a frame's aspect ratio as a bad video."""
    _check_ratio(height, width)
    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def _hf_qwen3_smart_resize(
    num_frames: int, height: int, width: int, temporal_factor: int, factor: int, min_pixels: int, max_pixels: float
) -> tuple[int, int]:
    """transformers 5.23.0 video_processing_qwen3_vl.py:75-108: bounds frames x area, not one frame's area."""
    height, width = short_side_up(height, width, factor)
    _check_ratio(height, width)
    return frames_area_resize(num_frames, height, width, temporal_factor=temporal_factor, factor=factor,
                              min_pixels=min_pixels, max_pixels=max_pixels)


def utils_frame_size(request: VideoRequest, *, nframes: int, height: int, width: int, family: VideoFamily) -> tuple[int, int]:
    """(height, width) qwen-vl-utils resizes ``nframes`` sampled frames to: vision_process.py:405-407, 448-469.

    min_pixels defaults to 128 * factor**2; max_pixels is min(768 * factor**2, total_pixels / nframes * 2),
    at least int(1.05 * min_pixels), then lowered to the record's max_pixels; resized_height/width replace the
    frame's own size (with the image bounds 4..16384 * factor**2).
    """
    factor = family.utils_factor
    min_pixels = VIDEO_MIN_TOKEN_NUM * factor * factor if request.min_pixels is None else request.min_pixels
    total_pixels = (
        family.model_seq_len * factor * factor * 0.9 if request.total_pixels is None else request.total_pixels
    )
    max_pixels = max(min(VIDEO_MAX_TOKEN_NUM * factor * factor, total_pixels / nframes * FRAME_FACTOR), int(min_pixels * 1.05))
    if request.max_pixels is not None:
        max_pixels = min(request.max_pixels, max_pixels)
    if request.resized_height is not None and request.resized_width is not None:
        return _utils_smart_resize(request.resized_height, request.resized_width, factor)
    return _utils_smart_resize(height, width, factor, min_pixels, max_pixels)


def processor_frame_size(*, nframes: int, height: int, width: int, family: VideoFamily) -> tuple[int, int]:
    """(height, width) the HF video processor resizes ``nframes`` frames of height x width to.

    Qwen2-VL/2.5-VL: video_processing_qwen2_vl.py:252-268 (per-frame bounds; with cap_pixels_per_frame the
    cap is max(min(max_pixels, int(max_video_tokens * factor**2 * 0.9) * 2 // nframes), int(1.05 * min))).
    Qwen3-VL: video_processing_qwen3_vl.py:201-218 (bounds nframes x area; the cap is per frame, times
    nframes). Unchanged when the family's processor does not resize.
    """
    if not family.processor_resize:
        return height, width
    factor, tps = family.factor, family.temporal_patch_size
    max_pixels = family.max_pixels
    if family.resize_rule == "qwen2":
        if family.cap_pixels_per_frame:
            total_pixels = int(family.max_video_tokens * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total_pixels * tps // nframes), int(family.min_pixels * 1.05))
        return _hf_qwen2_smart_resize(height, width, factor, family.min_pixels, max_pixels)
    if family.cap_pixels_per_frame:
        frame_cap = family.max_video_tokens * factor * factor
        pixels_per_frame = max(min(frame_cap, family.max_pixels // nframes), int(family.min_pixels * 1.05))
        max_pixels = pixels_per_frame * nframes
    return _hf_qwen3_smart_resize(nframes, height, width, tps, factor, family.min_pixels, max_pixels)


def plan_video(info: VideoInfo, request: VideoRequest, family: VideoFamily) -> VideoPlan:
    """Frames, grid and tokens of one video file, from its headers alone.

    qwen-vl-utils' decord/torchcodec path (vision_process.py:309-328, 356-376): frame_range, smart_nframes,
    indices = round(linspace(start, end, n)), sample_fps = n / count * fps; then ``utils_frame_size``
    (fetch_video) and ``processor_frame_size`` (the HF video processor) and the processor's patchify grid.
    """
    start, end, total = frame_range(request, total_frames=info.num_frames, video_fps=info.fps)
    nframes = smart_nframes(request, total_frames=total, video_fps=info.fps)
    indices = linspace_indices(start, end, nframes)
    sample_fps = nframes / max(total, 1e-6) * info.fps  # vision_process.py:321
    return _plan(
        indices=indices, video_fps=info.fps, total_frames=total, sample_fps=sample_fps,
        height=info.height, width=info.width, request=request, family=family,
    )


def plan_frame_list(sizes: Sequence[tuple[int, int]], request: VideoRequest, family: VideoFamily) -> VideoPlan:
    """Frames, grid and tokens of a video given as frame images of these (width, height) sizes.

    qwen-vl-utils' list branch (vision_process.py:415-446): each frame is resized as an image by
    ``fetch_image`` - called with ``image_factor`` as its patch size, so with factor 2 * 28 = 56 (2 * 32 = 64
    for Qwen3-VL) and the image bounds 4..16384 * factor**2 unless the part gives min/max_pixels - then the
    frames must share one size (torch.stack; else RecordError("bad_video")), the list is padded to an even
    length with its last frame, and the clip is resized like a video file's. Every frame is used: nframes,
    min/max_frames and video_start/end do not apply to a list. sample_fps defaults to 2.0; qwen-vl-utils reads
    only ``sample_fps``, packer also reads ``fps`` as it (which changes second_per_grid_t and timestamps only).
    """
    if not sizes:
        raise RecordError("bad_video", "the video's frame list is empty")
    image_factor = family.utils_factor * SPATIAL_MERGE_SIZE
    resized = set()
    for width, height in sizes:
        if request.resized_height is not None and request.resized_width is not None:
            resized.add(_utils_smart_resize(request.resized_height, request.resized_width, image_factor))
        else:
            min_pixels = IMAGE_MIN_TOKEN_NUM * image_factor**2 if request.min_pixels is None else request.min_pixels
            max_pixels = IMAGE_MAX_TOKEN_NUM * image_factor**2 if request.max_pixels is None else request.max_pixels
            resized.add(_utils_smart_resize(height, width, image_factor, min_pixels, max_pixels))
    if len(resized) > 1:
        shown = ", ".join(f"{w}x{h}" for h, w in sorted(resized))
        raise RecordError(
            "bad_video", f"the frame list's images resize to different sizes ({shown}); qwen-vl-utils needs one size"
        )
    height, width = resized.pop()
    nframes = _ceil_by_factor(len(sizes), FRAME_FACTOR)
    indices = np.minimum(np.arange(nframes), len(sizes) - 1)  # padded with the last frame
    sample_fps = request.sample_fps if request.sample_fps is not None else request.fps if request.fps is not None else 2.0
    raw_fps = request.raw_fps if request.raw_fps is not None else sample_fps
    total = (nframes / sample_fps) * raw_fps  # vision_process.py:445, the metadata's total_num_frames
    return _plan(
        indices=indices, video_fps=raw_fps, total_frames=total, sample_fps=nframes / total * raw_fps,
        height=height, width=width, request=request, family=family, timestamp_indices=np.arange(nframes),
    )


def frame_list_fetch_size(
    height: int, width: int, *, nframes: int, utils_size: tuple[int, int], family: VideoFamily
) -> tuple[int, int]:
    """(height, width) qwen-vl-utils' ``fetch_image`` gives a frame-list image of ``height`` x ``width``
    (vision_process.py:425, its first resize), recovered by the reader from the stored ``utils_size``.

    The shards keep the frame size after qwen-vl-utils (``utils_size``), not the fetched one between, so the
    reader takes the fetch with the image bounds the part gives by default (4..16384 * (2 * factor)**2) when
    the video rule then yields ``utils_size``, and ``utils_size`` itself otherwise (a part whose min/max_pixels
    put the fetched frame inside the video bounds, where the video resize keeps it). Exact for every part
    without pixel options, and for every fetched size inside the video bounds:

        qwen2-vl, 4 frames of 64x48: fetched 168x112 (min 4 * 56**2), then the video min 128 * 28**2 -> 392x280
    """
    fetched = _utils_smart_resize(height, width, family.utils_factor * SPATIAL_MERGE_SIZE)
    default = utils_frame_size(VideoRequest(), nframes=nframes, height=fetched[0], width=fetched[1], family=family)
    return fetched if default == tuple(utils_size) else (int(utils_size[0]), int(utils_size[1]))


def _plan(
    *, indices: np.ndarray, video_fps: float, total_frames: float, sample_fps: float, height: int, width: int,
    request: VideoRequest, family: VideoFamily, timestamp_indices: np.ndarray | None = None,
) -> VideoPlan:
    nframes = int(indices.shape[0])
    utils_size = utils_frame_size(request, nframes=nframes, height=height, width=width, family=family)
    size = processor_frame_size(nframes=nframes, height=utils_size[0], width=utils_size[1], family=family)
    tps = family.temporal_patch_size
    # patchify (video_processing_qwen2_vl.py:286-292, video_processing_qwen3_vl.py:236-242)
    grid = ((nframes + -nframes % tps) // tps, size[0] // family.patch_size, size[1] // family.patch_size)
    timestamps = None
    if family.timestamps:
        at = indices if timestamp_indices is None else timestamp_indices
        timestamps = tuple(qwen3_timestamps(at.tolist(), video_fps, tps))
    return VideoPlan(
        frame_indices=tuple(indices.tolist()),
        video_fps=video_fps,
        total_frames=total_frames,
        sample_fps=sample_fps,
        utils_size=utils_size,
        size=size,
        grid_thw=grid,
        num_tokens=grid[0] * grid[1] * grid[2] // family.merge_size**2,
        # processing_qwen2_5_vl.py:133-139 with the metadata's sampled_fps (video_utils.py:108-113)
        second_per_grid_t=tps / sample_fps,
        timestamps=timestamps,
    )


# ------------------------------------------------------------------------------------- text and time


def qwen3_timestamps(indices: Sequence[int], video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds shown before each temporal patch: processing_qwen3_vl.py:173-184 (``_calculate_timestamps``).

    The index list is padded to a multiple of the patch with its last index; each patch shows the mean of its
    first and last frame's time, index / video_fps.
    """
    indices = list(indices)
    if len(indices) % temporal_patch_size != 0:
        indices.extend(indices[-1] for _ in range(temporal_patch_size - len(indices) % temporal_patch_size))
    times = [idx / video_fps for idx in indices]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def qwen3_video_text(
    plan: VideoPlan,
    *,
    video_token: str = "<|video_pad|>",
    vision_start: str = "<|vision_start|>",
    vision_end: str = "<|vision_end|>",
) -> str:
    """Qwen3-VL's expansion of one video: ``<t seconds><|vision_start|>pad * (h*w/4)<|vision_end|>`` per patch.

    processing_qwen3_vl.py:75-103. transformers 5.23.0 substitutes this for the ``<|video_pad|>`` alone, so the
    chat template's own ``<|vision_start|>``/``<|vision_end|>`` stay around it; 4.57 (the Qwen3-VL release)
    substituted it for the whole ``<|vision_start|><|video_pad|><|vision_end|>``. The caller picks which.
    """
    if plan.timestamps is None:
        raise ValueError("qwen3_video_text needs a plan made with the qwen3-vl family (timestamps)")
    per_frame = vision_start + video_token * plan.tokens_per_frame + vision_end
    return "".join(f"<{t:.1f} seconds>" + per_frame for t in plan.timestamps)


def qwen25_temporal_positions(grid_t: int, second_per_grid_t: float, *, tokens_per_second: int) -> np.ndarray:
    """Qwen2.5-VL's temporal mRoPE index of each temporal patch, before adding the start position. int64 (grid_t,).

    transformers 5.23.0 modeling_qwen2_5_vl.py:1027 and modeling_qwen2_vl.py:881:
    ``(arange(t) * (tokens_per_second * second_per_grid_t)).long()`` with second_per_grid_t a float32 tensor,
    so float32 products, truncated. ``tokens_per_second`` is the checkpoint's vision_config value
    (Qwen2.5-VL-*-Instruct: 2; the config class default is 4). Qwen2-VL uses 1 per patch: arange(t).
    """
    interval = np.float32(np.float32(tokens_per_second) * np.float32(second_per_grid_t))
    return (np.arange(grid_t, dtype=np.float32) * interval).astype(np.int64)


