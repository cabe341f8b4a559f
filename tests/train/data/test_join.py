"""EqualSteps: ranks packing on the fly (OnlinePackedDataset) take the same number of steps, every real row once.

Ranks are threads that all-reduce through a barrier (the same call sequence as torch.distributed's MAX), and
one test runs two real processes over a gloo process group."""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from packer.core.types import IGNORE_INDEX
from packer.train.data.collate import collate
from packer.train.data.join import EqualSteps, filler_batch
from packer.train.data.online import OnlinePackedDataset
from packer.train.data.resume import ResumableLoader

OPTS = dict(profile="text", tokenizer="qwen2-vl", max_length=256)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Chats of very uneven lengths, so that ranks' streams pack into different numbers of rows."""
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("join") / "data.jsonl"
    with open(path, "w") as f:
        for i in range(90):
            words = int(rng.choice([3, 10, 40, 150]))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"q{i} " + "w " * words},
                                             {"role": "assistant", "content": f"a{i}"}]}) + "\n")
    return path


class ThreadGroup:
    """MAX all-reduce over threads standing in for ranks."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=60)
        self.values = [0] * size

    def reducer(self, rank: int):
        def reduce(value: int) -> int:
            self.values[rank] = value
            self.barrier.wait()
            out = max(self.values)
            self.barrier.wait()  # nobody overwrites a value before every rank has read the max
            return out

        return reduce


def _run_ranks(corpus: Path, world: int, *, workers: int, batch: int, pool: int) -> list[list[dict]]:
    group = ThreadGroup(world)
    out: list[list[dict]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            ds = OnlinePackedDataset([str(corpus)], rank=rank, world_size=world, pool_size=pool, seed=3, **OPTS)
            loader = EqualSteps(ResumableLoader(DataLoader(ds, batch_size=batch, num_workers=workers,
                                                           collate_fn=collate)), reduce_max=group.reducer(rank))
            out[rank] = list(loader)
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def _real_examples(batches: list[dict]) -> list[str]:
    return [e for b in batches for e, f in zip(b["example_ids"], b["filler_examples"].tolist(), strict=True) if not f]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "workers", "batch"), [(1, 0, 1), (2, 0, 2), (3, 2, 1), (4, 0, 3), (5, 0, 2),
                                                         (8, 0, 1)])
def test_equal_steps_every_real_row_once(corpus, world, workers, batch):
    reference = OnlinePackedDataset([str(corpus)], pool_size=8, seed=3, **OPTS)
    everything = Counter(e for row in reference for e in row["example_ids"])  # one stream: every accepted example
    per_rank = _run_ranks(corpus, world, workers=workers, batch=batch, pool=8)
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, f"ranks took different step counts: {[len(b) for b in per_rank]}"
    real = Counter(e for batches in per_rank for e in _real_examples(batches))
    assert real == everything  # every accepted example exactly once over all ranks, fillers aside
    for batches in per_rank:
        for b in batches:
            filler = bool(b["filler_examples"].all())
            assert filler == (b["num_filler_rows"] == b["num_rows"])
            if filler:
                assert b["num_loss_tokens"] == 0 and bool((b["labels"] == IGNORE_INDEX).all())
                assert bool((b["shift_labels"] == IGNORE_INDEX).all()) and "packer_state" not in b


def test_uneven_ranks_get_fillers(corpus):
    """The corpus really makes ranks uneven (else the tests above prove nothing), and fillers close the gap."""
    raw = [len(list(OnlinePackedDataset([str(corpus)], rank=r, world_size=4, pool_size=8, seed=3, **OPTS)))
           for r in range(4)]
    assert len(set(raw)) > 1, raw
    per_rank = _run_ranks(corpus, 4, workers=0, batch=1, pool=8)
    fillers = [sum(int(b["num_filler_rows"] > 0) for b in batches) for batches in per_rank]
    assert [len(b) for b in per_rank] == [max(raw)] * 4
    assert fillers == [max(raw) - n for n in raw]


def test_filler_batch_adds_no_loss_and_keeps_the_forward():
    batch = {"input_ids": torch.arange(6)[None], "labels": torch.tensor([[1, 2, -100, 4, 5, 6]]),
             "shift_labels": torch.tensor([[2, -100, 4, 5, 6, -100]]), "num_loss_tokens": 5,
             "filler_examples": torch.tensor([False, False]), "num_rows": 2, "num_filler_rows": 0,
             "example_ids": ["a", "b"], "packer_state": [{"count": 1}]}
    f = filler_batch(batch)
    assert f["input_ids"] is batch["input_ids"]  # same forward
    assert bool((f["labels"] == IGNORE_INDEX).all()) and bool((f["shift_labels"] == IGNORE_INDEX).all())
    assert f["num_loss_tokens"] == 0 and f["num_filler_rows"] == 2 and bool(f["filler_examples"].all())
    assert batch["labels"][0, 0] == 1 and "packer_state" not in f  # the real batch is untouched


def test_rank_without_any_row_says_why(corpus):
    group = ThreadGroup(2)
    results: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        batches = [{"input_ids": torch.zeros(1, 1)}] if rank == 0 else []
        try:
            results[rank] = list(EqualSteps(batches, reduce_max=group.reducer(rank)))
        except RuntimeError as e:
            results[rank] = e
            group.barrier.abort()
        except threading.BrokenBarrierError as e:
            results[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results[1], RuntimeError) and "no batch to copy" in str(results[1])


def _gloo_rank(rank: int, world: int, init: str, corpus: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        ds = OnlinePackedDataset([corpus], rank=rank, world_size=world, pool_size=8, seed=3, **OPTS)
        batches = list(EqualSteps(DataLoader(ds, batch_size=1, collate_fn=collate)))
        steps = torch.tensor([len(batches)])
        gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(gathered, steps)
        Path(out, f"{rank}.json").write_text(json.dumps({
            "steps": [int(g) for g in gathered], "real": _real_examples(batches),
            "fillers": sum(int(b["num_filler_rows"] > 0) for b in batches)}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_real_process_group(corpus, tmp_path):
    """Two processes, a real gloo all-reduce: equal steps on both, every real example once."""
    world = 2
    mp.start_processes(_gloo_rank, args=(world, f"file://{tmp_path / 'init'}", str(corpus), str(tmp_path)),
                       nprocs=world, start_method="spawn", join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    assert all(r["steps"] == results[0]["steps"] for r in results) and len(set(results[0]["steps"])) == 1
    real = list(itertools.chain.from_iterable(r["real"] for r in results))
    reference = [e for row in OnlinePackedDataset([str(corpus)], pool_size=8, seed=3, **OPTS) for e in row["example_ids"]]
    assert Counter(real) == Counter(reference)
