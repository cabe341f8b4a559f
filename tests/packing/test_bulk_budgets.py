"""Tests of the budgeted bulk planner: ``plan()``'s budgeted plan, pack ids and the writers' order included,
and every budget held."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import ConfigError
from packer.packing import bulk_budgets
from packer.packing.bulk_budgets import plan_budgeted
from packer.packing.planner import plan

NAMES = ["max_vision_tokens", "max_images"]


def mixed(seed: int, n: int, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint16 lengths with 30% image examples: (lengths, vision tokens, images; images in one byte, as
    ``columns.read_chunk`` gives an item count: the kernels read columns of two widths)."""
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.integers(1, capacity // 3 + 2, size=n), 1, capacity)
    images = (rng.random(n) < 0.3).astype(np.uint8)
    vision = (images * rng.integers(0, lens + 1)).astype(np.uint16)
    return lens.astype(np.uint16), vision, images


def two_source_columns(budgets: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, object]:
    """``mixed`` examples as a build's columns: 5 chunks of 1,000 from sources a, b, a, b, a; images over 2 (every
    97th) marked over ``max_images`` where it is set, as the encode marks a row over a budget."""
    from packer.pipeline.columns import ChunkColumns, ColumnsBuilder

    lens, vision, images = mixed(12, 5000, 512)
    images[::97] = 3
    built = ColumnsBuilder(5000)
    for a in range(0, 5000, 1000):
        part = slice(a, a + 1000)
        over = np.flatnonzero(images[part] > 2) if "max_images" in budgets else np.zeros(0)
        built.add(ChunkColumns(tokens=lens[part], loss_tokens=lens[part], loss_weight=None, linear=None,
                               counts={"num_vision_tokens": vision[part], "num_images": images[part]},
                               over=over.astype(np.int64), rejects=[]))
    return lens, vision, images, built.finish(["a", "b", "a", "b", "a"])


def check(lens, vision, images, capacity, limits, max_examples, refine, seed, counts=None):
    """plan_budgeted == plan() on the planned examples (row r ``counts[r]`` times, in row order), as the build
    reads them (order grouped, bounds)."""
    rows = np.arange(len(vision)) if counts is None else np.repeat(np.arange(len(vision)), counts)
    want = plan(lens[rows].astype(np.int64), capacity,
                costs=np.stack([vision[rows], images[rows]], 1).astype(np.int64),
                limits=limits, names=NAMES, max_examples=max_examples, refine=refine, seed=seed)
    got = plan_budgeted(lens, capacity, costs=[vision, images], limits=limits, names=NAMES, counts=counts,
                        max_examples=max_examples, refine=refine, seed=seed)
    assert got.order.dtype == np.int32 and got.bounds.dtype == np.int32
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(np.diff(got.bounds), np.bincount(want, minlength=got.num_packs))
    for p in range(got.num_packs):  # every budget held
        members = got.pack(p)
        assert lens[rows[members]].astype(np.int64).sum() <= capacity
        assert vision[rows[members]].astype(np.int64).sum() <= limits[0]
        assert images[rows[members]].astype(np.int64).sum() <= limits[1]
        assert max_examples is None or len(members) <= max_examples
    return got


@pytest.mark.parametrize("seed", range(24))
def test_same_plan_as_plan(seed):
    """Vision tokens, images and examples per pack, refine on and off, binding budgets and loose ones."""
    rng = np.random.default_rng(100 + seed)
    capacity = int(rng.choice([16, 64, 512, 4096]))
    lens, vision, images = mixed(seed, int(rng.integers(1, 4000)), capacity)
    limits = [int(max(vision.max(), 1) * rng.choice([1, 2, 5])), int(rng.choice([1, 2, 4, 100]))]
    check(lens, vision, images, capacity, limits, [None, 3, 8, 64][seed % 4], bool(seed % 2), seed)


@pytest.mark.parametrize("refine", [False, True])
def test_rows_through_counts_and_blocks(refine, monkeypatch):
    """Rows left out of the plan and rows planned up to 3 times (``counts``), and the decreasing order made in
    blocks smaller than one length's examples (several scans, a block ending inside a row's copies)."""
    monkeypatch.setattr(bulk_budgets, "BLOCK_MIN", 37)
    lens, vision, images = mixed(7, 3000, 256)
    kept = np.zeros(3000, np.uint8)
    kept[np.random.default_rng(1).choice(3000, size=2000, replace=False)] = 1
    check(lens, vision, images, 256, [300, 3], 6, refine, 3, counts=kept)
    check(lens, vision, images, 256, [300, 3], 6, refine, 3,
          counts=np.random.default_rng(2).integers(0, 4, size=3000).astype(np.uint8))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 64), st.data())
