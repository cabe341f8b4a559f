"""Training-time reader: ``PackedDataset`` streams the rows of a finished build as numpy views.

Split: every epoch has one global row order, a seeded permutation of row groups with each group's rows
permuted too (so reads stay sequential within a row group). It is padded to a multiple of the world size with
filler rows (or cut, ``drop_last``) so every rank gets the same N rows, hence the same number of batches for
any DataLoader: a rank with one batch more would wait at its all-reduce for peers that finished the epoch.
Rank r then reads row r of ``packer.train.data.rank_shares.deal``'s (W, N) matrix (balanced: rows of near-equal cost
at the same step on every rank), or, with ``balance=False``, the r-th contiguous slice of the order; DataLoader
worker w reads the w-th contiguous slice of its rank's N positions. No real row is read twice, none is lost.

    order:   [g3: r2 r0 r1] [g0: r1 r0 r2] [g2: ...] ... + fillers    (seed, epoch)
    balance=False:  rank 0: |---- first half ----|   rank 1: |---- second half ----|
    balance=True:   each window of W*window rows sorted by cost, dealt one cost-group per step
    workers:  |-- w0 --|-- w1 --|              (of the rank's N positions)

A filler row is a copy of a real row (the same tokens and images, so every rank runs the same forward and
the same parameters get gradients) with every label -100 and ``is_filler`` set: the loss and
``num_loss_tokens`` ignore it, and ``collate`` reports it (``num_filler_rows``, ``filler_examples``).

Columns are decoded with Arrow offsets/values into numpy views (no per-token Python objects);
``packer.train.data.collate.collate`` turns rows into a batch, and ``packer.train.data.resume`` holds the state that
resumes an epoch exactly.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.core.types import IGNORE_INDEX
from packer.shards.assemble import _list_parts, list_column
from packer.shards.io import ShardFile, ShardSet, open_shards
from packer.shards.schema import Manifest
from packer.train.data.rank_shares import CostWeights, deal, pad_order, read_row_stats
from packer.train.data.resume import STATE_VERSION, EpochProgress, check_state

TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents")
READ_COLUMNS = [*TOKEN_COLUMNS, "mrope_position_ids", "images", "videos", "example_ids", "example_sources"]
# schema v4: a row's loss weights (older shards: every loss weight is 1) and audio clips (older shards: none)
OPTIONAL_COLUMNS = ["loss_weights", "audios"]


class PackedDataset(IterableDataset):
    """Rows of a finished ``packer build`` as a torch ``IterableDataset``.

    Args:
        path: the build's output directory or object-store URL (must hold ``manifest.json``).
        rank, world_size: this process's data-parallel rank and the number of ranks.
        shuffle: a new deterministic order each epoch from (seed, epoch); False reads rows in shard order.
        seed: the shuffle seed.
        load_images: decode images in ``collate`` (False leaves only their metadata).
        image_root: where the build's media files are now (docs/training.md, "Images that moved"): an image,
            a video (its clip or frames) and an audio clip keep their path relative to the directory the build
            resolved them from (``--image-root``, else their JSONL file's directory) under this root; a file
            outside that directory (an absolute path in the input) keeps its path.
        drop_last: drop the epoch order's last ``n % world_size`` rows instead of adding filler rows.
        balance: deal rows so that every step holds rows of near-equal cost on every rank (``world_size`` > 1;
            reads the shards' ``num_tokens``, ``num_vision_tokens`` and ``cu_seqlens`` columns once, here).
            False: rank r reads the r-th contiguous slice of the order (fewer row-group decodes per rank).
        balance_window: rows per rank in one balancing window (the window is ``world_size`` times that many
            consecutive rows of the order); larger windows balance finer and reach further in the order.
        cost_weights: the cost model (``packer.train.data.rank_shares.CostWeights``; its docstring has the defaults).
        storage_options: fsspec options when ``path`` is an object-store URL (``s3://bucket/prefix``; unset:
            the standard AWS environment and config), as ``BuildConfig.storage_options``.

    Every rank yields ``len(self)`` rows, so every rank yields the same number of batches for the same
    DataLoader (``packer.train.data.collate.steps_per_epoch``), also after a resume (all ranks consumed the same
    number of batches, hence the same positions).
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
        drop_last: bool = False,
        balance: bool = True,
        balance_window: int = 32,
        cost_weights: CostWeights | None = None,
        storage_options: dict[str, Any] | None = None,
    ):
        super().__init__()
        self._options = dict(shuffle=shuffle, seed=seed, load_images=load_images, image_root=image_root,
                             drop_last=drop_last, balance=balance, balance_window=balance_window,
                             cost_weights=cost_weights, storage_options=storage_options)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.shards: ShardSet = open_shards(path, storage_options=storage_options)
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
            meta = self.shards.parquet(s).metadata
            blocks.extend((s, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
        self._blocks = np.array(blocks, dtype=np.int64).reshape(-1, 3)
        self._block_start = np.concatenate([[0], np.cumsum(self._blocks[:, 2])]) if len(blocks) else np.zeros(1, np.int64)
        self.num_rows = int(self._block_start[-1])
        """Real rows of the build (fillers not counted)."""
        if balance_window < 1:
            raise ValueError(f"balance_window must be >= 1, got {balance_window}")
        self.drop_last = drop_last
        self.balance = balance and world_size > 1  # one rank: every step is its own, nothing to balance
        self.balance_window = balance_window
        self.cost_weights = cost_weights or CostWeights()
        self._costs = read_row_stats(self.shards).costs(self.cost_weights) if self.balance else None
        per_rank = self.num_rows // world_size if drop_last else -(-self.num_rows // world_size)
        self.progress = EpochProgress(0, per_rank)
        """The consumed positions of this rank's epoch (``packer.train.data.resume``): indices into ``rank_plan``."""
        self._plan: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, rows, filler) cache

    def with_rank(self, rank: int, world_size: int) -> PackedDataset:
        """The same dataset (path and every option) read as ``rank`` of ``world_size``: what a trainer that learns
        its rank only when it starts (transformers' ``Trainer``, ``packer.train.trainers.trainer``) reads."""
        if (rank, world_size) == (self.rank, self.world_size):
            return self
        return PackedDataset(self.shards.root, rank=rank, world_size=world_size, **self._options)

    def __len__(self) -> int:
        """Rows this rank yields per epoch (all of its workers together), fillers included: equal on all ranks."""
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

    def epoch_plan(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's share of an epoch: (rows, filler), both (world_size, len(self)); rank r reads row r.

        ``rows`` are global row indices, ``filler`` marks the positions that yield a filler copy.
        """
        epoch = self.epoch if epoch is None else epoch
        rows, filler = pad_order(self.epoch_order(epoch), self.world_size, drop_last=self.drop_last)
        w = self.world_size
        if self.balance:
            rng = np.random.default_rng([self.seed, epoch, 1]) if self.shuffle else None
            cols = deal(self._costs[rows], w, window=self.balance_window, rng=rng)  # (W, N) padded positions
            return rows[cols], filler[cols]
        return rows.reshape(w, -1), filler.reshape(w, -1)

    def rank_plan(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """This rank's share of an epoch: (rows, filler), both (len(self),), in the order it reads them."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan[0] != epoch:
            rows, filler = self.epoch_plan(epoch)
            self._plan = (epoch, rows[self.rank].copy(), filler[self.rank].copy())
        return self._plan[1], self._plan[2]

    def worker_range(self, worker: int, num_workers: int) -> tuple[int, int]:
        """[lo, hi) positions of ``rank_plan`` read by one worker of this rank."""
        lo, hi = self.progress.lo, self.progress.hi
        span = hi - lo
        return lo + span * worker // num_workers, lo + span * (worker + 1) // num_workers

    # ------------------------------------------------------------------------------------ state
    def _header(self) -> dict[str, Any]:
        balance = ({"window": self.balance_window, "cost_weights": self.cost_weights.as_list()}
                   if self.balance else None)
        return {"version": STATE_VERSION, "seed": self.seed, "shuffle": self.shuffle, "rank": self.rank,
                "world_size": self.world_size, "num_rows": self.num_rows, "drop_last": self.drop_last,
                "balance": balance, "epoch": self.epoch}

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
        return self._iter_worker(worker, num_workers)

    def _iter_worker(self, worker: int, num_workers: int):
        """The rows one worker (of ``num_workers``) of this rank reads next, with their resume state."""
        positions, state = self.progress.begin(worker, num_workers)
        plan_rows, plan_filler = self.rank_plan()
        order, filler = plan_rows[positions], plan_filler[positions]
        blocks = np.searchsorted(self._block_start, order, side="right") - 1  # (n,) row group of each row
        # Read in chunks: a balanced window draws rows from many row groups, so each is decoded once per window
        # and its rows copied out; otherwise a chunk is a run of rows of one row group (views, no copy).
        keys = positions // self.balance_window if self.balance else blocks
        cuts = np.flatnonzero(np.diff(keys)) + 1
        files: dict[int, ShardFile] = {}
        count = state.counts[worker]
        for chunk in np.split(np.arange(len(order)), cuts):
            for k, row in zip(chunk.tolist(), self._read_chunk(files, order[chunk], blocks[chunk]), strict=True):
                if self.image_root is not None:
                    reroot_media(row, self.shards.manifest, self.image_root)
                if filler[k]:
                    row["labels"] = np.full_like(row["labels"], IGNORE_INDEX)
                    row.pop("loss_weights", None)
                row["is_filler"] = bool(filler[k])
                row.update(self._row_context)
                count += 1
                state.counts[worker] = count  # before the yield: a state taken with this row delivered counts it
                row["_state"] = {"epoch": state.epoch, "base": state.base, "worker": worker,
                                 "num_workers": num_workers, "count": count}
                yield row

    def _read_chunk(self, files: dict[int, ShardFile], order: np.ndarray, blocks: np.ndarray) -> list[dict]:
        """The rows ``order`` (global indices; row groups ``blocks``), decoding each row group once."""
        out: list[dict[str, Any] | None] = [None] * len(order)
        distinct = np.unique(blocks)
        copy = len(distinct) > 1  # views would keep every decoded row group of the window alive
        for block in distinct.tolist():
            shard, group, _ = (int(x) for x in self._blocks[block])
            if shard not in files:
                files[shard] = self.shards.parquet(shard)
            names = files[shard].schema_arrow.names
            columns = READ_COLUMNS + [c for c in OPTIONAL_COLUMNS if c in names]
            decoded = _decode_block(files[shard].read_row_group(group, columns=columns))
            for k in np.flatnonzero(blocks == block).tolist():
                out[k] = _row(decoded, int(order[k] - self._block_start[block]), copy=copy)
        return out  # type: ignore[return-value]


def _decode_block(table) -> dict[str, Any]:
    """A row group as numpy offsets/values per list column (views on Arrow buffers)."""
    out: dict[str, Any] = {"num_rows": table.num_rows}
    for name in TOKEN_COLUMNS:
        out[name] = list_column(table, name)
    mrope = table.column("mrope_position_ids")
    out["mrope_position_ids"] = None if mrope.null_count == table.num_rows else list_column(table, "mrope_position_ids")
    out["images"] = table.column("images").to_pylist()  # a few small structs per row
    out["videos"] = table.column("videos").to_pylist()
    out["audios"] = table.column("audios").to_pylist() if "audios" in table.column_names else None
    out["example_ids"] = table.column("example_ids").to_pylist()
    out["example_sources"] = table.column("example_sources").to_pylist()
    weights = table.column("loss_weights") if "loss_weights" in table.column_names else None
    out["loss_weights"] = None
    if weights is not None and weights.null_count < table.num_rows:
        off, values = _list_parts(weights)
        out["loss_weights"] = (off, values.to_numpy(zero_copy_only=False), weights.is_null().to_numpy(zero_copy_only=False))
    return out


def _row(block: dict[str, Any], i: int, *, copy: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {}
    take = np.array if copy else (lambda view: view)
    for name in TOKEN_COLUMNS:
        off, values = block[name]
        row[name] = take(values[off[i] : off[i + 1]])
    if block["mrope_position_ids"] is not None:
        off, values = block["mrope_position_ids"]
        row["mrope_position_ids"] = take(values[off[i] : off[i + 1]]).reshape(-1, 3).T  # (3, T)
    row["images"] = block["images"][i]
    row["videos"] = block["videos"][i]
    row["audios"] = [] if block["audios"] is None else block["audios"][i]
    row["example_ids"] = block["example_ids"][i]
    row["example_sources"] = block["example_sources"][i]
    if block["loss_weights"] is not None and not block["loss_weights"][2][i]:
        off, values, _ = block["loss_weights"]
        row["loss_weights"] = take(values[off[i] : off[i + 1]])
    return row


# ---------------------------------------------------------------------------------------- images that moved
def reroot_media(row: dict[str, Any], manifest: Manifest, image_root: str) -> None:
    """Move the row's images, videos (a clip, or each frame of a frame list) and audio clips under ``image_root``
    in place (see ``PackedDataset``'s image_root).

    A media file's build-time directory is the one its example's relative paths resolved against: the build's
    ``--image-root``, else the example's JSONL file's directory (the file is in its example id). Keeping the
    path relative to it, not just the file name, keeps ``train/1.jpg`` and ``val/1.jpg`` apart.
    """
    cu = row["cu_seqlens"]

    def move(path: str, offset: int) -> str:
        if not path:  # inline bytes
            return path
        example = int(np.searchsorted(cu, offset, side="right")) - 1
        jsonl = row["example_ids"][example].rpartition(":")[0]  # ids are path:line or path:line#copy
        base = _build_image_dir(manifest.base_dir or os.getcwd(), manifest.config.image_root, jsonl)
        rel = os.path.relpath(path, base)
        outside = rel == os.pardir or rel.startswith(os.pardir + os.sep)
        return path if outside else os.path.join(image_root, rel)

    row["images"] = [{**im, "source": move(im["source"], im["offset"])} for im in row["images"]]
    row["videos"] = [{**v, "source": move(v["source"], v["offset"]),
                      "frames": [move(f, v["offset"]) for f in v["frames"] or ()]} for v in row["videos"]]
    if row.get("audios"):
        row["audios"] = [{**a, "source": move(a["source"], a["offset"])} for a in row["audios"]]


@lru_cache(maxsize=256)
def _build_image_dir(base_dir: str, build_image_root: str | None, jsonl: str) -> str:
    """The directory the build resolved relative image paths of ``jsonl``'s records against (absolute)."""
    if build_image_root is not None:
        return os.path.abspath(os.path.join(base_dir, build_image_root))
    return os.path.dirname(os.path.abspath(os.path.join(base_dir, jsonl)))
