"""``EqualSteps``: every data-parallel rank takes the same number of steps, when ranks cannot know it ahead.

``PackedDataset`` gives every rank the same rows per epoch, because the shards say how many there are. On the
fly (``OnlinePackedDataset``) each rank packs its own lines and learns its row count only at the end: one rank
may run out a step or two before another, and under DDP/FSDP the ranks still stepping wait at an all-reduce
for peers that have left the epoch (a hang, or a desync at every epoch end). ``EqualSteps`` is the join:

    rank 0:  b0 b1 b2 b3 b4            rank 0:  b0 b1 b2 b3 b4
    rank 1:  b0 b1 b2          ->      rank 1:  b0 b1 b2 F  F      F: a filler batch
    rank 2:  b0 b1 b2 b3               rank 2:  b0 b1 b2 b3 F      (all stop after step 5)

Before each step the ranks all-reduce one flag, "I still have a batch" (MAX over the group); while any rank
has one, a rank that ran out yields a *filler*: a copy of its last batch with every label -100, so it runs the
same forward (the same parameters get gradients, as DDP needs) and adds nothing to the loss or to
``num_loss_tokens``. Every real batch is yielded once; the step count is the largest rank's. The cost is one
all-reduce of one integer per step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from packer.core.types import IGNORE_INDEX


def filler_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with no loss: labels and shift_labels all -100, counts 0, every example marked filler.

    The token, position and image tensors are shared with ``batch`` (read-only use); the loss-side tensors are
    new. ``packer_state`` is dropped: a filler consumes nothing, so resume accounting ignores it.
    """
    out = {k: v for k, v in batch.items() if k != "packer_state"}
    for key in ("labels", "shift_labels"):
        if key in out:
            out[key] = torch.full_like(out[key], IGNORE_INDEX)
    out["num_loss_tokens"] = 0
    if "filler_examples" in out:
        out["filler_examples"] = torch.ones_like(out["filler_examples"])
    out["num_filler_rows"] = out.get("num_rows", len(batch.get("packer_state", ())) or 1)
    out["example_ids"] = copy.copy(out.get("example_ids", []))
    return out


def all_reduce_max(group: Any = None) -> Callable[[int], int]:
    """The MAX of an int over ``group`` with ``torch.distributed`` (on the current CUDA device under NCCL)."""
    import torch.distributed as dist

    def reduce(value: int) -> int:
        cuda = dist.get_backend(group) == "nccl"
        flag = torch.tensor([value], dtype=torch.int64, device="cuda" if cuda else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return int(flag.item())

    return reduce


class EqualSteps:
    """Wrap a loader so every rank of the process group yields the same number of batches per pass.

        loader = EqualSteps(ResumableLoader(DataLoader(online_ds, batch_size=1, num_workers=2,
                                                        collate_fn=collate)))
        for batch in loader:      # the same number of steps on every rank; fillers have no loss tokens
            ...

    Args:
        loader: any iterable of collated batches (a DataLoader, a ``ResumableLoader``). Its ``state_dict`` /
            ``load_state_dict`` / ``__len__`` pass through, so it resumes as the loader does.
        group: the ``torch.distributed`` process group (default: the world). Needs an initialized group
            unless ``reduce_max`` is given.
        reduce_max: replaces the all-reduce: maps this rank's flag (0/1) to the group's MAX. For a process
            group of your own making (or threads standing in for ranks, as the tests do).

    A rank that has had no batch at all by the time it must fill raises: with fewer packs than ranks, lower
    ``pool_size`` or use fewer ranks. The last real batch is kept between passes for exactly that reason.
    """

    def __init__(self, loader: Iterable[dict[str, Any]], *, group: Any = None,
                 reduce_max: Callable[[int], int] | None = None):
        self.loader = loader
        self.group = group
        self.reduce_max = reduce_max
        self._last: dict[str, Any] | None = None
        self.num_filler_batches = 0
        """Filler batches this rank yielded in the last pass."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        reduce = self.reduce_max or all_reduce_max(self.group)
        self.num_filler_batches = 0
        batches = iter(self.loader)
        exhausted = False
        while True:
            batch = None if exhausted else next(batches, None)
            exhausted = batch is None
            if not reduce(0 if exhausted else 1):
                return
            if batch is None:
                if self._last is None:
                    raise RuntimeError("this rank has no batch to copy as a filler: it got no rows at all while "
                                       "other ranks did (fewer packs than ranks); lower pool_size or use fewer ranks")
                batch = filler_batch(self._last)
                self.num_filler_batches += 1
            else:
                self._last = batch
            yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]
