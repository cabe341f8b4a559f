"""Equal steps on every rank (issue 13): for W = 1..8 ranks, 0..3 DataLoader workers and batch sizes 1..3,
every rank yields the same number of batches, also after a resume at a random point, and the ranks together
yield every real row once (filler rows, labels -100, make up the difference; or ``drop_last``). Fillers leave
the loss and its gradients unchanged. Balanced dealing keeps all of it and evens out per-step cost.

Most cases run the DataLoader's worker protocol in one process (``_loader``: worker copies of the dataset,
per-worker batches, round robin), which ``test_emulation_matches_the_real_dataloader`` checks against torch's
own DataLoader and torchdata's StatefulDataLoader with worker processes.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from packer.core.types import IGNORE_INDEX
from packer.train.data.collate import collate, steps_per_epoch
from packer.train.data.dataset import PackedDataset
from packer.train.data.rank_shares import (
    CostWeights,
    deal,
    loader_steps,
    pad_order,
    read_row_stats,
    straggler_ratio,
)
from packer.train.data.resume import ResumableLoader
from tests.helpers import random_example, write_shardset

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
              pytest.mark.filterwarnings("ignore:Length of IterableDataset:UserWarning")]

NUM_ROWS = 19  # prime: every W in 2..8 but 1 leaves a remainder


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    rng = np.random.default_rng(13)
    examples = [random_example(rng, i, max_len=int(rng.choice([8, 60]))) for i in range(NUM_ROWS + 6)]
    sizes = [1] * (NUM_ROWS - 6) + [2] * 6
    return write_shardset(tmp_path_factory.mktemp("equal") / "out", examples, sizes, rows_per_shard=5,
                          rows_per_row_group=2)


@pytest.fixture(scope="module")
def all_ids(root):
    return sorted(e for r in PackedDataset(root, shuffle=False) for e in r["example_ids"])


def _real(batch: dict) -> list[str]:
    return [e for e, f in zip(batch["example_ids"], batch["filler_examples"].tolist(), strict=True) if not f]


def _loader(ds: PackedDataset, batch_size: int, num_workers: int, stop: int | None = None) -> list[dict]:
    """What ``ResumableLoader(DataLoader(ds, batch_size, num_workers, collate_fn=collate))`` yields, in one
    process: each worker a copy of the dataset (as a forked worker is), batching its own rows; one batch per
    worker in turn, skipping finished workers; the main copy records what the loop received."""
    ds.progress.new_pass()
    workers = max(num_workers, 1)
    gens = [(copy.deepcopy(ds) if num_workers else ds)._iter_worker(w, workers) for w in range(workers)]
    batches: list[dict] = []
    active = list(range(workers))
    while active and (stop is None or len(batches) < stop):
        for w in list(active):
            rows = [r for _, r in zip(range(batch_size), gens[w], strict=False)]
            if not rows:
                active.remove(w)
                continue
            batches.append(collate(rows))
            ds.update(batches[-1])
            if len(batches) == stop:
                break
    return batches


def _ds(root, rank: int, world: int, **kw) -> PackedDataset:
    return PackedDataset(root, rank=rank, world_size=world, seed=4, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("world", range(1, 9))
def test_equal_batches_on_every_rank_with_resume(root, all_ids, world):
    rng = random.Random(world)
    pristine = [_ds(root, r, world) for r in range(world)]  # a deep copy is a freshly constructed dataset
    for workers in range(4):
        for batch_size in range(1, 4):
            datasets = [copy.deepcopy(d) for d in pristine]
            expected = steps_per_epoch(datasets[0], batch_size, num_workers=workers)
            assert {len(d) for d in datasets} == {-(-NUM_ROWS // world)}
            full = [_loader(d, batch_size, workers) for d in datasets]
            assert [len(b) for b in full] == [expected] * world, (world, workers, batch_size)
            assert sorted(e for bs in full for b in bs for e in _real(b)) == all_ids

            # stop every rank after the same random number of batches, resume with another worker count
            stop, resume_workers = rng.randint(0, expected), rng.randint(0, 3)
            seen, rest_counts = [], set()
            for r, d in enumerate(datasets):
                d.set_epoch(1)
                first = _loader(d, batch_size, workers, stop)
                state = json.loads(json.dumps(d.state_dict()))
                fresh = copy.deepcopy(pristine[r])
                fresh.load_state_dict(state)
                rest = _loader(fresh, batch_size, resume_workers)
                rest_counts.add(len(rest))
                seen += [e for b in first + rest for e in _real(b)]
            assert len(rest_counts) == 1, (world, workers, batch_size, stop, resume_workers)
            assert sorted(seen) == all_ids


@pytest.mark.parametrize("world", [3, 5, 8])
def test_drop_last_drops_the_tail_instead(root, all_ids, world):
    for workers, batch_size in ((0, 2), (3, 1), (2, 3)):
        datasets = [_ds(root, r, world, drop_last=True) for r in range(world)]
        assert {len(d) for d in datasets} == {NUM_ROWS // world}
        full = [_loader(d, batch_size, workers) for d in datasets]
        assert len({len(b) for b in full}) == 1
        assert not any(b["num_filler_rows"] for bs in full for b in bs)
        rows = [r for d in datasets for r in d.rank_plan()[0]]
        assert len(rows) == len(set(rows)) == NUM_ROWS - NUM_ROWS % world
        seen = [e for bs in full for b in bs for e in _real(b)]
        assert len(seen) == len(set(seen)) and set(seen) <= set(all_ids)


def test_fewer_rows_than_ranks(root):
    small = _ds(root, 0, 8)
    assert len(small) == 3
    tiny_rows = [r for rank in range(40) for r in _ds(root, rank, 40).rank_plan()[0]]  # 19 rows, 40 ranks
    assert len(tiny_rows) == 40 and set(tiny_rows) == set(range(NUM_ROWS))
    assert len(_ds(root, 0, 40, drop_last=True)) == 0


@pytest.mark.slow
def test_emulation_matches_the_real_dataloader(root):
    """The in-process ``_loader`` yields what torch's DataLoader yields with worker processes, batch by batch,
    and a StatefulDataLoader resumed on three ranks gives each the same number of batches."""
    for workers, batch_size in ((2, 2), (3, 1)):
        real = ResumableLoader(DataLoader(_ds(root, 1, 3), batch_size=batch_size, num_workers=workers,
                                          collate_fn=collate))
        got = [b["example_ids"] for b in real]
        assert got == [b["example_ids"] for b in _loader(_ds(root, 1, 3), batch_size, workers)]
        assert len(got) == steps_per_epoch(_ds(root, 1, 3), batch_size, num_workers=workers)
    counts = set()
    for rank in range(3):
        loader = StatefulDataLoader(_ds(root, rank, 3), batch_size=2, num_workers=2, collate_fn=collate)
        for n, _ in enumerate(loader, start=1):
            if n == 3:
                break
        state = loader.state_dict()
        resumed = StatefulDataLoader(_ds(root, rank, 3), batch_size=2, num_workers=2, collate_fn=collate)
        resumed.load_state_dict(state)
        counts.add(sum(1 for _ in resumed))
    assert len(counts) == 1


def test_filler_rows_are_marked_and_carry_no_loss(root):
    ds = _ds(root, 2, 4)  # 19 rows on 4 ranks: 1 filler
    fillers = [r for rank in range(4) for r in _ds(root, rank, 4)._iter_worker(0, 1) if r["is_filler"]]
    assert len(fillers) == 1
    row = fillers[0]
    assert (row["labels"] == IGNORE_INDEX).all() and len(row["input_ids"]) > 0
    batch = collate([row])
    assert batch["num_filler_rows"] == 1 and batch["num_loss_tokens"] == 0
    assert batch["filler_examples"].all() and len(batch["filler_examples"]) == len(batch["example_ids"])
    assert len(ds) == 5


def test_filler_leaves_loss_and_gradients_unchanged(root):
    """A batch with a filler row gives the same summed loss and the same gradients as the batch without it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from packer.train.attention.hf import LAYOUT_KWARG, model_inputs, use_packed_attention
    from packer.train.trainers.loss import packed_cross_entropy

    rows = [r for rank in range(4) for r in _ds(root, rank, 4)._iter_worker(0, 1)]
    filler = next(r for r in rows if r["is_filler"])
    real = [r for r in rows if not r["is_filler"]][:2]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=None,
                                         eos_token_id=None, pad_token_id=None))
    use_packed_attention(model, "sdpa")

    def loss_and_grads(batch_rows):
        batch = collate(batch_rows)
        batch["input_ids"] = batch["input_ids"] % 64
        batch["labels"] = torch.where(batch["labels"] == IGNORE_INDEX, IGNORE_INDEX, batch["labels"] % 64)
        model.zero_grad()
        inputs = model_inputs(batch)
        out = packed_cross_entropy(model(**inputs).logits, batch["labels"], inputs[LAYOUT_KWARG], reduction="sum")
        out.loss.backward()
        return out, batch["num_loss_tokens"], [p.grad.clone() for p in model.parameters()]

    base, base_count, base_grads = loss_and_grads(real)
    for with_filler in ([*real, filler], [filler, *real]):
        out, count, grads = loss_and_grads(with_filler)
        torch.testing.assert_close(out.loss, base.loss, rtol=1e-5, atol=1e-5)
        assert out.count == base.count and count == base_count
        for g, h in zip(grads, base_grads, strict=True):
            torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-6)


