"""The encode cache: one Arrow IPC file per chunk of input lines, beside that chunk's rejects.

    OUT/.packer/encode/chunk-000000.arrow           EXAMPLE_SCHEMA rows (example-relative offsets)
    OUT/.packer/encode/chunk-000000.rejects.jsonl   the chunk's rejects, one JSON object per line

A chunk is committed by its ``.arrow`` file, renamed into place after its rejects: a chunk with rejects but no
``.arrow`` was interrupted and is encoded again. Token data stays on disk: the planner reads memory-mapped
length columns, the writer takes the rows of one shard file by file (``shards.assemble.take_rows``).

On an object store (``shards/store.py``) the same files are objects: the planner reads only the columns it
needs of each (ranged reads), the writers memory-map this machine's copy of each chunk (``store.local_file``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from packer.core.media import MEDIA
from packer.errors import REJECT_REASONS, ShardError
from packer.pipeline.faults import Hooks
from packer.shards.assemble import learn_layouts, take_rows
from packer.shards.io import write_text_atomic
from packer.shards.schema import EXAMPLE_SCHEMA
from packer.shards.store import ObjectPath, write_atomic

CACHE_FORMAT = 3
"""The chunk files' layout (``EXAMPLE_SCHEMA``): 3 stores labels and 1-D positions only where they cannot be
derived (``shards.derived``: ``label_runs``), 2 stores mRoPE positions as the shards do (runs, bases, rest per
example), 1 (no ``format`` in the encode mark) stored them dense. In every encode fingerprint, so a build never
reuses another format's cache (it encodes again); ``packer repack`` refuses one, saying to rebuild."""

PLAN_COLUMNS = ("example_id", "source_name", "num_tokens", "num_loss_tokens", "loss_weight",
                *dict.fromkeys(c for m in MEDIA for c in (m.token_column, m.own_tokens_column) if c),
                *(m.count_column for m in MEDIA))
"""What ``EncodeCache.open`` reads: the plan, the budget rejects and the stats need no token data (each medium's
token and count columns: ``num_vision_tokens``, ``num_video_tokens``, ``num_audio_tokens``, ``num_images``, ...)."""


@dataclass(frozen=True)
class ChunkCounts:
    """What one chunk of input lines became."""

    records: int  # non-blank lines
    encoded: int
    rejected: int


@dataclass(frozen=True)
class EncodeCache:
    """The cache of one build: ``num_chunks`` chunks under ``root`` (``OUT/.packer/encode``)."""

    root: Path | ObjectPath
    num_chunks: int
    starts: np.ndarray | None = field(default=None, compare=False, repr=False)
    """(num_chunks + 1,) index of each chunk's first example in the whole cache, then the total; set by
    ``indexed()`` once every chunk is committed."""

    def arrow(self, i: int) -> Path | ObjectPath:
        return self.root / f"chunk-{i:06d}.arrow"

    def rejects_file(self, i: int) -> Path | ObjectPath:
        return self.root / f"chunk-{i:06d}.rejects.jsonl"

    def counts(self, i: int) -> ChunkCounts | None:
        """A committed chunk's counts; None if chunk ``i`` is not committed."""
        arrow, rejects = self.arrow(i), self.rejects_file(i)
        if not (arrow.exists() and rejects.exists()):
            return None
        with _open_ipc(arrow, columns=("example_id",)) as reader:
            ids = reader.read_all().column("example_id")
            n = len(ids)
            # a split text is one record but several rows: count its chunk 0 only (ids path:line@k, core/ids.py)
            later_chunks = pc.sum(pc.match_substring_regex(ids, r"@[1-9][0-9]*$")).as_py() or 0
        r = rejects.read_bytes().count(b"\n")
        return ChunkCounts(records=n - later_chunks + r, encoded=n, rejected=r)

    def commit(self, i: int, table: pa.Table, rejects: list[dict[str, Any]], *, hooks: Hooks) -> None:
        """Write chunk ``i``: its rejects, then its rows (the commit), each atomically."""
        write_text_atomic(self.rejects_file(i), "".join(json.dumps(r, sort_keys=True) + "\n" for r in rejects))
        hooks.at("encode-partial", i)
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, EXAMPLE_SCHEMA) as writer:
            writer.write_table(table)
        write_atomic(self.arrow(i), sink.getvalue().to_pybytes())

    def read(self, i: int, columns: tuple[str, ...] = PLAN_COLUMNS) -> pa.Table:
        """``columns`` of committed chunk ``i`` (memory-mapped, or only those bytes of an object): ``build``
        reads each chunk's as it is committed, while the workers encode the next."""
        with _open_ipc(self.arrow(i), columns=columns) as reader:
            return reader.read_all()

    def open(self, columns: tuple[str, ...] = PLAN_COLUMNS, *, parts: list[pa.Table] | None = None) -> pa.Table:
        """``columns`` of the whole cache as one table: memory-mapped on a local disk, only those columns'
        bytes read from an object store (by default the plan's: token data is never read). ``parts``: every
        chunk's ``read(i, columns)`` already, in chunk order (nothing is read again)."""
        tables = parts if parts is not None else [self.read(i, columns) for i in range(self.num_chunks)]
        schema = pa.schema([EXAMPLE_SCHEMA.field(c) for c in columns])
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def indexed(self, rows: list[int] | None = None) -> EncodeCache:
        """This cache with ``starts`` (what ``take`` needs), from ``rows`` (each chunk's row count, known
        from ``read``) or else read from the chunk files' footers."""
        if rows is None:
            rows = []
            for i in range(self.num_chunks):
                with _open_ipc(self.arrow(i)) as reader:
                    rows.append(sum(reader.get_batch(b).num_rows for b in range(reader.num_record_batches)))
        if len(rows) != self.num_chunks:
            raise ValueError(f"indexed: {len(rows)} row counts for {self.num_chunks} chunks")
        return replace(self, starts=np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]))

    def take(self, sel: np.ndarray, *, remember: bool = False) -> pa.Table:
        """``open().take(sel)``, reading only the rows ``sel`` names, one chunk file at a time (``remember``:
        ``take_rows``')."""
        if self.starts is None:
            raise ValueError("EncodeCache.take needs indexed(): the chunk starts are not read yet")
        return take_rows(self._files(), self.starts, sel, remember=remember)

    def learn_layouts(self) -> int:
        """Every local chunk file's layout remembered in this process, as ``take(..., remember=True)`` would
        learn it at a file's first visit, no row taken (``assemble.learn_layouts``); how many it learnt."""
        return 0 if isinstance(self.root, ObjectPath) else learn_layouts(self._files())

    def _files(self) -> list[str | ObjectPath]:
        return [self.arrow(i) for i in range(self.num_chunks)] if isinstance(self.root, ObjectPath) else \
            [os.path.join(self.root, f"chunk-{i:06d}.arrow") for i in range(self.num_chunks)]  # no Path per file

    def rejects(self) -> list[dict[str, Any]]:
        """Every chunk's rejects, in chunk order; ShardError for a line that is not a reject (a corrupt cache)."""
        out = []
        for i in range(self.num_chunks):
            path = self.rejects_file(i)
            for n, line in enumerate(path.read_text().splitlines(keepends=True), start=1):
                try:
                    out.append(_checked_reject(line))
                except ValueError as e:
                    raise ShardError(f"{path}:{n} {e}: the encode cache is corrupt; delete {self.root} and rerun "
                                     "the same command") from None
        return out


