"""The media table (``packer.core.media``): every row names columns, fields and attributes that exist, and the
budgets derived from the rows are the planner's cost columns in the order its plans depend on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.core.media import BUDGETS, MEDIA, Medium, budgets_of, medium
from packer.core.types import Encoded
from packer.models.base import ModelProfile
from packer.packing import pack_totals, plan
from packer.pipeline.cache import PLAN_COLUMNS
from packer.report.verify.decode import MEDIA_FIELDS
from packer.shards.schema import EXAMPLE_SCHEMA, SCHEMA


@pytest.mark.parametrize("m", MEDIA, ids=lambda m: m.name)
def test_each_row_names_what_exists(m):
    """What a new row must bring: its placeholder and its rule attribute on the profile, its budgets in the
    config, its columns in the shards, the examples table and the encode cache, its items on ``Encoded``, its
    fields for verify."""
    assert m.placeholder in {f.name for f in dataclasses.fields(ModelProfile)}
    assert m.rule in ModelProfile.__annotations__ and getattr(ModelProfile, m.rule) is None  # the text base: none
    assert {m.count_budget, m.token_budget} <= {f.name for f in dataclasses.fields(BuildConfig)}
    assert {m.plural, m.token_column} | ({m.own_tokens_column} - {None}) <= set(SCHEMA.names)
    assert {m.count_column, m.token_column} <= set(EXAMPLE_SCHEMA.names) & set(PLAN_COLUMNS)
    assert m.plural in {f.name for f in dataclasses.fields(Encoded)}
    assert m.name in MEDIA_FIELDS and medium(m.name) is m


def test_budgets_are_the_cost_columns_in_plan_order():
    """A token budget shared by two media (vision: images and videos) is one column, listed where its first
    medium puts it; the order is the one plans were made with before the table."""
    assert [(b.flag, b.column, b.media) for b in BUDGETS] == [
        ("max_vision_tokens", "num_vision_tokens", ("image", "video")),
        ("max_images", "num_images", ("image",)),
        ("max_videos", "num_videos", ("video",)),
        ("max_audio_tokens", "num_audio_tokens", ("audio",)),
        ("max_audios", "num_audios", ("audio",)),
    ]


def test_a_new_row_is_two_more_cost_columns_the_planner_keeps():
    """A medium on a tower of its own (a made-up depth sensor) adds its token and count budgets as two columns;
    the planner holds them with no code of its own."""
    depth = Medium(name="depth", plural="depths", placeholder="depth_token", count_column="num_depths",
                   token_column="num_depth_tokens", own_tokens_column="num_depth_tokens", count_budget="max_depths",
                   token_budget="max_depth_tokens", tokens_noun="depth tokens", items_noun="depth maps", rule="depth")
    budgets = budgets_of((*MEDIA, depth))
    assert [b.flag for b in budgets[len(BUDGETS):]] == ["max_depth_tokens", "max_depths"]
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 400, 2_000)
    maps = rng.integers(0, 3, 2_000)
    costs = np.stack([np.minimum(lengths, maps * 40), maps], axis=1)  # (n, 2): depth tokens, depth maps
    ids = plan(lengths, 1024, costs=costs, limits=[200, 3], names=[b.flag for b in budgets[len(BUDGETS):]])
    assert pack_totals(costs[:, 0], ids).max() <= 200 and pack_totals(costs[:, 1], ids).max() <= 3
    with pytest.raises(Exception, match=r"example 0 has 9 'max_depths' units > max_depths 3; raise 'max_depths'"):
        plan(lengths[:1], 1024, costs=[[0, 9]], limits=[None, 3], names=["max_depth_tokens", "max_depths"])