def test_counts_plan_the_repeated_rows(capacity, data):
    """Any rows and copies (runs of rows left out, rows planned up to 5 times, few lengths so that blocks of a
    few examples end inside a row's copies): plan_budgeted, plan_next_fit and plan_first_fit through ``counts``
    make the plan
    of the repeated rows given as rows (``np.repeat``), which plan() makes too."""
    from unittest import mock

    from packer.packing.bulk_budgets import plan_first_fit, plan_next_fit

    n = data.draw(st.integers(1, 200))
    lens = np.array(data.draw(st.lists(st.integers(1, min(capacity, 8)), min_size=n, max_size=n)), np.uint16)
    images = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), np.uint16)
    vision = np.minimum(lens, images * data.draw(st.integers(0, capacity))).astype(np.uint16)
    counts = np.array(data.draw(st.lists(st.sampled_from([0, 0, 1, 1, 2, 5]), min_size=n, max_size=n)), np.uint8)
    limits = [max(int(vision.max()), 1) + data.draw(st.integers(0, capacity)), 2]
    max_examples = data.draw(st.sampled_from([None, 1, 3]))
    refine, seed = data.draw(st.booleans()), data.draw(st.integers(0, 3))
    rows = np.repeat(np.arange(n), counts)
    with mock.patch.object(bulk_budgets, "BLOCK_MIN", data.draw(st.integers(1, 9))):
        got = check(lens, vision, images, capacity, limits, max_examples, refine, seed, counts=counts)
        as_rows = plan_budgeted(lens[rows], capacity, costs=[vision[rows], images[rows]], limits=limits,
                                names=NAMES, max_examples=max_examples, refine=refine, seed=seed)
    assert np.array_equal(got.order, as_rows.order) and np.array_equal(got.bounds, as_rows.bounds)
    for planner in (plan_next_fit, plan_first_fit):
        got = planner(lens, capacity, costs=[vision, images], limits=limits, names=NAMES, counts=counts,
                      max_examples=max_examples, refine=refine, seed=seed)
        want = planner(lens[rows], capacity, costs=[vision[rows], images[rows]], limits=limits, names=NAMES,
                       max_examples=max_examples, refine=refine, seed=seed)
        assert np.array_equal(got.order, want.order) and np.array_equal(got.bounds, want.bounds)


def test_refine_saves_packs():
    """A case where refine empties packs: fewer packs than without it, still plan()'s."""
    for seed in range(40):
        lens, vision, images = mixed(seed, 2000, 64)
        plain = check(lens, vision, images, 64, [40, 2], None, False, seed)
        refined = check(lens, vision, images, 64, [40, 2], None, True, seed)
        if refined.num_packs < plain.num_packs:
            return
    pytest.fail("refine saved no pack on any seed")


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 120), st.data())
def test_budgets_hold(capacity, data):
    """Any lengths, counts and limits: plan()'s plan, every budget respected."""
    n = data.draw(st.integers(1, 300))
    lens = np.array(data.draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n)), dtype=np.uint16)
    images = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.uint16)
    vision = np.minimum(lens, images * data.draw(st.integers(0, capacity))).astype(np.uint16)
    limits = [max(int(vision.max()), 1) + data.draw(st.integers(0, capacity)), max(int(images.max()), 1)]
    check(lens, vision, images, capacity, limits, data.draw(st.sampled_from([None, 1, 2, 5])),
          data.draw(st.booleans()), data.draw(st.integers(0, 3)))


