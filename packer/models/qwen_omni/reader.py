"""The Qwen2.5-Omni reader: images through ``Qwen2VLImageProcessorPil`` (the checkpoint's min/max pixels),
videos from their planned frames only (the shared ``qwen_video_pixels`` maths, no torchvision), the processor's
``video_second_per_grid``, and each audio clip (a video's sound track too) decoded as qwen-omni-utils loads it
(``media.audio.decode_audio``: librosa.load at 16 kHz) and turned into Whisper log-mel features in numpy
(``shared.audio_features.whisper_log_mel``, 128 bins, padded to 30 s: WhisperFeatureExtractor's numbers within
a float32 rounding, tests/media/test_audio.py).

    pixel_values        (sum(t*h*w), 3*2*14*14) float32   image_grid_thw (N, 3) int64
    pixel_values_videos (sum(t*h*w), 3*2*14*14) float32   video_grid_thw (V, 3) int64   video_second_per_grid (V,)
    input_features      (A, 128, 3000) float32             feature_attention_mask (A, 3000) int32
    audio_offsets       (A,) int64: each clip's first audio token in the batch (a sound track's is inside its video)
"""

from __future__ import annotations

from typing import Any

import torch

from packer.errors import ShardError
from packer.models.reader import Reader
from packer.models.shared.qwen_video_pixels import sampled_frames, video_pixel_values


class QwenOmniReader(Reader):
    """Qwen2.5-Omni's thinker inputs."""

    def make_image_processor(self) -> Any:
        from transformers import Qwen2VLImageProcessorPil

        p = self.profile
        return Qwen2VLImageProcessorPil(
            min_pixels=p.min_pixels, max_pixels=p.max_pixels, patch_size=p.patch_size,
            temporal_patch_size=p.temporal_patch_size, merge_size=p.merge_size,
        )

    def batch_inputs(self, rows: list[dict[str, Any]], row_starts: Any, *, load_media: bool = True) -> dict[str, Any]:
        out = super().batch_inputs(rows, row_starts, load_media=load_media)
        audios = [a for r in rows for a in r.get("audios") or ()]  # rows in order, each row's clips in token order
        if audios:
            if load_media:
                out.update(self.audio_inputs(audios))
            out["audio_offsets"] = torch.tensor(
                [int(a["offset"]) + int(s) for r, s in zip(rows, row_starts, strict=False) for a in r.get("audios") or ()],
                dtype=torch.int64)
        return out

    def audio_inputs(self, audios: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``input_features`` and ``feature_attention_mask`` of ``audios`` (rows of the shards' ``audios``
        column), as Qwen2_5OmniProcessor gives them for those clips: one 30 s window each, the mask marking the
        clip's frames. ShardError where a clip no longer decodes to what the build counted."""
        import numpy as np

        from packer.media.audio import decode_audio
        from packer.models.shared.audio_features import whisper_log_mel

        feats, masks = [], []
        for a in audios:
            source = a["data"] if a.get("data") is not None else a["source"]
            y = decode_audio(source, target_sr=int(a["sample_rate"]), start=a.get("audio_start"),
                             end=a.get("audio_end"), video=bool(a.get("video")))
            mel = whisper_log_mel(y, feature_size=128)
            if y.shape[0] != a["num_samples"] or int(mel.attention_mask.sum()) != a["feature_length"]:
                raise ShardError(f"{a['source'] or 'inline audio'}: decodes to {y.shape[0]} samples, "
                                 f"{int(mel.attention_mask.sum())} frames; the build counted {a['num_samples']}, "
                                 f"{a['feature_length']} (the file changed since the build?)")
            feats.append(mel.features)
            masks.append(mel.attention_mask)
        return {"input_features": torch.from_numpy(np.stack(feats).astype(np.float32)),
                "feature_attention_mask": torch.from_numpy(np.stack(masks).astype(np.int32))}

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        p = self.profile
        pixels, grids = [], []
        for v in videos:
            utils_size = (v["utils_height"], v["utils_width"])
            pixel_values, grid = video_pixel_values(
                sampled_frames(v, utils_size, p.video_family()), resized_height=v["height"], resized_width=v["width"],
                patch_size=p.patch_size, image_mean=p.image_mean, image_std=p.image_std,
                temporal_patch_size=p.temporal_patch_size, merge_size=p.merge_size, utils_size=utils_size,
            )
            pixels.append(pixel_values)
            grids.append(grid)
        return {
            "pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.cat(grids),
            # the processor's list of floats, made a float32 tensor by return_tensors="pt"
            "video_second_per_grid": torch.tensor([v["second_per_grid_t"] for v in videos], dtype=torch.float32),
        }

