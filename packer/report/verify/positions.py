"""Positions: 1-D ``position_ids`` are the tree positions of the row's node forest, and mRoPE positions equal the
family's recomputation of ``get_rope_index`` along each tree path (as stored: a fraction an integer family's
positions must not have is a difference)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import packer.report.verify.family as family
from packer.core import tree
from packer.report.verify.decode import Rows, rows_with
from packer.report.verify.report import RowCheck

if TYPE_CHECKING:
    from packer.models.base import ModelProfile
    from packer.report.verify.media import Spans


def check_tree_positions(d: Rows, check: RowCheck) -> None:
    """0 at each example, a branch continues from its parent (``tree.tree_position_ids`` of the forest)."""
    L = len(d.input_ids.values)
    offsets, parents = d.forest
    expected = tree.tree_position_ids(L, offsets, parents).astype(np.int64) if L else np.zeros(0, np.int64)
    check(rows_with(expected != d.position_ids.values, d.input_ids.row_of, d.num_rows), "position_ids",
          lambda i: "position_ids differ from the tree positions (0 at each example, a branch continues from its parent)")


def check_mrope(d: Rows, check: RowCheck, profile: ModelProfile, spans: dict[str, Spans], sound: np.ndarray) -> None:
    """mRoPE positions of rows whose media spans are sound (``sound``, (L,)) against the family's, with each
    video's ``second_per_grid_t`` and each clip's plan."""
    L = len(d.input_ids.values)
    if not family.uses_mrope(profile) or not L:
        return
    got = d.mrope.values.reshape(-1, 3).T  # (3, L): token-major storage
    image, video, audio = spans["image"], spans["video"], spans["audio"]
    videos = dict(offset=video.starts[video.sound], grid=video.grids[video.sound],
                  second_per_grid_t=video.fields["second_per_grid_t"][video.sound])
    audios = {k: audio.fields[k][audio.sound] for k in ("feature_length", "num_tokens", "video")}
    audios["offset"] = audio.starts[audio.sound]  # the family's spans, as for videos
    offsets, parents = d.forest
    want = family.expected_positions(profile, L, offsets, parents,
                                     images=dict(offset=image.starts[image.sound], grid=image.grids[image.sound]),
                                     videos=videos, audios=audios)
    bad = (got != want).any(axis=0) & sound
    check(rows_with(bad, d.input_ids.row_of, d.num_rows), "mrope_position_ids",
          lambda i: "mrope_position_ids differ from get_rope_index of each example's tree paths")
