"""Every question verify asks the model family, in one place: the family protocol is redesigned around rule
objects (``profile.image``, ``profile.video``, ``profile.audio``: ``core.media.Medium.rule``), and this
module is what re-points verify at it. The checks call these functions, never the profile's hooks.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from packer.models.base import ModelProfile
    from packer.shards.schema import Manifest


def load_profile(manifest: Manifest) -> ModelProfile:
    """The build's profile with the manifest config's overrides."""
    from packer.models import get_profile

    return get_profile(manifest.profile, **manifest.config.profile_overrides())


def uses_mrope(profile: ModelProfile) -> bool:
    return bool(profile.mrope)


def spans(profile: ModelProfile, medium: str, ids: np.ndarray, row_starts: np.ndarray, offsets: np.ndarray,
          fields: dict[str, np.ndarray], token_id: int | None) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
    """The family's spans of a medium's placeholders, ``(offsets, fields, on)``: what the span checks walk
    (Qwen3-VL: a video's temporal patches, each a run of its own) and which id lies on them (``on``: an id,
    True = the placeholder, False/None = none)."""
    return profile.verify_spans(medium, ids, row_starts, offsets, fields, token_id)


def grid_num_tokens(profile: ModelProfile, medium: str, grids: np.ndarray) -> np.ndarray:
    """(I,) tokens of each image's (or video's) (t, h, w) grid under the family's rule."""
    if medium == "video":
        return profile.video_grid_num_tokens(grids)
    return profile.grid_num_tokens(grids)


def audio_num_tokens(profile: ModelProfile, feature_lengths: np.ndarray) -> np.ndarray:
    """(A,) tokens of each clip from its feature length."""
    return profile.audio_num_tokens(feature_lengths)


def video_faults(profile: ModelProfile, grids: np.ndarray, sizes: np.ndarray, num_frames: np.ndarray) -> np.ndarray:
    """(V,) bool: a video whose grid disagrees with its stored frame size and sampled frame count."""
    return profile.video_faults(grids, sizes, num_frames)


def audio_sample_rate(profile: ModelProfile) -> int:
    return profile.audio_sample_rate


def audio_feature_lengths(profile: ModelProfile, num_samples: np.ndarray, padded: np.ndarray) -> np.ndarray:
    """(A,) the family's feature length of each clip, -1 where it cannot say: clips with padded_samples
    (``padded >= 0``, schema v5) are asked with them, the others without (the families that never store them
    keep their one-argument ``audio_feature_lengths``; asked about a padded clip, they answer -1: a fault)."""
    has = padded >= 0
    want = np.full(len(padded), -1, dtype=np.int64)
    if (~has).any():
        want[~has] = profile.audio_feature_lengths(num_samples[~has])
    if has.any() and "padded_samples" in inspect.signature(profile.audio_feature_lengths).parameters:
        want[has] = profile.audio_feature_lengths(num_samples[has], padded_samples=padded[has])
    return want


def extra_positions(profile: ModelProfile, num_tokens: int, node_offsets: np.ndarray, node_parents: np.ndarray,
                    image_starts: np.ndarray, image_grids: np.ndarray, **media: np.ndarray) -> np.ndarray:
    """(3, L) the family's mRoPE positions of the flat token stream (``get_rope_index`` along each tree path);
    ``media``: the videos' and audio clips' offsets and plans, where any (``video_offsets``, ``audio_offsets``...)."""
    return profile.expected_extra_positions(num_tokens, node_offsets, node_parents, image_starts, image_grids, **media)
