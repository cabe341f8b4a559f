"""Training-time reader: ``PackedDataset`` streams shard rows, ``collate`` makes model inputs.

Split: every epoch has one global row order, a seeded permutation of row groups with each group's rows
permuted too (so reads stay sequential within a row group). Rank r takes the r-th contiguous slice of that
order, and DataLoader worker w the w-th contiguous slice of its rank's part: no row is read twice, none is
lost, and each worker decodes whole row groups once.

    order:   [g3: r2 r0 r1] [g0: r1 r0 r2] [g2: ...] ...      (seed, epoch)
    rank 0:  |------ first half ------|   rank 1: |---- second half ----|
    workers:  |-- w0 --|-- w1 --|              ...

Columns are decoded with Arrow offsets/values into numpy views (no per-token Python objects).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .example import IGNORE_INDEX
from .shards import ShardSet, list_column, open_shards

TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents")


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
        self._start: dict[int, int] = {}  # worker id -> rows of this epoch already consumed (resume)
        self._consumed: dict[int, int] = {}
        cfg = self.shards.config
        self.profile = self.shards.manifest.get("profile", cfg.get("profile", "text"))
        self.profile_options = {"min_pixels": cfg.get("min_pixels"), "max_pixels": cfg.get("max_pixels")}
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
            self._start, self._consumed = {}, {}

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

    # ------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Resumable position: epoch and rows consumed per worker (see docs/reliability.md)."""
        return {"epoch": self.epoch, "seed": self.seed, "consumed": dict(self._consumed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration yields exactly the rows not yet consumed."""
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this dataset has seed {self.seed}")
        self.epoch = int(state["epoch"])
        self._start = {int(k): int(v) for k, v in state["consumed"].items()}
        self._consumed = dict(self._start)

    # ------------------------------------------------------------------------------------ reading
    def __iter__(self):
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        lo, hi = self.worker_range(worker, num_workers)
        skip = self._start.get(worker, 0)
        order = self.epoch_order()[lo + skip : hi]
        files: dict[int, pq.ParquetFile] = {}
        cached_block, decoded = -1, None
        count = skip
        for g in order.tolist():
            block = int(np.searchsorted(self._block_start, g, side="right") - 1)
            if block != cached_block:
                shard, group, _ = self._blocks[block]
                if shard not in files:
                    files[int(shard)] = pq.ParquetFile(self.shards.shard_path(int(shard)))
                decoded = _decode_block(files[int(shard)].read_row_group(int(group)))
                cached_block = block
            row = _row(decoded, g - int(self._block_start[block]))
            row["profile"] = self.profile
            row["profile_options"] = self.profile_options
            row["load_images"] = self.load_images
            row["image_root"] = self.image_root
            count += 1
            self._consumed[worker] = count
            row["_state"] = (worker, count, self.epoch)
            yield row
        # the epoch is done for this worker; the next iteration starts the next epoch from scratch
        self._start.pop(worker, None)


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
    from .vision import get_profile

    return get_profile(name, min_pixels=min_pixels, max_pixels=max_pixels)


def _image_ref(image: dict[str, Any], image_root: str | None):
    from .example import ImageRef

    if image["data"] is not None:
        return ImageRef(data=image["data"])
    path = image["source"]
    if image_root:
        path = str(Path(image_root) / Path(path).name)
    return ImageRef(path=path)


def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate rows into one unpadded (1, T) batch with explicit boundaries (docs/format.md)."""
    lengths = [len(r["input_ids"]) for r in rows]
    row_start = np.concatenate([[0], np.cumsum(lengths)])  # (R+1,)
    input_ids = torch.from_numpy(np.concatenate([r["input_ids"] for r in rows]).astype(np.int64))[None]  # (1, T)
    labels = torch.from_numpy(np.concatenate([r["labels"] for r in rows]).astype(np.int64))[None]  # (1, T)
    pos = torch.from_numpy(np.concatenate([r["position_ids"] for r in rows]).astype(np.int64))[None]  # (1, T)
    cu = np.concatenate([rows[0]["cu_seqlens"][:1]] + [r["cu_seqlens"][1:] + s for r, s in zip(rows, row_start[:-1], strict=True)])
    node_counts = [len(r["node_offsets"]) for r in rows]
    node_start = np.concatenate([[0], np.cumsum(node_counts)])
    node_offsets = np.concatenate([r["node_offsets"] + s for r, s in zip(rows, row_start[:-1], strict=True)])
    node_parents = np.concatenate(
        [np.where(r["node_parents"] < 0, -1, r["node_parents"] + n) for r, n in zip(rows, node_start[:-1], strict=True)]
    )
    cu_t = torch.from_numpy(cu.astype(np.int32))  # (E+1,)
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
        "num_loss_tokens": int((labels != IGNORE_INDEX).sum()),
        "example_ids": [e for r in rows for e in r["example_ids"]],
    }
    if not (node_parents >= 0).any():  # linear rows: HF's own shifted loss is exact with these
        shift = torch.full_like(labels, IGNORE_INDEX)
        shift[:, :-1] = labels[:, 1:]  # example starts carry -100, so nothing crosses a boundary
        batch["shift_labels"] = shift
    if "mrope_position_ids" in rows[0]:
        mrope = torch.from_numpy(np.concatenate([r["mrope_position_ids"] for r in rows], axis=1).astype(np.int64))
        batch["position_ids"] = torch.cat([pos, mrope], dim=0)[:, None, :]  # (4, 1, T): text row, then t/h/w
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
