"""What the driver keeps of each encoded example: its lengths in the narrowest dtypes, nothing else.

The plan, the budget rejects, the stats and the card need a few numbers per example, not the cache's tables:
holding those tables (memory-mapped) kept every chunk file's pages resident, and converting their columns
to int64 / Python objects cost 8-70 B per column per example (1,155 B per example at 3M tiny records, issue
32). So each chunk's columns are read once, as it lands, into compact arrays, and the chunk file is let go:

    tokens, loss tokens     uint16 (max_length < 65,536; else uint32)                     2 + 2 B
    media counts            only the count columns (``MEDIA``) that hold a non-zero value  2 B each
                            (an item count, ``num_images``..., 1 B where a chunk's fit)
    source                  one per chunk (every file belongs to one source)              0 B
    loss weight             float64, only in a build where a weight differs from its loss tokens
    linear text             one bool per row, only in a chunk where some row is not linear text
    budget rejects          the rows over a budget or max_length (``overlong``), with their rejects

Example: ``cols = Columns.gather([read_chunk(cache, i, config) for i in range(n)], sources)``, then
``cols.tokens`` is what the planner reads.

What ``read_chunk`` reads of a chunk (``chunk_table``: a few numbers per row, whatever the build's options) is
also kept in one file, ``OUT/.packer/encode/columns.arrow`` (``ColumnsFile``), written as the encode stage reads
each chunk: a build that reuses the whole cache (``packer repack``, a rebuild with other packing options, a
resume past the encode stage) reads that file, not every chunk's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from packer.core.ids import id_location
from packer.core.media import BUDGETS, MEDIA
from packer.packing.budgets import budget_message, limits_of

COUNT_COLUMNS = tuple(dict.fromkeys(c for m in MEDIA for c in (m.token_column, m.own_tokens_column, m.count_column)
                                    if c))
"""Each medium's token and count columns (``num_vision_tokens``, ``num_images``, ...): kept where non-zero."""

_ITEM_COUNTS = frozenset(m.count_column for m in MEDIA)
"""The count columns of items (``num_images``, ...): uint8 where a chunk's fit (``read_chunk``)."""

_READ = ("num_tokens", "num_loss_tokens", "loss_weight", "loss_weights", "node_offsets", *COUNT_COLUMNS)
PLAIN = "plain"  # chunk_table's column: no per-node loss weights, one node (what read_chunk's linear needs of the lists)


def length_dtype(max_length: int) -> type:
    """uint16 while every length fits (max_length < 65,536): 2 bytes per example."""
    return np.uint16 if max_length < 2**16 else np.uint32


@dataclass(frozen=True)
class ChunkColumns:
    """One chunk's compact columns (``read_chunk``)."""

    tokens: np.ndarray
    loss_tokens: np.ndarray
    counts: dict[str, np.ndarray]  # COUNT_COLUMNS that hold a non-zero value in this chunk
    loss_weight: np.ndarray | None  # float64, where some row's weight differs from its loss tokens
    linear: np.ndarray | None  # bool per row (card's trl_exact); None: every row is linear text
    over: np.ndarray  # rows over a budget (int64, chunk-relative)
    rejects: list[dict[str, Any]]  # their rejects (``overlong``)


def read_chunk(cache: Any, i: int, config: Any, source: str, table: pa.Table | None = None) -> ChunkColumns:
    """Chunk ``i``'s compact columns, its budget rejects included; the chunk's file is closed on return.
    ``table``: its ``chunk_table`` already (``ColumnsFile``), else read from the chunk's file."""
    table = chunk_table(cache, i) if table is None else table
    dtype = length_dtype(config.max_length)
    tokens = _narrow(table.column("num_tokens"), dtype)
    loss_tokens = _narrow(table.column("num_loss_tokens"), dtype)
    counts = {}
    for name in COUNT_COLUMNS:
        values = table.column(name).to_numpy()
        if values.any():
            top = values.max()
            # a count (images per example) in one byte where the chunk's fit: the planners read it as it is
            # (issue 32: 1 byte per row off the driver's peak in every phase after the encode)
            counts[name] = values.astype(np.uint8 if name in _ITEM_COUNTS and top < 2**8
                                         else dtype if top < np.iinfo(dtype).max else np.uint32)
    weight = table.column("loss_weight").to_numpy()
    loss_weight = weight.astype(np.float64) if (weight != loss_tokens).any() else None
    linear = weight == loss_tokens
    for name in COUNT_COLUMNS:
        if name in counts:
            linear &= counts[name] == 0
    linear &= table.column(PLAIN).to_numpy(zero_copy_only=False)
    limits = np.array([np.iinfo(np.int64).max if v is None else v for v in limits_of(config)], dtype=np.int64)
    costs = np.stack([counts[b.column].astype(np.int64) if b.column in counts else np.zeros(len(tokens), np.int64)
                      for b in BUDGETS], axis=1) if counts else np.zeros((len(tokens), len(BUDGETS)), np.int64)
    # longer than max_length: a cache kept up to more (``--keep-up-to``, a repack); the encoder's own message
    long = tokens > config.max_length
    over = np.flatnonzero((costs > limits).any(axis=1) | long)
    rejects = []
    ids = cache.read(i, ("example_id",)).column("example_id") if len(over) else None
    for r in over.tolist():
        path, line = id_location(ids[r].as_py())
        rejects.append({"path": path, "line": line, "reason": "overlong", "source": source,
                        "message": f"{tokens[r]} tokens > --max-length {config.max_length}" if long[r]
                        else budget_message(config, costs[r].tolist())})
    return ChunkColumns(tokens=tokens, loss_tokens=loss_tokens, counts=counts, loss_weight=loss_weight,
                        linear=None if linear.all() else linear, over=over, rejects=rejects)


