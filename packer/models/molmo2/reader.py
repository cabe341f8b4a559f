"""The Molmo2 reader: the processor's own code for images and videos (``processor.py``: no torchvision), each
image run marked in ``mm_token_type_ids``, and a batch's videos given to the model as images (``join_vision``).

    pixel_values (crops, 729, 588)   image_token_pooling (tokens, 4)   image_grids (N, 4)   image_num_crops (N,)
    mm_token_type_ids (1, T)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packer.media.video import decode_frames
from packer.models.molmo2.processor import image_processor_class, video_processor_class
from packer.models.molmo2.video import frame_runs
from packer.models.reader import Reader


class Molmo2Reader(Reader):
    """Molmo2's image and video inputs, its token types, one form for every batch with videos."""

    def batch_inputs(self, rows: list[dict[str, Any]], row_starts: np.ndarray, *, load_media: bool = True) -> dict[str, Any]:
        """The default's images and videos, plus ``mm_token_type_ids`` (1 on every token of an image's run and of
        a video frame's run, as Molmo2Processor marks them); with pixels, videos joined to the images."""
        out = super().batch_inputs(rows, row_starts, load_media=load_media)
        runs = [(int(im["offset"]) + int(s), int(im["num_tokens"])) for r, s in zip(rows, row_starts, strict=False)
                for im in r["images"]]
        runs += [(a + int(s), b - a) for r, s in zip(rows, row_starts, strict=False) for v in r.get("videos", ())
                 for a, b in frame_runs(r["input_ids"], offset=int(v["offset"]),
                                        grid=(v["grid_t"], v["grid_h"], v["grid_w"]))]
        types = torch.zeros((1, int(row_starts[-1])), dtype=torch.int64)
        for offset, n in runs:
            types[0, offset : offset + n] = 1
        out["mm_token_type_ids"] = types
        return join_vision(out) if load_media else out

    def make_image_processor(self) -> Any:
        p = self.profile
        return image_processor_class()(
            size={"height": p.crop_px, "width": p.crop_px}, max_crops=p.max_crops,
            overlap_margins=list(p.overlap_margins), patch_size=p.patch_size, pooling_size=list(p.pooling),
        )

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``pixel_values_videos`` (frames, 729, 588), ``video_token_pooling`` (tokens, 9), ``video_grids``
        (V, 3) of the shards' videos: only ``frame_indices`` decoded, then Molmo2VideoProcessor's own code."""
        p = self.profile
        processor = video_processor_class()(
            size={"height": p.crop_px, "width": p.crop_px}, patch_size=p.patch_size,
            pooling_size=list(p.video_pooling),
        )
        clips = [torch.from_numpy(decode_frames(v["source"], list(v["frame_indices"]))) for v in videos]
        out = processor(videos=clips, do_sample_frames=False, input_data_format="channels_last", return_tensors="pt")
        return {k: out[k] for k in ("pixel_values_videos", "video_token_pooling", "video_grids")}


def cut_images(batch: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """The batch's image inputs cut per image: its crops' ``pixel_values``, its pooled tokens'
    ``image_token_pooling`` (re-based to its own crops), its ``image_grids`` and ``image_num_crops`` rows."""
    crops = batch["image_num_crops"].tolist()
    grids = batch["image_grids"]
    pooled = (grids[:, 0] * grids[:, 1] + grids[:, 2] * grids[:, 3]).tolist()
    patches = batch["pixel_values"].shape[1]
    out, c0, p0 = [], 0, 0
    for i, (c, p) in enumerate(zip(crops, pooled, strict=True)):
        pool = batch["image_token_pooling"][p0 : p0 + p]
        out.append({
            "pixel_values": batch["pixel_values"][c0 : c0 + c],
            "image_token_pooling": pool.where(pool < 0, pool - c0 * patches),
            "image_grids": grids[i : i + 1],
            "image_num_crops": batch["image_num_crops"][i : i + 1],
        })
        c0, p0 = c0 + c, p0 + p
    return out


def join_vision(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch's videos given as images, at their places in token order; ``image_offsets`` then names every
    image input's first token (images' and videos'), ``video_offsets`` the videos' still.

    Molmo2Model.forward refuses ``pixel_values`` and ``pixel_values_videos`` together, yet a packed row mixes
    image and video examples. Its ``get_video_features`` is ``get_image_features`` of the frames as crops with
    image_grids (frames * rows, cols, 0, 0), and the pooled features land on the <im_patch> tokens in order.
    So each video joins the image inputs by token offset: its frames as crops, its pooling rows (9 wide; the
    images' 4 padded with -1, which the adapter masks) offset past the crops before it. Every batch with videos
    takes this one form, so every check runs the same path (tests/train/test_molmo2_video_equivalence.py
    compares it with the model's own pixel_values_videos path).

        images at 10 and 900, a video at 400  ->  crops: image 0's, the video's frames, image 1's
    """
    if "pixel_values_videos" not in batch:
        return batch
    items = []
    if "pixel_values" in batch:
        images = cut_images(batch)
        items = [(int(o), im["pixel_values"], im["image_token_pooling"], im["image_grids"][0],
                  int(im["image_num_crops"][0])) for o, im in zip(batch["image_offsets"].tolist(), images, strict=True)]
    patches = batch["pixel_values_videos"].shape[1]
    f0 = p0 = 0
    for o, (t, h, w) in zip(batch["video_offsets"].tolist(), batch["video_grids"].tolist(), strict=True):
        pool = batch["video_token_pooling"][p0 : p0 + t * h * w]
        pool = pool.where(pool < 0, pool - f0 * patches)
        grid = torch.tensor([t * h, w, 0, 0], dtype=torch.int64)
        items.append((int(o), batch["pixel_values_videos"][f0 : f0 + t], pool, grid, t))
        f0, p0 = f0 + t, p0 + t * h * w
    items.sort(key=lambda x: x[0])
    width = max(x[2].shape[1] for x in items)
    pools, crops = [], 0
    for _, pixels, pool, _, _ in items:
        pool = torch.nn.functional.pad(pool, (0, width - pool.shape[1]), value=-1)
        pools.append(pool.where(pool < 0, pool + crops * patches))
        crops += pixels.shape[0]
    out = {k: v for k, v in batch.items() if k not in ("pixel_values_videos", "video_token_pooling", "video_grids")}
    out.update(pixel_values=torch.cat([x[1] for x in items]), image_token_pooling=torch.cat(pools),
               image_grids=torch.stack([x[3].to(torch.int64) for x in items]),
               image_num_crops=torch.tensor([x[4] for x in items], dtype=torch.int64),
               image_offsets=torch.tensor([x[0] for x in items], dtype=torch.int64))
    return out
