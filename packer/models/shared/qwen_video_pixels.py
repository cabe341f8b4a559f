"""Video pixels for the Qwen-VL family without torchvision: sampled frames -> ``pixel_values_videos``.

transformers' ``Qwen2VLVideoProcessor`` and ``Qwen3VLVideoProcessor`` need torchvision, which the CPU torch here
cannot have. What they compute is short, and every step is torch's own (torchvision's resize is a call to
``torch.nn.functional.interpolate``), so ``video_pixel_values`` does the same steps with the same ops:

    frames (T, H, W, 3) uint8  -> (T, 3, H, W)
      [utils]   ``utils_size``: qwen-vl-utils' resize (torchvision v1: bicubic, antialiased, in float32, rounded
                back to uint8), then float32
      resize    the processor's: bicubic, antialiased, to (resized_height, resized_width); a uint8 clip through
                torch's native uint8 kernel (torchvision v2 picks it on CPU), a float32 one in float32;
                skipped at the same size, as torchvision skips it
      pad       T up to a multiple of temporal_patch_size with copies of the last frame
      patchify  rows in (t, h-block, w-block, h-in-block, w-in-block) order, columns (channel, frame, y, x)
      normalize float32 (x - 255 * mean) / (255 * std): the processor's fused rescale + normalize (done last,
                on one copy: elementwise, so the same values as the processor's normalize-then-patchify)

    10 frames of 480x640, Qwen2-VL (patch 14), resized to 476x644
      -> pixel_values_videos (5 * 34 * 46, 3 * 2 * 14 * 14) = (7820, 1176) float32, video_grid_thw [[5, 34, 46]]

Sources followed (transformers 5.23.0): ``video_processing_utils.py`` (``_prepare_input_videos``),
``image_processing_backends.py`` (``TorchvisionBackend.resize``, ``rescale_and_normalize``),
``models/qwen2_vl/video_processing_qwen2_vl.py`` and ``models/qwen3_vl/video_processing_qwen3_vl.py``
(``patchify``); qwen-vl-utils 0.0.14 ``vision_process.py:470-475`` (fetch_video's resize); torchvision's
``transforms/functional.py`` + ``_functional_tensor.py`` (v1 ``resize``) and ``transforms/v2/functional/
_geometry.py`` (``resize_image``).
tests/models/test_qwen_video.py checks it against a line-by-line transcription of those sources, and against
the real processors where torchvision imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.media.video import decode_frame_list, decode_frames
from packer.models.shared.qwen_video_plan import frame_list_fetch_size

if TYPE_CHECKING:
    import torch

    from packer.models.shared.qwen_video_plan import VideoFamily

# transformers.image_utils.OPENAI_CLIP_MEAN / _STD: Qwen2-VL's and Qwen2.5-VL's normalization.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# transformers.image_utils.IMAGENET_STANDARD_MEAN / _STD: Qwen3-VL's (class default and checkpoints alike).
HALF_MEAN = (0.5, 0.5, 0.5)
HALF_STD = (0.5, 0.5, 0.5)
RESCALE_FACTOR = 1 / 255  # the processors' rescale_factor


def video_pixel_values(
    frames: np.ndarray,
    *,
    resized_height: int,
    resized_width: int,
    patch_size: int,
    image_mean: Sequence[float],
    image_std: Sequence[float],
    temporal_patch_size: int = 2,
    merge_size: int = 2,
    utils_size: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One video's (``pixel_values_videos``, ``video_grid_thw``), as the HF Qwen video processor gives them.

    frames: (T, H, W, 3) uint8 RGB, the sampled frames in order (``packer.media.video.decode_frames``).
    resized_height, resized_width: the frame size in the vision tower (the plan's ``size``), multiples of
        patch_size * merge_size: where the HF processor resizes to (or, not resizing, what it is given).
    patch_size: 14 for Qwen2-VL / Qwen2.5-VL, 16 for Qwen3-VL.
    image_mean, image_std: ``CLIP_MEAN``/``CLIP_STD`` (Qwen2/2.5-VL) or ``HALF_MEAN``/``HALF_STD`` (Qwen3-VL).
    utils_size: (height, width) qwen-vl-utils' ``fetch_video`` resizes to first (the plan's ``utils_size``),
        or None for frames handed to the processor as they are.

    Returns float32 (grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size**2) and int64 (1, 3).
    Without ``utils_size``: equal to ``Qwen2VLVideoProcessor()(videos=[frames], do_sample_frames=False)``
    whose size rule gives (resized_height, resized_width) (``Qwen3VLVideoProcessor`` alike). With it: equal to
    qwen-vl-utils' resize, then that processor (``do_resize=False`` for Qwen3-VL, as its README calls it).

    The two resizes differ: qwen-vl-utils calls torchvision's v1 ``resize``, which works in float32 and rounds
    to uint8 once; the processor calls v2's, whose CPU uint8 bicubic kernel rounds between its horizontal and
    vertical passes (up to 26 levels apart on noise, 1 on smooth frames), so each path is followed as written.
    """
    import torch
    from torch.nn.functional import interpolate

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must be (T, H, W, 3) uint8 with T >= 1, got {frames.dtype} {frames.shape}")
    factor = patch_size * merge_size
    for name, side in (("height", resized_height), ("width", resized_width)):
        if side < factor or side % factor:
            raise ValueError(f"resized {name} {side} is not a positive multiple of patch_size * merge_size = {factor}")

    def resize(video: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        # torchvision returns the input at its own size (v1 and v2 alike); a bicubic resize is antialiased
        if tuple(video.shape[-2:]) == size:
            return video
        return interpolate(video, size=list(size), mode="bicubic", align_corners=False, antialias=True)

    video = torch.from_numpy(frames).permute(0, 3, 1, 2)  # (T, 3, H, W) uint8, a view
    if utils_size is not None and tuple(video.shape[-2:]) != tuple(utils_size):
        # torchvision v1 functional_tensor.resize: float32, clamp to [0, 255], round, back to uint8 (then
        # fetch_video's `.float()`: exact on these integers, so the frames stay uint8 here until normalized)
        video = resize(video.contiguous().to(torch.float32), tuple(utils_size)).clamp(0, 255).round().to(torch.uint8)
    # The processor: torchvision v2 resize_image, which on a CPU uint8 tensor runs torch's uint8 bicubic kernel
    # directly (on qwen-vl-utils' float frames the float one: their values are these uint8 ones), on the
    # contiguous (T, 3, H, W) layout the processor gives it.
    if tuple(video.shape[-2:]) != (resized_height, resized_width):
        if utils_size is not None:
            video = video.to(torch.float32)
        video = resize(video.contiguous(), (resized_height, resized_width))  # (T, 3, h, w)

    if pad := -video.shape[0] % temporal_patch_size:
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])  # (T', 3, h, w), T' % tps == 0
    t = video.shape[0] // temporal_patch_size
    gh, gw = resized_height // patch_size, resized_width // patch_size
    m, p = merge_size, patch_size
    patches = video.reshape(t, temporal_patch_size, 3, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, gh/m, gw/m, m, m, 3, tps, p, p)
    # One copy into patch order before normalizing: on uint8 frames a quarter of the bytes (~3x faster than
    # normalizing first, measured); normalization is elementwise, so the values are the same.
    pixel_values = patches.reshape(t * gh * gw, 3, temporal_patch_size * p * p)
    pixel_values = pixel_values.to(torch.float32, copy=True)  # copy: never write into the caller's frames

    # Rescale fused into normalize (TorchvisionBackend.rescale_and_normalize): float32 mean and std tensors
    # times 1 / rescale_factor, then x.sub_(mean).div_(std), each step rounded to float32.
    mean = (torch.tensor(list(image_mean)) * (1.0 / RESCALE_FACTOR)).view(1, 3, 1)
    std = (torch.tensor(list(image_std)) * (1.0 / RESCALE_FACTOR)).view(1, 3, 1)
    pixel_values.sub_(mean).div_(std)  # (t*gh*gw, 3, tps*p*p) float32
    return pixel_values.view(t * gh * gw, 3 * temporal_patch_size * p * p), torch.tensor([[t, gh, gw]], dtype=torch.int64)