def chunk_table(cache: Any, i: int) -> pa.Table:
    """What ``read_chunk`` reads of chunk ``i``, whatever the build's options: the length, weight and count
    columns as the cache holds them, and ``PLAIN`` in place of the two list columns."""
    table = cache.read(i, _READ)
    plain = (table.column("loss_weights").is_null().to_numpy(zero_copy_only=False)
             & (pc.list_value_length(table.column("node_offsets")).to_numpy(zero_copy_only=False) == 1))
    return table.drop_columns(["loss_weights", "node_offsets"]).append_column(PLAIN, pa.array(plain, pa.bool_()))


def _narrow(column: pa.ChunkedArray, dtype: type) -> np.ndarray:
    values = column.to_numpy()
    return values.astype(dtype) if not len(values) or values.max() <= np.iinfo(dtype).max else values


@dataclass
class Columns:
    """Every chunk's compact columns, concatenated: (n,) arrays over the cache's rows, in cache order."""

    rows: np.ndarray  # (C,) rows per chunk
    sources: list[str]  # (C,) each chunk's source
    tokens: np.ndarray
    loss_tokens: np.ndarray | None  # None once ``stages.plan_packs`` summed it (``Plan.loss``)
    counts: dict[str, np.ndarray]  # COUNT_COLUMNS with a non-zero value anywhere
    loss_weight: np.ndarray | None
    linear: np.ndarray | None  # bool per row; None: every row linear text
    over: np.ndarray  # cache rows over a budget (sorted)
    rejects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def gather(cls, parts: list[ChunkColumns], sources: list[str]) -> Columns:
        """Concatenate ``parts`` (emptied as it goes)."""
        builder = ColumnsBuilder(sum(len(p.tokens) for p in parts))
        for p in parts:
            builder.add(p)
        parts.clear()
        return builder.finish(sources)

    def count(self, name: str) -> np.ndarray | None:
        """(n,) the count column ``name`` (``num_images``...), None where every row holds 0."""
        return self.counts.get(name)

    def source_codes(self, names: list[str]) -> np.ndarray:
        """(n,) each row's source as its index in ``names`` (uint8 while there are < 256 sources)."""
        codes = np.array([names.index(s) for s in self.sources], dtype=np.uint8 if len(names) < 256 else np.int32)
        return np.repeat(codes, self.rows)


