"""``video_pixel_values`` against what the Qwen video processors compute, without torchvision.

transformers' video processors import torchvision, which cannot be installed here, so the reference below is a
transcription of the code they run, in its own words and order, from the installed sources:

- transformers 5.23.0 ``video_processing_utils.py:675-703`` (``_prepare_input_videos``),
  ``image_processing_backends.py:234-288, 329-367`` (``TorchvisionBackend.resize``, the fused
  ``rescale_and_normalize``), ``models/qwen2_vl/video_processing_qwen2_vl.py:286-316`` and
  ``models/qwen3_vl/video_processing_qwen3_vl.py:236-266`` (``patchify``, identical);
- torchvision's v2 ``resize_image`` (``transforms/v2/functional/_geometry.py``, what ``tvF.resize`` runs on a
  tensor) and v1 ``resize`` (``transforms/functional.py`` + ``_functional_tensor.py``, what qwen-vl-utils
  0.0.14 ``vision_process.py:470-475`` calls, then ``.float()``).

``test_matches_real_processor`` runs the real processors instead, where torchvision imports.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.functional import interpolate

from packer.models.shared.qwen_video_pixels import (
    CLIP_MEAN,
    CLIP_STD,
    HALF_MEAN,
    HALF_STD,
    video_pixel_values,
)

QWEN2 = dict(patch_size=14, image_mean=CLIP_MEAN, image_std=CLIP_STD)
QWEN3 = dict(patch_size=16, image_mean=HALF_MEAN, image_std=HALF_STD)


# ------------------------------------------------------------------------------ the transcribed reference


def tv2_resize_image(image: torch.Tensor, size: list[int]) -> torch.Tensor:
    """torchvision v2 ``resize_image`` with interpolation=BICUBIC, antialias=True, max_size=None, on CPU."""
    align_corners = False  # BILINEAR or BICUBIC
    shape = image.shape
    numel = image.numel()
    num_channels, old_height, old_width = shape[-3:]
    new_height, new_width = size  # _compute_resized_output_size of a 2-element size
    if (new_height, new_width) == (old_height, old_width):
        return image
    elif numel > 0:
        dtype = image.dtype
        acceptable_dtypes = [torch.float32, torch.float64]
        if image.device.type == "cpu":
            acceptable_dtypes.append(torch.uint8)  # _do_native_uint8_resize_on_cpu(BICUBIC) is True
        image = image.reshape(-1, num_channels, old_height, old_width)
        strides = image.stride()
        if image.is_contiguous(memory_format=torch.channels_last) and image.shape[0] == 1 and numel != strides[0]:
            new_strides = list(strides)
            new_strides[0] = numel
            image = image.as_strided((1, num_channels, old_height, old_width), new_strides)
        need_cast = dtype not in acceptable_dtypes
        if need_cast:
            image = image.to(dtype=torch.float32)
        image = interpolate(
            image, size=[new_height, new_width], mode="bicubic", align_corners=align_corners, antialias=True
        )
        if need_cast:
            if dtype == torch.uint8:
                image = image.clamp_(min=0, max=255)
            if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
                image = image.round_()
            image = image.to(dtype=dtype)
    return image.reshape(shape[:-3] + (num_channels, new_height, new_width))


def tv1_resize(img: torch.Tensor, size: list[int]) -> torch.Tensor:
    """torchvision v1 ``functional.resize`` -> ``_functional_tensor.resize``, interpolation "bicubic",
    antialias=True, on a (T, C, H, W) tensor."""
    _, image_height, image_width = img.shape[-3:]
    output_size = list(size)
    if [image_height, image_width] == output_size:
        return img
    # _cast_squeeze_in(img, [torch.float32, torch.float64])
    need_squeeze = False
    if img.ndim < 4:
        img = img.unsqueeze(dim=0)
        need_squeeze = True
    out_dtype = img.dtype
    need_cast = False
    if out_dtype not in [torch.float32, torch.float64]:
        need_cast = True
        img = img.to(torch.float32)
    img = interpolate(img, size=output_size, mode="bicubic", align_corners=False, antialias=True)
    if out_dtype == torch.uint8:
        img = img.clamp(min=0, max=255)
    # _cast_squeeze_out
    if need_squeeze:
        img = img.squeeze(dim=0)
    if need_cast:
        if out_dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            img = torch.round(img)
        img = img.to(out_dtype)
    return img


def qwen_vl_utils_resize(frames: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """vision_process.py: decord's (T, H, W, C) batch -> ``torch.tensor(...).permute(0, 3, 1, 2)`` (:323),
    then ``transforms.functional.resize(video, [h, w], BICUBIC, antialias=True).float()`` (:470-475)."""
    video = torch.tensor(frames).permute(0, 3, 1, 2)
    return tv1_resize(video, list(size)).float()


def hf_video_processor(
    video, *, size: tuple[int, int] | None, patch_size: int, image_mean, image_std,
    temporal_patch_size: int = 2, merge_size: int = 2, rescale_factor: float = 1 / 255,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2VLVideoProcessor / Qwen3VLVideoProcessor on one video, its resize rule's answer given as ``size``
    (None: do_resize=False)."""
    # _prepare_input_videos
    if isinstance(video, np.ndarray):
        video = torch.from_numpy(video).contiguous()
    if video.shape[1] not in (1, 3):  # infer_channel_dimension_format: LAST
        video = video.permute(0, 3, 1, 2).contiguous()
    # _preprocess: group_videos_by_shape stacks the videos of one shape, (B, T, C, H, W)
    stacked_videos = torch.stack([video])
    if size is not None:
        stacked_videos = tv2_resize_image(stacked_videos, list(size))  # super().resize -> tvF.resize
    # rescale_and_normalize -> _fuse_mean_std_and_rescale_factor
    mean = torch.tensor(image_mean) * (1.0 / rescale_factor)
    std = torch.tensor(image_std) * (1.0 / rescale_factor)
    images = stacked_videos.to(torch.float32)
    # tvF.normalize -> normalize_image(inplace=...): the values do not depend on inplace
    images = images.clone()
    mean = torch.as_tensor(mean, dtype=images.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=images.dtype).view(-1, 1, 1)
    videos = images.sub_(mean).div_(std)
    # patchify
    batch_size, num_frames, channel, resized_height, resized_width = videos.shape
    if pad := -num_frames % temporal_patch_size:
        repeats = videos[:, -1:].expand(-1, pad, -1, -1, -1)
        videos = torch.cat((videos, repeats), dim=1)
        num_frames += pad
    grid_t = num_frames // temporal_patch_size
    grid_h, grid_w = resized_height // patch_size, resized_width // patch_size
    patches = videos.view(
        batch_size, grid_t, temporal_patch_size, channel, grid_h // merge_size, merge_size, patch_size,
        grid_w // merge_size, merge_size, patch_size,
    )
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    flatten_patches = patches.reshape(
        batch_size, grid_t * grid_h * grid_w, channel * temporal_patch_size * patch_size * patch_size
    )
    return torch.cat([flatten_patches[0]], dim=0), torch.tensor([[grid_t, grid_h, grid_w]])