def test_deterministic_and_empty():
    lens, vision, images = mixed(3, 500, 128)
    a = plan_budgeted(lens, 128, costs=[vision, images], limits=[200, 2], names=NAMES, seed=5, refine=True)
    b = plan_budgeted(lens, 128, costs=[vision, images], limits=[200, 2], names=NAMES, seed=5, refine=True)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.bounds, b.bounds)
    empty = plan_budgeted(np.zeros(0, np.uint16), 128, costs=[vision[:0]], limits=[10], names=NAMES[:1])
    assert empty.num_packs == 0 and empty.order.shape == (0,)


def test_a_column_of_zeros_is_left_out():
    """A budget set with no example costing any (None: the build's count column is all zero) changes nothing."""
    lens, vision, images = mixed(4, 800, 128)
    with_none = plan_budgeted(lens, 128, costs=[None, images], limits=[5, 2], names=NAMES, max_examples=7)
    want = plan(lens, 128, costs=images[:, None].astype(np.int64), limits=[2], names=NAMES[1:], max_examples=7)
    assert np.array_equal(with_none.pack_ids(), want)


@pytest.mark.parametrize(("vision", "limit", "match"), [
    ([5, 9, 3], 8, "example 1 has 9 vision tokens > max_vision_tokens 8; raise 'max_vision_tokens'"),
    ([5, 7, 3], 8, "example 1 has 7 vision tokens but only 6 tokens in all"),
])
def test_errors_as_plan_words_them(vision, limit, match):
    lens = np.array([6, 6, 6], dtype=np.uint16)
    costs = np.array(vision, dtype=np.uint16)
    with pytest.raises(ConfigError, match=match):
        plan(lens, 16, costs=costs[:, None].astype(np.int64), limits=[limit], names=NAMES[:1])
    with pytest.raises(ConfigError, match=match):
        plan_budgeted(lens, 16, costs=[costs], limits=[limit], names=NAMES[:1])
    with pytest.raises(ConfigError, match="example 0 has 17 tokens > capacity 16"):
        plan_budgeted(np.array([17], np.uint16), 16, costs=[costs[:1]], limits=[limit], names=NAMES[:1])


@pytest.mark.parametrize("refine", [False, True])
def test_build_plans_budgets_in_bulk(refine):
    """``stages.plan_packs`` with budgets and max_examples_per_pack takes plan_budgeted, and its plan is the
    per-example planner's (``stages._plan``) pack for pack, rows over a budget left out (the ``index`` path)."""
    from packer.config import BuildConfig
    from packer.pipeline.columns import ChunkColumns, ColumnsBuilder
    from packer.pipeline.stages import _plan, plan_packs

    config = BuildConfig.from_inputs(["x.jsonl"], "out", max_length=512, max_vision_tokens=600, max_images=2,
                                     max_examples_per_pack=9, refine=refine, seed=4)
    lens, vision, images = mixed(11, 5000, 512)
    images[::97] = 3  # over max_images: the build's ``over`` rows, left out of the plan
    built = ColumnsBuilder(5000)
    for a in range(0, 5000, 1000):
        part = slice(a, a + 1000)
        built.add(ChunkColumns(tokens=lens[part], loss_tokens=lens[part], loss_weight=None, linear=None,
                               counts={"num_vision_tokens": vision[part], "num_images": images[part]},
                               over=np.flatnonzero(images[part] > 2).astype(np.int64), rejects=[]))
    columns = built.finish([""] * 5)
    got = plan_packs(columns, config)
    rows = np.arange(5000) if got.sampled is None else got.sampled.index()  # None: every row once
    assert len(rows) == 5000 - len(range(0, 5000, 97))
    assert np.array_equal(rows, np.setdiff1d(np.arange(5000), np.arange(0, 5000, 97)))
    want = _plan(config, lens[rows].astype(np.int64), np.stack([vision[rows], images[rows]], 1).astype(np.int64))
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(got.pack_sizes, np.bincount(want))


