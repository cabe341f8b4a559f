"""Tests of the planner: invariants on random and adversarial inputs, exact agreement with naive references."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import ConfigError
from packer.packing import ALGORITHMS, efficiency, groups, lower_bound, pack_totals, plan

FAST = ("bfd", "ffd", "next-fit")  # the compiled ones; `binpacking` is tested on small inputs only
SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


# -------------------------------------------------------------------------------------------------------
# Independent references (plain Python, quadratic)
# -------------------------------------------------------------------------------------------------------


def reference_bfd(lengths: list[int], capacity: int) -> list[int]:
    """Best-fit decreasing the textbook way; returns the sorted pack loads."""
    loads: list[int] = []
    for s in sorted(lengths, reverse=True):
        fits = [b for b, load in enumerate(loads) if load + s <= capacity]
        if fits:
            best = max(fits, key=lambda b: loads[b])  # fullest pack that still fits = smallest gap
            loads[best] += s
        else:
            loads.append(s)
    return sorted(loads)


def reference_ffd(lengths: list[int], capacity: int) -> list[int]:
    loads: list[int] = []
    for s in sorted(lengths, reverse=True):
        for b, load in enumerate(loads):
            if load + s <= capacity:
                loads[b] += s
                break
        else:
            loads.append(s)
    return sorted(loads)


def reference_next_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    packs: list[list[int]] = []
    load = capacity + 1
    for i, s in enumerate(lengths):
        if load + s > capacity:
            packs.append([])
            load = 0
        packs[-1].append(i)
        load += s
    return packs


def check_plan(ids: np.ndarray, lengths: np.ndarray, capacity: int) -> int:
    """The invariants every plan must meet; returns the pack count."""
    assert ids.dtype == np.int64 and ids.shape == lengths.shape
    if lengths.size == 0:
        return 0
    num_packs = int(ids.max()) + 1
    assert ids.min() == 0 and np.array_equal(np.unique(ids), np.arange(num_packs))  # contiguous 0..P-1
    assert pack_totals(lengths, ids).max() <= capacity
    assert num_packs >= lower_bound(lengths, capacity)
    return num_packs


# -------------------------------------------------------------------------------------------------------
# Invariants on random inputs
# -------------------------------------------------------------------------------------------------------


@st.composite
def instances(draw, max_n: int = 200):
    capacity = draw(st.integers(1, 300))
    n = draw(st.integers(0, max_n))
    lengths = draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n))
    return np.array(lengths, dtype=np.int64), capacity


@SETTINGS
@given(instances(), st.sampled_from(FAST), st.booleans(), st.integers(0, 3))
def test_invariants(case, algorithm, refine, seed):
    lengths, capacity = case
    ids = plan(lengths, capacity, algorithm=algorithm, refine=refine, seed=seed)
    check_plan(ids, lengths, capacity)
    assert np.array_equal(ids, plan(lengths, capacity, algorithm=algorithm, refine=refine, seed=seed))


@SETTINGS
@given(instances())
def test_bfd_matches_reference(case):
    lengths, capacity = case
    ids = plan(lengths, capacity)
    # Packs with equal gaps are interchangeable, so BFD's loads do not depend on tie-breaking: compare all.
    assert sorted(pack_totals(lengths, ids).tolist()) == reference_bfd(lengths.tolist(), capacity)


@SETTINGS
@given(instances())
def test_ffd_matches_reference(case):
    lengths, capacity = case
    ids = plan(lengths, capacity, algorithm="ffd")
    assert sorted(pack_totals(lengths, ids).tolist()) == reference_ffd(lengths.tolist(), capacity)


@SETTINGS
@given(instances())
def test_next_fit_keeps_order(case):
    lengths, capacity = case
    got = sorted(g.tolist() for g in groups(plan(lengths, capacity, algorithm="next-fit")))
    assert got == reference_next_fit(lengths.tolist(), capacity)


@SETTINGS
@given(instances(), st.integers(1, 6))
def test_loose_budget_is_plain_bfd(case, dummy):
    """A budget that never binds takes the constrained code path but must give BFD's exact loads."""
    lengths, capacity = case
    ids = plan(lengths, capacity, max_examples=max(1, lengths.size), vision=np.zeros_like(lengths),
               vision_budget=dummy)  # fmt: skip
    assert sorted(pack_totals(lengths, ids).tolist()) == reference_bfd(lengths.tolist(), capacity)


@st.composite
def multimodal(draw):
    lengths, capacity = draw(instances(max_n=150))
    n = lengths.size
    vision = np.array([draw(st.integers(0, int(x))) for x in lengths], dtype=np.int64)
    images = np.array([draw(st.integers(0, 3)) if v else 0 for v in vision], dtype=np.int64)
    vision_budget = int(vision.max(initial=0)) + draw(st.integers(1, capacity))
    max_images = int(images.max(initial=0)) + draw(st.integers(0, 2)) or 1
    max_examples = draw(st.integers(1, 8))
    return lengths, capacity, vision, images, vision_budget, max_images, max_examples, n


