"""Tests of the bulk planner: the same plan as ``plan(..., algorithm="bfd")``, pack for pack, and the layout
a shard writer reads (every example once, packs contiguous, none over capacity)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import ConfigError
from packer.packing import bulk
from packer.packing.bulk import PackOrder, ShuffledPrefix, plan_bulk, write_order
from packer.packing.planner import plan

SETTINGS = settings(
    max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def reference_bfd_loads(lengths: list[int], capacity: int) -> list[int]:
    """Best-fit decreasing the textbook way, one example at a time; the sorted pack loads."""
    loads: list[int] = []
    for s in sorted(lengths, reverse=True):
        fits = [b for b, load in enumerate(loads) if load + s <= capacity]
        if fits:
            loads[max(fits, key=lambda b: loads[b])] += s  # the fullest pack that fits = the smallest gap
        else:
            loads.append(s)
    return sorted(loads)


def one_at_a_time(lengths: np.ndarray, capacity: int, seed: int) -> np.ndarray:
    """plan()'s tokens-only kernel, one example at a time, numbered as plan() numbers packs. Called directly,
    so the comparison stays independent once plan() itself routes that path to plan_bulk."""
    from packer.packing.kernels import bfd_fast
    assign, num_packs = bfd_fast(np.ascontiguousarray(lengths, dtype=np.int64), capacity, 0)
    return np.random.default_rng(seed).permutation(num_packs)[assign]


def check_layout(p: PackOrder, lengths: np.ndarray, capacity: int) -> None:
    """What a shard writer relies on."""
    n = lengths.shape[0]
    assert p.order.dtype == np.int32 and p.bounds.dtype == np.int32
    assert p.order.shape == (n,)
    assert np.array_equal(np.sort(p.order), np.arange(n))  # every example exactly once
    assert p.bounds[0] == 0 and p.bounds[-1] == n
    sizes = p.sizes()
    assert (sizes >= 1).all()  # no empty pack
    for k in range(p.num_packs):
        members = p.pack(k)
        assert (np.diff(members) > 0).all()  # increasing example index inside a pack
        assert lengths[members].sum() <= capacity


@st.composite
def instances(draw, max_n: int = 200):
    capacity = draw(st.integers(1, 300))
    n = draw(st.integers(0, max_n))
    # Few distinct lengths half of the time: many examples per class is the case the bulk moves are for.
    pool = draw(st.lists(st.integers(1, capacity), min_size=1, max_size=4)) if draw(st.booleans()) else None
    item = st.sampled_from(pool) if pool else st.integers(1, capacity)
    return np.array(draw(st.lists(item, min_size=n, max_size=n)), dtype=np.int64), capacity


@pytest.mark.slow
@SETTINGS
@given(instances(), st.integers(0, 3))
def test_same_plan_as_bfd(case, seed):
    """Element for element: same packs, same numbering, same seeded write order as plan()."""
    lengths, capacity = case
    p = plan_bulk(lengths, capacity, seed=seed)
    assert np.array_equal(p.pack_ids(), one_at_a_time(lengths, capacity, seed))
    assert np.array_equal(p.pack_ids(), plan(lengths, capacity, algorithm="bfd", seed=seed))
    check_layout(p, lengths, capacity)


@SETTINGS
@given(instances())
def test_loads_match_reference(case):
    lengths, capacity = case
    p = plan_bulk(lengths, capacity)
    loads = [int(lengths[p.pack(k)].sum()) for k in range(p.num_packs)]
    assert sorted(loads) == reference_bfd_loads(lengths.tolist(), capacity)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint32, np.int64])
def test_dtypes_give_one_plan(dtype):
    lengths = np.random.default_rng(0).integers(1, 1001, 5000)
    want = plan_bulk(lengths, 1000)
    got = plan_bulk(lengths.astype(dtype), 1000)
    assert np.array_equal(got.order, want.order) and np.array_equal(got.bounds, want.bounds)


def test_lognormal_same_as_bfd():
    """The benchmark's workload (scripts/bench_packing.py), 200k lengths at 8192, as uint16."""
    raw = np.random.default_rng(0).lognormal(np.log(300), 1.0, 200_000)
    lengths = np.clip(np.rint(raw), 1, 8192).astype(np.uint16)
    p = plan_bulk(lengths, 8192, seed=5)
    assert np.array_equal(p.pack_ids(), one_at_a_time(lengths, 8192, 5))
    assert p.num_packs == 12_053  # LB + 0


def test_visit_records_grow():
    """600s open a pack each, then every 400 is its own visit: n / 2 visits, more than the first guess of
    n // 16 + capacity records, so the record arrays grow mid-loop."""
    lengths = np.tile([600, 400], 10_000)
    p = plan_bulk(lengths, 1000)
    assert p.num_packs == 10_000 and (p.sizes() == 2).all()
    assert np.array_equal(p.pack_ids(), one_at_a_time(lengths, 1000, 0))


@pytest.mark.parametrize(
    ("lengths", "capacity", "packs"),
    [
        ([8] * 5, 8, 5),  # all at capacity
        ([1] * 17, 8, 3),  # all length 1: 8 + 8 + 1
        ([1] * 7, 1, 7),  # capacity 1
        ([3] * 9, 8, 5),  # all equal, 2 per pack, the last alone
        ([7, 1, 7, 1, 7, 1], 8, 3),  # capacity - 1, then 1s into the gaps
        ([7, 8, 7, 8], 8, 4),  # capacity - 1 and capacity
        ([4, 4, 4, 4, 4], 8, 3),
        ([70_000, 1, 69_999, 35_000, 35_000], 70_000, 3),  # capacity >= 2**16: int32 visit counts
    ],
)
def test_edges(lengths, capacity, packs):
    lengths = np.array(lengths, dtype=np.int64)
    p = plan_bulk(lengths, capacity)
    assert p.num_packs == packs
    check_layout(p, lengths, capacity)
    assert np.array_equal(p.pack_ids(), one_at_a_time(lengths, capacity, 0))