@pytest.mark.parametrize("seed", range(8))
def test_copies_apart_as_separate_copies(seed):
    """separate_copies_bulk makes mixing.separate_copies' swaps: the same packs after up-sampling (weights 2
    and 2.5), with budgets (plan_budgeted) and tokens-only (plan_bulk), refine on and off."""
    from packer.packing.bulk import plan_bulk
    from packer.packing.bulk_budgets import separate_copies_bulk
    from packer.packing.mixing import Sampled, sample_sources, separate_copies

    rng = np.random.default_rng(seed)
    capacity = int(rng.choice([16, 64, 512]))
    lens, vision, images = mixed(seed, int(rng.integers(1, 3000)), capacity)
    index, _ = sample_sources(rng.integers(0, 3, size=len(lens)), [(0, 1.0), (1, 2.0), (2, 2.5)], seed=seed)
    index = index.astype(np.int32)
    sampled = Sampled.of(np.bincount(index, minlength=len(lens)).astype(np.uint8))
    planned, refine = lens[index], seed % 3 == 0
    if seed % 2:
        ids = plan(planned, capacity, refine=refine, seed=seed)
        want = separate_copies(index.astype(np.int64), ids, planned.astype(np.int64), capacity=capacity, seed=seed)
        got = separate_copies_bulk(plan_bulk(planned, capacity, seed=seed, refine=refine), sampled, lens,
                                   capacity=capacity, seed=seed)
    else:
        limits = [int(max(vision.max(), 1)) * 2, 3]
        costs = np.stack([vision[index], images[index]], 1).astype(np.int64)
        ids = plan(planned, capacity, costs=costs, limits=limits, names=NAMES, refine=refine, seed=seed)
        want = separate_copies(index.astype(np.int64), ids, planned.astype(np.int64), costs=costs, limits=limits,
                               capacity=capacity, seed=seed)
        packs = plan_budgeted(lens, capacity, costs=[vision, images], limits=limits, names=NAMES,
                              counts=sampled.counts, refine=refine, seed=seed)
        got = separate_copies_bulk(packs, sampled, lens, capacity=capacity, seed=seed, costs=[vision, images],
                                   limits=limits)
    assert (want != ids).any()  # swaps happened
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(np.diff(got.bounds), np.bincount(want))