class ColumnsBuilder:
    """``Columns`` filled chunk by chunk as they land: each chunk's arrays are copied into arrays of
    ``rows_hint`` rows allocated once (pages untouched until written, so a hint above the rows costs no
    memory), and freed; no per-chunk object outlives its ``add``. Grows (a copy) past the hint: a split
    text's chunks are rows beyond its one input line."""

    def __init__(self, rows_hint: int):
        self.n = 0
        self.rows: list[int] = []
        self.tokens: np.ndarray | None = None
        self.loss_tokens: np.ndarray | None = None
        self.counts: dict[str, np.ndarray] = {}
        self.loss_weight: np.ndarray | None = None
        self.linear: np.ndarray | None = None
        self.over: list[np.ndarray] = []
        self.rejects: list[dict[str, Any]] = []
        self._size = max(1, rows_hint)

    def _fit(self, a: np.ndarray | None, dtype: Any, fill: Any = None) -> np.ndarray:
        """``a`` with room for ``self._size`` rows of at least ``dtype`` (rows already in it kept)."""
        if a is not None and a.shape[0] >= self._size and np.can_cast(dtype, a.dtype):
            return a
        out = np.empty(self._size, dtype=dtype if a is None else np.result_type(a.dtype, dtype))
        if a is not None:
            out[: self.n] = a[: self.n]
        elif fill is not None:
            out[: self.n] = fill
        return out

    def add(self, part: ChunkColumns) -> None:
        k = len(part.tokens)
        start, end = self.n, self.n + k
        if end > self._size:
            self._size = max(end, 2 * self._size)
        self.tokens = self._fit(self.tokens, part.tokens.dtype)
        self.loss_tokens = self._fit(self.loss_tokens, part.loss_tokens.dtype)
        self.tokens[start:end] = part.tokens
        self.loss_tokens[start:end] = part.loss_tokens
        for name in set(self.counts) | set(part.counts):
            values = part.counts.get(name)
            # a chunk without the column keeps its dtype (a uint8 count stays one byte)
            self.counts[name] = self._fit(self.counts.get(name), self.counts[name].dtype if values is None
                                          else values.dtype, fill=0)
            self.counts[name][start:end] = 0 if values is None else values
        if part.loss_weight is not None or self.loss_weight is not None:
            if self.loss_weight is None:
                self.loss_weight = self._fit(None, np.float64)
                self.loss_weight[:start] = self.loss_tokens[:start]
            self.loss_weight = self._fit(self.loss_weight, np.float64)
            self.loss_weight[start:end] = part.loss_tokens if part.loss_weight is None else part.loss_weight
        if part.linear is not None or self.linear is not None:
            self.linear = self._fit(self.linear, bool, fill=True)
            self.linear[start:end] = True if part.linear is None else part.linear
        if len(part.over):
            self.over.append(part.over + start)
        self.rejects.extend(part.rejects)
        self.rows.append(k)
        self.n = end

    def finish(self, sources: list[str]) -> Columns:
        """The columns of every chunk added, in order; ``sources``: each chunk's source. The builder is spent:
        it lets its arrays go, so a column the ``Columns`` drops (``loss_tokens``) is freed."""
        n = self.n
        dtype = self.tokens.dtype if self.tokens is not None else np.uint16
        empty = np.zeros(0, dtype=dtype)
        columns = Columns(
            rows=np.array(self.rows, dtype=np.int64), sources=sources,
            tokens=empty if self.tokens is None else self.tokens[:n],
            loss_tokens=empty if self.loss_tokens is None else self.loss_tokens[:n],
            counts={c: self.counts[c][:n] for c in COUNT_COLUMNS if c in self.counts},
            loss_weight=None if self.loss_weight is None else self.loss_weight[:n],
            linear=None if self.linear is None else self.linear[:n],
            over=np.concatenate(self.over) if self.over else np.zeros(0, dtype=np.int64),
            rejects=sorted(self.rejects, key=lambda r: (r["path"], r["line"])))
        self.tokens = self.loss_tokens = self.loss_weight = self.linear = None
        self.counts = {}
        return columns


class ColumnsFile:
    """``OUT/.packer/encode/columns.arrow``: every chunk's ``chunk_table`` as one record batch, in chunk order
    (~14 bytes per example on disk, against the chunk files' kilobytes): one file to open where a build that
    reuses a whole cache would otherwise open every chunk's (docs/benchmarks.md, "Repack").

    ``write`` fills ``columns.arrow.tmp-PID`` and ``commit`` renames it into place; an interrupted build leaves
    only the temp file (``output.remove_stale_temp_files`` removes it). A local cache only: on an object store
    the chunks are read as before."""

    NAME = "columns.arrow"

    def __init__(self, root: Path):
        self.path = root / self.NAME
        self._tmp = root / f"{self.NAME}.tmp-{os.getpid()}"
        self._sink: Any = None
        self._writer: Any = None

    def write(self, table: pa.Table) -> None:
        """Append one chunk's ``chunk_table`` (a batch even for a chunk of no row: batch i is chunk i)."""
        if self._writer is None:
            self.path.unlink(missing_ok=True)  # an older cache's: never read beside the new chunks
            self._sink = pa.OSFile(str(self._tmp), "wb")
            # lz4: 14 B per example on disk instead of 41 (the count columns are mostly zeros), and faster to
            # read than the raw file (docs/benchmarks.md, "Repack")
            self._writer = ipc.new_file(self._sink, table.schema, options=ipc.IpcWriteOptions(compression="lz4"))
        self._writer.write_batch(pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns],
                                                            schema=table.schema))

    def commit(self) -> int:
        """Rename the file into place (after the last chunk's ``write``); its size in bytes."""
        if self._writer is None:
            return 0
        self._writer.close()
        self._sink.close()
        os.replace(self._tmp, self.path)
        self._writer = None
        return self.path.stat().st_size

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._tmp.unlink(missing_ok=True)
            self._writer = None

    def reader(self, num_chunks: int, size: int) -> Callable[[int], pa.Table] | None:
        """A function of i -> chunk i's ``chunk_table`` (memory-mapped); None where the file is not the one the
        encode mark names (``size`` bytes, ``num_chunks`` batches): missing, or of another cache."""
        if not self.path.is_file() or self.path.stat().st_size != size:
            return None
        reader = ipc.open_file(pa.memory_map(str(self.path)))
        if reader.num_record_batches != num_chunks:
            return None
        return lambda i: pa.Table.from_batches([reader.get_batch(i)])
