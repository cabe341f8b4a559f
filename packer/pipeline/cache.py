"""The encode cache: one Arrow IPC file per chunk of input lines, beside that chunk's rejects.

    OUT/.packer/encode/chunk-000000.arrow           EXAMPLE_SCHEMA rows (example-relative offsets)
    OUT/.packer/encode/chunk-000000.rejects.jsonl   the chunk's rejects, one JSON object per line

A chunk is committed by its ``.arrow`` file, renamed into place after its rejects: a chunk with rejects but no
``.arrow`` was interrupted and is encoded again. Token data stays on disk: the planner reads memory-mapped
length columns, the writer takes the rows of one shard file by file (``shards.assemble.take_rows``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from packer.errors import REJECT_REASONS, ShardError
from packer.pipeline.faults import Hooks
from packer.shards.assemble import take_rows
from packer.shards.schema import EXAMPLE_SCHEMA


@dataclass(frozen=True)
class ChunkCounts:
    """What one chunk of input lines became."""

    records: int  # non-blank lines
    encoded: int
    rejected: int


@dataclass(frozen=True)
class EncodeCache:
    """The cache of one build: ``num_chunks`` chunks under ``root`` (``OUT/.packer/encode``)."""

    root: Path
    num_chunks: int
    starts: np.ndarray | None = field(default=None, compare=False, repr=False)
    """(num_chunks + 1,) index of each chunk's first example in the whole cache, then the total; set by
    ``indexed()`` once every chunk is committed."""

    def arrow(self, i: int) -> Path:
        return self.root / f"chunk-{i:06d}.arrow"

    def rejects_file(self, i: int) -> Path:
        return self.root / f"chunk-{i:06d}.rejects.jsonl"

    def counts(self, i: int) -> ChunkCounts | None:
        """A committed chunk's counts; None if chunk ``i`` is not committed."""
        arrow, rejects = self.arrow(i), self.rejects_file(i)
        if not (arrow.exists() and rejects.exists()):
            return None
        with pa.memory_map(str(arrow)) as src:
            ids = ipc.open_file(src).read_all().column("example_id")
            n = len(ids)
            # a split text is one record but several rows: count its chunk 0 only (ids path:line@k, core/ids.py)
            later_chunks = pc.sum(pc.match_substring_regex(ids, r"@[1-9][0-9]*$")).as_py() or 0
        r = sum(1 for _ in open(rejects, "rb"))
        return ChunkCounts(records=n - later_chunks + r, encoded=n, rejected=r)

    def commit(self, i: int, table: pa.Table, rejects: list[dict[str, Any]], *, hooks: Hooks) -> None:
        """Write chunk ``i``: its rejects, then its rows (the commit), each atomically."""
        rej = self.rejects_file(i)
        tmp_rej = rej.with_name(rej.name + f".tmp-{os.getpid()}")
        tmp_rej.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rejects))
        os.replace(tmp_rej, rej)
        hooks.at("encode-partial", i)
        out = self.arrow(i)
        tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, EXAMPLE_SCHEMA) as writer:
            writer.write_table(table)
        os.replace(tmp, out)

    def open(self) -> pa.Table:
        """The whole cache as one memory-mapped table (token data is not read into memory)."""
        tables = [ipc.open_file(pa.memory_map(str(self.arrow(i)))).read_all() for i in range(self.num_chunks)]
        return pa.concat_tables(tables) if tables else EXAMPLE_SCHEMA.empty_table()

    def indexed(self) -> EncodeCache:
        """This cache with ``starts`` read from the chunk files' footers (what ``take`` needs)."""
        rows = []
        for i in range(self.num_chunks):
            with pa.memory_map(str(self.arrow(i))) as src:
                reader = ipc.open_file(src)
                rows.append(sum(reader.get_batch(b).num_rows for b in range(reader.num_record_batches)))
        return replace(self, starts=np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]))

    def take(self, sel: np.ndarray) -> pa.Table:
        """``open().take(sel)``, reading only the rows ``sel`` names, one chunk file at a time."""
        if self.starts is None:
            raise ValueError("EncodeCache.take needs indexed(): the chunk starts are not read yet")
        return take_rows([self.arrow(i) for i in range(self.num_chunks)], self.starts, sel)

    def rejects(self) -> list[dict[str, Any]]:
        """Every chunk's rejects, in chunk order; ShardError for a line that is not a reject (a corrupt cache)."""
        out = []
        for i in range(self.num_chunks):
            path = self.rejects_file(i)
            with open(path) as f:
                for n, line in enumerate(f, start=1):
                    try:
                        out.append(_checked_reject(line))
                    except ValueError as e:
                        raise ShardError(f"{path}:{n} {e}: the encode cache is corrupt; delete {self.root} and rerun "
                                         "the same command") from None
        return out


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