def test_deal_balances_steps_and_keeps_the_epoch(root):
    rng = np.random.default_rng(0)
    costs = rng.lognormal(0, 0.6, size=8 * 200)
    cols = deal(costs, 8, window=64, rng=np.random.default_rng(1))
    assert cols.shape == (8, 200) and sorted(cols.ravel().tolist()) == list(range(1600))
    before, _ = straggler_ratio(costs.reshape(8, 200).T)
    after, _ = straggler_ratio(costs[cols].T)
    assert before > 1.3 and after < 1.05
    assert np.array_equal(cols, deal(costs, 8, window=64, rng=np.random.default_rng(1)))  # deterministic

    # the dataset's plan: each epoch covers every row (fillers aside), ranks' rows at a step are cost neighbours
    plans = [_ds(root, 0, 4).epoch_plan(e) for e in (0, 1)]
    for rows, filler in plans:
        assert sorted(rows[~filler].tolist()) == list(range(NUM_ROWS))
    assert not np.array_equal(plans[0][0], plans[1][0])


def test_row_stats_and_padding(root):
    ds = PackedDataset(root, shuffle=False)
    stats = read_row_stats(ds.shards)
    rows = list(ds)
    assert stats.num_tokens.tolist() == [len(r["input_ids"]) for r in rows]
    assert stats.sum_len2.tolist() == [int((np.diff(r["cu_seqlens"].astype(np.int64)) ** 2).sum()) for r in rows]
    costs = stats.costs(CostWeights(row=1, token=0, attention=0, vision=0))
    assert (costs == 1).all()
    r, f = pad_order(np.array([4, 0, 3, 1, 2]), 4)
    assert r.tolist() == [4, 0, 3, 1, 2, 4, 0, 3] and f.tolist() == [False] * 5 + [True] * 3
    r, f = pad_order(np.array([4, 0, 3, 1, 2]), 4, drop_last=True)
    assert r.tolist() == [4, 0, 3, 1] and not f.any()


def test_loader_steps_is_the_dataloader_order():
    assert [s.tolist() for s in loader_steps(5, 2, 0)] == [[0, 1], [2, 3], [4]]
    # 2 workers: w0 = 0 1 2 (batches [0 1] [2]), w1 = 3 4 5 6 (batches [3 4] [5 6])
    assert [s.tolist() for s in loader_steps(7, 2, 2)] == [[0, 1], [3, 4], [2], [5, 6]]
    assert [s.tolist() for s in loader_steps(5, 1, 3)] == [[0], [1], [3], [2], [4]]


def test_state_of_another_split_is_refused(root):
    state = _ds(root, 0, 2).state_dict()
    with pytest.raises(ValueError, match="drop_last"):
        _ds(root, 0, 2, drop_last=True).load_state_dict(state)
    with pytest.raises(ValueError, match="balance"):
        _ds(root, 0, 2, balance=False).load_state_dict(state)
    assert Counter(type(v).__name__ for v in state.values())  # JSON-friendly
    json.dumps(state)
