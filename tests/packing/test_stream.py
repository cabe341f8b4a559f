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
        ({"vision_budget": 3}, r"'vision_budget' is set but no `vision` counts"),
        (
            {"vision": len, "vision_budget": 2},
            r"example 0 of the stream has 3 vision tokens > max_vision_tokens 2: raise 'max_vision_tokens'",
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
    with pytest.raises(ConfigError, match="3 images > max_images 2"):
        list(pack_stream([(10, 3)], capacity=100, length=lambda t: t[0], images=lambda t: t[1], max_images=2))


# (tokens, vision tokens, images, videos, audio tokens, audio clips) of an example; budgets of a pack
ALL_BUDGETS = dict(vision_budget=60, max_images=3, max_videos=2, max_audio_tokens=50, max_audios=2, max_examples=5)
COUNTS = dict(vision=lambda e: e[1], images=lambda e: e[2], videos=lambda e: e[3], audio=lambda e: e[4],
              audios=lambda e: e[5])
# text tokens, vision tokens, images, videos, audio tokens, clips -> the counts (tokens hold vision and audio)
example_counts = st.tuples(st.integers(1, 50), st.integers(0, 60), st.integers(0, 3), st.integers(0, 2),
                           st.integers(0, 50), st.integers(0, 2)).map(lambda t: (t[0] + t[1] + t[4], *t[1:]))


def _within_every_budget(pack: list[tuple]) -> None:
    assert sum(e[0] for e in pack) <= 200
    for j, budget in enumerate(("vision_budget", "max_images", "max_videos", "max_audio_tokens", "max_audios"), 1):
        assert sum(e[j] for e in pack) <= ALL_BUDGETS[budget], budget
    assert len(pack) <= ALL_BUDGETS["max_examples"]


@SETTINGS
@given(st.lists(example_counts, max_size=200), st.integers(1, 40), st.sampled_from(["bfd", "ffd", "next-fit"]),
       st.floats(0.0, 1.0), st.data())
def test_every_budget_exactly_once_and_resume(raw, pool_size, algorithm, min_fill, data):
    """With every budget set: each pack holds every budget, each example comes out once, and a stream resumed
    from any round's ``on_round`` snapshot yields the uninterrupted stream's packs from that round on."""
    examples = [(*e, i) for i, e in enumerate(raw)]  # the counts, then a unique position
    kw = dict(capacity=200, pool_size=pool_size, length=lambda e: e[0], algorithm=algorithm, min_fill=min_fill,
              seed=3, **COUNTS, **ALL_BUDGETS)
    snaps, tagged = [], []
    for pack in pack_stream(examples, on_round=lambda r, pool, age: snaps.append((r, list(pool), list(age))), **kw):
        _within_every_budget(pack)
        assert [e[-1] for e in pack] == sorted(e[-1] for e in pack)  # arrival order inside a pack
        tagged.append((len(snaps) - 1, pack))
    assert sorted(e[-1] for _, p in tagged for e in p) == list(range(len(examples)))
    if snaps:
        r, pool, age = data.draw(st.sampled_from(snaps))
        rest = examples[max(e[-1] for e in pool) + 1 :]
        assert list(pack_stream(rest, resume=(r, pool, age), **kw)) == [p for rr, p in tagged if rr >= r]


@pytest.mark.parametrize(
    ("budget", "count", "value", "match"),
    [
        ("max_videos", "videos", 3, r"example 0 of the stream has 3 videos > max_videos 2: raise 'max_videos'"),
        ("max_audio_tokens", "audio", 51,
         r"example 0 of the stream has 51 audio tokens > max_audio_tokens 50: raise 'max_audio_tokens'"),
        ("max_audios", "audios", 3, r"example 0 of the stream has 3 audio clips > max_audios 2: "
         "raise 'max_audios'"),
    ],
)
def test_new_budgets_refuse_an_example_over_them_and_need_their_count(budget, count, value, match):
    limit = {"max_videos": 2, "max_audio_tokens": 50, "max_audios": 2}[budget]
    with pytest.raises(ConfigError, match=match):
        list(pack_stream([10], capacity=100, length=int, **{count: lambda e: value, budget: limit}))
    with pytest.raises(ConfigError, match=rf"'{budget}' is set but no `{count}` counts"):
        list(pack_stream([10], capacity=100, length=int, **{budget: limit}))


def test_audio_budgets_bind():
    """Audio-heavy examples that fit on tokens alone are split by the clip and audio-token budgets, and the
    packs are what the planner makes of the same pool (one round)."""
    kw = dict(capacity=1000, pool_size=100, length=lambda i: 40, audio=lambda i: 30, audios=lambda i: 1)
    assert len(list(pack_stream(range(12), **kw))) == 1  # counts given, no budget: tokens alone
    packs = list(pack_stream(range(12), max_audio_tokens=100, max_audios=2, **kw))
    assert all(len(p) <= 2 for p in packs) and sorted(i for p in packs for i in p) == list(range(12))
    want = plan(np.full(12, 40), 1000, audio=np.full(12, 30), max_audio_tokens=100, audios=np.ones(12, np.int64),
                max_audios=2)
    assert [list(p) for p in packs] == [g.tolist() for g in groups(want)]
    packs = list(pack_stream(range(12), max_audio_tokens=60, **kw))  # two clips' tokens per pack
    assert len(packs) == 6


@SETTINGS
@given(st.lists(example_counts, max_size=120), st.integers(1, 30))
def test_a_cost_function_is_the_named_budgets(raw, pool_size):
    """``costs``/``limits`` (one row per example, as ``packing.plan`` takes them) stream the same packs as the
    named count functions and budgets; an unbounded cost is dropped."""
    examples = [(*e, i) for i, e in enumerate(raw)]
    kw = dict(capacity=200, pool_size=pool_size, length=lambda e: e[0], seed=3, max_examples=5)
    named = list(pack_stream(examples, **COUNTS, **{k: v for k, v in ALL_BUDGETS.items() if k != "max_examples"}, **kw))
    limits = [ALL_BUDGETS[k] for k in ("vision_budget", "max_images", "max_videos", "max_audio_tokens", "max_audios")]
    matrix = list(pack_stream(examples, costs=lambda e: (*e[1:6], 99), limits=[*limits, None], **kw))
    assert matrix == named
