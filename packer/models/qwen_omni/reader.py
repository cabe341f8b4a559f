"""The Qwen2.5-Omni and Qwen3-Omni reader (Qwen3-Omni: 16 px patches, mean/std 0.5, each clip padded to its
``padded_samples``, the base Reader's rule): images through ``Qwen2VLImageProcessorPil`` (the checkpoint's min/max pixels),
videos from their planned frames only (the shared ``qwen_video_pixels`` maths, no torchvision), the processor's
``video_second_per_grid``, and (the base ``Reader``'s default, which is Qwen2.5-Omni's) each audio clip, a video's
sound track too, decoded as qwen-omni-utils loads it (``media.audio.decode_audio``: librosa.load at 16 kHz) and
turned into Whisper log-mel features in numpy (``shared.audio_features.whisper_log_mel``, 128 bins, padded to and
cut at the released ``chunk_length`` of 300 s: WhisperFeatureExtractor's numbers within its float32 STFT's rounding,
tests/models/test_qwen_omni.py).

    pixel_values        (sum(t*h*w), 3*2*14*14) float32   image_grid_thw (N, 3) int64
    pixel_values_videos (sum(t*h*w), 3*2*14*14) float32   video_grid_thw (V, 3) int64   video_second_per_grid (V,)
    input_features      (A, 128, 30000) float32            feature_attention_mask (A, 30000) int32  (15 MB a clip,
                        as the processor pads; the audio tower reads only the masked frames)
    audio_offsets       (A,) int64: each clip's first audio token in the batch (a sound track's is inside its video)
"""

from __future__ import annotations

from typing import Any

import torch

from packer.models.reader import Reader
from packer.models.shared.qwen_inputs import qwen2vl_image_processor
from packer.models.shared.qwen_video_pixels import planned_video_pixels


class QwenOmniReader(Reader):
    """Qwen2.5-Omni's thinker inputs."""

    def make_image_processor(self) -> Any:
        return qwen2vl_image_processor(self.profile)

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pixels, grids = planned_video_pixels(videos, self.profile)
        return {
            "pixel_values_videos": pixels, "video_grid_thw": grids,
            # the processor's list of floats, made a float32 tensor by return_tensors="pt"
            "video_second_per_grid": torch.tensor([v["second_per_grid_t"] for v in videos], dtype=torch.float32),
        }

