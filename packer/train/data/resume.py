"""Exact resumption: which positions of a rank's epoch order are consumed, and a loader that counts them.

The state is the set of positions of the rank's epoch plan (``PackedDataset.rank_plan``: the same number N
on every rank) already consumed, as a few [start, end) intervals (docs/reliability.md). A pass over the epoch reads the rank's remaining positions, split into contiguous
worker slices, each in order, so "worker w has delivered c rows" means "the first c positions of w's slice":

    rank's positions:  [ 0 1 2 3 4 5 6 7 8 9 ]    consumed before the pass: [(2, 4)]
    remaining:           0 1 . . 4 5 6 7 8 9      2 workers: w0 = 0 1 4 5, w1 = 6 7 8 9
    w0 delivered 3, w1 delivered 1  ->  consumed [(0, 5), (6, 7)]   (the base 2 3, w0: 0 1 4, w1: 6)

Who counts:

- ``torchdata``'s ``StatefulDataLoader`` calls ``state_dict()`` inside each worker after each batch and
  hands each worker its own state back on resume (the worker form: base intervals + its slice count);
- a plain ``DataLoader``: wrap it in ``ResumableLoader``. Every row carries ``(epoch, base, worker,
  num_workers, count)`` into ``collate``'s ``packer_state``; the wrapper records the batches the training
  loop has actually received (prefetched ones are not), and ``state_dict()`` turns the per-worker counts into
  intervals. Workers may finish at different times and deliver in any interleaving: counts are absolute.

A state from N workers resumes with any number of workers (the remaining rows are re-split), except that
StatefulDataLoader itself needs the same number.

Equal batches after a resume: under DDP every rank has received the same number of batches when a
checkpoint is taken, and every rank splits and batches its N positions the same way, so every rank has
consumed the same positions and re-splits the same remaining ones: the resumed epochs are equal in batches too
(tests/train/data/test_equal_steps.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# version 1 (per-worker counts only) could not be read back in the main process; version 2 counted positions of
# the global order (ranks had contiguous, unequal slices), version 3 positions of the rank's own plan
STATE_VERSION = 3
# a state resumes only the dataset it came from: these decide which rows each rank position holds
STATE_KEYS = ("seed", "shuffle", "rank", "world_size", "num_rows", "drop_last", "balance")

Intervals = tuple[tuple[int, int], ...]  # sorted, disjoint [start, end) ranges of epoch-order positions


def merge_intervals(intervals: Iterable) -> Intervals:
    """Sorted, merged [start, end) intervals."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions -> the [start, end) intervals of their consecutive runs."""
    if len(positions) == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate([[0], breaks])]
    ends = positions[np.concatenate([breaks - 1, [len(positions) - 1]])] + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def worker_slice(n: int, worker: int, num_workers: int) -> tuple[int, int]:
    """[lo, hi) of worker ``worker``'s contiguous share of ``n`` items."""
    return n * worker // num_workers, n * (worker + 1) // num_workers


@dataclass
class Pass:
    """One pass over (the rest of) an epoch: where it started and how far each worker got."""

    epoch: int
    base: Intervals  # positions already consumed when the pass started
    num_workers: int
    counts: dict[int, int] = field(default_factory=dict)  # worker -> rows of its slice consumed
    pid: int = field(default_factory=os.getpid)  # a forked worker's copy of the main's pass is not its own


