"""The released checkpoints' constants, one cited fixture per family (``<family>.json``), and the one place that
maps a fixture's keys to a profile's values (``PROFILE_VALUE``: rename a profile attribute here, nowhere else).

A fixture holds, per profile, the values each released file sets (``files[name]["values"]``) and where they were
read (``files[name]["source"]``: the checkpoint repo and revision, or the public copy they were read from; "not
found" says so). ``checkpoint_dir`` writes them back as a checkpoint directory's files, for tests of what a
user's ``--tokenizer <dir>`` says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

# (file, key) -> the profile's value for it. Files named "tokenizer" map token strings to ids and are compared
# against the builtin tokenizer instead (``token_ids``); config.json's token ids through ``TOKEN_KEYS``.
PROFILE_VALUE: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("preprocessor_config.json", "min_pixels"): lambda p: p.min_pixels,
    ("preprocessor_config.json", "max_pixels"): lambda p: p.max_pixels,
    ("preprocessor_config.json", "patch_size"): lambda p: p.patch_size,
    ("preprocessor_config.json", "merge_size"): lambda p: p.merge_size,
    ("preprocessor_config.json", "temporal_patch_size"): lambda p: p.temporal_patch_size,
    ("preprocessor_config.json", "image_mean"): lambda p: list(p.image_mean),
    ("preprocessor_config.json", "image_std"): lambda p: list(p.image_std),
    # audio: what the reader pads/cuts to and the count rule's cap, from the profile
    ("preprocessor_config.json", "sampling_rate"): lambda p: p.audio_sample_rate,
    ("preprocessor_config.json", "feature_size"): lambda p: p.reader().audio_feature_size,
    ("preprocessor_config.json", "chunk_length"): lambda p: p.reader().audio_chunk_length,
    ("preprocessor_config.json", "n_samples"): lambda p: p.reader().audio_chunk_length * p.audio_sample_rate,
    ("preprocessor_config.json", "nb_max_frames"): lambda p: _max_frames(p),
}

# config.json keys that name a token id -> the profile attribute holding that token's string
TOKEN_KEYS = {
    "audio_token_index": "audio_token", "audio_token_id": "audio_token", "image_token_index": "image_token",
    "image_token_id": "image_token", "video_token_index": "video_token", "video_token_id": "video_token",
    "audio_start_token_id": "audio_start", "audio_end_token_id": "audio_end",
    "vision_start_token_id": "vision_start", "vision_end_token_id": "vision_end",
}

# Keys a family's fixture records but no profile value stands for (the processor's own defaults, or values the
# profile takes from the processor's call rather than the file): listed so a new key is a decision, not a miss.
RECORDED_ONLY = {
    "feature_extractor_type", "image_processor_type", "processor_class", "dither", "padding_side", "padding_value",
    "return_attention_mask", "hop_length", "n_fft", "position_id_per_seconds", "seconds_per_chunk",
}


def _max_frames(profile: Any) -> int:
    """The cap of the family's frame count: the frames of a clip far longer than any chunk."""
    import numpy as np

    return int(profile.audio_feature_lengths(np.array([10**9], dtype=np.int64))[0])


def families() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def load(family: str) -> dict[str, Any]:
    return json.loads((HERE / f"{family}.json").read_text())


def released_profiles() -> list[tuple[str, str, dict[str, Any]]]:
    """(family, profile name, that profile's fixture entry) for every fixture."""
    return [(f, name, entry) for f in families() for name, entry in load(f)["profiles"].items()]


def file_values(entry: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(entry["files"].get(name, {}).get("values", {}))


def checkpoint_dir(path: Path, entry: dict[str, Any]) -> Path:
    """A checkpoint directory holding the released processor files of ``entry`` (their recorded values)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json"):
        values = file_values(entry, name)
        if values:
            (path / name).write_text(json.dumps(values, indent=2))
    return path


def whisper_extractor(entry: dict[str, Any]) -> Any:
    """transformers' WhisperFeatureExtractor configured as the released preprocessor_config.json says (what
    ``from_pretrained`` builds from it: the file's keys as constructor arguments)."""
    from transformers import WhisperFeatureExtractor

    values = file_values(entry, "preprocessor_config.json")
    keys = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "dither",
            "return_attention_mask")
    return WhisperFeatureExtractor(**{k: values[k] for k in keys if k in values})