def planned_video_pixels(videos: Sequence[dict[str, Any]], profile: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(``pixel_values_videos``, ``video_grid_thw``) of stored ``videos`` (rows of the shards' ``videos`` column):
    each one's planned frames (``sampled_frames``) through ``video_pixel_values`` with ``profile``'s patch,
    merge and normalization settings (a Qwen-VL or Qwen-Omni profile)."""
    import torch

    pixels, grids = [], []
    for v in videos:
        utils_size = (v["utils_height"], v["utils_width"])
        pixel_values, grid = video_pixel_values(
            sampled_frames(v, utils_size, profile.video.family()), resized_height=v["height"], resized_width=v["width"],
            patch_size=profile.patch_size, image_mean=profile.image_mean, image_std=profile.image_std,
            temporal_patch_size=profile.temporal_patch_size, merge_size=profile.merge_size, utils_size=utils_size,
        )
        pixels.append(pixel_values)
        grids.append(grid)
    return torch.cat(pixels), torch.cat(grids)


def sampled_frames(video: dict[str, Any], utils_size: tuple[int, int], family: VideoFamily) -> np.ndarray:
    """The planned frames of one stored video, RGB uint8 (T, H, W, 3): decoded from the clip, or a frame list's
    images each resized as qwen-vl-utils' ``fetch_image`` resizes it (PIL's default bicubic, to
    ``qwen_video_plan.frame_list_fetch_size``); ``video_pixel_values`` then does fetch_video's resize."""
    if not video["frames"]:
        return decode_frames(video["source"], video["frame_indices"])
    from PIL import Image

    nframes = len(video["frame_indices"])
    out = []
    for f in decode_frame_list([video["frames"][i] for i in video["frame_indices"]]):
        h, w = frame_list_fetch_size(f.shape[0], f.shape[1], nframes=nframes, utils_size=utils_size, family=family)
        out.append(f if f.shape[:2] == (h, w) else np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BICUBIC)))
    return np.stack(out)