def write_ipc_atomic(path: Path | ObjectPath, table: pa.Table, metadata: dict[str, str]) -> None:
    """``table`` (EXAMPLE_SCHEMA) as an Arrow IPC file at ``path``, ``metadata`` in its schema, written under
    a temp name and moved into place (``store.write_atomic``'s rule): a local file streamed to disk (no copy
    of the table in memory), an object from a buffer."""
    table = table.replace_schema_metadata(metadata)
    if isinstance(path, ObjectPath):
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        write_atomic(path, sink.getvalue().to_pybytes())
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def committed_ipc(path: Path | ObjectPath, metadata: dict[str, str]) -> bool:
    """Is ``path`` a whole Arrow IPC file (``write_ipc_atomic``'s) whose schema holds ``metadata``? False
    for a missing file, one of other metadata, or bytes that are not an IPC file."""
    if not path.exists():
        return False
    try:
        with _open_ipc(path, columns=()) as reader:
            held = reader.schema.metadata or {}
    except (pa.ArrowException, OSError):
        return False
    return all(held.get(k.encode()) == v.encode() for k, v in metadata.items())


@contextmanager
def _open_ipc(path: Path | ObjectPath, *, columns: tuple[str, ...] | None = None) -> Iterator[ipc.RecordBatchFileReader]:
    """An Arrow IPC file's reader: a local file memory-mapped, an object read by ranges (the footer and only
    ``columns``' buffers)."""
    if isinstance(path, ObjectPath):
        source = path.open("rb", block_size=1 << 16)  # small reads: a column's buffers, not s3fs's 50 MB blocks
    else:
        source = pa.memory_map(str(path))
    with source:
        fields = None if columns is None else [EXAMPLE_SCHEMA.get_field_index(c) for c in columns]
        yield ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=fields))


def _checked_reject(line: str) -> dict[str, Any]:
    """One line of a chunk's rejects file; ValueError saying what is wrong with it."""
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        r = None
    if not (isinstance(r, dict) and isinstance(r.get("path"), str) and isinstance(r.get("line"), int)):
        raise ValueError(f"is not a reject record ({line.strip()[:80]!r})")
    if r.get("reason") not in REJECT_REASONS:
        raise ValueError(f"has reject reason {r.get('reason')!r}, not one of {', '.join(REJECT_REASONS)}")
    return r
