"""The reference packer's video plans are checked against: what users run, from the decoded clip.

qwen-vl-utils and the HF video processors import torchvision at module level, which this machine cannot
install, so this file transcribes qwen-vl-utils **0.0.14**, ``qwen_vl_utils/vision_process.py`` (PyPI wheel
``qwen_vl_utils-0.0.14-py3-none-any.whl``), keeping its names, expressions and order:

- lines 24-53 (constants, round/ceil/floor_by_factor), 56-81 (smart_resize), 84-90 (to_rgb),
  93-141 (fetch_image, local-file branch), 144-181 (smart_nframes), 234-289 (calculate_video_frame_range),
  292-329 (_read_video_decord), 403-469 (fetch_video up to the resize).

Two substitutions, both I/O: decord's ``VideoReader`` is replaced by decoding **every** frame with PyAV
(``len(vr)`` is the number of frames that decode, ``get_avg_fps()`` the stream's ``avg_frame_rate``, which is
what decord returns), so the frame count does not come from any header; and torchvision's resize is not run:
the frame size it would produce is the reference's output (the grid depends on nothing else).

The HF side uses transformers 5.23.0's own code where it imports without torchvision: the Qwen2-VL
``smart_resize`` (image_processing_pil_qwen2_vl.py, a checked copy of the video processor's), Qwen3-VL's
video ``smart_resize``, ``VideoMetadata.sampled_fps`` and ``Qwen3VLProcessor._calculate_timestamps``; the
processors' resize caps and patchify grid (video_processing_qwen2_vl.py:252-268, 286-292 and
video_processing_qwen3_vl.py:201-218, 236-242) are transcribed. The Qwen3-VL grid is also taken from a real
``Qwen3VLVideoProcessor`` call in test_video.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import av
import numpy as np
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_qwen2_smart_resize
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_qwen3_smart_resize
from transformers.video_utils import VideoMetadata

# vision_process.py:24-37
MAX_RATIO = 200
SPATIAL_MERGE_SIZE = 2
IMAGE_MIN_TOKEN_NUM = 4
IMAGE_MAX_TOKEN_NUM = 16384
VIDEO_MIN_TOKEN_NUM = 128
VIDEO_MAX_TOKEN_NUM = 768
FPS = 2.0
FRAME_FACTOR = 2
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
MODEL_SEQ_LEN = 128000


def round_by_factor(number: int, factor: int) -> int:  # :41-43
    return round(number / factor) * factor


def ceil_by_factor(number: int, factor: int) -> int:  # :46-48
    return math.ceil(number / factor) * factor


def floor_by_factor(number: int, factor: int) -> int:  # :51-53
    return math.floor(number / factor) * factor


def smart_resize(height, width, factor, min_pixels=None, max_pixels=None):  # :56-81
    max_pixels = max_pixels if max_pixels is not None else (IMAGE_MAX_TOKEN_NUM * factor ** 2)
    min_pixels = min_pixels if min_pixels is not None else (IMAGE_MIN_TOKEN_NUM * factor ** 2)
    assert max_pixels >= min_pixels, "The max_pixels of image must be greater than or equal to min_pixels."
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_RATIO}, got {max(height, width) / min(height, width)}"
        )
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = floor_by_factor(height / beta, factor)
        w_bar = floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def to_rgb(pil_image: Image.Image) -> Image.Image:  # :84-90
    if pil_image.mode == 'RGBA':
        white_background = Image.new("RGB", pil_image.size, (255, 255, 255))
        white_background.paste(pil_image, mask=pil_image.split()[3])
        return white_background
    else:
        return pil_image.convert("RGB")


def fetch_image(ele: dict, image_patch_size: int = 14) -> Image.Image:  # :93-141, a local path only
    image = ele["image"]
    patch_factor = int(image_patch_size * SPATIAL_MERGE_SIZE)
    image_obj = Image.open(image)
    image = to_rgb(image_obj)
    if "resized_height" in ele and "resized_width" in ele:
        resized_height, resized_width = smart_resize(ele["resized_height"], ele["resized_width"], factor=patch_factor)
    else:
        width, height = image.size
        min_pixels = ele.get("min_pixels", IMAGE_MIN_TOKEN_NUM * patch_factor ** 2)
        max_pixels = ele.get("max_pixels", IMAGE_MAX_TOKEN_NUM * patch_factor ** 2)
        resized_height, resized_width = smart_resize(
            height, width, factor=patch_factor, min_pixels=min_pixels, max_pixels=max_pixels
        )
    image = image.resize((resized_width, resized_height))
    return image


@lru_cache(maxsize=256)  # the tests ask for the same photo under the same options many times
def _fetch_image_cached(path: str, options: tuple, image_patch_size: int) -> Image.Image:
    return fetch_image({"image": path, **dict(options)}, image_patch_size)


def smart_nframes(ele: dict, total_frames: int, video_fps: float) -> int:  # :144-181
    assert not ("fps" in ele and "nframes" in ele), "Only accept either `fps` or `nframes`"
    if "nframes" in ele:
        nframes = round_by_factor(ele["nframes"], FRAME_FACTOR)
    else:
        fps = ele.get("fps", FPS)
        min_frames = ceil_by_factor(ele.get("min_frames", FPS_MIN_FRAMES), FRAME_FACTOR)
        max_frames = floor_by_factor(ele.get("max_frames", min(FPS_MAX_FRAMES, total_frames)), FRAME_FACTOR)
        nframes = total_frames / video_fps * fps
        nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
        nframes = floor_by_factor(nframes, FRAME_FACTOR)
    if not (FRAME_FACTOR <= nframes and nframes <= total_frames):
        raise ValueError(f"nframes should in interval [{FRAME_FACTOR}, {total_frames}], but got {nframes}.")
    return nframes


def calculate_video_frame_range(ele: dict, total_frames: int, video_fps: float):  # :234-289
    if video_fps <= 0:
        raise ValueError("video_fps must be a positive number")
    if total_frames <= 0:
        raise ValueError("total_frames must be a positive integer")
    video_start = ele.get("video_start", None)
    video_end = ele.get("video_end", None)
    if video_start is None and video_end is None:
        return 0, total_frames - 1, total_frames
    max_duration = total_frames / video_fps
    if video_start is not None:
        video_start_clamped = max(0.0, min(video_start, max_duration))
        start_frame = math.ceil(video_start_clamped * video_fps)
    else:
        start_frame = 0
    if video_end is not None:
        video_end_clamped = max(0.0, min(video_end, max_duration))
        end_frame = math.floor(video_end_clamped * video_fps)
        end_frame = min(end_frame, total_frames - 1)
    else:
        end_frame = total_frames - 1
    if start_frame >= end_frame:
        raise ValueError(f"Invalid time range: Start frame {start_frame} exceeds end frame {end_frame}.")
    return start_frame, end_frame, end_frame - start_frame + 1


class AllFrames:
    """decord.VideoReader's part that _read_video_decord uses, from decoding every frame with PyAV."""

    def __init__(self, path: str):
        with av.open(path) as container:
            stream = container.streams.best("video")
            self.frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]  # presentation order
            self.avg_fps = stream.average_rate.numerator / stream.average_rate.denominator

    def __len__(self) -> int:
        return len(self.frames)

    def get_avg_fps(self) -> float:
        return self.avg_fps

    def get_batch(self, idx: list[int]) -> np.ndarray:
        return np.stack([self.frames[i] for i in idx])  # (T, H, W, 3)


