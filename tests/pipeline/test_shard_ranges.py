"""``stages.ShardRanges``: each shard's range made when it is read (as its write task is sent) holds what the
eager ranges held: the packs' cache rows and copy numbers of ``np.repeat``'d rows, shard by shard."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.pipeline.columns import ChunkColumns, ColumnsBuilder
from packer.pipeline.stages import (
    Exchange,
    MapOutputs,
    ShardRanges,
    plan_packs,
    planned_examples,
    shard_ranges,
    writer_groups,
)


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


@pytest.mark.parametrize(("weight", "groups"), [(1.0, 1), (2.5, 1), (1.0, 3), (2.5, 3)])
def test_each_range_is_given_where_its_rows_start_in_each_map_output(weight, groups, tmp_path):
    """Counted as the ranges are made (no (M, S) table): the same starts in order, again, and out of order;
    with writer groups, each group's map outputs hold its shards' rows alone (their starts counted from the
    group's first shard)."""
    plan, config = _plan(weight)
    ranges = shard_ranges(plan, rows_per_shard=config.rows_per_shard)
    n = len(ranges)
    cache_starts = np.array([0, 150, 200, 420, 600])  # four map outputs over the 600 cache rows
    first = writer_groups(n, groups)
    out_starts = np.arange(len(first) - 1)[:, None] * 10 + np.arange(5)  # (G, M + 1): only passed on
    moved = replace(ranges, remember=True, exchange=MapOutputs(tmp_path, cache_starts, out_starts, first))
    assert moved.groups == groups and n > 2 * groups  # groups of several shards
    # the table the driver no longer holds: rows of shard s from map m, then where they start in its group's
    counts = np.array([np.bincount(np.searchsorted(cache_starts, ranges[s].examples, side="right") - 1,
                                   minlength=4) for s in range(n)]).T  # (M, S)
    assert (counts > 0).sum(axis=1).min() > 1  # each map output feeds several shards
    sections = np.zeros_like(counts)
    for g in range(groups):
        part = counts[:, first[g] : first[g + 1]]
        sections[:, first[g] : first[g + 1]] = np.cumsum(part, axis=1) - part
    for s in [*range(n), n - 1, 2, 2, 0, n - 2, 1]:  # in order, made twice, back, forward skipping shards
        r = moved[s]
        g = int(np.searchsorted(first, s, side="right")) - 1
        assert r.remember and isinstance(r.exchange, Exchange) and r.exchange.root == tmp_path
        assert moved.group(s) == r.exchange.group == g and r.exchange.groups == groups
        np.testing.assert_array_equal(r.exchange.sections, sections[:, s : s + 1].T)
        np.testing.assert_array_equal(r.exchange.out_starts, out_starts[g])
        np.testing.assert_array_equal(r.examples, ranges[s].examples)


def test_writer_groups_split_the_shards_evenly_and_never_leave_one_empty():
    for shards in range(1, 40):
        for groups in range(1, 9):
            first = writer_groups(shards, groups)
            sizes = np.diff(first)
            assert first[0] == 0 and first[-1] == shards and len(sizes) == min(groups, shards)
            assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1
