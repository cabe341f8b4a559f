"""Training-time reader: ``PackedDataset`` streams shard rows, ``collate`` makes model inputs.

Split: every epoch has one global row order, a seeded permutation of row groups with each group's rows
permuted too (so reads stay sequential within a row group). Rank r takes the r-th contiguous slice of that
order, and DataLoader worker w the w-th contiguous slice of its rank's part: no row is read twice, none is
lost, and each worker decodes whole row groups once.

    order:   [g3: r2 r0 r1] [g0: r1 r0 r2] [g2: ...] ...      (seed, epoch)
    rank 0:  |------ first half ------|   rank 1: |---- second half ----|
    workers:  |-- w0 --|-- w1 --|              ...

Columns are decoded with Arrow offsets/values into numpy views (no per-token Python objects).

Exact resumption (docs/reliability.md). The state is the set of epoch-order positions already consumed, as
a few [start, end) intervals. A pass over the epoch reads the rank's remaining positions, split into
contiguous worker slices, each in order, so "worker w has delivered c rows" means "the first c positions
of w's slice". Who counts:

- ``torchdata``'s ``StatefulDataLoader`` calls ``state_dict()`` inside each worker after each batch and
  hands each worker its own state back on resume (the worker form: base intervals + its slice count);
- a plain ``DataLoader``: wrap it in ``ResumableLoader``. Every row carries ``(epoch, base, worker,
  num_workers, count)`` into ``collate``'s ``packer_state``; the wrapper records the batches the training
  loop has actually received (prefetched ones are not), and ``state_dict()`` turns the per-worker counts into
  intervals. Workers may finish at different times and deliver in any interleaving: counts are absolute.

A state from N workers resumes with any number of workers (the remaining rows are re-split), except that
StatefulDataLoader itself needs the same number.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.core.types import IGNORE_INDEX
from packer.shards.assemble import list_column
from packer.shards.io import ShardSet, open_shards

TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents")
READ_COLUMNS = [*TOKEN_COLUMNS, "mrope_position_ids", "images", "example_ids"]  # what a row needs
STATE_VERSION = 2  # version 1 (per-worker counts only) could not be read back in the main process

Intervals = tuple[tuple[int, int], ...]  # sorted, disjoint [start, end) ranges of epoch-order positions


@dataclass
class _Pass:
    """One pass over (the rest of) an epoch: where it started and how far each worker got."""

    epoch: int
    base: Intervals  # positions already consumed when the pass started
    num_workers: int
    counts: dict[int, int] = field(default_factory=dict)  # worker -> rows of its slice consumed
    pid: int = field(default_factory=os.getpid)  # a forked worker's copy of the main's pass is not its own


def _merge(intervals) -> Intervals:
    """Sorted, merged [start, end) intervals."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted positions -> the [start, end) intervals of their consecutive runs."""
    if len(positions) == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate([[0], breaks])]
    ends = positions[np.concatenate([breaks - 1, [len(positions) - 1]])] + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


