"""The Gemma 4 reader: images through ``Gemma4ImageProcessorPil`` (no torchvision), videos from their planned frames
only (``video_pixels.py``: the video processor's maths in torch).

    pixel_values        (I, 2520, 768) float32   image_position_ids (I, 2520, 2) int64    one row per image
    pixel_values_videos (F, 630, 768) float32    video_position_ids (F, 630, 2) int64     one row per frame
    num_frames_per_video (V,) int64
    input_features      (A, T, 128) float32      input_features_mask (A, T) bool          one row per clip
    audio_offsets       (A,) int64: each clip's first soft token in the batch
    audio_frames        (A,) int64: the frames the extractor computes for each clip alone (valid or not)

Gemma4Model encodes each row alone (the padding patches masked), so a batch's images and frames are its
examples' in token order, exactly as the processor gives one text with those images and videos. Its audio tower
encodes each clip as a row of its own too (its frames padded to the batch's longest clip, masked): a clip's
soft tokens do not depend on the other clips of the batch (tests/models/test_gemma4_audio.py measures it).
"""

from __future__ import annotations

from typing import Any

import torch

from packer.errors import ShardError
from packer.media.video import decode_frames
from packer.models.gemma4.resize import target_size
from packer.models.gemma4.video_pixels import video_pixel_values
from packer.models.reader import Reader


class Gemma4Reader(Reader):
    def batch_inputs(self, rows: list[dict[str, Any]], row_starts: Any, *, load_media: bool = True) -> dict[str, Any]:
        out = super().batch_inputs(rows, row_starts, load_media=load_media)
        audios = [a for r in rows for a in r.get("audios") or ()]  # rows in order, each row's clips in token order
        if audios:
            if load_media:
                out.update(self.audio_inputs(audios))
            from packer.models.gemma4.audio import computed_frames

            out["audio_frames"] = torch.tensor([computed_frames(a["num_samples"]) for a in audios], dtype=torch.int64)
            out["audio_offsets"] = torch.tensor(
                [int(a["offset"]) + int(s) for r, s in zip(rows, row_starts, strict=False) for a in r.get("audios") or ()],
                dtype=torch.int64)
        return out

    def audio_inputs(self, audios: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``input_features`` and ``input_features_mask`` of ``audios`` (rows of the shards' ``audios`` column):
        each clip decoded as the build counted it (``media.audio.decode_audio``) and made features as
        Gemma4AudioFeatureExtractor makes them (``audio.log_mel``, bit-equal), padded to the longest. ShardError
        where a clip no longer decodes to what the build counted."""
        from packer.media.audio import decode_audio
        from packer.models.gemma4.audio import batch_features, log_mel

        clips = []
        for a in audios:
            source = a["data"] if a.get("data") is not None else a["source"]
            y = decode_audio(source, target_sr=int(a["sample_rate"]), start=a.get("audio_start"),
                             end=a.get("audio_end"), video=bool(a.get("video")))
            clip = log_mel(y)
            if y.shape[0] != a["num_samples"] or int(clip.mask.sum()) != a["feature_length"]:
                raise ShardError(f"{a['source'] or 'inline audio'}: decodes to {y.shape[0]} samples, "
                                 f"{int(clip.mask.sum())} frames; the build counted {a['num_samples']}, "
                                 f"{a['feature_length']} (the file changed since the build?)")
            clips.append(clip)
        features, mask = batch_features(clips)
        return {"input_features": torch.from_numpy(features), "input_features_mask": torch.from_numpy(mask)}

    def make_image_processor(self) -> Any:
        # google/gemma-4-*-it processor_config.json: the class defaults (bicubic, rescale 1/255, no normalize,
        # patch 16, pooling 3) and max_soft_tokens 280, which is the profile's. The PIL backend: torchvision is
        # not a dependency.
        from transformers import Gemma4ImageProcessorPil

        p = self.profile
        return Gemma4ImageProcessorPil(max_soft_tokens=p.max_soft_tokens, patch_size=p.patch_size,
                                       pooling_kernel_size=p.pooling_kernel_size)

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Each stored video's planned frames decoded (``media.video.decode_frames``) and made what
        Gemma4VideoProcessor makes of them, frames of all videos in one leading axis."""
        p = self.profile
        pixels, positions = [], []
        for v in videos:
            frames = decode_frames(v["source"], v["frame_indices"])  # (T, H, W, 3) uint8
            size = target_size(frames.shape[1], frames.shape[2], patch_size=p.patch_size,
                               max_soft_tokens=p.video_max_soft_tokens, pooling=p.pooling_kernel_size)
            if size != (int(v["height"]), int(v["width"])):
                raise ShardError(f"{v['source']}: its frames are {frames.shape[2]}x{frames.shape[1]} px now, which "
                                 f"do not resize to the stored {v['width']}x{v['height']}; the clip changed since the build")
            x, pos = video_pixel_values(frames, patch_size=p.patch_size, max_soft_tokens=p.video_max_soft_tokens,
                                        pooling=p.pooling_kernel_size)
            pixels.append(x)
            positions.append(pos)
        return {"pixel_values_videos": torch.cat(pixels), "video_position_ids": torch.cat(positions),
                "num_frames_per_video": torch.tensor([len(v["frame_indices"]) for v in videos], dtype=torch.int64)}