@pytest.mark.parametrize("seed", range(12))
def test_next_fit_is_plans_next_fit(seed):
    """plan_next_fit == plan(algorithm="next-fit") pack for pack and in write order: tokens only, with
    budgets (binding and loose), max_examples, costs read through ``index``; every pack a run of examples."""
    from packer.packing.bulk_budgets import plan_next_fit

    rng = np.random.default_rng(300 + seed)
    capacity = int(rng.choice([16, 64, 512]))
    lens, vision, images = mixed(seed, int(rng.integers(1, 3000)), capacity)
    max_examples = [None, 3, 8][seed % 3]
    index = np.sort(rng.choice(len(lens), size=len(lens) // 2 + 1)) if seed % 4 == 2 else None
    rows = np.arange(len(lens)) if index is None else index  # rows left out and rows planned more than once
    counts = None if index is None else np.bincount(index, minlength=len(lens)).astype(np.uint8)
    planned = lens[rows]
    refine = seed >= 6  # refine empties packs: no longer runs of examples
    if seed % 2:
        want = plan(planned, capacity, algorithm="next-fit", max_examples=max_examples, refine=refine, seed=seed)
        got = plan_next_fit(planned, capacity, max_examples=max_examples, refine=refine, seed=seed)
    else:
        limits = [int(max(vision.max(), 1) * rng.choice([1, 2])), int(rng.choice([1, 2, 100]))]
        want = plan(planned, capacity, algorithm="next-fit", costs=np.stack([vision[rows], images[rows]], 1),
                    limits=limits, names=NAMES, max_examples=max_examples, refine=refine, seed=seed)
        got = plan_next_fit(lens, capacity, costs=[vision, images], limits=limits, names=NAMES, counts=counts,
                            max_examples=max_examples, refine=refine, seed=seed)
    assert got.order.dtype == np.int32 and got.bounds.dtype == np.int32
    assert np.array_equal(got.pack_ids(), want)
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    if not refine:
        assert all(np.all(np.diff(got.pack(p)) == 1) for p in range(got.num_packs))


@pytest.mark.parametrize("seed", range(16))
def test_first_fit_is_plans_ffd(seed):
    """plan_first_fit == plan(algorithm="ffd") pack for pack and in write order: tokens only and with budgets
    (binding and loose), max_examples, refine on and off, rows left out or planned more than once
    (``counts``), more packs than the tree's first 1024 leaves (it doubles)."""
    from packer.packing.bulk_budgets import plan_first_fit

    rng = np.random.default_rng(400 + seed)
    capacity = int(rng.choice([16, 64, 512, 4096]))
    lens, vision, images = mixed(seed, int(rng.integers(1, 4000)), capacity)
    counts = rng.choice([0, 1, 1, 2, 3], size=len(lens)).astype(np.uint8) if seed % 3 == 0 else None
    rows = np.arange(len(lens)) if counts is None else np.repeat(np.arange(len(lens)), counts)
    max_examples, refine = [None, 3, 8, 64][seed % 4], seed % 8 >= 4
    if seed % 2:
        want = plan(lens[rows], capacity, algorithm="ffd", max_examples=max_examples, refine=refine, seed=seed)
        got = plan_first_fit(lens, capacity, counts=counts, max_examples=max_examples, refine=refine, seed=seed)
    else:
        limits = [int(max(vision.max(), 1) * rng.choice([1, 2, 5])), int(rng.choice([1, 2, 4, 100]))]
        want = plan(lens[rows], capacity, algorithm="ffd", costs=np.stack([vision[rows], images[rows]], 1),
                    limits=limits, names=NAMES, max_examples=max_examples, refine=refine, seed=seed)
        got = plan_first_fit(lens, capacity, costs=[vision, images], limits=limits, names=NAMES, counts=counts,
                             max_examples=max_examples, refine=refine, seed=seed)
    assert got.order.dtype == np.int32 and got.bounds.dtype == np.int32
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(np.diff(got.bounds), np.bincount(want, minlength=got.num_packs))


def test_first_fit_tree_doubles():
    """Packs far above the bound the tree is sized for (every example just over half the capacity: one per
    pack, twice the token bound): the tree doubles while planning, still plan(algorithm="ffd")'s plan."""
    from packer.packing.bulk_budgets import plan_first_fit

    lens = np.full(3000, 33, dtype=np.uint16)
    lens[::7] = 20
    want = plan(lens, 64, algorithm="ffd", refine=True, seed=1)
    got = plan_first_fit(lens, 64, refine=True, seed=1)
    assert got.num_packs > 2048  # the tree was sized for 2048 packs
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))


def test_refine_in_small_windows(monkeypatch):
    """refine collecting the candidates' members a few packs at a time (``WINDOW_MAX``): the same plans."""
    from packer.packing.bulk_budgets import plan_next_fit

    lens, vision, images = mixed(5, 3000, 256)
    kw = {"costs": [vision, images], "limits": [300, 3], "names": NAMES, "max_examples": 6, "refine": True, "seed": 2}
    wide = plan_next_fit(lens, 256, **kw), plan_budgeted(lens, 256, **kw)
    monkeypatch.setattr(bulk_budgets, "WINDOW_MAX", 5)
    narrow = plan_next_fit(lens, 256, **kw), plan_budgeted(lens, 256, **kw)
    for a, b in zip(wide, narrow, strict=True):
        assert np.array_equal(a.order, b.order) and np.array_equal(a.bounds, b.bounds)
    want = plan(lens, 256, algorithm="next-fit", costs=np.stack([vision, images], 1), limits=[300, 3], names=NAMES,
                max_examples=6, refine=True, seed=2)
    assert np.array_equal(narrow[0].order, np.argsort(want, kind="stable"))


