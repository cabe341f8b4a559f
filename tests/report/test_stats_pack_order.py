"""``compute_stats`` from a build's compact plan (issue 32): ``packs=(order, bounds)`` over uint16 lengths and
one-byte source codes gives the very stats.json of ``pack_ids`` over int64 arrays and source names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packer.packing.bulk import plan_bulk
from packer.report import stats
from packer.report.stats import compute_stats


@pytest.mark.parametrize("block", [None, 97])  # 97: the per-pack, per-source and fill passes over many blocks
def test_pack_order_and_narrow_arrays_give_the_same_stats(block, monkeypatch):
    if block is not None:
        monkeypatch.setattr(stats, "_BLOCK", block)
    rng = np.random.default_rng(3)
    n = 5000
    lengths = rng.integers(1, 300, size=n).astype(np.uint16)
    packs = plan_bulk(lengths, 512, seed=7)
    pack_ids = packs.pack_ids()
    names = ["chat", "code", "web"]
    codes = rng.integers(0, 3, size=n).astype(np.uint8)
    loss = (lengths // 2).astype(np.uint16)
    weight = loss * rng.choice([0.5, 1.0, 2.0], size=n)
    vision = np.where(rng.random(n) < 0.2, lengths // 3, 0).astype(np.uint16)
    for loss_weight, vis in ((None, None), (weight, vision)):
        wide = compute_stats(lengths=lengths.astype(np.int64), pack_ids=pack_ids, capacity=512,
                             vision=np.zeros(n, np.int64) if vis is None else vis.astype(np.int64),
                             loss_tokens=loss.astype(np.int64),
                             loss_weight=loss.astype(np.float64) if loss_weight is None else loss_weight,
                             sources=np.array(names, dtype=object)[codes], input_records=n)
        narrow = compute_stats(lengths=lengths, packs=(packs.order, packs.bounds), capacity=512, vision=vis,
                               loss_tokens=loss, loss_weight=loss_weight, sources=codes, source_names=names,
                               input_records=n)
        assert json.dumps(narrow, sort_keys=True) == json.dumps(wide, sort_keys=True)
    assert set(narrow["sources"]) == set(names) and narrow["packs"] == packs.num_packs


def test_one_source_needs_no_array():
    lengths = np.random.default_rng(4).integers(1, 100, size=999).astype(np.uint16)
    packs = plan_bulk(lengths, 256)
    wide = compute_stats(lengths=lengths.astype(np.int64), pack_ids=packs.pack_ids(), capacity=256,
                         vision=np.zeros(999, np.int64), loss_tokens=lengths.astype(np.int64),
                         sources=np.array(["chat"] * 999, dtype=object))
    narrow = compute_stats(lengths=lengths, packs=(packs.order, packs.bounds), capacity=256, vision=None,
                           loss_tokens=lengths, sources=None, source_names=["chat"])
    assert json.dumps(narrow, sort_keys=True) == json.dumps(wide, sort_keys=True)
    assert narrow["sources"]["chat"]["share"] == 1.0


@pytest.mark.parametrize("block", [None, 7, 64])  # 7, 64: blocks of rows and of packs across the MARK steps
def test_rows_weighted_by_copies_give_the_planned_stats(block, monkeypatch):
    """A build with up-sampled copies passes its per-row columns and ``Sampled`` (issue 32): the very stats of
    the planned arrays (``Sampled.planned``), rows left out (0 copies) and rows copied up to 3 times, one
    source, three and six, with loss weights (made per planned example, as before) and without."""
    from packer.packing.mixing import Sampled

    if block is not None:
        monkeypatch.setattr(stats, "_BLOCK", block)
    rng = np.random.default_rng(5)
    rows = 3000
    counts = rng.integers(0, 4, size=rows).astype(np.uint8)
    counts[:200] = 0  # a run of rows left out across marks
    sampled = Sampled.of(counts)
    lengths = rng.integers(1, 300, size=rows).astype(np.uint16)
    packs = plan_bulk(sampled.planned(lengths), 512, seed=7)
    loss = (lengths // 2).astype(np.uint16)
    vision = np.where(rng.random(rows) < 0.2, lengths // 3, 0).astype(np.uint16)
    codes = rng.integers(0, 3, size=rows).astype(np.uint8)
    for names, sources, vis, weight in ((["chat"], None, None, None),
                                        (["chat", "code", "web"], codes, vision, None),
                                        (["chat", "code", "web"], codes, vision, loss * rng.random(rows)),
                                        ([f"s{k}" for k in range(6)], codes * 2 + (lengths % 2).astype(np.uint8),
                                         vision, None)):  # 6 sources: two passes of up to 4
        common = dict(packs=(packs.order, packs.bounds), capacity=512, source_names=names, input_records=rows)
        planned = compute_stats(lengths=sampled.planned(lengths), vision=None if vis is None else sampled.planned(vis),
                                loss_tokens=sampled.planned(loss),
                                loss_weight=None if weight is None else sampled.planned(weight),
                                sources=None if sources is None else sampled.planned(sources), **common)
        weighted = compute_stats(lengths=lengths, vision=vis, loss_tokens=loss, loss_weight=weight, sources=sources,
                                 sampled=sampled, **common)
        assert json.dumps(weighted, sort_keys=True) == json.dumps(planned, sort_keys=True)
        assert set(weighted["sources"]) == set(names)
    assert weighted["examples"] == int(counts.sum())


@pytest.mark.parametrize("block", [None, 7])
def test_loss_sums_give_the_loss_column_stats(block, monkeypatch):
    """``LossSums`` (what a build sums before its plan, letting the column go): the very stats of the loss-token
    column, rows copied 0-3 times or once each, one source and three, chunks of one source each (runs of
    chunks of the same source merged)."""
    from packer.packing.mixing import Sampled
    from packer.report.stats import LossSums

    if block is not None:
        monkeypatch.setattr(stats, "_BLOCK", block)
    rng = np.random.default_rng(8)
    chunk_rows = rng.integers(1, 60, size=80)
    chunk_codes = rng.integers(0, 3, size=80)
    chunk_codes[10:14] = 1  # a run of one source's chunks
    rows = int(chunk_rows.sum())
    codes = np.repeat(chunk_codes, chunk_rows).astype(np.uint8)
    lengths = rng.integers(1, 300, size=rows).astype(np.uint16)
    loss = (lengths // 3).astype(np.uint16)
    for counts in (rng.integers(0, 4, size=rows).astype(np.uint8), None):
        sampled = None if counts is None else Sampled.of(counts)
        packs = plan_bulk(lengths if sampled is None else sampled.planned(lengths), 512, seed=2)
        for names, sources in ((["chat"], None), (["chat", "code", "web"], codes)):
            common = dict(lengths=lengths, vision=None, packs=(packs.order, packs.bounds), capacity=512,
                          sources=sources, source_names=names, sampled=sampled)
            sums = LossSums.of(loss, counts, chunk_rows.tolist(), (chunk_codes if sources is not None
                                                                    else np.zeros(80, int)).tolist())
            want = compute_stats(loss_tokens=loss, **common)
            assert json.dumps(compute_stats(loss_tokens=sums, **common), sort_keys=True) == json.dumps(want, sort_keys=True)
            assert sums.total == want["loss_tokens"]
    with pytest.raises(ValueError, match="unweighted"):
        compute_stats(loss_tokens=sums, loss_weight=loss * 0.5, **common)