def read_video_decord(ele: dict, vr: AllFrames):  # :292-329
    total_frames, video_fps = len(vr), vr.get_avg_fps()
    start_frame, end_frame, total_frames = calculate_video_frame_range(ele, total_frames, video_fps)
    nframes = smart_nframes(ele, total_frames=total_frames, video_fps=video_fps)
    idx = torch.linspace(start_frame, end_frame, nframes).round().long().tolist()
    video = vr.get_batch(idx)
    video = torch.from_numpy(video).permute(0, 3, 1, 2)  # Convert to TCHW format (torch.tensor there: a copy)
    sample_fps = nframes / max(total_frames, 1e-6) * video_fps
    video_metadata = dict(fps=video_fps, frames_indices=idx, total_num_frames=total_frames, video_backend="decord")
    return video, video_metadata, sample_fps


def fetch_video(ele: dict, image_patch_size: int, vr: AllFrames | None = None, model_seq_len: int = MODEL_SEQ_LEN):
    """:403-469 without the final torchvision resize: (video (T, C, H, W) before it, (resized_h, resized_w),
    metadata, sample_fps). ``model_seq_len`` stands for the MODEL_SEQ_LEN environment variable (:37)."""
    image_factor = image_patch_size * SPATIAL_MERGE_SIZE
    VIDEO_FRAME_MIN_PIXELS = VIDEO_MIN_TOKEN_NUM * image_factor * image_factor
    VIDEO_FRAME_MAX_PIXELS = VIDEO_MAX_TOKEN_NUM * image_factor * image_factor
    if isinstance(ele["video"], str):
        video, video_metadata, sample_fps = read_video_decord(ele, vr)
    else:
        process_info = ele.copy()
        process_info.pop("type", None)
        process_info.pop("video", None)
        image_list = [_fetch_image_cached(video_element, tuple(sorted(process_info.items())), image_factor)
                      for video_element in ele["video"]]
        nframes = ceil_by_factor(len(image_list), FRAME_FACTOR)
        if len(image_list) < nframes:
            image_list.extend([image_list[-1]] * (nframes - len(image_list)))
        sample_fps = ele.get("sample_fps", 2.0)
        # there: torch.stack of per-frame tensors; the same (T, C, H, W) uint8, stacked by numpy (5x faster)
        video = torch.from_numpy(np.stack([np.array(image).transpose(2, 0, 1) for image in image_list]))
        raw_fps = process_info.pop("raw_fps", sample_fps)
        video_metadata = dict(
            fps=raw_fps, frames_indices=[i for i in range(len(video))], total_num_frames=(nframes / sample_fps) * raw_fps
        )
    nframes, _, height, width = video.shape
    min_pixels = ele.get("min_pixels", VIDEO_FRAME_MIN_PIXELS)
    total_pixels = ele.get("total_pixels", model_seq_len * image_factor * image_factor * 0.9)
    max_pixels = max(min(VIDEO_FRAME_MAX_PIXELS, total_pixels / nframes * FRAME_FACTOR), int(min_pixels * 1.05))
    max_pixels_supposed = ele.get("max_pixels", max_pixels)
    max_pixels = min(max_pixels_supposed, max_pixels)
    if "resized_height" in ele and "resized_width" in ele:
        resized_height, resized_width = smart_resize(ele["resized_height"], ele["resized_width"], factor=image_factor)
    else:
        resized_height, resized_width = smart_resize(
            height, width, factor=image_factor, min_pixels=min_pixels, max_pixels=max_pixels
        )
    return video, (resized_height, resized_width), video_metadata, sample_fps


