"""The GLM-4.6V reader: images through ``Glm46VImageProcessorPil`` (no torchvision), videos from their planned frames
only, through ``Glm46VVideoProcessor``'s maths in torch (``video_pixel_values``: its class needs torchvision), and
a batch's videos handed to the model AS IMAGES:

    pixel_values   (sum of h*w over the images and every temporal patch, 3*2*14*14) float32, in token order
    image_grid_thw (images + temporal patches, 3) int64: an image's (1, h, w), a video's (1, h, w) per patch

Why: ``Glm46VModel.get_placeholder_mask`` takes every ``<|image|>`` token as an image placeholder AND as a video one
(a video's patches hold ``<|image|>`` too), so a forward given both ``pixel_values`` and ``pixel_values_videos``
refuses, and a packed batch mixes examples with images and examples with videos. What the model does with a video
is what it does with those images: ``get_video_features`` splits ``video_grid_thw`` into one (1, h, w) grid per
temporal patch and runs the vision tower on the same pixel rows (a temporal patch's two frames are one row block,
as an image is itself twice), and the placeholders are filled in token order either way. The proof runs each path
with the processor's own video inputs (``pixel_values_videos``, ``video_grid_thw``, ``mm_token_type_ids`` 2) and
checks the two agree (tests/models/test_glm46v.py). Positions come from the shards (``position_ids`` (4, 1, T)),
so the model's ``get_rope_index`` never runs on a packed batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packer.media.video import decode_frames
from packer.models.reader import Reader, image_ref

# transformers.image_utils.OPENAI_CLIP_MEAN / _STD: Glm46VImageProcessor's and Glm46VVideoProcessor's
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESCALE_FACTOR = 1 / 255


class Glm46VReader(Reader):
    def make_image_processor(self) -> Any:
        # The PIL backend (torchvision is not a dependency); the checkpoints' size, the class's other defaults.
        from transformers import Glm46VImageProcessorPil

        p = self.profile
        return Glm46VImageProcessorPil(
            size={"shortest_edge": p.min_pixels, "longest_edge": p.max_pixels}, patch_size=p.patch_size,
            temporal_patch_size=p.temporal_patch_size, merge_size=p.merge_size,
        )

    def batch_inputs(self, rows: list[dict[str, Any]], row_starts: np.ndarray, *, load_media: bool = True) -> dict[str, Any]:
        """``pixel_values`` / ``image_grid_thw`` of the batch's images and videos' temporal patches in token order,
        ``image_offsets`` and ``video_offsets`` (each entry's first token in the batch)."""
        images = [im for r in rows for im in r["images"]]
        videos = [v for r in rows for v in r.get("videos", ())]
        out: dict[str, Any] = {}
        if images:
            out["image_offsets"] = torch.tensor(_offsets(rows, row_starts, "images"), dtype=torch.int64)
        if videos:
            out["video_offsets"] = torch.tensor(_offsets(rows, row_starts, "videos"), dtype=torch.int64)
        if not load_media or not (images or videos):
            return out
        blocks: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (batch offset, pixel rows, grids)
        if images:
            processed = self.pixel_values([image_ref(im) for im in images])
            at = 0
            for off, grid in zip(out["image_offsets"].tolist(), processed["image_grid_thw"], strict=True):
                n = int(grid.prod())
                blocks.append((off, processed["pixel_values"][at : at + n], grid[None]))
                at += n
        for off, v in zip(out.get("video_offsets", torch.zeros(0)).tolist(), videos, strict=True):
            pixels, (t, h, w) = video_pixel_values(
                decode_frames(v["source"], v["frame_indices"]), height=v["height"], width=v["width"],
                patch_size=self.profile.patch_size, temporal_patch_size=self.profile.temporal_patch_size,
                merge_size=self.profile.merge_size,
            )
            blocks.append((off, pixels, torch.tensor([[1, h, w]] * t, dtype=torch.int64)))
        blocks.sort(key=lambda b: b[0])
        out["pixel_values"] = torch.cat([b[1] for b in blocks])
        out["image_grid_thw"] = torch.cat([b[2] for b in blocks])
        return out


def video_pixel_values(
    frames: np.ndarray, *, height: int, width: int, patch_size: int = 14, temporal_patch_size: int = 2,
    merge_size: int = 2, image_mean: tuple[float, ...] = CLIP_MEAN, image_std: tuple[float, ...] = CLIP_STD,
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """One clip's ``pixel_values_videos`` and ``video_grid_thw`` as ``Glm46VVideoProcessor`` gives them for these
    sampled frames (``do_sample_frames=False``), without torchvision.

    frames (T, H, W, 3) uint8 -> (T, 3, H, W) -> resize to (height, width): torchvision v2's ``resize`` of a CPU
    uint8 tensor, bicubic with antialias, which is torch's own uint8 kernel (``interpolate``), skipped at the same
    size -> pad T to a multiple of 2 with the last frame -> rescale and normalize fused (float32 ``(x - 255 *
    mean) / (255 * std)``, ``rescale_and_normalize``) -> patchify: rows (t, h-block, w-block, h-in, w-in), columns
    (channel, frame, y, x) (``Glm46VVideoProcessor.patchify``).

    Returns float32 (t * h * w, 3 * 2 * 14 * 14) and (t, h, w) in patches.
    """
    from torch.nn.functional import interpolate

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] < 1:
        raise ValueError(f"frames must be (T, H, W, 3) uint8 with T >= 1, got {frames.dtype} {frames.shape}")
    video = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()  # (T, 3, H, W) uint8
    if tuple(video.shape[-2:]) != (height, width):
        video = interpolate(video, size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    if pad := -video.shape[0] % temporal_patch_size:
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
    # rescale + normalize fused (TorchvisionBackend._fuse_mean_std_and_rescale_factor, then torchvision's
    # normalize: x.sub_(mean).div_(std)), float32 throughout
    mean = (torch.tensor(list(image_mean)) * (1.0 / RESCALE_FACTOR)).view(1, 3, 1, 1)
    std = (torch.tensor(list(image_std)) * (1.0 / RESCALE_FACTOR)).view(1, 3, 1, 1)
    video = video.to(torch.float32).sub_(mean).div_(std)
    t = video.shape[0] // temporal_patch_size
    gh, gw, m, p = height // patch_size, width // patch_size, merge_size, patch_size
    patches = video.view(t, temporal_patch_size, 3, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, gh/m, gw/m, m, m, 3, tps, p, p)
    return patches.reshape(t * gh * gw, 3 * temporal_patch_size * p * p), (t, gh, gw)



def _offsets(rows: list[dict[str, Any]], row_starts: np.ndarray, key: str) -> list[int]:
    """The batch offset of every entry of ``key`` ("images", "videos"), rows in order."""
    return [int(e["offset"]) + int(s) for r, s in zip(rows, row_starts, strict=False) for e in r.get(key, ())]