def test_empty():
    p = plan_bulk(np.zeros(0, dtype=np.uint16), 8)
    assert p.num_packs == 0 and p.order.shape == (0,) and p.bounds.tolist() == [0]
    assert p.pack_ids().shape == (0,)


def test_golden():
    """The module docstring's example: 6+4 and 5+3+2; seed 0 numbers them as plan() does."""
    p = plan_bulk(np.array([6, 5, 4, 3, 2], dtype=np.uint16), 10)
    assert p.order.tolist() == [0, 2, 1, 3, 4]
    assert p.bounds.tolist() == [0, 2, 5]
    assert p.pack_ids().tolist() == [0, 1, 0, 1, 1]


@pytest.mark.parametrize(
    ("lengths", "capacity", "match"),
    [
        (
            [3, 9, 2],
            8,
            r"example 1 has 9 tokens > capacity 8; raise 'max_length' or drop/truncate the example",
        ),
        ([3, 0, 2], 8, r"example 1 has 0 tokens; every example needs at least 1"),
        ([3, -4, 2], 8, r"example 1 has -4 tokens; every example needs at least 1"),
        ([3, 4], 0, r"'capacity \(max_length\)' must be a positive integer, got 0"),
        ([3, 4], True, r"'capacity \(max_length\)' must be a positive integer, got True"),
        ([3.0, 4.0], 8, r"'lengths' must hold integers, got dtype float64"),
        ([[3, 4]], 8, r"'lengths' must be a 1-D array, got shape \(1, 2\)"),
    ],
)
def test_errors(lengths, capacity, match):
    with pytest.raises(ConfigError, match=match):
        plan_bulk(np.array(lengths), capacity)
    with pytest.raises(ConfigError, match=match):  # word for word what plan() says
        plan(np.array(lengths), capacity)


@pytest.mark.parametrize("num_packs", [0, 1, 2, 3, 64, 1000, 100_003])
@pytest.mark.parametrize("seed", [0, 7])
def test_write_order_is_numpys_permutation(num_packs, seed, monkeypatch):
    """The replayed Fisher-Yates gives plan()'s permutation; so does the fallback (numpy's own shuffle)."""
    want = np.random.default_rng(seed).permutation(num_packs)
    assert np.array_equal(write_order(num_packs, seed), want)
    monkeypatch.setattr(bulk, "_REPLAY_OK", [False])
    assert np.array_equal(write_order(num_packs, seed), want)


def _per_example_refine(lens: np.ndarray, capacity: int, seed: int) -> np.ndarray:
    """plan(refine=True)'s tokens-only path spelled out: two bfd_fast runs, the better one refined by
    refine_packs, the survivors shuffled (per-example int64 arrays)."""
    from packer.packing import kernels
    from packer.packing.balance import refine_packs
    from packer.packing.planner import _UNBOUNDED, _completion_threshold

    assign, packs = kernels.bfd_fast(lens, capacity, 0)
    other, other_packs = kernels.bfd_fast(lens, capacity, _completion_threshold(lens))
    if other_packs < packs:
        assign, packs = other, other_packs
    needs = np.ones((lens.shape[0], 1), dtype=np.int64)
    assign, packs = refine_packs(assign, packs, lens, needs, capacity, np.array([_UNBOUNDED], dtype=np.int64))
    return np.random.default_rng(seed).permutation(packs).astype(np.int64)[assign]


@pytest.mark.parametrize("seed", range(30))
def test_refine_in_bulk_is_plans_refine(seed):
    """plan_bulk(refine=True) makes plan(refine=True)'s plan (exact completion, then emptied packs), pack ids
    and the writers' order included, on lengths where refine saves packs and where it does not."""
    rng = np.random.default_rng(seed)
    capacity = int(rng.choice([16, 64, 512, 4096]))
    n = int(rng.integers(1, 20000))
    kind = seed % 3
    if kind == 0:  # tiny records: plain BFD often one pack above the bound
        lens = rng.integers(3, 43, size=n)
    elif kind == 1:
        lens = rng.lognormal(np.log(capacity / 6), 0.8, size=n).astype(int)
    else:
        lens = rng.integers(1, capacity // 3 + 2, size=n)
    lens = np.clip(lens, 1, capacity).astype(np.uint16)
    want = _per_example_refine(lens.astype(np.int64), capacity, seed)
    got = plan_bulk(lens, capacity, seed=seed, refine=True)
    assert np.array_equal(got.order, np.argsort(want, kind="stable"))
    assert np.array_equal(np.diff(got.bounds), np.bincount(want))


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 70_001, 1 << 20])
@pytest.mark.parametrize("seed", [0, [7, 2]])
def test_a_shuffled_prefix_is_the_permutations_blocks(n, seed):
    """Blocks of ``write_order`` replayed backwards (the swaps' draws regenerated from saved states, 1 << 20
    spanning several of them) are its slices: from the start, inside, at the end, all of it."""
    want = write_order(n, seed)
    shuffled = ShuffledPrefix(n, seed)
    size = shuffled.block_size
    for c0 in range(0, n, max(1, n // 5)):  # blocks from across the permutation, every one of block_size
        c1 = min(n, c0 + size)
        assert np.array_equal(shuffled.block(c0, c1), want[c0:c1])
    for c0, c1 in ((0, n), (n - 1, n), (n // 2, n // 2 + 1)):
        assert np.array_equal(shuffled.block(c0, c1), want[c0:c1])
    assert not shuffled.bitmap.any()  # each block clears what it traced
