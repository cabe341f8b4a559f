"""Tests of ``balance_vision`` in bulk: ``plan(..., balance=...)``'s plan, pack ids and write order included,
from the compact columns and each row's copies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.packing import bulk_budgets
from packer.packing.bulk_balance import plan_balanced
from packer.packing.planner import plan
from tests.packing.test_bulk_budgets import mixed, two_source_columns

NAMES = ["max_vision_tokens", "max_images"]


def check(lens, vision, images, capacity, *, vision_limit, image_limit, max_examples, algorithm, refine, seed,
          counts=None):
    """plan_balanced == plan(balance=vision) on the planned examples (row r ``counts[r]`` times)."""
    rows = np.arange(len(vision)) if counts is None else np.repeat(np.arange(len(vision)), counts)
    limits = [vision_limit, image_limit]
    want = plan(lens[rows].astype(np.int64), capacity, costs=np.stack([vision[rows], images[rows]], 1).astype(np.int64),
                limits=limits, names=NAMES, algorithm=algorithm, balance=0, max_examples=max_examples,
                refine=refine, seed=seed)
    bound = [j for j, lim in enumerate(limits) if lim is not None]
    got = plan_balanced(lens, capacity, vision=vision, costs=[[vision, images][j] for j in bound],
                        limits=[limits[j] for j in bound], names=[NAMES[j] for j in bound],
                        vision_at=0 if vision_limit is not None else -1, counts=counts, max_examples=max_examples,
                        algorithm=algorithm, refine=refine, seed=seed)
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(np.diff(got.bounds), np.bincount(want, minlength=got.num_packs))
    return got


def case(seed: int) -> dict:
    rng = np.random.default_rng(700 + seed)
    capacity = int(rng.choice([16, 64, 512, 4096]))
    lens, vision, images = mixed(seed, int(rng.integers(1, 3000)), capacity)
    return dict(lens=lens, vision=vision, images=images, capacity=capacity,
                vision_limit=[None, int(max(vision.max(), 1) * rng.choice([1, 2, 5]))][seed % 2],
                image_limit=[None, None, int(rng.choice([1, 2, 4]))][seed % 3],
                max_examples=[None, 3, 8, None, 64][seed % 5], refine=bool(seed // 2 % 2), seed=seed)


@pytest.mark.parametrize("algorithm", ["bfd", "ffd", "next-fit"])
@pytest.mark.parametrize("seed", range(30))
def test_same_plan_as_plan(seed, algorithm):
    """Vision bounded or not, images, examples per pack, refine on and off: every candidate of
    ``balance.balanced`` (the base plan, the capped best fit, LPT with and without its refine) wins in some."""
    check(**case(seed), algorithm=algorithm)


@pytest.mark.parametrize("seed", range(16))
def test_rows_through_counts(seed, monkeypatch):
    """Rows left out and copied up to 3 times, blocks of 37 examples: the plan of the repeated rows."""
    monkeypatch.setattr(bulk_budgets, "BLOCK_MIN", 37)
    monkeypatch.setattr("packer.packing.bulk_balance.BLOCK_MIN", 37)
    c = case(seed)
    counts = np.random.default_rng(seed).integers(0, 4, size=len(c["lens"])).astype(np.uint8)
    check(**c, algorithm=["bfd", "ffd", "next-fit"][seed % 3], counts=counts)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 64), st.data())
def test_any_small_input_plans_as_plan(capacity, data):
    """Small rows copied 0-3 times, vision on few or most rows, bounded or not, any algorithm."""
    n = data.draw(st.integers(1, 60))
    lens = np.array(data.draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n)), dtype=np.uint16)
    share = data.draw(st.sampled_from([0.1, 0.5, 0.9]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    vision = ((rng.random(n) < share) * rng.integers(0, lens.astype(np.int64) + 1)).astype(np.uint16)
    images = (vision > 0).astype(np.uint8)
    counts = data.draw(st.sampled_from([None, rng.integers(0, 4, size=n).astype(np.uint8)]))
    if counts is not None and not counts.any():
        counts[0] = 1
    check(lens, vision, images, capacity,
          vision_limit=data.draw(st.sampled_from([None, capacity, max(int(vision.max()), 1)])),
          image_limit=data.draw(st.sampled_from([None, 1, 3])), max_examples=data.draw(st.sampled_from([None, 2, 5])),
          algorithm=data.draw(st.sampled_from(["bfd", "ffd", "next-fit"])), refine=data.draw(st.booleans()),
          seed=data.draw(st.integers(0, 9)), counts=counts)


def test_no_vision_is_the_plain_plan():
    lens = np.random.default_rng(0).integers(1, 60, size=500).astype(np.uint16)
    zero = np.zeros(500, dtype=np.uint16)
    got = plan_balanced(lens, 64, vision=zero, refine=True, seed=3)
    assert np.array_equal(got.order, np.argsort(plan(lens.astype(np.int64), 64, refine=True, seed=3), kind="stable"))
    assert plan_balanced(lens[:0], 64, vision=zero[:0]).num_packs == 0


@pytest.mark.parametrize(("algorithm", "budgets", "weight"), [
    ("bfd", {}, 1.0),  # tokens only: the base plan from bfd_fast's runs
    ("bfd", {}, 2.0),
    ("bfd", {"max_vision_tokens": 600, "max_images": 2}, 2.0),
    ("ffd", {"max_examples_per_pack": 9}, 1.0),
    ("next-fit", {"max_vision_tokens": 600}, 2.0),
])
def test_build_plans_balance_in_bulk(algorithm, budgets, weight):
    """``stages.plan_packs`` with ``balance_vision`` is the per-example path's plan (``stages._plan``, then
    ``separate_copies`` where a source is up-sampled), rows over a budget left out."""
    from packer.config import BuildConfig
    from packer.packing.mixing import separate_copies
    from packer.pipeline.stages import _plan, plan_packs

    config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": ["a.jsonl"]},
                                                {"name": "b", "paths": ["b.jsonl"], "weight": weight}]},
                                   output="out", algorithm=algorithm, balance_vision=True, max_length=512, seed=4,
                                   **budgets)
    lens, vision, images, columns = two_source_columns(budgets)
    got = plan_packs(columns, config)
    rows = np.arange(5000) if got.sampled is None else got.sampled.index()
    costs = np.stack([vision[rows], images[rows]], 1)[:, :1 + ("max_images" in budgets)].astype(np.int64)
    want = _plan(config, lens[rows].astype(np.int64), costs)
    if weight != 1.0:
        assert len(rows) > 5000  # copies planned
        want = separate_copies(rows.astype(np.int64), want, lens[rows].astype(np.int64), costs=costs,
                               limits=[budgets.get("max_vision_tokens"), budgets.get("max_images")][:costs.shape[1]],
                               capacity=512, seed=4)
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(got.pack_sizes, np.bincount(want))


def test_std_in_place_is_numpys_std():
    """``_std``'s in-place steps give ``np.bincount(assign, weights=vis).std()``'s bits (the choice compares them)."""
    from packer.packing.bulk_balance import _std

    rng = np.random.default_rng(5)
    for _ in range(40):
        packs = int(rng.integers(1, 50_000))
        n = int(rng.integers(1, 3 * packs + 2))
        slot = rng.integers(0, packs, n).astype(np.int32)
        vis = (rng.integers(0, 1300, n) * (rng.random(n) < rng.random())).astype(np.uint16)
        want = float(np.bincount(slot, weights=vis, minlength=packs).std())
        assert _std(slot, vis, np.zeros(0, np.uint8), packs) == want
