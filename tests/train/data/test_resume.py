"""Exact resumption in training: stop anywhere, resume in a fresh dataset and loader, and the union of rows
is exactly the epoch: none twice, none skipped. Plain DataLoader (via ResumableLoader) and torchdata's
StatefulDataLoader, 2 ranks x 3 workers, prefetching, uneven worker slices and partial last batches."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from packer.train.data.resume import ResumableLoader
from tests.helpers import random_example, write_shardset

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")]

WORLD, SEED, BATCH = 2, 5, 2
NUM_ROWS = 41  # 20 + 21 rows per rank; 3 workers get 6/7/7 and 7/7/7: uneven slices, partial last batches


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    rng = np.random.default_rng(11)
    examples = [random_example(rng, i) for i in range(NUM_ROWS + 9)]
    sizes = [1] * (NUM_ROWS - 9) + [2] * 9  # some rows hold two examples
    return write_shardset(tmp_path_factory.mktemp("resume") / "out", examples, sizes, rows_per_shard=7,
                          rows_per_row_group=3)


def _plain(ds: PackedDataset, workers: int) -> ResumableLoader:
    extra = {"prefetch_factor": 4} if workers else {}  # workers run well ahead of the loop
    return ResumableLoader(DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate, **extra))


def _stateful(ds: PackedDataset, workers: int) -> StatefulDataLoader:
    extra = {"prefetch_factor": 4} if workers else {}
    return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate, **extra)


LOADERS = {"plain": _plain, "stateful": _stateful}


def _take(loader, stop: int | None = None) -> list[str]:
    """Example ids of the batches the loop receives, stopping after ``stop`` batches."""
    seen: list[str] = []
    for n, batch in enumerate(loader, start=1):
        seen += [e for e, f in zip(batch["example_ids"], batch["filler_examples"].tolist(), strict=True) if not f]
        if n == stop:
            break
    return seen


def _epoch(root, rank: int, epoch: int = 0) -> list[str]:
    ds = PackedDataset(root, rank=rank, world_size=WORLD, seed=SEED)
    ds.set_epoch(epoch)
    return _take(_plain(ds, 0))


def _roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))  # a checkpoint stores it as plain JSON / torch.save


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "stateful"])
@pytest.mark.parametrize("stop", [0, 1, 4, 11])  # 11 batches: every row of the rank (the epoch is done)
def test_resume_mid_epoch_yields_exactly_the_rest(root, kind, stop):
    make = LOADERS[kind]
    for rank in range(WORLD):
        full = _epoch(root, rank, epoch=1)
        ds = PackedDataset(root, rank=rank, world_size=WORLD, seed=SEED)
        ds.set_epoch(1)
        loader = make(ds, 3)
        first = _take(loader, stop) if stop else []
        state = _roundtrip(loader.state_dict())
        del loader
        fresh = PackedDataset(root, rank=rank, world_size=WORLD, seed=SEED)
        resumed = make(fresh, 3)
        resumed.load_state_dict(state)
        rest = _take(resumed)
        assert len(first) + len(rest) == len(full)
        assert Counter(first + rest) == Counter(full), f"rank {rank}: rows lost or repeated"
        if kind == "stateful":  # StatefulDataLoader also restores the worker round-robin: the same sequence
            same = PackedDataset(root, rank=rank, world_size=WORLD, seed=SEED)
            same.set_epoch(1)
            assert first + rest == _take(make(same, 3))


def test_ranks_together_cover_the_epoch_once(root):
    every = [e for rank in range(WORLD) for e in _epoch(root, rank)]
    assert len(every) == len(set(every)) == NUM_ROWS + 9


@pytest.mark.slow
@pytest.mark.parametrize("resume_workers", [0, 2, 3])
def test_plain_state_resumes_with_another_worker_count(root, resume_workers):
    full = _epoch(root, 1)
    loader = _plain(PackedDataset(root, rank=1, world_size=WORLD, seed=SEED), 3)
    first = _take(loader, 5)
    state = _roundtrip(loader.state_dict())
    resumed = _plain(PackedDataset(root, rank=1, world_size=WORLD, seed=SEED), resume_workers)
    resumed.load_state_dict(state)
    rest = _take(resumed)
    assert Counter(first + rest) == Counter(full) and len(first + rest) == len(full)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_interrupted_twice(root, kind):
    make = LOADERS[kind]
    full = _epoch(root, 0)
    seen: list[str] = []
    state = None
    for stop in (2, 3, None):
        loader = make(PackedDataset(root, rank=0, world_size=WORLD, seed=SEED), 3)
        if state is not None:
            loader.load_state_dict(state)
        seen += _take(loader, stop)
        state = _roundtrip(loader.state_dict())
    assert Counter(seen) == Counter(full) and len(seen) == len(full)


def test_state_only_counts_received_batches_not_prefetched(root):
    """Workers have produced far more than one batch when the loop stops after one."""
    loader = _plain(PackedDataset(root, rank=0, world_size=WORLD, seed=SEED), 3)
    first = _take(loader, 1)
    consumed = loader.state_dict()["consumed"]
    assert sum(b - a for a, b in consumed) == len(first) == BATCH


@pytest.mark.slow
def test_epochs_differ_and_are_deterministic(root):
    e0, e1 = _epoch(root, 0, 0), _epoch(root, 0, 1)
    assert e0 != e1 and sorted(e0 + _epoch(root, 1, 0)) == sorted(e1 + _epoch(root, 1, 1))
    assert _epoch(root, 0, 1) == e1
    # and through a loader with workers, epoch after epoch on one dataset
    ds = PackedDataset(root, rank=0, world_size=WORLD, seed=SEED)
    loader = _plain(ds, 3)
    runs = []
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        runs.append(_take(loader))
    assert Counter(runs[0]) == Counter(e0) and Counter(runs[1]) == Counter(e1)
    assert runs[0] == runs[2] and runs[0] != runs[1]


@pytest.mark.slow
def test_resume_in_the_next_epoch(root):
    ds = PackedDataset(root, rank=0, world_size=WORLD, seed=SEED)
    loader = _plain(ds, 3)
    _take(loader)  # epoch 0, whole
    ds.set_epoch(1)
    first = _take(loader, 3)
    state = _roundtrip(loader.state_dict())
    assert state["epoch"] == 1
    fresh = PackedDataset(root, rank=0, world_size=WORLD, seed=SEED)
    resumed = _plain(fresh, 3)
    resumed.load_state_dict(state)
    assert fresh.epoch == 1
    assert Counter(first + _take(resumed)) == Counter(_epoch(root, 0, 1))


def test_state_of_another_dataset_is_refused(root):
    state = PackedDataset(root, rank=0, world_size=WORLD, seed=SEED).state_dict()
    with pytest.raises(ValueError, match="seed"):
        PackedDataset(root, rank=0, world_size=WORLD, seed=SEED + 1).load_state_dict(state)
    with pytest.raises(ValueError, match="rank"):
        PackedDataset(root, rank=1, world_size=WORLD, seed=SEED).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        PackedDataset(root, rank=0, world_size=WORLD, seed=SEED).load_state_dict({"epoch": 0, "consumed": {}})


def test_persistent_workers_are_refused(root):
    ds = PackedDataset(root, rank=0, world_size=WORLD, seed=SEED)
    with pytest.raises(ValueError, match="persistent_workers"):
        ResumableLoader(DataLoader(ds, batch_size=1, num_workers=1, persistent_workers=True, collate_fn=collate))
