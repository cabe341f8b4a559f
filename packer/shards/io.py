"""Atomic shard and JSON writes, checksums, and opening a finished build (``ShardSet``), on a local disk or an
object store (``shards/store.py``: a path here is a ``Path`` or an ``ObjectPath``)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from packer.config import BuildConfig
from packer.errors import ShardError
from packer.shards import mrope
from packer.shards.schema import MANIFEST, Manifest, ShardEntry
from packer.shards.store import ObjectPath, open_input, store_path, write_atomic


def sha256_file(path: str | Path | ObjectPath) -> str:
    h = hashlib.sha256()
    with path.open("rb") if isinstance(path, ObjectPath) else open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def write_shard(tables: pa.Table | Iterable[pa.Table], path: str | Path | ObjectPath, *,
                rows_per_row_group: int) -> dict[str, Any]:
    """Write one shard atomically (temp name, fsync, rename; on a store: temp object, copy); return its
    manifest entry. ``tables``: its rows, or their slices in order (``SCHEMA``, each but the last a whole number
    of row groups: the file's bytes are then the whole table's), each written before the next is made."""
    if isinstance(tables, pa.Table):
        tables = (tables,)
    options = dict(compression="zstd", use_dictionary=["example_sources"],
                   write_statistics=["num_tokens", "num_loss_tokens", "num_vision_tokens"])
    if isinstance(path, ObjectPath):
        sink = pa.BufferOutputStream()
        rows = _write_parquet(tables, sink, rows_per_row_group, options)
        data = sink.getvalue().to_pybytes()
        write_atomic(path, data)
        return {"file": path.name, "rows": rows, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        rows = _write_parquet(tables, tmp, rows_per_row_group, options)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"file": path.name, "rows": rows, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def _write_parquet(tables: Iterable[pa.Table], where: Any, rows_per_row_group: int, options: dict[str, Any]) -> int:
    """``pq.write_table`` of the tables' concatenation (the same bytes where each slice but the last is a whole
    number of row groups); returns its rows."""
    rows, writer = 0, None
    try:
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(where, table.schema, **options)
            elif rows % rows_per_row_group:
                raise ValueError(f"a shard's slice starts at row {rows}, inside a row group of {rows_per_row_group}")
            writer.write_table(table, row_group_size=rows_per_row_group)
            rows += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ValueError("a shard needs rows")
    return rows


def write_json_atomic(path: str | Path | ObjectPath, obj: Any) -> None:
    """Write JSON to a temp file and rename it into place."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: str | Path | ObjectPath, text: str) -> None:
    """Write text (UTF-8) to a temp file and rename it into place."""
    write_atomic(store_path(path), text.encode("utf-8"))


@dataclass(frozen=True)
class ShardSet:
    """A finished build: its directory (or object-store prefix) and manifest."""

    root: Path | ObjectPath
    manifest: Manifest

    @property
    def shards(self) -> tuple[ShardEntry, ...]:
        return self.manifest.shards

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def shard_path(self, i: int) -> Path | ObjectPath:
        return self.root / self.shards[i].file

    def parquet(self, i: int) -> ShardFile:
        """Shard ``i`` opened for reading (footer read; row groups on demand)."""
        return parquet_file(self.shard_path(i))

    @property
    def config(self) -> BuildConfig:
        return self.manifest.config


class ShardFile:
    """A shard opened for reading: ``pyarrow.parquet.ParquetFile``'s reads, each table (or batch) passed through
    ``mrope.to_dense``, so every reader gets v5's dense ``mrope_position_ids`` from a v6 shard (the one place the
    sparse columns are read). Asking for ``mrope_position_ids`` reads v6's three columns in its place;
    ``schema_arrow`` and ``metadata`` are the file's own (what ``packer verify`` checks)."""

    def __init__(self, source: Any) -> None:
        self._file = pq.ParquetFile(source)
        self._sparse = mrope.RUNS in self._file.schema_arrow.names

    @property
    def schema_arrow(self) -> pa.Schema:
        return self._file.schema_arrow

    @property
    def metadata(self) -> Any:
        return self._file.metadata

    @property
    def num_row_groups(self) -> int:
        return self._file.num_row_groups

    def _columns(self, columns: list[str] | None) -> list[str] | None:
        if columns is None or not self._sparse or mrope.DENSE not in columns:
            return columns
        return [s for c in columns for s in (mrope.SPARSE_COLUMNS if c == mrope.DENSE else (c,))]

    def read(self, columns: list[str] | None = None, **kwargs: Any) -> pa.Table:
        return mrope.to_dense(self._file.read(columns=self._columns(columns), **kwargs))

    def read_row_group(self, i: int, columns: list[str] | None = None, **kwargs: Any) -> pa.Table:
        return mrope.to_dense(self._file.read_row_group(i, columns=self._columns(columns), **kwargs))

    def iter_batches(self, batch_size: int = 65536, columns: list[str] | None = None, **kwargs: Any):
        for batch in self._file.iter_batches(batch_size=batch_size, columns=self._columns(columns), **kwargs):
            yield from mrope.to_dense(pa.Table.from_batches([batch])).to_batches() if self._sparse else (batch,)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parquet_file(path: Path | ObjectPath) -> ShardFile:
    """A shard opened for reading, local or on an object store; its rows as every schema version from v5 reads
    (``ShardFile``)."""
    return ShardFile(open_input(path))


def read_shard(path: str | Path | ObjectPath, columns: list[str] | None = None) -> pa.Table:
    """A whole shard file as readers see it (``ShardFile.read``): a v6 shard's mRoPE positions dense."""
    with parquet_file(store_path(path)) as f:
        return f.read(columns=columns)


def open_shards(path: str | Path | ObjectPath, *, storage_options: dict[str, Any] | None = None) -> ShardSet:
    """Open a finished build (a directory, or an object-store URL: ``storage_options`` go to its fsspec
    filesystem); ShardError if the manifest is missing (unfinished build), of another version, or lacks a key a
    reader needs."""
    root = store_path(path, storage_options)
    if isinstance(root, Path) and not root.is_dir():
        raise ShardError(f"{root} is not a directory of packer shards")
    mpath = root / MANIFEST
    if not mpath.exists():
        raise ShardError(
            f"{root} has no {MANIFEST}: the build did not finish (or this is not a packer output). "
            "Rerun the same `packer build` command to complete it."
        )
    try:
        data = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShardError(f"{mpath} is unreadable: {e}") from e
    return ShardSet(root=root, manifest=Manifest.from_dict(data, where=str(mpath)))
