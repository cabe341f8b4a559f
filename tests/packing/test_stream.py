"""Tests of on-the-fly packing: exactly-once, capacity, bounded pool, agreement with the offline plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import ConfigError
from packer.packing import groups, plan
from packer.packing.stream import pack_stream

SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


class Counting:
    """An iterator over 0..n-1 that records how many items were read."""

    def __init__(self, n: int):
        self.n = n
        self.read = 0

    def __iter__(self):
        for i in range(self.n):
            self.read += 1
            yield i


@SETTINGS
@given(
    st.integers(1, 200),
    st.lists(st.integers(1, 200), max_size=400),
    st.integers(1, 64),
    st.sampled_from(["bfd", "ffd", "next-fit"]),
    st.floats(0.0, 1.0),
)
def test_exactly_once_and_within_capacity(capacity, raw, pool_size, algorithm, min_fill):
    lengths = [min(x, capacity) for x in raw]
    source = Counting(len(lengths))
    emitted: list[int] = []
    for pack in pack_stream(source, capacity=capacity, pool_size=pool_size, length=lengths.__getitem__,
                            algorithm=algorithm, min_fill=min_fill):  # fmt: skip
        assert pack and sum(lengths[i] for i in pack) <= capacity
        assert pack == sorted(pack)  # arrival order inside a pack
        emitted += pack
        assert source.read - len(emitted) <= pool_size  # never more than a pool in hand
    assert sorted(emitted) == list(range(len(lengths)))


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 50)), max_size=300), st.integers(1, 40))
def test_budgets(pairs, pool_size):
    examples = [{"n": n, "v": min(v, n)} for n, v in pairs]
    packs = list(pack_stream(examples, capacity=64, pool_size=pool_size, length=lambda e: e["n"],
                             vision=lambda e: e["v"], vision_budget=50, max_examples=4))  # fmt: skip
    assert sum(len(p) for p in packs) == len(examples)
    for pack in packs:
        assert sum(e["n"] for e in pack) <= 64
        assert sum(e["v"] for e in pack) <= 50
        assert len(pack) <= 4


def test_pool_holding_everything_is_the_offline_plan():
    lengths = np.random.default_rng(0).integers(1, 100, 500)
    packs = list(pack_stream(range(500), capacity=100, pool_size=10_000, length=lengths.__getitem__, seed=7))
    assert [list(p) for p in packs] == [g.tolist() for g in groups(plan(lengths, 100, seed=7))]


def test_deterministic():
    lengths = np.random.default_rng(1).integers(1, 100, 3000).tolist()

    def run(seed: int) -> list[list[int]]:
        return list(
            pack_stream(range(3000), capacity=128, pool_size=200, length=lengths.__getitem__, seed=seed)
        )

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_leftovers_fill_better_than_emitting_everything():
    lengths = np.clip(np.rint(np.random.default_rng(0).lognormal(np.log(300), 1.0, 20_000)), 1, 8192)
    lengths = lengths.astype(np.int64).tolist()

    def packs(min_fill: float) -> int:
        return sum(1 for _ in pack_stream(range(len(lengths)), capacity=8192, pool_size=500,
                                          length=lengths.__getitem__, min_fill=min_fill))  # fmt: skip

    offline = int(plan(np.array(lengths), 8192).max()) + 1
    assert offline <= packs(0.99) < packs(0.0)  # min_fill 0 = no leftovers, every round flushed


def test_no_example_waits_forever():
    """With min_fill 1 every partial pack wants to wait; max_wait still bounds the delay in rounds."""
    lengths = np.random.default_rng(2).integers(1, 90, 2000).tolist()
    source = Counting(2000)
    delay = {}
    for pack in pack_stream(source, capacity=100, pool_size=50, length=lengths.__getitem__, min_fill=1.0,
                            max_wait=2):  # fmt: skip
        for i in pack:
            delay[i] = source.read - i
    assert len(delay) == 2000
    # read at most one pool per round, held at most max_wait rounds after the round that first saw it
    assert max(d for i, d in delay.items() if i < 1900) <= (2 + 2) * 50


def test_default_length_and_empty_input():
    assert list(pack_stream([], capacity=4)) == []
    assert list(pack_stream(["ab", "c", "abcd"], capacity=4, pool_size=10)) == [["abcd"], ["ab", "c"]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"examples": ["abc", "abcdefghi"]}, r"example 1 of the stream has 9 tokens; .*raise 'max_length'"),
        ({"examples": ["abc", ""]}, r"example 1 of the stream has 0 tokens"),
        ({"pool_size": 0}, r"'pool_size' must be a positive integer"),
        ({"vision_budget": 3}, r"'vision_budget' is set but no `vision` function"),
        (
            {"vision": len, "vision_budget": 2},
            r"example 0 of the stream has 3 vision tokens > vision budget 2",
        ),
        ({"min_fill": 1.5}, r"'min_fill' must be in \[0, 1\]"),
    ],
)
def test_errors(kwargs, match):
    args = {"examples": ["abc"], "capacity": 8, **kwargs}
    with pytest.raises(ConfigError, match=match):
        list(pack_stream(args.pop("examples"), **args))


@pytest.mark.slow
@pytest.mark.parametrize("pool_size", [1, 7, 32])
def test_resume_from_any_round_gives_the_same_packs(pool_size):
    """``on_round`` sees (r, pool, ages); a stream resumed from it (the examples after the pool's) yields
    exactly the packs the uninterrupted stream yields from round r on."""
    rng = np.random.default_rng(pool_size)
    lengths = rng.integers(1, 100, size=120).tolist()
    items = list(enumerate(lengths))  # (position, length)
    kw = dict(capacity=100, pool_size=pool_size, length=lambda t: t[1], seed=5)
    snaps, tagged = [], []
    for pack in pack_stream(items, on_round=lambda r, pool, age: snaps.append((r, list(pool), list(age))), **kw):
        tagged.append((len(snaps) - 1, pack))  # round the pack came from
    assert [r for r, _, _ in snaps] == list(range(len(snaps)))
    for r, pool, age in snaps:
        rest = items[max(p for p, _ in pool) + 1 :]
        resumed = list(pack_stream(rest, resume=(r, pool, age), **kw))
        assert resumed == [pack for rr, pack in tagged if rr >= r]


def test_image_budget_per_pack():
    items = [(10, k % 3) for k in range(50)]  # (tokens, images)
    packs = list(pack_stream(items, capacity=100, pool_size=16, length=lambda t: t[0], images=lambda t: t[1],
                             max_images=2))
    assert sorted(x for p in packs for x in p) == sorted(items)
    assert max(sum(k for _, k in p) for p in packs) <= 2
    with pytest.raises(ConfigError, match="image budget"):
        list(pack_stream([(10, 3)], capacity=100, length=lambda t: t[0], images=lambda t: t[1], max_images=2))
