"""Training-time reader: ``PackedDataset`` streams the rows of a finished build as numpy views.

Split: every epoch has one global row order, a seeded permutation of row groups with each group's rows
permuted too (so reads stay sequential within a row group). Rank r takes the r-th contiguous slice of that
order, and DataLoader worker w the w-th contiguous slice of its rank's part: no row is read twice, none is
lost, and each worker decodes whole row groups once.

    order:   [g3: r2 r0 r1] [g0: r1 r0 r2] [g2: ...] ...      (seed, epoch)
    rank 0:  |------ first half ------|   rank 1: |---- second half ----|
    workers:  |-- w0 --|-- w1 --|              ...

Columns are decoded with Arrow offsets/values into numpy views (no per-token Python objects);
``packer.train.collate.collate`` turns rows into a batch, and ``packer.train.resume`` holds the state that
resumes an epoch exactly.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from torch.utils.data import IterableDataset, get_worker_info

from packer.shards.assemble import list_column
from packer.shards.io import ShardSet, open_shards
from packer.shards.schema import Manifest
from packer.train.resume import STATE_VERSION, EpochProgress, check_state

TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents")
READ_COLUMNS = [*TOKEN_COLUMNS, "mrope_position_ids", "images", "example_ids"]  # what a row needs


class PackedDataset(IterableDataset):
    """Rows of a finished ``packer build`` as a torch ``IterableDataset``.

    Args:
        path: the build's output directory (must hold ``manifest.json``).
        rank, world_size: this process's data-parallel rank and the number of ranks.
        shuffle: a new deterministic order each epoch from (seed, epoch); False reads rows in shard order.
        seed: the shuffle seed.
        load_images: decode images in ``collate`` (False leaves only their metadata).
        image_root: where the build's images are now (docs/training.md, "Images that moved"): an image keeps
            its path relative to the directory the build resolved it from (``--image-root``, else its JSONL
            file's directory) under this root; an image outside that directory (an absolute path in the
            input) keeps its path.
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
        image_root: str | Path | None = None,
    ):
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.shards: ShardSet = open_shards(path)
        self.rank, self.world_size, self.shuffle, self.seed = rank, world_size, shuffle, seed
        self.load_images = load_images
        self.image_root = None if image_root is None else os.path.abspath(image_root)
        manifest = self.shards.manifest
        self.profile = manifest.profile
        self.profile_options = manifest.config.profile_overrides()  # the build's family settings
        # what collate needs to decode a row's images, attached to every row
        self._row_context = {"profile": self.profile, "profile_options": self.profile_options,
                             "load_images": load_images}
        blocks = []  # (shard index, row group index, rows)
        for s in range(len(self.shards.shards)):
            meta = pq.ParquetFile(self.shards.shard_path(s)).metadata
            blocks.extend((s, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
        self._blocks = np.array(blocks, dtype=np.int64).reshape(-1, 3)
        self._block_start = np.concatenate([[0], np.cumsum(self._blocks[:, 2])]) if len(blocks) else np.zeros(1, np.int64)
        self.num_rows = int(self._block_start[-1])
        lo, hi = self.num_rows * rank // world_size, self.num_rows * (rank + 1) // world_size
        self.progress = EpochProgress(lo, hi)
        """The consumed positions of this rank's epoch (``packer.train.resume``)."""

    def __len__(self) -> int:
        """Rows this rank yields per epoch (all of its workers together)."""
        return self.progress.hi - self.progress.lo

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order is read next (as with DistributedSampler.set_epoch)."""
        self.progress.set_epoch(epoch)

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """The global row order of an epoch: global row indices (block order, then row order in a block)."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return np.arange(self.num_rows, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch])
        perm = rng.permutation(len(self._blocks))
        parts = [self._block_start[b] + rng.permutation(int(self._blocks[b, 2])) for b in perm]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def worker_range(self, worker: int, num_workers: int) -> tuple[int, int]:
        """[lo, hi) positions in the epoch order read by one worker of this rank."""
        lo, hi = self.progress.lo, self.progress.hi
        span = hi - lo
        return lo + span * worker // num_workers, lo + span * (worker + 1) // num_workers

    # ------------------------------------------------------------------------------------ state
    def _header(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "seed": self.seed, "shuffle": self.shuffle, "rank": self.rank,
                "world_size": self.world_size, "num_rows": self.num_rows, "epoch": self.epoch}

    def state_dict(self) -> dict[str, Any]:
        """Resumable position: the epoch and the consumed positions of its order (docs/reliability.md).

        In the main process, what ``ResumableLoader`` (or the in-process iteration) has delivered. Inside a
        DataLoader worker (torchdata's StatefulDataLoader calls it there), that worker's own progress.
        """
        info = get_worker_info()
        if info is None:
            return {**self._header(), **self.progress.state()}
        return {**self._header(), **self.progress.state(info.id, info.num_workers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next pass yields exactly the rows not yet consumed."""
        check_state(state, self._header())
        self.progress.load(state)

    def update(self, batch: dict[str, Any]) -> None:
        """Record that the training loop received ``batch`` (``ResumableLoader`` calls this for you)."""
        self.progress.update(batch.get("packer_state", ()))

    # ------------------------------------------------------------------------------------ reading
    def __iter__(self):
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        positions, state = self.progress.begin(worker, num_workers)
        order = self.epoch_order()[positions]
        files: dict[int, pq.ParquetFile] = {}
        cached_block, decoded = -1, None
        count = state.counts[worker]
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
            if self.image_root is not None and row["images"]:
                row["images"] = reroot_images(row, self.shards.manifest, self.image_root)
            row.update(self._row_context)
            count += 1
            state.counts[worker] = count  # before the yield: a state taken with this row delivered counts it
            row["_state"] = {"epoch": state.epoch, "base": state.base, "worker": worker, "num_workers": num_workers,
                             "count": count}
            yield row


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


# ---------------------------------------------------------------------------------------- images that moved
def reroot_images(row: dict[str, Any], manifest: Manifest, image_root: str) -> list[dict[str, Any]]:
    """The row's images with their paths moved under ``image_root`` (see ``PackedDataset``'s image_root).

    An image's build-time directory is the one its example's relative paths resolved against: the build's
    ``--image-root``, else the example's JSONL file's directory (the file is in its example id). Keeping the
    path relative to it, not just the file name, keeps ``train/1.jpg`` and ``val/1.jpg`` apart.
    """
    cu = row["cu_seqlens"]
    out = []
    for im in row["images"]:
        if not im["source"]:  # inline bytes
            out.append(im)
            continue
        example = int(np.searchsorted(cu, im["offset"], side="right")) - 1
        jsonl = row["example_ids"][example].rpartition(":")[0]  # ids are path:line or path:line#copy
        base = _build_image_dir(manifest.base_dir or os.getcwd(), manifest.config.image_root, jsonl)
        rel = os.path.relpath(im["source"], base)
        outside = rel == os.pardir or rel.startswith(os.pardir + os.sep)
        out.append(im if outside else {**im, "source": os.path.join(image_root, rel)})
    return out


@lru_cache(maxsize=256)
def _build_image_dir(base_dir: str, build_image_root: str | None, jsonl: str) -> str:
    """The directory the build resolved relative image paths of ``jsonl``'s records against (absolute)."""
    if build_image_root is not None:
        return os.path.abspath(os.path.join(base_dir, build_image_root))
    return os.path.dirname(os.path.abspath(os.path.join(base_dir, jsonl)))