# ---------------------------------------------------------------------------------------------- frames


def _frames(kind: str, t: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """(t, h, w, 3) uint8: noise (every rounding shows), a smooth gradient, or sharp edges."""
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return rng.integers(0, 256, (t, h, w, 3), dtype=np.uint8)
    y, x = np.mgrid[0:h, 0:w]
    if kind == "gradient":
        base = (x * 255 // max(w - 1, 1) + y * 97 // max(h - 1, 1))[None, :, :, None] + np.arange(t)[:, None, None, None] * 7
        return ((np.broadcast_to(base, (t, h, w, 3)) + np.array([0, 40, 80])) % 256).astype(np.uint8)
    edges = ((x // 5 + y // 3) % 2 * 255).astype(np.uint8)  # a checkerboard: bicubic overshoot clamps
    return np.broadcast_to(edges[None, :, :, None], (t, h, w, 3)).copy()


CASES = [  # (frames kind, T, H, W, resized (h, w), family)
    ("noise", 2, 61, 97, (56, 112), QWEN2),  # down
    ("noise", 3, 30, 45, (56, 56), QWEN2),  # up, odd T padded with the last frame
    ("gradient", 4, 100, 77, (112, 84), QWEN2),
    ("edges", 1, 64, 96, (64, 96), QWEN3),  # same size: no resize, one frame padded to two
    ("edges", 5, 91, 130, (96, 128), QWEN3),
    ("noise", 2, 47, 33, (64, 32), QWEN3),
]


@pytest.mark.parametrize(("kind", "t", "h", "w", "size", "family"), CASES)
def test_equals_processor_on_raw_frames(kind, t, h, w, size, family) -> None:
    frames = _frames(kind, t, h, w)
    pixels, grid = video_pixel_values(frames, resized_height=size[0], resized_width=size[1], **family)
    ref_pixels, ref_grid = hf_video_processor(frames, size=size, **family)
    assert grid.tolist() == ref_grid.tolist()
    assert pixels.dtype == torch.float32 and pixels.shape == ref_pixels.shape
    assert torch.equal(pixels, ref_pixels)


@pytest.mark.parametrize(("kind", "t", "h", "w", "size", "family"), CASES)
def test_equals_qwen_vl_utils_then_processor(kind, t, h, w, size, family) -> None:
    """qwen-vl-utils resizes (v1, float path), then Qwen2-VL's processor resizes again (to the same or, with
    other bounds, another size) and Qwen3-VL's is called with do_resize=False."""
    frames = _frames(kind, t, h, w)
    resized = qwen_vl_utils_resize(frames, size)
    processor_sizes = [size, (size[0] + 28, size[1])] if family is QWEN2 else [None]
    for processor_size in processor_sizes:
        ref_pixels, ref_grid = hf_video_processor(resized, size=processor_size, **family)
        target = processor_size or size
        pixels, grid = video_pixel_values(
            frames, resized_height=target[0], resized_width=target[1], utils_size=size, **family
        )
        assert grid.tolist() == ref_grid.tolist()
        assert torch.equal(pixels, ref_pixels), processor_size


def test_the_two_resizes_differ_on_noise() -> None:
    """Why both paths exist: torchvision v1 (float, one rounding) and v2 (CPU uint8 kernel) disagree."""
    frames = _frames("noise", 2, 61, 97)
    direct, _ = video_pixel_values(frames, resized_height=56, resized_width=112, **QWEN2)
    via_utils, _ = video_pixel_values(frames, resized_height=56, resized_width=112, utils_size=(56, 112), **QWEN2)
    assert not torch.equal(direct, via_utils)


def test_constants_are_transformers() -> None:
    from transformers.image_utils import (
        IMAGENET_STANDARD_MEAN,
        IMAGENET_STANDARD_STD,
        OPENAI_CLIP_MEAN,
        OPENAI_CLIP_STD,
    )

    assert (list(CLIP_MEAN), list(CLIP_STD)) == (list(OPENAI_CLIP_MEAN), list(OPENAI_CLIP_STD))
    assert (list(HALF_MEAN), list(HALF_STD)) == (list(IMAGENET_STANDARD_MEAN), list(IMAGENET_STANDARD_STD))


def test_decoded_clip_grid_equals_plan(tmp_path) -> None:
    """A PyAV clip through the build's plan and the reader's decode: the grid is the plan's, for both rules."""
    from packer.media.video import decode_frames, probe
    from packer.models.shared.qwen_video_plan import VideoRequest, get_video_family, plan_video
    from tests.media.make_videos import write_clip

    path = write_clip(tmp_path / "c.mp4", fps=25, frames=30, width=150, height=98)
    for name, family in (("qwen2-vl", QWEN2), ("qwen3-vl", QWEN3)):
        plan = plan_video(probe(str(path)), VideoRequest(), get_video_family(name))
        frames = decode_frames(str(path), plan.frame_indices)
        pixels, grid = video_pixel_values(
            frames, resized_height=plan.size[0], resized_width=plan.size[1], utils_size=plan.utils_size, **family
        )
        assert tuple(grid[0].tolist()) == plan.grid_thw
        assert pixels.shape[0] == plan.num_tokens * 4
        ref, _ = hf_video_processor(
            qwen_vl_utils_resize(frames, plan.utils_size), size=plan.size if name == "qwen2-vl" else None, **family
        )
        assert torch.equal(pixels, ref)


@pytest.mark.parametrize(("bad", "match"), [
    (dict(frames=np.zeros((2, 8, 8, 3), np.float32)), "uint8"),
    (dict(frames=np.zeros((0, 8, 8, 3), np.uint8)), "T >= 1"),
    (dict(resized_height=50), "multiple of patch_size"),
])
def test_bad_arguments(bad, match) -> None:
    args = dict(frames=np.zeros((2, 8, 8, 3), np.uint8), resized_height=56, resized_width=56, **QWEN2) | bad
    with pytest.raises(ValueError, match=match):
        video_pixel_values(**args)


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen3-vl"])
def test_matches_real_processor(family) -> None:
    """The real transformers video processors (they need torchvision: skipped without it)."""
    pytest.importorskip("torchvision")
    from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as smart_resize3

    for kind, t, h, w, _, _ in CASES:
        if family == "qwen3-vl" and t < 2:
            continue  # Qwen3-VL's smart_resize refuses fewer frames than the temporal patch
        frames = _frames(kind, t, h, w)
        if family == "qwen2-vl":
            processor = Qwen2VLVideoProcessor(cap_pixels_per_frame=False)
            size = smart_resize(h, w, factor=28, min_pixels=processor.size["shortest_edge"], max_pixels=processor.size["longest_edge"])
            params = QWEN2
        else:
            processor = Qwen3VLVideoProcessor(cap_pixels_per_frame=False)
            size = smart_resize3(
                t, h, w, factor=32, min_pixels=processor.size["shortest_edge"], max_pixels=processor.size["longest_edge"]
            )
            params = QWEN3
        out = processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        pixels, grid = video_pixel_values(frames, resized_height=size[0], resized_width=size[1], **params)
        assert out["video_grid_thw"].tolist() == grid.tolist()
        assert torch.equal(out["pixel_values_videos"], pixels), (kind, t, h, w)
        # and after qwen-vl-utils' resize (torchvision v1), as users run it
        resized = torchvision_v1_resize(frames, size)
        out = processor(videos=[resized], do_sample_frames=False, do_resize=family == "qwen2-vl", return_tensors="pt")
        pixels, _ = video_pixel_values(frames, resized_height=size[0], resized_width=size[1], utils_size=size, **params)
        assert torch.equal(out["pixel_values_videos"], pixels), (kind, t, h, w)


def torchvision_v1_resize(frames: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode

    video = torch.tensor(frames).permute(0, 3, 1, 2)
    return transforms.functional.resize(video, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True).float()


@pytest.mark.parametrize(("name", "size", "options"), [
    ("qwen2-vl", (64, 48), {}),  # fetched 168x112 (image min), then the video min: two resizes
    ("qwen2-vl", (1000, 700), {}),  # fetched ~full size, then the video max: two resizes
    ("qwen3-vl", (48, 36), {}),
    ("qwen2.5-vl", (120, 90), {"min_pixels": 64 * 28 * 28, "max_pixels": 128 * 28 * 28}),  # fetched in bounds
])
@pytest.mark.slow
def test_frame_list_pixels_follow_qwen_vl_utils(tmp_path, coco_images, name, size, options) -> None:
    """A frame list read back: each image resized as qwen-vl-utils' ``fetch_image`` does (PIL), then as its
    ``fetch_video`` does, then the processor - against tests/media/qwen_reference.py's transcription of
    qwen-vl-utils 0.0.14 (frames, sizes) and ``video_pixel_values`` (checked above against the processor).
    The first two cases fail if the reader resizes each image straight to the utils size."""
    from packer.core.types import VideoRef
    from packer.models import get_profile
    from tests.media import qwen_reference as ref

    paths = _frame_images(tmp_path, coco_images, size)
    profile = get_profile(name)
    family = profile.video.family()
    want = ref.reference({"type": "video", "video": paths, **options}, family)
    want_pixels, want_grid = video_pixel_values(
        want.frames.permute(0, 2, 3, 1).numpy(), resized_height=want.size[0], resized_width=want.size[1],
        patch_size=profile.patch_size, image_mean=profile.image_mean, image_std=profile.image_std,
        utils_size=want.utils_size,
    )
    plan = profile.video.plan(VideoRef(frames=tuple(paths), options=tuple(sorted(options.items()))))
    assert (plan.utils_size, plan.size, plan.grid_thw) == (want.utils_size, want.size, tuple(want_grid[0].tolist()))
    stored = {"source": "", "frames": paths, "frame_indices": list(plan.frame_indices), "height": plan.size[0],
              "width": plan.size[1], "utils_height": plan.utils_size[0], "utils_width": plan.utils_size[1],
              "second_per_grid_t": plan.second_per_grid_t}
    got = profile.reader().video_pixel_values([stored])
    assert torch.equal(got["video_grid_thw"], want_grid)
    assert torch.equal(got["pixel_values_videos"], want_pixels)


def _frame_images(root, coco_images, size: tuple[int, int]) -> list[str]:
    from PIL import Image

    paths = []
    for i, src in enumerate(coco_images[:3]):
        paths.append(str(root / f"{i}.png"))  # lossless: every reader reads the same pixels
        Image.open(src).convert("RGB").resize(size, Image.Resampling.BILINEAR).save(paths[-1])
    return paths


@pytest.mark.parametrize(("name", "size"), [("qwen2-vl", (64, 48)), ("qwen2-vl", (1000, 700)), ("qwen3-vl", (48, 36))])
def test_frame_list_matches_real_qwen_vl_utils(tmp_path, coco_images, name, size) -> None:
    """The same against the real qwen-vl-utils ``fetch_video`` and HF video processor (they need torchvision:
    skipped without it; qwen-vl-utils is not a dependency either)."""
    pytest.importorskip("torchvision")
    qwen_vl_utils = pytest.importorskip("qwen_vl_utils")
    from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

    from packer.core.types import VideoRef
    from packer.models import get_profile

    paths = _frame_images(tmp_path, coco_images, size)
    profile = get_profile(name)
    video = qwen_vl_utils.fetch_video({"type": "video", "video": paths}, image_patch_size=profile.patch_size)
    if name == "qwen3-vl":  # as Qwen3-VL's README calls it
        out = Qwen3VLVideoProcessor()(videos=[video], do_sample_frames=False, do_resize=False, return_tensors="pt")
    else:
        out = Qwen2VLVideoProcessor()(videos=[video], do_sample_frames=False, return_tensors="pt")
    plan = profile.video.plan(VideoRef(frames=tuple(paths)))
    stored = {"source": "", "frames": paths, "frame_indices": list(plan.frame_indices), "height": plan.size[0],
              "width": plan.size[1], "utils_height": plan.utils_size[0], "utils_width": plan.utils_size[1],
              "second_per_grid_t": plan.second_per_grid_t}
    got = profile.reader().video_pixel_values([stored])
    assert torch.equal(got["video_grid_thw"], out["video_grid_thw"])
    assert torch.equal(got["pixel_values_videos"], out["pixel_values_videos"])