def test_capacity_over_uint16():
    """max_length >= 65,536 with only max_examples as a budget: the pack state holds the tokens left in int32
    (uint16 overflowed: more packs than plan()'s), the same plans for best, first and next fit."""
    from packer.packing.bulk_budgets import plan_first_fit, plan_next_fit

    lens = np.random.default_rng(0).integers(1, 70000, size=600).astype(np.uint32)
    for algorithm, planner in (("bfd", plan_budgeted), ("ffd", plan_first_fit), ("next-fit", plan_next_fit)):
        want = plan(lens, 100000, algorithm=algorithm, max_examples=4, refine=True, seed=1)
        got = planner(lens, 100000, max_examples=4, refine=True, seed=1)
        assert np.array_equal(got.order, np.argsort(want, kind="stable")), algorithm


def test_first_fit_in_blocks(monkeypatch):
    """The decreasing order made in blocks smaller than one length's examples (a block ending inside a row's
    copies), with budgets and refine: still plan(algorithm="ffd")'s plan."""
    from packer.packing.bulk_budgets import plan_first_fit

    monkeypatch.setattr(bulk_budgets, "BLOCK_MIN", 37)
    lens, vision, images = mixed(7, 3000, 256)
    counts = np.random.default_rng(2).integers(0, 4, size=3000).astype(np.uint8)
    rows = np.repeat(np.arange(3000), counts)
    want = plan(lens[rows], 256, algorithm="ffd", costs=np.stack([vision[rows], images[rows]], 1), limits=[300, 3],
                names=NAMES, max_examples=6, refine=True, seed=3)
    got = plan_first_fit(lens, 256, costs=[vision, images], limits=[300, 3], names=NAMES, counts=counts,
                         max_examples=6, refine=True, seed=3)
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))


def test_next_fit_errors_as_plan_words_them():
    from packer.packing.bulk_budgets import plan_next_fit

    lens, vision = np.array([6, 6, 6], dtype=np.uint16), np.array([5, 9, 3], dtype=np.uint16)
    with pytest.raises(ConfigError, match="example 1 has 9 vision tokens > max_vision_tokens 8"):
        plan_next_fit(lens, 16, costs=[vision], limits=[8], names=NAMES[:1])
    with pytest.raises(ConfigError, match="example 0 has 17 tokens > capacity 16"):
        plan_next_fit(np.array([17], np.uint16), 16)


@pytest.mark.parametrize(("algorithm", "budgets", "weight"), [
    ("next-fit", {"max_vision_tokens": 600, "max_images": 2, "max_examples_per_pack": 9}, 1.0),
    ("next-fit", {"max_vision_tokens": 600, "max_images": 2, "max_examples_per_pack": 9}, 2.0),
    ("ffd", {"max_vision_tokens": 600, "max_images": 2, "max_examples_per_pack": 9}, 2.0),
    ("ffd", {}, 1.0),
    ("bfd", {"max_vision_tokens": 600}, 2.0),  # one budget: the planners read its planned column, no index
    ("bfd", {}, 2.5),  # tokens only (plan_bulk) with copies
])
def test_build_plans_in_bulk_with_copies(algorithm, budgets, weight):
    """``stages.plan_packs`` in bulk (plan_next_fit with ``algorithm: next-fit``, refine off and on,
    plan_first_fit with ``ffd``, plan_budgeted, plan_bulk) is the per-example path's plan (``stages._plan``, then ``separate_copies`` where a source is
    up-sampled), rows over a budget left out."""
    from packer.config import BuildConfig
    from packer.packing.mixing import separate_copies
    from packer.pipeline.stages import _plan, _used, plan_packs

    config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": ["a.jsonl"]},
                                                {"name": "b", "paths": ["b.jsonl"], "weight": weight}]},
                                   output="out", algorithm=algorithm, refine=algorithm != "next-fit" or weight == 2.0,
                                   max_length=512,
                                   seed=4, **budgets)
    lens, vision, images, columns = two_source_columns(budgets)
    got = plan_packs(columns, config)
    rows = np.arange(5000) if got.sampled is None else got.sampled.index()  # None: every row once
    costs = np.stack([vision[rows], images[rows]], 1)[:, :len(_used(config))].astype(np.int64)
    want = _plan(config, lens[rows].astype(np.int64), costs)
    if weight != 1.0:
        assert len(rows) > 5000  # copies planned
        want = separate_copies(rows.astype(np.int64), want, lens[rows].astype(np.int64), costs=costs,
                               limits=[budgets[k] for k in ("max_vision_tokens", "max_images") if k in budgets],
                               capacity=512, seed=4)
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(got.pack_sizes, np.bincount(want))


