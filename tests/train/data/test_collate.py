"""collate: rows -> one unpadded (1, T) batch with explicit boundaries (the contract of docs/format.md)."""

from __future__ import annotations

import numpy as np
import torch

from packer.core.types import IGNORE_INDEX
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.helpers import random_example, write_shardset


def test_collate_contract(tmp_path):
    rng = np.random.default_rng(7)
    examples = [random_example(rng, i) for i in range(12)]
    root = write_shardset(tmp_path / "out", examples, [4, 3, 5], rows_per_shard=2)
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