class EpochProgress:
    """The consumed positions of one rank's epoch order: what ``PackedDataset.state_dict()`` saves.

    Args:
        lo, hi: the rank's [lo, hi) share of the epoch order.
    """

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self.epoch = 0
        self.pending: dict[str, Any] | None = None  # a loaded state, applied by the next pass
        self.current: Pass | None = None  # the pass this process iterates or tracks (ResumableLoader)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.pending, self.current = None, None

    def remaining(self, base: Intervals) -> np.ndarray:
        """The rank's positions not in ``base``, ascending."""
        keep = np.ones(self.hi - self.lo, dtype=bool)
        for a, b in base:
            keep[max(a, self.lo) - self.lo : max(min(b, self.hi) - self.lo, 0)] = False
        return self.lo + np.flatnonzero(keep)

    def consumed(self) -> Intervals:
        """Every position of this epoch consumed so far (main-process view)."""
        p = self.current
        if p is None:
            if self.pending is None:
                return ()
            p = Pass(self.epoch, self.pending["base"], self.pending.get("num_workers", 1))
            if "worker" in self.pending:
                p.counts[self.pending["worker"]] = self.pending["count"]
        remaining = self.remaining(p.base)
        taken = list(p.base)
        for w, c in p.counts.items():
            a, _ = worker_slice(len(remaining), w, p.num_workers)
            taken += runs(remaining[a : a + c])
        return merge_intervals(taken)

    def state(self, worker: int | None = None, num_workers: int = 1) -> dict[str, Any]:
        """The consumed positions (main process, ``worker`` None), or one worker's base and count."""
        if worker is None:
            return {"consumed": [list(iv) for iv in self.consumed()]}
        if self.current is not None and self.current.pid == os.getpid():
            base, count = self.current.base, self.current.counts.get(worker, 0)
        elif self.pending is not None:
            base = self.pending["base"]
            count = self.pending["count"] if self.pending.get("worker") == worker else 0
        else:
            base, count = (), 0
        return {"consumed": [list(iv) for iv in base], "worker": worker, "num_workers": num_workers, "count": count}

    def load(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (checked by ``check_state``): the next pass skips what it consumed."""
        self.epoch = int(state["epoch"])
        self.current = None
        self.pending = {"base": merge_intervals(state["consumed"])}
        if "worker" in state:
            self.pending.update(worker=int(state["worker"]), num_workers=int(state["num_workers"]),
                                count=int(state["count"]))

    def update(self, states: Iterable[dict[str, Any]]) -> None:
        """Record rows the training loop received (each row's ``packer_state`` entry)."""
        for st in states:
            if st["epoch"] != self.epoch:
                continue  # a batch of an epoch this dataset has moved past
            base = tuple(tuple(iv) for iv in st["base"])
            p = self.current
            if p is None or p.base != base or p.num_workers != st["num_workers"]:
                p = self.current = Pass(self.epoch, base, st["num_workers"])
                self.pending = None  # the workers have applied it
            p.counts[st["worker"]] = max(p.counts.get(st["worker"], 0), st["count"])

    def new_pass(self) -> None:
        """Forget the tracked pass: a new iteration of the loader starts (from the pending state, if any)."""
        self.current = None

    def begin(self, worker: int, num_workers: int) -> tuple[np.ndarray, Pass]:
        """Start reading: the epoch-order positions this worker reads next, and the pass that counts them."""
        base, skip = (), 0
        if self.pending is not None:
            base = self.pending["base"]
            if "worker" in self.pending:  # one worker's own state (StatefulDataLoader hands each its own)
                if self.pending["num_workers"] != num_workers:
                    raise ValueError(f"a worker state saved with {self.pending['num_workers']} workers cannot resume "
                                     f"with {num_workers}; use the same num_workers")
                skip = self.pending["count"] if self.pending["worker"] == worker else 0
        self.pending = None
        remaining = self.remaining(base)
        a, b = worker_slice(len(remaining), worker, num_workers)
        self.current = Pass(self.epoch, base, num_workers, {worker: skip})
        return remaining[a + skip : b], self.current


def check_state(state: dict[str, Any], expected: dict[str, Any]) -> None:
    """ValueError unless ``state`` was saved by this packer's state format for a dataset like ``expected``."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"state version {state.get('version')} is not {STATE_VERSION}; it was saved by another "
                         "packer version and cannot be resumed exactly")
    for key in STATE_KEYS:
        if state.get(key) != expected[key]:
            raise ValueError(f"state was saved with {key}={state[key]!r}, this dataset has {expected[key]!r}; "
                             "resume with the same shards, seed, shuffle, rank, world size, drop_last and balancing")


class ResumableLoader:
    """A ``DataLoader`` over a ``PackedDataset`` whose ``state_dict()`` counts only the batches received.

    Workers prefetch batches ahead of the loop; a state taken from the dataset inside them would count rows
    the loop never saw. This wrapper records each batch as the loop receives it (``collate`` puts each row's
    worker and count in ``packer_state``), so a checkpoint taken after step k resumes at batch k+1::

        loader = ResumableLoader(DataLoader(ds, batch_size=1, num_workers=4, collate_fn=collate))
        loader.load_state_dict(ckpt["data"])            # optional: resume
        for batch in loader:
            ...
            ckpt["data"] = loader.state_dict()

    The DataLoader must not use ``persistent_workers`` (its workers would keep a stale copy of the state).
    """

    def __init__(self, loader):
        if not callable(getattr(loader.dataset, "update", None)) or not hasattr(loader.dataset, "progress"):
            raise TypeError("ResumableLoader needs a DataLoader over a PackedDataset or an OnlinePackedDataset")
        if getattr(loader, "persistent_workers", False):
            raise ValueError("ResumableLoader needs persistent_workers=False: persistent workers keep the dataset "
                             "state of their first epoch")
        self.loader = loader
        self.dataset = loader.dataset

    def __iter__(self):
        self.dataset.progress.new_pass()
        for batch in self.loader:
            self.dataset.update(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
