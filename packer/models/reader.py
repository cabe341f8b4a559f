"""``Reader``: the reader side of a family (``ModelProfile.reader()``): a batch of shard rows -> the model's media
inputs (pixels, grids, the family's own keys). ``packer.train.collate`` builds everything a row says about tokens
and boundaries, then asks the profile's reader for the rest with ONE call, ``batch_inputs``.

The default serves the common case: every image through the family's HF image processor
(``make_image_processor``), videos through ``video_pixel_values``, every audio clip decoded (only its window, as the
family's loader decodes it: ``packer.media.audio.decode_audio``) and made into Whisper log-mel features in numpy
(``audio_features``), and ``image_offsets`` / ``video_offsets`` / ``audio_offsets`` (the first token of each, in
the batch). A family overrides the part that differs (LLaVA-OneVision's image groups,
Gemma 3's pan-and-scan blocks, Molmo2's token types and videos-as-images). Imported only when a reader is asked
for: torch and transformers load here, never at build time.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from packer.core.types import ImageRef
from packer.errors import ConfigError, ShardError
from packer.media.images import load_image
from packer.models.registry import no_medium

if TYPE_CHECKING:
    from packer.models.base import ModelProfile


def image_ref(image: dict[str, Any]) -> ImageRef:
    """A stored image entry's reference (inline bytes, else its path)."""
    if image["data"] is not None:
        return ImageRef(data=image["data"])
    return ImageRef(path=image["source"])


