"""``pixel_values_videos`` without torchvision (packer.models.qwen_video_pixels): the temporal/spatial patch
layout against the Qwen2-VL image processor's own (PIL backend, which patches a still image as a 2-frame
clip of itself), and against the real ``Qwen2VLVideoProcessor`` where torchvision is installed."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from transformers import Qwen2VLImageProcessorPil

from packer.models import get_profile
from packer.models.qwen_video_pixels import patchify, resized


def _frames(coco_images, height: int, width: int) -> list[np.ndarray]:
    return [np.asarray(Image.open(p).convert("RGB").resize((width, height), Image.BICUBIC)) for p in coco_images[:2]]


def test_patch_layout_matches_the_image_processor(coco_images):
    """Frames A, B at a planned size (h, w multiples of 28): row k of the clip holds patch k of A in its
    first temporal slot and of B in its second, each exactly as the image processor patches that frame."""
    a, b = _frames(coco_images, 84, 112)
    processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    images = [processor(images=[f], do_resize=False, return_tensors="np")["pixel_values"] for f in (a, b)]
    clip = patchify(resized([a, b], height=84, width=112), patch_size=14, merge_size=2, temporal_patch_size=2)
    assert clip.shape == images[0].shape == (6 * 8, 3 * 2 * 14 * 14)
    slots = clip.reshape(-1, 3, 2, 14, 14)
    for t, image in enumerate(images):
        np.testing.assert_allclose(slots[:, :, t], image.reshape(-1, 3, 2, 14, 14)[:, :, t], atol=1e-5)


def test_an_odd_frame_count_repeats_the_last_frame(coco_images):
    a, b = _frames(coco_images, 56, 56)
    three = patchify(resized([a, b, b], height=56, width=56), patch_size=14, merge_size=2, temporal_patch_size=2)
    four = patchify(resized([a, b, b, b], height=56, width=56), patch_size=14, merge_size=2, temporal_patch_size=2)
    np.testing.assert_array_equal(three, four)


def test_against_the_hf_video_processor(coco_images):
    """Where torchvision exists (a GPU machine): the real processor on the same frames, already at the planned
    size (so neither side resizes), gives the same pixels."""
    pytest.importorskip("torchvision")
    import torch
    from transformers import Qwen2VLVideoProcessor

    frames = _frames(coco_images, 84, 112) * 2  # 4 frames
    hf = Qwen2VLVideoProcessor(do_resize=False)(videos=[np.stack(frames)], return_tensors="pt", do_sample_frames=False)
    ours = get_profile("qwen2.5-vl")
    clip = patchify(resized(frames, height=84, width=112), patch_size=ours.patch_size, merge_size=ours.merge_size,
                    temporal_patch_size=ours.temporal_patch_size)
    assert hf["video_grid_thw"].tolist() == [[2, 6, 8]]
    torch.testing.assert_close(hf["pixel_values_videos"], torch.from_numpy(clip), atol=1e-5, rtol=1e-5)