@SETTINGS
@given(multimodal(), st.sampled_from(FAST), st.booleans(), st.booleans())
def test_cost_matrix_is_the_named_budgets(case, algorithm, balance, refine):
    """``costs``/``limits`` and the named keywords are one plan: the same columns in the same order give the same
    ids; an unbounded column is only balanced."""
    lengths, capacity, vision, images, vision_budget, max_images, max_examples, _ = case
    named = plan(lengths, capacity, algorithm=algorithm, vision=vision, vision_budget=vision_budget,
                 images=images, max_images=max_images, max_examples=max_examples, balance_vision=balance,
                 refine=refine)  # fmt: skip
    costs = np.stack([vision, images], axis=1).reshape(-1, 2)
    matrix = plan(lengths, capacity, algorithm=algorithm, costs=costs, limits=[vision_budget, max_images],
                  names=["max_vision_tokens", "max_images"], max_examples=max_examples,
                  balance=0 if balance else None, refine=refine)  # fmt: skip
    np.testing.assert_array_equal(matrix, named)
    np.testing.assert_array_equal(plan(lengths, capacity, costs=costs[:, :1], limits=[None], balance=0),
                                  plan(lengths, capacity, vision=vision, balance_vision=True))


def test_cost_matrix_errors():
    with pytest.raises(ConfigError, match=r"'costs' must be an \(n, k\) = \(2, 1\) array"):
        plan(np.array([3, 2]), 8, costs=np.ones((2, 2), np.int64), limits=[1])
    with pytest.raises(ConfigError, match="not both"):
        plan(np.array([3, 2]), 8, costs=np.ones((2, 1), np.int64), limits=[1], vision=[1, 1])
    with pytest.raises(ConfigError, match=r"'balance' must be a column of costs"):
        plan(np.array([3, 2]), 8, costs=np.ones((2, 1), np.int64), limits=[1], balance=1)