@dataclass
class Reference:
    indices: list[int]
    total_frames: float
    video_fps: float
    sample_fps: float
    utils_size: tuple[int, int]
    size: tuple[int, int]
    grid: tuple[int, int, int]
    tokens: int
    second_per_grid_t: float
    timestamps: list[float] | None
    frames: torch.Tensor  # (T, C, H, W) uint8, the sampled frames before any resize


def hf_processor_size(nframes: int, height: int, width: int, family: Any) -> tuple[int, int]:
    """The HF video processor's resize of a (nframes, height, width) clip (transformers 5.23.0)."""
    if not family.processor_resize:
        return height, width
    factor, temporal_factor = family.patch_size * family.merge_size, family.temporal_patch_size
    max_pixels = family.max_pixels
    if family.resize_rule == "qwen2":  # video_processing_qwen2_vl.py:252-268
        if family.cap_pixels_per_frame:
            total_pixels = int(family.max_video_tokens * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total_pixels * temporal_factor // nframes), int(family.min_pixels * 1.05))
        return hf_qwen2_smart_resize(height, width, factor=factor, min_pixels=family.min_pixels, max_pixels=max_pixels)
    if family.cap_pixels_per_frame:  # video_processing_qwen3_vl.py:201-218
        frame_cap = family.max_video_tokens * factor * factor
        pixels_per_frame = max(min(frame_cap, family.max_pixels // nframes), int(family.min_pixels * 1.05))
        max_pixels = pixels_per_frame * nframes
    return hf_qwen3_smart_resize(
        height=height, width=width, num_frames=nframes, factor=factor, temporal_factor=temporal_factor,
        min_pixels=family.min_pixels, max_pixels=max_pixels,
    )


def reference(ele: dict, family: Any, vr: AllFrames | None = None) -> Reference:
    """qwen-vl-utils' fetch_video for ``ele`` then the family's HF processor: everything packer plans."""
    video, utils_size, metadata, sample_fps = fetch_video(ele, family.patch_size, vr, family.model_seq_len)
    nframes = video.shape[0]
    size = hf_processor_size(nframes, *utils_size, family)
    tps = family.temporal_patch_size
    grid = ((nframes + -nframes % tps) // tps, size[0] // family.patch_size, size[1] // family.patch_size)
    meta = VideoMetadata(**metadata)
    timestamps = None
    if family.timestamps:
        timestamps = Qwen3VLProcessor._calculate_timestamps(None, list(meta.frames_indices), meta.fps, tps)
    return Reference(
        indices=list(metadata["frames_indices"]),
        total_frames=metadata["total_num_frames"],
        video_fps=metadata["fps"],
        sample_fps=sample_fps,
        utils_size=utils_size,
        size=size,
        grid=grid,
        tokens=grid[0] * grid[1] * grid[2] // family.merge_size ** 2,
        second_per_grid_t=tps / meta.sampled_fps,  # processing_qwen2_5_vl.py:133-139
        timestamps=timestamps,
        frames=video,
    )
