"""The Qwen2-Audio reader: each clip decoded as the model card loads it (``media.audio.decode_audio``:
librosa.load at 16 kHz, its window) and turned into Whisper log-mel features in numpy
(``shared.audio_features.whisper_log_mel``, 128 bins, padded to and cut at 30 s), as ``Qwen2AudioProcessor``
gives them.

    input_features          (A, 128, 3000) float32
    feature_attention_mask  (A, 3000) int32: the clip's frames
    audio_offsets           (A,) int64: each clip's first <|AUDIO|> in the batch (bookkeeping, not a model input)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packer.errors import ShardError
from packer.models.reader import Reader


class Qwen2AudioReader(Reader):
    """Qwen2-Audio's audio inputs."""

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
        """``input_features`` and ``feature_attention_mask`` of ``audios`` (rows of the shards' ``audios`` column).
        ShardError where a clip no longer decodes to what the build counted."""
        from packer.media.audio import decode_audio
        from packer.models.shared.audio_features import whisper_log_mel

        feats, masks = [], []
        for a in audios:
            source = a["data"] if a.get("data") is not None else a["source"]
            y = decode_audio(source, target_sr=int(a["sample_rate"]), start=a.get("audio_start"),
                             end=a.get("audio_end"), video=bool(a.get("video")))
            mel = whisper_log_mel(y, feature_size=self.profile.num_mel_bins)
            frames = int(mel.attention_mask.sum())
            if y.shape[0] != a["num_samples"] or frames != a["feature_length"]:
                raise ShardError(f"{a['source'] or 'inline audio'}: decodes to {y.shape[0]} samples, {frames} frames; "
                                 f"the build counted {a['num_samples']}, {a['feature_length']} (the file changed "
                                 "since the build?)")
            feats.append(mel.features)
            masks.append(mel.attention_mask)
        return {"input_features": torch.from_numpy(np.stack(feats).astype(np.float32)),
                "feature_attention_mask": torch.from_numpy(np.stack(masks).astype(np.int32))}
