"""A checkpoint directory's processor files against a profile: a build whose ``--tokenizer`` is a checkpoint
directory is refused where that directory's ``preprocessor_config.json`` / ``video_preprocessor_config.json`` /
``processor_config.json`` set a value the profile would count with otherwise, unless the build sets that value
itself (``--max-pixels``, ``--profile-option key=value``). So counts never silently follow a profile's guess
over the user's own files (issue 34: a 300 s audio chunk counted as 30 s).

    Qwen2.5-Omni dir, preprocessor_config.json {"chunk_length": 30}
        -> ConfigError: .../preprocessor_config.json sets chunk_length 30; profile 'qwen2.5-omni' would count
           with audio_chunk_length 300: pass --profile-option audio_chunk_length=30 (or 300 to keep it)

Only keys a profile has a setting for are compared (the released keys, tests/models/released/ has them all).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packer.errors import ConfigError

FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")

# file key (dotted into nested dicts) -> the profile setting it fixes, where the profile has that setting.
# The video file's keys are the video processor's: only those a profile holds apart from the image's.
KEYS: dict[str, dict[str, str]] = {
    "preprocessor_config.json": {
        "min_pixels": "min_pixels", "max_pixels": "max_pixels",
        "size.shortest_edge": "min_pixels", "size.longest_edge": "max_pixels",
        "patch_size": "patch_size", "merge_size": "merge_size", "temporal_patch_size": "temporal_patch_size",
        "chunk_length": "audio_chunk_length",
        "image_seq_length": "tokens_per_image", "do_pan_and_scan": "do_pan_and_scan",
        "max_image_size.longest_edge": "tile_px",
    },
    "video_preprocessor_config.json": {"min_pixels": "video_min_pixels", "max_pixels": "video_max_pixels"},
    "processor_config.json": {
        "image_seq_length": "tokens_per_image", "image_processor.max_soft_tokens": "max_soft_tokens",
        "video_processor.max_soft_tokens": "video_max_soft_tokens", "video_processor.num_frames": "video_num_frames",
    },
}


# Keys a profile's released processor call never reads, by profile name: Qwen3OmniMoeProcessor pads each call to
# its longest clip with truncation=False, so its extractor's chunk_length neither pads nor cuts a clip.
UNREAD: dict[str, set[str]] = {"qwen3-omni": {"chunk_length"}}


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def check_processor_files(profile: Any, directory: str | Path, *, explicit: set[str] = frozenset()) -> None:
    """ConfigError where a file of ``directory`` (a checkpoint directory, or one processor file) sets a value that
    ``profile`` (already with the build's overrides) does not have, for a setting the build did not set itself
    (``explicit``)."""
    where = Path(directory)
    if where.is_file() and where.name not in FILES:
        raise ConfigError(f"{where}: not a processor file; expected a checkpoint directory or one of {', '.join(FILES)}")
    paths = [where] if where.is_file() else [where / name for name in FILES]
    for path in paths:
        name = path.name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot read the checkpoint's processor file: {e}") from e
        for key, setting in KEYS[name].items():
            if key == "size.longest_edge" and hasattr(profile, "longest_edge"):
                setting = "longest_edge"  # SmolVLM's and Mistral 3's: an edge in pixels, not an area
            want = _get(data, key)
            if want is None or setting in explicit or not hasattr(profile, setting) or key in UNREAD.get(
                    profile.name, ()):
                continue
            have = getattr(profile, setting)
            if have is None or isinstance(want, (dict, list)) or have == want:
                continue
            if setting not in profile.overridable:  # e.g. a patch size: another model, not another setting
                raise ConfigError(
                    f"{path} sets {key} {want}; profile {profile.name!r} counts with {setting} {have}, which no "
                    f"build option changes: this checkpoint's processor is not one profile {profile.name!r} is "
                    "exact for")
            option = f"--max-pixels {want}" if setting == "max_pixels" else (
                f"--min-pixels {want}" if setting == "min_pixels" else f"--profile-option {setting}={want}")
            raise ConfigError(
                f"{path} sets {key} {want}; profile {profile.name!r} would count with {setting} {have}: pass "
                f"{option} to follow the checkpoint (or set {setting} explicitly to keep {have})")