class PackedDataset(IterableDataset):
    """Rows of a finished ``packer build`` as a torch ``IterableDataset``.

    Args:
        path: the build's output directory (must hold ``manifest.json``).
        rank, world_size: this process's data-parallel rank and the number of ranks.
        shuffle: a new deterministic order each epoch from (seed, epoch); False reads rows in shard order.
        seed: the shuffle seed.
        load_images: decode images in ``collate`` (False leaves only their metadata).
        image_root: re-root image paths recorded at build time (when the images moved).
    """

    def __init__(
        self,
        path: str | Path,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        *,
        load_images: bool = True,
        image_root: str | None = None,
    ):
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.shards: ShardSet = open_shards(path)
        self.rank, self.world_size, self.shuffle, self.seed = rank, world_size, shuffle, seed
        self.load_images, self.image_root = load_images, image_root
        self.epoch = 0
        self._pending: dict[str, Any] | None = None  # a loaded state, applied by the next pass
        self._pass: _Pass | None = None  # the pass this process iterates or tracks (ResumableLoader)
        cfg = self.shards.config
        self.profile = self.shards.manifest.get("profile", cfg.get("profile", "text"))
        self.profile_options = {"min_pixels": cfg.get("min_pixels"), "max_pixels": cfg.get("max_pixels")}
        # what collate needs to decode a row's images, attached to every row
        self._row_context = {"profile": self.profile, "profile_options": self.profile_options,
                             "load_images": load_images, "image_root": image_root}
        blocks = []  # (shard index, row group index, rows)
        for s in range(len(self.shards.shards)):
            meta = pq.ParquetFile(self.shards.shard_path(s)).metadata
            blocks.extend((s, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
        self._blocks = np.array(blocks, dtype=np.int64).reshape(-1, 3)
        self._block_start = np.concatenate([[0], np.cumsum(self._blocks[:, 2])]) if len(blocks) else np.zeros(1, np.int64)
        self.num_rows = int(self._block_start[-1])

    def __len__(self) -> int:
        """Rows this rank yields per epoch (all of its workers together)."""
        lo, hi = self._rank_range()
        return hi - lo

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order is read next (as with DistributedSampler.set_epoch)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._pending, self._pass = None, None

    # ------------------------------------------------------------------------------------ order/split
    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """The global row order of an epoch: global row indices (block order, then row order in a block)."""
        epoch = self.epoch if epoch is None else epoch
        n_blocks = len(self._blocks)
        if not self.shuffle:
            return np.arange(self.num_rows, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch])
        perm = rng.permutation(n_blocks)
        parts = [self._block_start[b] + rng.permutation(int(self._blocks[b, 2])) for b in perm]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _rank_range(self) -> tuple[int, int]:
        n = self.num_rows
        return n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size

    def worker_range(self, worker: int, num_workers: int) -> tuple[int, int]:
        """[lo, hi) positions in the epoch order read by one worker of this rank."""
        lo, hi = self._rank_range()
        span = hi - lo
        return lo + span * worker // num_workers, lo + span * (worker + 1) // num_workers

    def _remaining(self, base: Intervals) -> np.ndarray:
        """This rank's epoch-order positions not in ``base``, ascending."""
        lo, hi = self._rank_range()
        keep = np.ones(hi - lo, dtype=bool)
        for a, b in base:
            keep[max(a, lo) - lo : max(min(b, hi) - lo, 0)] = False
        return lo + np.flatnonzero(keep)

    @staticmethod
    def _slice(n: int, worker: int, num_workers: int) -> tuple[int, int]:
        return n * worker // num_workers, n * (worker + 1) // num_workers

    # ------------------------------------------------------------------------------------ state
    def _header(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "seed": self.seed, "shuffle": self.shuffle, "rank": self.rank,
                "world_size": self.world_size, "num_rows": self.num_rows, "epoch": self.epoch}

    def _consumed(self) -> Intervals:
        """Every position of this epoch consumed so far (main-process view)."""
        p = self._pass
        if p is None:
            if self._pending is None:
                return ()
            p = _Pass(self.epoch, self._pending["base"], self._pending.get("num_workers", 1))
            if "worker" in self._pending:
                p.counts[self._pending["worker"]] = self._pending["count"]
        remaining = self._remaining(p.base)
        taken = list(p.base)
        for w, c in p.counts.items():
            a, _ = self._slice(len(remaining), w, p.num_workers)
            taken += _runs(remaining[a : a + c])
        return _merge(taken)

    def state_dict(self) -> dict[str, Any]:
        """Resumable position: the epoch and the consumed positions of its order (docs/reliability.md).

        In the main process, what ``ResumableLoader`` (or the in-process iteration) has delivered. Inside a
        DataLoader worker (torchdata's StatefulDataLoader calls it there), that worker's own progress.
        """
        info = get_worker_info()
        if info is None:
            return {**self._header(), "consumed": [list(iv) for iv in self._consumed()]}
        if self._pass is not None and self._pass.pid == os.getpid():
            base, count = self._pass.base, self._pass.counts.get(info.id, 0)
        elif self._pending is not None:
            base = self._pending["base"]
            count = self._pending["count"] if self._pending.get("worker") == info.id else 0
        else:
            base, count = (), 0
        return {**self._header(), "consumed": [list(iv) for iv in base], "worker": info.id,
                "num_workers": info.num_workers, "count": count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next pass yields exactly the rows not yet consumed."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')} is not {STATE_VERSION}; it was saved by another "
                             "packer version and cannot be resumed exactly")
        for key in ("seed", "shuffle", "rank", "world_size", "num_rows"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state was saved with {key}={state[key]!r}, this dataset has {getattr(self, key)!r}; "
                                 "resume with the same shards, seed, shuffle, rank and world size")
        self.epoch = int(state["epoch"])
        self._pass = None
        self._pending = {"base": _merge(state["consumed"])}
        if "worker" in state:
            self._pending.update(worker=int(state["worker"]), num_workers=int(state["num_workers"]),
                                 count=int(state["count"]))

    def update(self, batch: dict[str, Any]) -> None:
        """Record that the training loop received ``batch`` (``ResumableLoader`` calls this for you)."""
        for st in batch.get("packer_state", ()):
            if st["epoch"] != self.epoch:
                continue  # a batch of an epoch this dataset has moved past
            base = tuple(tuple(iv) for iv in st["base"])
            p = self._pass
            if p is None or p.base != base or p.num_workers != st["num_workers"]:
                p = self._pass = _Pass(self.epoch, base, st["num_workers"])
                self._pending = None  # the workers have applied it
            p.counts[st["worker"]] = max(p.counts.get(st["worker"], 0), st["count"])

    def _new_pass(self) -> None:
        """Forget the tracked pass: a new iteration of the loader starts (from the pending state, if any)."""
        self._pass = None

    # ------------------------------------------------------------------------------------ reading
    def __iter__(self):
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        base, skip = (), 0
        if self._pending is not None:
            base = self._pending["base"]
            if "worker" in self._pending:  # one worker's own state (StatefulDataLoader hands each its own)
                if self._pending["num_workers"] != num_workers:
                    raise ValueError(f"a worker state saved with {self._pending['num_workers']} workers cannot resume "
                                     f"with {num_workers}; use the same num_workers")
                skip = self._pending["count"] if self._pending["worker"] == worker else 0
        self._pending = None
        remaining = self._remaining(base)
        a, b = self._slice(len(remaining), worker, num_workers)
        order = self.epoch_order()[remaining[a + skip : b]]
        state = _Pass(self.epoch, base, num_workers, {worker: skip})
        self._pass = state
        files: dict[int, pq.ParquetFile] = {}
        cached_block, decoded = -1, None
        count = skip
        blocks = np.searchsorted(self._block_start, order, side="right") - 1  # (n,) row group of each row
        in_block = order - self._block_start[blocks]
        for block, i in zip(blocks.tolist(), in_block.tolist(), strict=True):
            if block != cached_block:
                shard, group, _ = self._blocks[block]
                if shard not in files:
                    files[int(shard)] = pq.ParquetFile(self.shards.shard_path(int(shard)))
                decoded = _decode_block(files[int(shard)].read_row_group(int(group), columns=READ_COLUMNS))
                cached_block = block
            row = _row(decoded, i)
            row.update(self._row_context)
            count += 1
            state.counts[worker] = count  # before the yield: a state taken with this row delivered counts it
            row["_state"] = {"epoch": state.epoch, "base": base, "worker": worker, "num_workers": num_workers,
                             "count": count}
            yield row


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
        if not isinstance(loader.dataset, PackedDataset):
            raise TypeError("ResumableLoader needs a DataLoader over a PackedDataset")
        if getattr(loader, "persistent_workers", False):
            raise ValueError("ResumableLoader needs persistent_workers=False: persistent workers keep the dataset "
                             "state of their first epoch")
        self.loader = loader
        self.dataset: PackedDataset = loader.dataset

    def __iter__(self):
        self.dataset._new_pass()
        for batch in self.loader:
            self.dataset.update(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)


def _decode_block(table) -> dict[str, Any]:
    """A row group as numpy offsets/values per list column (views on Arrow buffers)."""
    out: dict[str, Any] = {"num_rows": table.num_rows}
    for name in TOKEN_COLUMNS:
        out[name] = list_column(table, name)
    mrope = table.column("mrope_position_ids")
    out["mrope_position_ids"] = None if mrope.null_count == table.num_rows else list_column(table, "mrope_position_ids")
    out["images"] = table.column("images").to_pylist()  # a few small structs per row
    out["example_ids"] = table.column("example_ids").to_pylist()
    return out


def _row(block: dict[str, Any], i: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name in TOKEN_COLUMNS:
        off, values = block[name]
        row[name] = values[off[i] : off[i + 1]]
    if block["mrope_position_ids"] is not None:
        off, values = block["mrope_position_ids"]
        row["mrope_position_ids"] = values[off[i] : off[i + 1]].reshape(-1, 3).T  # (3, T)
    row["images"] = block["images"][i]
    row["example_ids"] = block["example_ids"][i]
    return row


@lru_cache(maxsize=4)
def _profile(name: str, min_pixels: int | None, max_pixels: int | None):
    from packer.models import get_profile

    return get_profile(name, min_pixels=min_pixels, max_pixels=max_pixels)


def _image_ref(image: dict[str, Any], image_root: str | None):
    from packer.core.types import ImageRef

    if image["data"] is not None:
        return ImageRef(data=image["data"])
    path = image["source"]
    if image_root:
        path = str(Path(image_root) / Path(path).name)
    return ImageRef(path=path)


def _cat(rows: list[dict[str, Any]], key: str, shifts: np.ndarray | None = None) -> np.ndarray:
    """One column of all rows, each optionally shifted (a single row is used as is: no copy)."""
    if len(rows) == 1:
        return rows[0][key] if shifts is None else rows[0][key] + shifts[0]
    if shifts is None:
        return np.concatenate([r[key] for r in rows])
    return np.concatenate([r[key] + s for r, s in zip(rows, shifts, strict=True)])


def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate rows into one unpadded (1, T) batch with explicit boundaries (docs/format.md)."""
    row_start = np.cumsum([0] + [len(r["input_ids"]) for r in rows])  # (R+1,)
    labels_np = _cat(rows, "labels").astype(np.int64)  # (T,)
    input_ids = torch.from_numpy(_cat(rows, "input_ids").astype(np.int64))[None]  # (1, T)
    labels = torch.from_numpy(labels_np)[None]  # (1, T)
    pos = torch.from_numpy(_cat(rows, "position_ids").astype(np.int64))[None]  # (1, T)
    if len(rows) == 1:
        cu = rows[0]["cu_seqlens"]
        node_offsets, node_parents = rows[0]["node_offsets"], rows[0]["node_parents"]
    else:
        cu = np.concatenate([rows[0]["cu_seqlens"][:1]] + [r["cu_seqlens"][1:] + s for r, s in zip(rows, row_start[:-1], strict=True)])
        node_start = np.cumsum([0] + [len(r["node_offsets"]) for r in rows])
        node_offsets = _cat(rows, "node_offsets", row_start[:-1])
        node_parents = np.concatenate(
            [np.where(r["node_parents"] < 0, -1, r["node_parents"] + n) for r, n in zip(rows, node_start[:-1], strict=True)]
        )
    cu_t = torch.from_numpy(cu.astype(np.int32))  # (E+1,); a copy: Arrow-backed views are read-only
    max_seqlen = int(np.diff(cu).max()) if len(cu) > 1 else 0
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": pos,
        "cu_seqlens": cu_t,
        "max_seqlen": max_seqlen,
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
        "node_offsets": torch.from_numpy(node_offsets.astype(np.int32)),  # (N,)
        "node_parents": torch.from_numpy(node_parents.astype(np.int32)),  # (N,)
        "num_loss_tokens": int(np.count_nonzero(labels_np != IGNORE_INDEX)),
        "example_ids": [e for r in rows for e in r["example_ids"]],
    }
    if not (node_parents >= 0).any():  # linear rows: HF's own shifted loss is exact with these
        shift = np.empty_like(labels_np)
        shift[:-1] = labels_np[1:]  # example starts carry -100, so nothing crosses a boundary
        shift[-1:] = IGNORE_INDEX
        batch["shift_labels"] = torch.from_numpy(shift)[None]  # (1, T)
    if "mrope_position_ids" in rows[0]:
        mrope = np.concatenate([r["mrope_position_ids"] for r in rows], axis=1)  # (3, T)
        full = np.empty((4, 1, mrope.shape[1]), dtype=np.int64)  # (4, 1, T): text row, then t/h/w
        full[0, 0] = pos[0].numpy()
        full[1:, 0] = mrope
        batch["position_ids"] = torch.from_numpy(full)
    images = [im for r in rows for im in r["images"]]
    if images and rows[0].get("load_images", True):
        profile = _profile(rows[0]["profile"], **{k: v for k, v in rows[0]["profile_options"].items()})
        refs = [_image_ref(im, rows[0].get("image_root")) for im in images]
        batch.update(profile.pixel_values(refs))
    if images:  # first vision token of each image in the batch
        offsets = [im["offset"] + int(s) for r, s in zip(rows, row_start[:-1], strict=True) for im in r["images"]]
        batch["image_offsets"] = torch.tensor(offsets, dtype=torch.int64)
    if "_state" in rows[-1]:
        batch["packer_state"] = [r["_state"] for r in rows]
    return batch


def steps_per_epoch(dataset: PackedDataset, batch_size: int) -> int:
    """Batches this rank yields per epoch (each worker batches its own rows)."""
    return math.ceil(len(dataset) / batch_size)