@pytest.mark.parametrize("seed", range(4))
def test_one_byte_columns_plan_as_widened_ones(seed):
    """Budget columns of two widths (uint8 counts anywhere among uint16 ones, ``_columns``) give the plans of
    the same columns all uint16: best, first and next fit, refine on, and separate_copies_bulk's swaps."""
    from packer.packing.bulk_budgets import plan_first_fit, plan_next_fit, separate_copies_bulk
    from packer.packing.mixing import Sampled

    rng = np.random.default_rng(500 + seed)
    lens, vision, images = mixed(seed, 2000, 512)
    videos = (rng.random(len(lens)) < 0.2).astype(np.uint8) * rng.integers(1, 3, size=len(lens)).astype(np.uint8)
    names = ["max_images", "max_vision_tokens", "max_videos"]
    narrow = [images, vision, videos]
    wide = [c.astype(np.uint16) for c in narrow]
    limits = [2, int(vision.max()) * 2, 3]
    counts = rng.choice([0, 1, 1, 2, 3], size=len(lens)).astype(np.uint8)
    for planner in (plan_budgeted, plan_first_fit, plan_next_fit):
        got, want = (planner(lens, 512, costs=cols, limits=limits, names=names, counts=counts, max_examples=8,
                             refine=True, seed=seed) for cols in (narrow, wide))
        assert np.array_equal(got.order, want.order) and np.array_equal(got.bounds, want.bounds)
    sampled = Sampled.of(counts)
    got, want = (separate_copies_bulk(plan_budgeted(lens, 512, costs=cols, limits=limits, names=names,
                                                    counts=counts, seed=seed),
                                      sampled, lens, capacity=512, seed=seed, costs=cols, limits=limits)
                 for cols in (narrow, wide))
    assert np.array_equal(got.order, want.order) and np.array_equal(got.bounds, want.bounds)


def test_an_item_count_stays_one_byte_across_chunks():
    """ColumnsBuilder keeps a uint8 count uint8 through a chunk without it, and widens it for a chunk whose
    counts do not fit a byte."""
    from packer.pipeline.columns import ChunkColumns, ColumnsBuilder

    def chunk(images):
        tokens = np.full(4, 300, np.uint16)
        return ChunkColumns(tokens=tokens, loss_tokens=tokens, loss_weight=None, linear=None,
                            counts={} if images is None else {"num_images": images}, over=np.zeros(0, np.int64),
                            rejects=[])

    built = ColumnsBuilder(4)
    for part in (np.array([1, 0, 2, 0], np.uint8), None, np.array([0, 3, 0, 0], np.uint8)):
        built.add(chunk(part))
    images = built.finish([""] * 3).count("num_images")
    assert images.dtype == np.uint8 and images.tolist() == [1, 0, 2, 0, 0, 0, 0, 0, 0, 3, 0, 0]
    built = ColumnsBuilder(4)
    for part in (np.array([1, 0, 2, 0], np.uint8), np.array([300, 0, 0, 0], np.uint16)):
        built.add(chunk(part))
    images = built.finish([""] * 2).count("num_images")
    assert images.dtype == np.uint16 and images.tolist() == [1, 0, 2, 0, 300, 0, 0, 0]
