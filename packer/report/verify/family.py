"""Every question verify asks the model family, in one place: the family's rule objects (``profile.image``,
``profile.video``, ``profile.audio``: ``core.media.Medium.rule``; ``profile.positions``; ``packer.models.rules``).
The checks call these functions, never the profile. A medium whose rule is None (the family lacks it) has every
stored entry wrong.
"""

from __future__ import annotations

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
    return bool(profile.positions.mrope)


def spans(profile: ModelProfile, medium: str, ids: np.ndarray, row_starts: np.ndarray, offsets: np.ndarray,
          fields: dict[str, np.ndarray], token_id: int | None) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
    """The family's spans of a medium's placeholders, ``(offsets, fields, on)``: what the span checks walk
    (Qwen3-VL: a video's temporal patches, each a run of its own) and which id lies on them (``on``: an id,
    True = the placeholder, False/None = none)."""
    rule = getattr(profile, medium)
    if rule is None:
        return offsets, fields, True
    return rule.spans(ids, row_starts, offsets, fields, token_id)


def num_tokens(profile: ModelProfile, medium: str, fields: dict[str, np.ndarray]) -> np.ndarray:
    """(S,) tokens of each stored entry (an image's or video's grid, a clip's feature length) under the family's
    rule; -1 where it has none."""
    rule = getattr(profile, medium)
    if rule is None:
        return np.full(len(fields["offset"]), -1, dtype=np.int64)
    return rule.tokens(fields)


def video_faults(profile: ModelProfile, fields: dict[str, np.ndarray]) -> np.ndarray:
    """(V,) bool: a video whose grid disagrees with its stored frame size, sampled frame count, seconds per grid or
    token count."""
    video = profile.video
    if video is None:
        return np.ones(len(fields["offset"]), dtype=bool)
    return video.faults(fields) | (video.tokens(fields) != fields["num_tokens"])


def audio_faults(profile: ModelProfile, fields: dict[str, np.ndarray]) -> np.ndarray:
    """(A,) bool: a clip whose sample rate, samples or feature length disagree under the family's rule, or whose
    padded_samples (schema v5, -1 where null) are fewer than its samples."""
    audio = profile.audio
    if audio is None:
        return np.ones(len(fields["offset"]), dtype=bool)
    return audio.faults(fields)


def expected_positions(profile: ModelProfile, num_tokens: int, node_offsets: np.ndarray, node_parents: np.ndarray,
                       *, images: dict[str, np.ndarray], videos: dict[str, np.ndarray],
                       audios: dict[str, np.ndarray]) -> np.ndarray:
    """(3, L) the family's mRoPE positions of the flat token stream (``get_rope_index`` along each tree path);
    ``images``: ``offset``, ``grid``; ``videos``: ``offset``, ``grid``, ``second_per_grid_t``; ``audios``:
    ``offset``, ``feature_length``, ``num_tokens``, ``video``."""
    return profile.positions.expected(num_tokens, node_offsets, node_parents, images=images, videos=videos,
                                      audios=audios)