class Reader:
    """Turns one profile's rows into its model's media inputs."""

    audio_feature_size: ClassVar[int] = 128
    """Mel bins of the default audio features (Whisper large-v3's 128: Qwen2-Audio, Qwen2.5-Omni, Qwen3-Omni)."""

    @property
    def audio_chunk_length(self) -> int:
        """Seconds each clip without ``padded_samples`` is padded to and cut at: the profile's
        ``audio_chunk_length`` (the released preprocessor_config.json's ``chunk_length``), else Whisper's 30."""
        return int(getattr(self.profile, "audio_chunk_length", 30))

    def __init__(self, profile: ModelProfile):
        self.profile = profile

    # ------------------------------------------------------------------ the one call collate makes

    def batch_inputs(self, rows: list[dict[str, Any]], row_starts: np.ndarray, *, load_media: bool = True) -> dict[str, Any]:
        """The media inputs of a batch of ``rows`` laid end to end: row r spans ``row_starts[r]`` to
        ``row_starts[r + 1]`` of the batch's tokens (``row_starts`` (R+1,)).

        ``load_media`` False: no pixel is decoded (``PackedDataset(load_images=False)``), only the offsets.
        """
        out: dict[str, Any] = {}
        images = [im for r in rows for im in r["images"]]
        if images:
            if load_media:
                grids = [(im["grid_t"], im["grid_h"], im["grid_w"]) for im in images]
                out.update(self.pixel_inputs([image_ref(im) for im in images], grids))
            out["image_offsets"] = torch.tensor(_offsets(rows, row_starts, "images"), dtype=torch.int64)
        videos = [v for r in rows for v in r.get("videos", ())]
        if videos:  # only each video's sampled frames are decoded
            if load_media:
                out.update(self.video_pixel_values(videos))
            out["video_offsets"] = torch.tensor(_offsets(rows, row_starts, "videos"), dtype=torch.int64)
        audios = [a for r in rows for a in r.get("audios") or ()]
        if audios:  # only each clip's window is decoded; a video's sound track from its clip
            if load_media:
                out.update(self.audio_inputs(audios))
            out["audio_offsets"] = torch.tensor(_offsets(rows, row_starts, "audios"), dtype=torch.int64)
        return out

    # ------------------------------------------------------------------ images

    def image_processor(self) -> Any:
        """The HF image processor configured like the profile (built offline, cached per profile)."""
        return _image_processor(type(self), self.profile)

    def make_image_processor(self) -> Any:
        """A new HF image processor for the profile (``image_processor`` caches it)."""
        raise no_medium(self.profile.name, "image")

    def pixel_values(self, images: list[ImageRef]) -> dict[str, torch.Tensor]:
        """Decode ``images`` (RGB) and run the processor; keep the outputs the model's forward takes."""
        decoded = [load_image(ref) for ref in images]
        out = self.image_processor()(images=decoded, return_tensors="pt")
        return {k: out[k] for k in self.profile.forward_keys if k in out}

    def pixel_inputs(self, images: list[ImageRef], grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """What a batch's images give the model, knowing their stored grids too: ``pixel_values`` by default.

        A family whose model needs more than the pixels (which images were tiled) overrides it.
        """
        return self.pixel_values(images)

    # ------------------------------------------------------------------ videos

    def video_pixel_values(self, videos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The model's video inputs for ``videos`` (rows of the shards' ``videos`` column), decoding only the
        planned frames."""
        raise no_medium(self.profile.name, "image")


    # ------------------------------------------------------------------ audio

    def audio_inputs(self, audios: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The model's audio inputs for ``audios`` (rows of the shards' ``audios`` column): each clip decoded at
        its stored rate (``decode_audio``), then ``audio_features``. ShardError where a clip no longer decodes to
        the samples the build counted (the file changed since the build)."""
        from packer.media.audio import decode_audio

        if self.profile.audio is None:
            raise ConfigError(f"profile {self.profile.name!r} takes no audio, but the rows hold audio clips")
        samples = []
        for a in audios:
            source = a["data"] if a.get("data") is not None else a["source"]
            y = decode_audio(source, target_sr=int(a["sample_rate"]), start=a.get("audio_start"),
                             end=a.get("audio_end"), video=bool(a.get("video")))
            if y.shape[0] != a["num_samples"]:
                raise ShardError(f"{a['source'] or 'inline audio'}: decodes to {y.shape[0]} samples, the build "
                                 f"counted {a['num_samples']} (the file changed since the build?)")
            samples.append(y)
        return self.audio_features(samples, audios)

    def audio_features(self, samples: list[np.ndarray], audios: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Features of decoded clips (mono float32 at their stored rate), as ``WhisperFeatureExtractor`` gives them
        (``shared.audio_features.whisper_log_mel``, numpy): ``input_features`` (A, mel bins, F) float32 and
        ``feature_attention_mask`` (A, F) int32, each mask's sum the stored ``feature_length`` (else ShardError:
        the build counted another rule).

        A clip without ``padded_samples`` (every family but Qwen3-Omni) is the extractor on the clip alone, padded
        to and cut at ``audio_chunk_length`` seconds (``padding="max_length"``): F = 3000 for 30 s (Qwen2-Audio),
        30000 for Qwen2.5-Omni's 300 s. A clip with them is its row of the extractor called on its
        example's clips with ``padding=True, truncation=False`` (the clip zero-padded to ``padded_samples``, the
        longest of them), kept up to its mask; F is then the longest mask of the batch (3000 or 30000 too where a clip
        without them is in it), and the frames past a clip's mask are zeros the model never reads."""
        from packer.models.shared.audio_features import whisper_log_mel

        feats, masks = [], []
        for y, a in zip(samples, audios, strict=True):
            padded = a.get("padded_samples")
            where = a["source"] or "inline audio"
            if padded is None:
                mel = whisper_log_mel(y, feature_size=self.audio_feature_size, sampling_rate=int(a["sample_rate"]),
                                      chunk_length=self.audio_chunk_length)
            elif padded < len(y):
                raise ShardError(f"{where}: padded to {padded} samples, fewer than its {len(y)}")
            else:  # the extractor's "longest" padding of the example's call: this clip zero-padded to the longest
                mel = whisper_log_mel(y, feature_size=self.audio_feature_size, sampling_rate=int(a["sample_rate"]),
                                      padding="max_length", max_length=int(padded), truncation=False)
            frames = int(mel.attention_mask.sum())
            if frames != a["feature_length"]:
                raise ShardError(f"{where}: {frames} feature frames, the build counted {a['feature_length']}; "
                                 f"profile {self.profile.name!r} needs its own audio_features")
            if padded is None:
                feats.append(mel.features)
                masks.append(mel.attention_mask)
            else:
                feats.append(mel.features[:, :frames])
                masks.append(mel.attention_mask[:frames])
        width = max(m.shape[0] for m in masks)
        features = np.zeros((len(feats), self.audio_feature_size, width), np.float32)
        mask = np.zeros((len(masks), width), np.int32)
        for i, (f, m) in enumerate(zip(feats, masks, strict=True)):
            features[i, :, : f.shape[1]] = f
            mask[i, : m.shape[0]] = m
        return {"input_features": torch.from_numpy(features), "feature_attention_mask": torch.from_numpy(mask)}


def _offsets(rows: list[dict[str, Any]], row_starts: np.ndarray, key: str) -> list[int]:
    """The batch offset of every entry of ``key`` ("images", "videos", "audios"), rows in order."""
    return [int(e["offset"]) + int(s) for r, s in zip(rows, row_starts, strict=False) for e in r.get(key) or ()]


@lru_cache(maxsize=16)
def _image_processor(reader: type[Reader], profile: ModelProfile) -> Any:
    return reader(profile).make_image_processor()
