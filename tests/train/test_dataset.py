"""PackedDataset: every row exactly once across ranks and workers; collate builds the batch contract."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.core.types import IGNORE_INDEX
from packer.errors import ShardError
from packer.train.dataset import PackedDataset, collate
from tests.helpers import random_example, write_shardset


@pytest.fixture(scope="module")
def shardset(tmp_path_factory):
    rng = np.random.default_rng(7)
    examples = [random_example(rng, i) for i in range(60)]
    cuts = np.sort(rng.choice(np.arange(1, 60), size=24, replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [60]])).tolist()  # 25 packs of 1+ examples
    return write_shardset(tmp_path_factory.mktemp("ds") / "out", examples, sizes, rows_per_shard=7,
                          rows_per_row_group=3), examples


def _ids(batch_iter):
    return [e for b in batch_iter for e in b["example_ids"]]


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_ranks_two_workers_cover_every_row_once(shardset, shuffle):
    root, examples = shardset
    seen = []
    for rank in range(2):
        ds = PackedDataset(root, rank=rank, world_size=2, shuffle=shuffle, seed=3)
        loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate)
        seen += _ids(loader)
    counts = Counter(seen)
    assert set(counts) == {e.example_id for e in examples}
    assert max(counts.values()) == 1


def test_epochs_reshuffle_deterministically(shardset):
    root, _ = shardset
    a = PackedDataset(root, seed=1)
    b = PackedDataset(root, seed=1)
    order0 = a.epoch_order(0)
    np.testing.assert_array_equal(order0, b.epoch_order(0))
    assert not np.array_equal(order0, a.epoch_order(1))
    assert sorted(order0.tolist()) == list(range(a.num_rows))


def test_rows_roundtrip_exactly(shardset):
    root, examples = shardset
    by_id = {e.example_id: e for e in examples}
    for row in PackedDataset(root, shuffle=False):
        cu = row["cu_seqlens"]
        for k, ex_id in enumerate(row["example_ids"]):
            e = by_id[ex_id]
            sl = slice(cu[k], cu[k + 1])
            np.testing.assert_array_equal(row["input_ids"][sl], e.input_ids)
            np.testing.assert_array_equal(row["labels"][sl], e.labels)
            np.testing.assert_array_equal(row["position_ids"][sl], e.position_ids)


def test_collate_contract(shardset):
    root, _ = shardset
    rows = list(PackedDataset(root, shuffle=False))[:3]
    batch = collate(rows)
    T = sum(len(r["input_ids"]) for r in rows)
    assert batch["input_ids"].shape == (1, T) and batch["input_ids"].dtype == torch.int64
    assert batch["labels"].shape == (1, T)
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"][0] == 0 and batch["cu_seqlens"][-1] == T
    assert torch.all(batch["cu_seqlens"].diff() > 0)
    assert batch["max_seqlen"] == int(batch["cu_seqlens"].diff().max())
    assert isinstance(batch["max_seqlen"], int)
    assert batch["num_loss_tokens"] == int((batch["labels"] != IGNORE_INDEX).sum())
    # node parents stay inside their row's nodes and point backwards
    parents = batch["node_parents"]
    idx = torch.arange(len(parents))
    assert torch.all((parents == -1) | (parents < idx))
    # every example start is a root node start
    starts = set(batch["cu_seqlens"][:-1].tolist())
    roots = set(batch["node_offsets"][parents == -1].tolist())
    assert starts == roots


def test_collate_shift_labels_for_linear_rows():
    rng = np.random.default_rng(3)
    examples = []
    for i in range(4):
        e = random_example(rng, i)
        e.node_offsets, e.node_parents = np.array([0], np.int32), np.array([-1], np.int32)
        examples.append(e)
    rows = [{
        "input_ids": e.input_ids, "labels": e.labels, "position_ids": e.position_ids,
        "cu_seqlens": np.array([0, e.num_tokens], np.int32), "node_offsets": e.node_offsets,
        "node_parents": e.node_parents, "images": [], "example_ids": [e.example_id],
    } for e in examples]
    batch = collate(rows)
    shift = batch["shift_labels"][0]
    labels = batch["labels"][0]
    assert torch.equal(shift[:-1], labels[1:]) and shift[-1] == IGNORE_INDEX
    # nothing is predicted across an example boundary: each example's first label is -100
    for start in batch["cu_seqlens"][1:-1].tolist():
        assert shift[start - 1] == IGNORE_INDEX


def test_unfinished_build_is_refused(tmp_path):
    (tmp_path / "shard-00000.parquet").write_bytes(b"PAR1")
    with pytest.raises(ShardError, match="no manifest.json"):
        PackedDataset(tmp_path)
