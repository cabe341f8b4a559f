"""``stages.ShardRanges``: each shard's range made when it is read (as its write task is sent) holds what the
eager ranges held: the packs' cache rows and copy numbers of ``np.repeat``'d rows, shard by shard."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.pipeline.columns import ChunkColumns, ColumnsBuilder
from packer.pipeline.stages import Exchange, ShardRanges, plan_packs, planned_examples, shard_ranges


def _plan(weight: float):
    config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": ["a.jsonl"]},
                                                {"name": "b", "paths": ["b.jsonl"], "weight": weight}]},
                                   output="out", profile="text", max_length=64, rows_per_shard=7)
    rng = np.random.default_rng(3)
    built = ColumnsBuilder(600)
    for _ in range(6):  # six chunks of 100 rows, sources a b a b a b
        tokens = rng.integers(3, 43, size=100).astype(np.uint16)
        built.add(ChunkColumns(tokens=tokens, loss_tokens=tokens - 2, counts={}, loss_weight=None, linear=None,
                               over=np.zeros(0, np.int64), rejects=[]))
    return plan_packs(built.finish(["a", "b"] * 3), config), config


@pytest.mark.parametrize("weight", [1.0, 2.5])
def test_each_range_holds_the_rows_and_copies_of_its_packs(weight):
    plan, config = _plan(weight)
    ranges = shard_ranges(plan, rows_per_shard=config.rows_per_shard)
    packs = len(plan.bounds) - 1
    assert isinstance(ranges, ShardRanges) and len(ranges) == -(-packs // 7) > 3
    if weight == 1.0:
        assert plan.sampled is None
        index, copy = np.arange(plan.num_examples), np.zeros(plan.num_examples, np.int64)
    else:  # sampled: planned example i is the i-th of np.repeat(rows, counts), copy k of its row the k-th
        counts = plan.sampled.counts.astype(np.int64)
        assert counts.max() > 1
        index = np.repeat(np.arange(len(counts)), counts)
        copy = np.arange(len(index)) - np.repeat(np.cumsum(counts) - counts, counts)
    assert planned_examples(ranges) == plan.num_examples == sum(len(r.examples) for r in ranges)
    assert sum(ranges.num_packs(s) for s in range(len(ranges))) == packs
    for s, r in enumerate(ranges):
        p0, p1 = 7 * s, min(packs, 7 * s + 7)
        planned = plan.order[plan.bounds[p0] : plan.bounds[p1]]
        assert r.first == s and r.exchange is None and not r.remember
        np.testing.assert_array_equal(r.pack_sizes, np.diff(plan.bounds[p0 : p1 + 1].astype(np.int64)))
        np.testing.assert_array_equal(r.examples, index[planned])
        if r.copies is None:
            assert not copy[planned].any()
        else:
            np.testing.assert_array_equal(r.copies, copy[planned])
    assert ranges[-1].first == len(ranges) - 1
    with pytest.raises(IndexError):
        ranges[len(ranges)]


def test_the_exchange_and_layout_are_given_to_every_range(tmp_path):
    plan, config = _plan(2.5)
    ranges = shard_ranges(plan, rows_per_shard=config.rows_per_shard)
    sections = np.arange(3 * len(ranges), dtype=np.int64).reshape(3, len(ranges))  # (M, S)
    starts = np.array([0, 200, 400, 600])
    moved = replace(ranges, remember=True, exchange=(tmp_path, starts, starts, sections))
    for s in (0, len(ranges) - 1):
        r = moved[s]
        assert r.remember and isinstance(r.exchange, Exchange) and r.exchange.root == tmp_path
        np.testing.assert_array_equal(r.exchange.sections, sections[:, s : s + 1].T)
        np.testing.assert_array_equal(r.examples, ranges[s].examples)