@SETTINGS
@given(multimodal(), st.sampled_from(FAST), st.booleans(), st.booleans())
def test_budgets_hold(case, algorithm, balance, refine):
    lengths, capacity, vision, images, vision_budget, max_images, max_examples, n = case
    ids = plan(lengths, capacity, algorithm=algorithm, vision=vision, vision_budget=vision_budget,
               images=images, max_images=max_images, max_examples=max_examples, balance_vision=balance,
               refine=refine)  # fmt: skip
    if n == 0:
        assert ids.size == 0
        return
    num_packs = check_plan(ids, lengths, capacity)
    assert pack_totals(vision, ids).max() <= vision_budget
    assert pack_totals(images, ids).max() <= max_images
    assert np.bincount(ids).max() <= max_examples
    assert num_packs >= -(-n // max_examples)


@SETTINGS
@given(multimodal(), st.sampled_from(FAST), st.integers(1, 3), st.booleans())
def test_video_budget_holds(case, algorithm, max_videos, balance):
    """``max_videos`` is one more budget column: never exceeded, beside the vision and image budgets."""
    lengths, capacity, vision, images, vision_budget, max_images, _, n = case
    videos = np.minimum(images, max_videos)  # some examples at the budget, some without video
    ids = plan(lengths, capacity, algorithm=algorithm, vision=vision, vision_budget=vision_budget,
               images=images, max_images=max_images, videos=videos, max_videos=max_videos, balance_vision=balance)
    if n:
        check_plan(ids, lengths, capacity)
        assert pack_totals(videos, ids).max() <= max_videos
        assert pack_totals(images, ids).max() <= max_images


@SETTINGS
@given(multimodal(), st.sampled_from(FAST), st.integers(1, 3), st.booleans(), st.booleans())
def test_audio_budgets_hold(case, algorithm, max_audios, balance, refine):
    """``max_audio_tokens`` and ``max_audios`` are two more budget columns: never exceeded, beside the vision,
    image and video budgets (audio tokens are part of the example's tokens, apart from its vision tokens)."""
    lengths, capacity, vision, images, vision_budget, max_images, _, n = case
    audio = (lengths - vision) // 2  # up to half of the text-side tokens are audio
    audios = np.minimum((audio > 0) + images % 2, max_audios)
    budget = max(int(audio.max()) if n else 1, 1) + 3
    ids = plan(lengths, capacity, algorithm=algorithm, vision=vision, vision_budget=vision_budget,
               images=images, max_images=max_images, audio=audio, max_audio_tokens=budget, audios=audios,
               max_audios=max_audios, balance_vision=balance, refine=refine)
    if n:
        check_plan(ids, lengths, capacity)
        assert pack_totals(audio, ids).max() <= budget
        assert pack_totals(audios, ids).max() <= max_audios
        assert pack_totals(vision, ids).max() <= vision_budget and pack_totals(images, ids).max() <= max_images


def test_audio_budget_binds():
    """Four examples of 10 tokens, 6 of them audio, fit two packs of 20; a budget of 6 audio tokens needs four."""
    lengths, audio = np.full(4, 10), np.full(4, 6)
    assert check_plan(plan(lengths, 20), lengths, 20) == 2
    ids = plan(lengths, 20, audio=audio, max_audio_tokens=6)
    assert check_plan(ids, lengths, 20) == 4 and pack_totals(audio, ids).max() == 6
    ids = plan(lengths, 40, audios=np.ones(4, dtype=np.int64), max_audios=3)
    assert check_plan(ids, lengths, 40) == 2 and np.bincount(ids).max() == 3


@SETTINGS
@given(multimodal())
def test_balance_never_costs_more_than_tolerance(case):
    lengths, capacity, vision, *_ = case
    if lengths.size == 0:
        return
    base = int(plan(lengths, capacity).max()) + 1
    balanced = plan(lengths, capacity, vision=vision, balance_vision=True)
    assert check_plan(balanced, lengths, capacity) <= base + int(base * 0.001)


# -------------------------------------------------------------------------------------------------------
# Adversarial inputs
# -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("lengths", "capacity", "packs"),
    [
        ([], 8, 0),
        ([8] * 5, 8, 5),  # all at capacity
        ([1] * 17, 8, 3),  # all length 1
        ([1] * 7, 1, 7),  # capacity 1
        ([3] * 9, 8, 5),  # all equal, 2 per pack
        ([7, 1, 7, 1, 7, 1], 8, 3),  # L-1 + 1
        ([7, 8, 7, 8], 8, 4),  # L-1 and L
        ([4, 4, 4, 4, 4], 8, 3),
    ],
)
def test_adversarial(algorithm, lengths, capacity, packs):
    lengths = np.array(lengths, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the binpacking library's slowness warning
        ids = plan(lengths, capacity, algorithm=algorithm)
    assert check_plan(ids, lengths, capacity) == packs


def test_golden_plan():
    """One exact plan, the docstring example: 6+4 and 5+3+2; pack numbers are the seed-0 shuffle."""
    assert plan(np.array([6, 5, 4, 3, 2]), 10, seed=0).tolist() == [0, 1, 0, 1, 1]
    assert plan(np.array([6, 5, 4, 3, 2]), 10, seed=3).tolist() == [1, 0, 1, 0, 0]


def test_seed_changes_order_only():
    lengths = np.random.default_rng(0).integers(1, 100, 2000)
    a, b = plan(lengths, 100, seed=0), plan(lengths, 100, seed=1)
    assert not np.array_equal(a, b)
    assert sorted(map(tuple, groups(a))) == sorted(map(tuple, groups(b)))  # same packs, other numbering
    assert np.array_equal(a, plan(lengths, 100, seed=0))


def test_accepts_other_integer_dtypes():
    lengths = np.array([5, 3, 2], dtype=np.uint16)
    assert plan(lengths, 5).tolist() == plan(lengths.astype(np.int64), 5).tolist()
    assert plan([5, 3, 2], 5).dtype == np.int64


def test_binpacking_library_warns_and_is_valid():
    lengths = np.random.default_rng(1).integers(1, 50, 300)
    with pytest.warns(UserWarning, match="quadratic"):
        ids = plan(lengths, 50, algorithm="binpacking")
    check_plan(ids, lengths, 50)


def test_refine_empties_a_pack():
    """Next-fit leaves [6] [6, 4] [4]; refine moves the last 4 into the first pack's gap."""
    lengths = np.array([6, 6, 4, 4])
    assert sorted(pack_totals(lengths, plan(lengths, 10, algorithm="next-fit")).tolist()) == [4, 6, 10]
    refined = plan(lengths, 10, algorithm="next-fit", refine=True)
    assert sorted(g.tolist() for g in groups(refined)) == [[0, 3], [1, 2]]


def test_refine_exact_completion():
    """BFD: 18+5 | 17+4+3 | 3 (gaps 2 and 1 strand the last 3). Completion closes 18 with the pair 4+3
    instead of 5 (which would leave 2 < the completion threshold), then 17+5+3: two full packs."""
    lengths = np.array([18, 17, 5, 4, 3, 3])
    assert int(plan(lengths, 25).max()) + 1 == 3
    refined = plan(lengths, 25, refine=True)
    assert sorted(g.tolist() for g in groups(refined)) == [[0, 3, 4], [1, 2, 5]]


def test_refine_pays_after_next_fit():
    lengths = np.random.default_rng(3).integers(1, 60, 3000)
    base = plan(lengths, 64, algorithm="next-fit")
    refined = plan(lengths, 64, algorithm="next-fit", refine=True)
    check_plan(refined, lengths, 64)
    assert refined.max() < base.max()


def test_balance_vision_spreads_load():
    rng = np.random.default_rng(0)
    text = rng.integers(1, 400, 4000)
    vision = np.where(rng.random(4000) < 0.5, rng.integers(64, 1024, 4000), 0)
    lengths = text + vision
    plain = plan(lengths, 4096, vision=vision)
    balanced = plan(lengths, 4096, vision=vision, balance_vision=True)
    assert balanced.max() <= plain.max() + int((plain.max() + 1) * 0.001)
    assert pack_totals(vision, balanced).std() < 0.6 * pack_totals(vision, plain).std()


def test_balance_without_vision_is_a_noop():
    lengths = np.arange(1, 50)
    assert np.array_equal(plan(lengths, 60, balance_vision=True), plan(lengths, 60))
    assert np.array_equal(plan(lengths, 60, vision=np.zeros(49, int), balance_vision=True), plan(lengths, 60))


# -------------------------------------------------------------------------------------------------------
# Helpers and errors
# -------------------------------------------------------------------------------------------------------


def test_groups_and_totals():
    ids = np.array([1, 0, 1, 2, 0])
    assert [g.tolist() for g in groups(ids)] == [[1, 4], [0, 2], [3]]
    assert groups(np.zeros(0, dtype=np.int64)) == []
    assert pack_totals([1, 2, 3, 4, 5], ids).tolist() == [7, 4, 4]
    assert lower_bound([5, 5, 1], 10) == 2 and lower_bound([], 10) == 0
    assert efficiency([5, 5], np.array([0, 0]), 10) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lengths": [3, 9]}, r"example 1 has 9 tokens > capacity 8; raise 'max_length'"),
        ({"lengths": [3, 0]}, r"example 1 has 0 tokens; every example needs at least 1"),
        ({"lengths": [-1]}, r"example 0 has -1 tokens"),
        ({"algorithm": "worst-fit"}, r"'algorithm' must be one of bfd, ffd, next-fit, binpacking"),
        ({"capacity": 0}, r"'capacity \(max_length\)' must be a positive integer"),
        ({"lengths": [1.5]}, r"'lengths' must hold integers"),
        ({"lengths": [[1]]}, r"'lengths' must be a 1-D array"),
        ({"vision": [1, 1, 1]}, r"'vision' has 3 entries but there are 2 examples"),
        (
            {"lengths": [3, 6], "vision": [1, 5], "vision_budget": 4},
            r"example 1 has 5 vision tokens > max_vision_tokens 4; raise 'max_vision_tokens'",
        ),
        ({"vision": [4, 1]}, r"example 0 has 4 vision tokens but only 3 tokens in all"),
        ({"vision_budget": 4}, r"'vision_budget' is set but no `vision` counts"),
        ({"images": [0, 3], "max_images": 2}, r"example 1 has 3 images > max_images 2; raise 'max_images'"),
        ({"max_images": 2}, r"'max_images' is set but no `images` counts"),
        ({"videos": [0, 3], "max_videos": 2}, r"example 1 has 3 videos > max_videos 2; raise 'max_videos'"),
        ({"max_videos": 2}, r"'max_videos' is set but no `videos` counts"),
        ({"lengths": [3, 4], "audio": [0, 3], "max_audio_tokens": 2},
         r"example 1 has 3 audio tokens > max_audio_tokens 2; raise 'max_audio_tokens'"),
        ({"audio": [4, 1]}, r"example 0 has 4 audio tokens but only 3 tokens in all"),
        ({"max_audio_tokens": 2}, r"'max_audio_tokens' is set but no `audio` counts"),
        ({"audios": [0, 3], "max_audios": 2}, r"example 1 has 3 audio clips > max_audios 2; raise 'max_audios'"),
        ({"max_audios": 0}, r"'max_audios' must be a positive integer"),
        ({"max_examples": 0}, r"'max_examples_per_pack' must be a positive integer"),
        ({"lengths": [], "max_images": -1}, r"'max_images' must be a positive integer"),
        ({"algorithm": "binpacking", "max_examples": 2}, r"'binpacking' only knows the token budget"),
    ],
)
def test_errors_name_the_knob(kwargs, match):
    args = {"lengths": [3, 2], "capacity": 8, **kwargs}
    with pytest.raises(ConfigError, match=match):
        plan(np.array(args.pop("lengths")), args.pop("capacity"), **args)
