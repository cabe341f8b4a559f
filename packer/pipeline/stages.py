"""The stages of a build, as plain functions that know no executor:

    scan_chunks        input files -> chunks of CHUNK_LINES lines (byte ranges) or rows    in the parent
                       (a streamed file, formats/files.py: spilled as JSON-lines chunk files)
    encode_chunk       one chunk -> its rows and rejects in the encode cache             a task (any process)
    plan_packs         the compact length columns (columns.py) -> packs (order, bounds)   in the parent
    exchange_map       consecutive chunks -> their planned rows in write order             a task (any process)
                       (map_tasks: only for builds of many shards)
    write_shard_range  consecutive shards of the plan -> Parquet files + markers          a task (any process)
                       (each shard gathered, assembled and written a slice of row groups at a time)

The task stages are idempotent: a committed chunk is not encoded again, a committed map output of the same
positions is not written again, and a shard whose marker matches its file is not written again, so a resumed build, or an executor that retries a task, redoes only what is
missing. Each task writes its own files atomically and returns what it did; the same tasks give the same
bytes whatever runs them, in whatever order.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from packer.config import BuildConfig, make_encoder  # noqa: F401 (make_encoder: where callers found it before)
from packer.core.ids import copy_ids
from packer.core.location import absolute, parent_of, read_range
from packer.core.media import BUDGETS
from packer.errors import ConfigError, RecordError, StorageError
from packer.packing.budgets import FLAGS, VISION, limits_of
from packer.pipeline.cache import ChunkCounts, EncodeCache, committed_ipc, write_ipc_atomic
from packer.pipeline.columns import Columns, length_dtype
from packer.pipeline.faults import Hooks
from packer.report.stats import LossSums
from packer.shards import derived
from packer.shards.assemble import LAYOUTS_MAX, assemble_packs, encoded_table, take_rows
from packer.shards.io import sha256_file, shard_name, write_json_atomic, write_shard
from packer.shards.schema import WORK_DIR
from packer.shards.store import store_path

if TYPE_CHECKING:  # numba, which mixing's kernels import, is loaded by the plan only (not in workers); the encoder's
    # modules where one is made (config.make_encoder): not in a repack, which encodes nothing
    from packer.encode.encoder import Encoder
    from packer.packing.mixing import Sampled

CHUNK_LINES = 512  # lines per encode task: small enough to resume finely, large enough to amortize IPC
SLICE_TOKENS = 1 << 20  # most tokens a shard's write gathers and assembles at a time (``_assembled``)


def progress_bar(iterable=None, *, enabled: bool, **kw):
    return _bar_class()(iterable, disable=not enabled, dynamic_ncols=True, **kw)


@lru_cache(maxsize=1)
def _bar_class() -> type:
    """tqdm's bar without its monitor thread: a bar, even a disabled one, starts a thread that lives until the
    process exits, and a live thread makes the next build in this process spawn its workers instead of forking
    them (``local._forkable``)."""
    from tqdm.auto import tqdm

    return type("PackerBar", (tqdm,), {"monitor_interval": 0})


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Prefix a StorageError (an object or file that could not be read or written past its retries) with the
    stage and the unit of work it hit, and say that a rerun resumes."""
    try:
        yield
    except StorageError as e:
        raise StorageError(f"{name}: {e}; what is committed stays: rerun the command to resume") from e.__cause__


# ---------------------------------------------------------------------------------------------- scan
@dataclass(frozen=True)
class Chunk:
    """A contiguous range of records of one input file: lines of a JSONL file, rows of a table."""

    index: int
    path: str
    source: str
    start: int  # byte offset; for a table, 0-based row
    end: int  # byte offset (exclusive); for a table, row (exclusive)
    first_line: int  # 1-based number of the first line (row)
    num_lines: int = CHUNK_LINES  # lines in the chunk (blank ones included)
    table: bool = False  # a Parquet/Arrow file (formats/tables.py): start/end count rows
    spill: str = ""  # a streamed file's chunk (files.py) as JSON lines in the work dir: read this, not ``path``


def _table_chunks(path: str, source: str, first_index: int) -> list[Chunk]:
    """A table's rows in chunks of at most CHUNK_LINES rows: consecutive small row groups (record batches)
    merged, a big group cut in CHUNK_LINES pieces; counted from the file's metadata alone."""
    from packer.formats.tables import unit_rows

    chunks: list[Chunk] = []
    start = end = 0
    for n in unit_rows(path):
        if end > start and end - start + n > CHUNK_LINES:
            chunks.append(Chunk(first_index + len(chunks), path, source, start, end, start + 1, end - start, True))
            start = end
        group_end = end + n
        while group_end - start > CHUNK_LINES:  # a big group: split it
            chunks.append(Chunk(first_index + len(chunks), path, source, start, start + CHUNK_LINES, start + 1,
                                CHUNK_LINES, True))
            start += CHUNK_LINES
        end = group_end
    if end > start:
        chunks.append(Chunk(first_index + len(chunks), path, source, start, end, start + 1, end - start, True))
    return chunks


def streamed_inputs(config: BuildConfig) -> bool:
    """Does any input need ``files.records`` (compressed, an array, text, a tar)? Their chunks are spilled
    into the work dir, so ``build`` scans them once that dir is prepared."""
    from packer.formats.files import is_streamed
    from packer.formats.read import expand_inputs
    from packer.formats.tables import is_table

    return any(not is_table(p) and is_streamed(p) for s in config.sources for p in expand_inputs(s.paths))


def scan_chunks(config: BuildConfig, *, progress: bool = False, spill: str | None = None) -> list[Chunk]:
    """Split every input file into chunks of ``CHUNK_LINES`` lines, in source / file order; a streamed file
    (``streamed_inputs``) is read once and its records spilled as JSON-lines chunk files under ``spill``
    (``OUT/.packer/inputs``), kept for a resumed build."""
    with stage("scan"):
        return _scan(config, progress=progress, spill=spill)


def _scan(config: BuildConfig, *, progress: bool, spill: str | None) -> list[Chunk]:
    from packer.core.location import file_size, open_file
    from packer.formats.files import is_streamed
    from packer.formats.read import expand_inputs
    from packer.formats.tables import check_columns, is_table

    chunks: list[Chunk] = []
    seen: set[str] = set()
    streamed = 0
    for source in config.sources:
        for path in expand_inputs(source.paths):
            if path in seen:
                raise ConfigError(f"{path} is named by two sources; each file may belong to one source only")
            seen.add(path)
            if is_table(path):
                check_columns(path, config.column_map)
                chunks.extend(_table_chunks(path, source.name, len(chunks)))
                continue
            if is_streamed(path):
                if spill is None:
                    raise ConfigError(f"{path} is read as a stream (formats/files.py): scan it with a spill dir")
                chunks.extend(_spill_chunks(path, source.name, len(chunks), config=config, spill=spill,
                                            name=f"{streamed:05d}", progress=progress))
                streamed += 1
                continue
            size = file_size(path)
            with open_file(path) as f, progress_bar(
                total=size, enabled=progress, unit="B", unit_scale=True, desc=f"scan {Path(path).name}", leave=False
            ) as bar:
                start, line_no, lines = 0, 1, 0
                pos = 0
                for raw in f:
                    pos += len(raw)
                    lines += 1
                    if lines == CHUNK_LINES:
                        chunks.append(Chunk(len(chunks), path, source.name, start, pos, line_no))
                        bar.update(pos - start)
                        start, line_no, lines = pos, line_no + CHUNK_LINES, 0
                if lines:
                    chunks.append(Chunk(len(chunks), path, source.name, start, pos, line_no, lines))
                    bar.update(pos - start)
    return chunks


def _spill_chunks(path: str, source: str, first_index: int, *, config: BuildConfig, spill: str, name: str,
                  progress: bool) -> list[Chunk]:
    """A streamed file's records (``files.records``) as chunk files ``spill/NAME-JJJJJJ.jsonl`` of
    ``CHUNK_LINES`` records each, blank lines standing in for the numbers a record does not use (so line k
    of a chunk file is record ``first_line + k``, as in a JSONL chunk); ``spill/NAME.json`` lists them once
    all are written, and a resumed build reads that list instead of the file."""
    from packer.formats.files import records
    from packer.shards.store import store_path, write_atomic

    root = store_path(spill, config.storage_options)
    root.mkdir(parents=True, exist_ok=True)
    listing = root / f"{name}.json"
    if listing.exists():
        done = json.loads(listing.read_text())
        if done.get("input") == absolute(path):
            return [Chunk(first_index + j, path, source, 0, c["size"], c["first_line"], c["num_lines"],
                          spill=str(root / c["file"])) for j, c in enumerate(done["chunks"])]
    # a tar's videos become files beside the shards, which name them (on an object store: a temp dir, files.py)
    media_dir = str(root.parent.parent / "media") if isinstance(root, Path) else None
    entries: list[dict[str, Any]] = []
    lines: list[bytes] = []
    first = last = 0

    def flush() -> None:
        data = b"".join(line + b"\n" for line in lines)
        file = f"{name}-{len(entries):06d}.jsonl"
        write_atomic(root / file, data)
        entries.append({"file": file, "size": len(data), "first_line": first, "num_lines": last - first + 1})

    with progress_bar(enabled=progress, unit="rec", unit_scale=True, desc=f"scan {Path(path).name}",
                      leave=False) as bar:
        for number, raw in records(path, media_dir=media_dir):
            if not lines:
                first = number
            else:
                lines.extend([b""] * (number - last - 1))  # the blank lines between two records
            lines.append(raw)
            last = number
            if number - first + 1 >= CHUNK_LINES:
                flush()
                bar.update(len(lines))
                lines = []
        if lines:
            flush()
            bar.update(len(lines))
    write_json_atomic(listing, {"input": absolute(path), "chunks": entries})
    return [Chunk(first_index + j, path, source, 0, c["size"], c["first_line"], c["num_lines"],
                  spill=str(root / c["file"])) for j, c in enumerate(entries)]


# -------------------------------------------------------------------------------------------- encode
def _read_chunk_lines(chunk: Chunk, config: BuildConfig) -> Iterator[tuple[int, bytes]]:
    if chunk.spill:  # a streamed file's chunk, spilled by the scan
        data = store_path(chunk.spill, config.storage_options).read_bytes()
    else:
        data = read_range(chunk.path, chunk.start, chunk.end)
    lines = data.split(b"\n")  # the same rule the scan counted lines by (not splitlines: \r is no break)
    if lines and lines[-1] == b"":
        lines.pop()
    for i, raw in enumerate(lines):
        yield chunk.first_line + i, raw


def _chunk_records(chunk: Chunk, config: BuildConfig, base_dir: str, lines: list[tuple[int, bytes]] | None = None,
                   values: dict[int, Any] | None = None) -> Iterator[Any]:
    """Each record of the chunk parsed: an Example or a RecordError, in line (row) order; blank lines skipped.
    ``lines``: only these (line, bytes) of a JSONL chunk (``_encode_chunk``: those its text chats left), ``values``
    the JSON values of some of them, read there (``parse_lines``)."""
    from packer.formats import parse_record
    from packer.formats.read import parse_lines
    from packer.formats.tables import row_records

    options = config.record_options(chunk.source)  # a dataset_info source's mapping and media root
    if chunk.table:
        import pyarrow as pa

        try:
            rows = list(row_records(chunk.path, chunk.start, chunk.end))
        except (pa.ArrowException, OSError) as e:  # a file cut short or changed since the scan
            raise ConfigError(f"cannot read rows {chunk.start}..{chunk.end - 1} of {chunk.path}: {e}") from e
        for row, obj in enumerate(rows, start=chunk.first_line):
            try:
                yield parse_record(obj, path=chunk.path, line=row, base_dir=base_dir, source_name=chunk.source,
                                   **options)
            except RecordError as e:
                yield e if e.path else e.located(chunk.path, row)
        return
    yield from parse_lines(_read_chunk_lines(chunk, config) if lines is None else lines, path=chunk.path,
                           base_dir=base_dir, source_name=chunk.source, values=values, **options)


def _reject_record(err: RecordError, source: str) -> dict[str, Any]:
    return {"path": err.path, "line": err.line, "reason": err.reason, "message": err.message, "source": source}


def encode_chunk(
    chunk: Chunk, *, encoder: Encoder, cache: EncodeCache, config: BuildConfig, hooks: Hooks
) -> ChunkCounts:
    """Encode one chunk into the cache and return its counts; a committed chunk is not encoded again.

    Under ``config.strict`` the chunk's first bad record raises its RecordError (it pickles, so it reaches
    the parent from a worker intact).
    """
    with stage(f"encode (chunk {chunk.index}: {chunk.path} from line {chunk.first_line})"), collector_paused():
        return _encode_chunk(chunk, encoder=encoder, cache=cache, config=config, hooks=hooks)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off for a chunk's encode (what ``encode_chunk`` runs under). A chunk's records,
    messages and spans live until its table is written, so with the collector on every few hundred new ones
    made it walk them all again, and each full collection every object the worker holds unfrozen: a quarter of
    a chunk's CPU (docs/benchmarks.md, "Fast paths"). They hold no cycles: reference counts free them when the
    chunk is done; the few a chunk may leave (a reject's traceback) wait for the collector's next run after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _encode_chunk(chunk: Chunk, *, encoder: Encoder, cache: EncodeCache, config: BuildConfig,
                  hooks: Hooks) -> ChunkCounts:
    done = cache.counts(chunk.index)
    if done is not None:
        return done
    base_dir = parent_of(chunk.path)  # a URL's prefix for an input on a store: media resolve there, not locally
    taken, taken_lines, lines, values = _plain_columns(chunk, config, encoder)
    parsed: list[Any] = list(_chunk_records(chunk, config, base_dir, lines, values))  # Example or RecordError, in line order
    # One tokenizer call for the whole chunk: ~1.8x cheaper than one call per record (Encoder.encode_batch).
    examples = [p for p in parsed if not isinstance(p, RecordError)]
    results = iter(encoder.encode_batch(examples, rows=True) if examples else ())
    encoded, rejects, at = [], [], []
    for p in parsed:
        result = p if isinstance(p, RecordError) else next(results)
        if isinstance(result, RecordError):
            if config.strict:
                raise result
            rejects.append(_reject_record(result, chunk.source))
        else:  # one Encoded or batch-finish's Row, or a split text's chunks (ids path:line@k)
            for one in result if isinstance(result, list) else [result]:
                one.source_name = chunk.source
                encoded.append(one)
                at.append(p.line)
    if taken:
        encoded = _in_line_order(taken + encoded, taken_lines + at)
    table = encoded_table(encoded)
    cache.commit(chunk.index, table, rejects, hooks=hooks)
    return ChunkCounts(records=len(parsed) + len(taken), encoded=table.num_rows, rejected=len(rejects))


def _in_line_order(items: list[Any], lines: list[int]) -> list[Any]:
    """A chunk's rows (``items``: Rows of the plain-columns path's and the general path's batches, Encodeds;
    ``lines``: each one's input line) in line order, what the general path gives the whole chunk, every Row moved
    onto one Rows of all their batches (``finish.concat_rows``): ``encoded_table`` gathers them in one run, not
    one per stretch of a batch."""
    from packer.encode.finish import Row, concat_rows

    blocks = {id(one.block): one.block for one in items if isinstance(one, Row)}
    if len(blocks) > 1:
        merged, firsts = concat_rows(list(blocks.values()))
        first = dict(zip(blocks, firsts, strict=True))
        for one in items:
            if isinstance(one, Row):
                one.r += first[id(one.block)]
                one.block = merged
    order = np.array(lines, dtype=np.int64)
    if (order[1:] >= order[:-1]).all():
        return items
    return [items[k] for k in np.argsort(order, kind="stable").tolist()]


def _plain_columns(chunk: Chunk, config: BuildConfig, encoder: Encoder
                   ) -> tuple[list[Any], list[int], list[tuple[int, bytes]] | None, dict[int, Any] | None]:
    """A JSONL chunk's plain records finished as columns (``formats.read.text_chats``: chats of one-text messages
    by ``Encoder.encode_chats``, text records by ``Encoder.encode_texts``): their Rows and input lines, every
    other line for the general path, the records those left among them, in order (None where the encoder has no
    such path or the source maps its records: ``_chunk_records`` reads the chunk), and the JSON values of the
    other lines ``text_chats`` read (the general path does not read them again)."""
    options = config.record_options(chunk.source)
    if chunk.table or options["dataset"] is not None or options["columns"] or not encoder.takes_texts():
        return [], [], None, None
    from packer.encode.finish import Row
    from packer.formats.read import text_chats

    cols, rest = text_chats(_read_chunk_lines(chunk, config))
    block, records, rows = encoder.encode_chats(cols.nodes, cols.counts, cols.roles, cols.contents)
    docs, doc_rows = encoder.encode_texts(cols.docs)
    path, source = chunk.path, chunk.source
    taken: list[Any] = []
    lines: list[int] = []
    # (per kind: its Rows, the records taken, their rows there, every record's line and bytes; text record k is
    # row k of its Rows, so its records taken are its rows)
    for blk, recs, rs, at, raws in ((block, records, rows, cols.lines, cols.raws),
                                    (docs, doc_rows, doc_rows, cols.doc_lines, cols.doc_raws)):
        done = [at[k] for k in recs.tolist()]
        taken += [Row(blk, r, f"{path}:{line}", source) for line, r in zip(done, rs.tolist(), strict=True)]
        lines += done
        if len(done) < len(at):  # the records it left, back among the others
            left = np.ones(len(at), dtype=bool)
            left[recs] = False
            rest += [(at[k], raws[k]) for k in np.flatnonzero(left).tolist()]
    rest.sort()
    return taken, lines, rest, cols.values


# ---------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    """Which cached example goes in which pack, as ``packing.bulk.PackOrder`` holds it: the planned examples
    (an up-sampled example once per copy, in input order) grouped pack by pack in write order. 4 bytes per
    example (``order``) above the lengths, not pack ids + their argsort (issue 32); a sampled build adds one
    byte per cache row (``sampled``: each row's copies), not a row and a copy number per planned example."""

    sampled: Sampled | None  # each cache row's copies in the plan; None: every cache row once, in order
    order: np.ndarray  # (n,) planned examples, pack 0's first; inside a pack in increasing index
    bounds: np.ndarray  # (P + 1,) pack p holds order[bounds[p]:bounds[p + 1]]
    columns: Columns  # the cache's compact columns (stats, card)
    loss: LossSums | None = None  # the loss tokens' sums, where plan_packs let their column go

    @property
    def num_examples(self) -> int:
        return int(self.order.shape[0])

    @property
    def pack_sizes(self) -> np.ndarray:
        """(P,) examples per pack."""
        return np.diff(self.bounds.astype(np.int64))

    def planned(self, values: np.ndarray | None) -> np.ndarray | None:
        """(n,) ``values`` (one per cache row) of each planned example (a copy where sources were sampled)."""
        return values if values is None or self.sampled is None else self.sampled.planned(values)

    @property
    def lengths(self) -> np.ndarray:
        """(n,) tokens (columns.length_dtype) of each planned example."""
        return self.planned(self.columns.tokens)

    def rows(self, planned: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(cache row, copy number or None: no copy) of each of the ``planned`` examples."""
        if self.sampled is None:
            return planned, None
        rows, copies = self.sampled.locate(planned)
        return rows, copies if copies.any() else None

    def cost(self, j: int) -> np.ndarray | None:
        """(n,) budget ``j``'s count (``BUDGETS`` order) per planned example; None where every one is 0."""
        return self.planned(self.columns.count(BUDGETS[j].column))

    @property
    def vision(self) -> np.ndarray | None:
        """(n,) vision tokens, None where there are none."""
        return self.cost(VISION)

    def stats_columns(self, names: list[str]) -> dict[str, Any]:
        """``compute_stats``' lengths, vision, loss tokens and weights, sources (codes into ``names``, None for
        one source) per cache row, with ``sampled``: the stats weight each row by its copies, so no column is
        made per planned example (issue 32: 8.75 bytes per cache row at 1.25 copies)."""
        columns = self.columns
        many = len(set(columns.sources)) > 1
        return {"lengths": columns.tokens, "vision": columns.count(BUDGETS[VISION].column),
                "loss_tokens": columns.loss_tokens if self.loss is None else self.loss,
                "loss_weight": columns.loss_weight,
                "sources": columns.source_codes(names) if many else None,
                "source_names": names if many else columns.sources[:1], "sampled": self.sampled}


def plans_tokens_only(config: BuildConfig) -> bool:
    """Whether ``plan_packs`` plans with ``plan_bulk`` (tokens-only best fit): no budget, no ``balance_vision``,
    no ``max_examples_per_pack``. ``warm_planner`` loads that planner's kernels only then."""
    return (config.algorithm in BULK_ALGORITHMS and config.algorithm not in ("next-fit", "ffd")
            and not config.balance_vision and not _used(config) and config.max_examples_per_pack is None)


def plan_packs(columns: Columns, config: BuildConfig) -> Plan:
    """Sample the sources by weight, then plan every kept example (the rows over a budget or ``max_length`` left
    out) from the
    compact length columns alone: ``packing.bulk.plan_bulk`` for tokens-only best fit, ``refine`` included (4
    bytes per example), ``packing.bulk_budgets.plan_budgeted`` with budgets or ``max_examples_per_pack``,
    ``plan_first_fit`` / ``plan_next_fit`` for ``ffd`` / ``next-fit`` (refine included), and
    ``packing.bulk_balance.plan_balanced`` with ``balance_vision``, and ``separate_copies_bulk`` for up-sampled
    copies (the same plans as ``packing.plan`` and ``mixing.separate_copies``, ~4-8 bytes per example),
    ``packing.plan`` for the ``binpacking`` reference only."""
    from packer.packing.mixing import Sampled, sample_counts, separate_copies

    n = columns.num_rows
    names = [s.name for s in config.sources]
    weights = [(names.index(s.name), s.weight) for s in config.sources]
    counts = None  # (n,) copies of each row planned, where sources are sampled or rows left out
    # a cache kept up to more (--keep-up-to, a repack) is sampled as the cache of this max_length would be:
    # over the rows that fit only (those longer are rejects, ``columns.read_chunk``)
    fits = None if columns.tokens.max(initial=0) <= config.max_length else columns.tokens <= config.max_length
    if any(w != 1.0 for _, w in weights):
        codes = columns.source_codes(names)
        if fits is None:
            counts = sample_counts(codes, weights, seed=config.seed)
        else:
            counts = np.zeros(n, dtype=np.uint8)
            drawn = sample_counts(codes[fits], weights, seed=config.seed)
            counts = counts.astype(drawn.dtype, copy=False)
            counts[fits] = drawn
            del drawn
        del codes
    if len(columns.over):  # one byte per row, not np.isin's sort or int64 rows
        if counts is None:
            counts = np.ones(n, dtype=np.uint8)
        counts[columns.over] = 0
    sampled = None if counts is None else Sampled.of(counts)
    copies = sampled is not None and int(counts.max(initial=0)) > 1
    del counts
    loss = None
    if columns.loss_weight is None and columns.loss_tokens is not None:
        # the stats read the loss tokens only as sums (per source, weighted by the copies): made now, and the
        # column let go before the planner runs (2 bytes per cache row off the driver's peak, issue 32)
        loss = LossSums.of(columns.loss_tokens, None if sampled is None else sampled.counts, columns.rows.tolist(),
                           [names.index(s) if s in names else -1 for s in columns.sources])
        columns.loss_tokens = None
    limits = limits_of(config)
    used = _used(config)
    if config.algorithm in BULK_ALGORITHMS:
        # plan()'s plan (and separate_copies' swaps) at bulk memory, pack ids included, without plan()'s (n,)
        # int64 arrays (~44 bytes per example tokens-only with refine, ~110 with budgets, ~450 with copies: their
        # Python rows) or pack ids + their argsort: plan_bulk tokens-only (over the planned lengths),
        # plan_next_fit, plan_first_fit and plan_budgeted with budgets or max_examples_per_pack, reading the
        # rows' columns through ``sampled``'s counts (no per-planned-example array but the plan itself).
        from packer.packing.bulk import plan_bulk
        from packer.packing.bulk_budgets import (
            plan_budgeted,
            plan_first_fit,
            plan_next_fit,
            separate_copies_bulk,
        )

        if config.balance_vision:  # the vision tokens balanced, bounded or not: the bounded budgets planned
            used = [j for j in used if limits[j] is not None]
        cols = [columns.count(BUDGETS[j].column) for j in used]
        counts = None if sampled is None else sampled.counts
        if config.balance_vision:  # plan(balance=...)'s plan: the bulk candidates of balance.balanced
            from packer.packing.bulk_balance import plan_balanced

            packs = plan_balanced(columns.tokens, config.max_length, vision=columns.count(BUDGETS[VISION].column),
                                  costs=cols, limits=[limits[j] for j in used], names=[FLAGS[j] for j in used],
                                  vision_at=used.index(VISION) if VISION in used else -1, counts=counts,
                                  max_examples=config.max_examples_per_pack, algorithm=config.algorithm,
                                  refine=config.refine, seed=config.seed)
        elif config.algorithm in ("next-fit", "ffd"):  # plan(algorithm=...)'s packs, refine included
            planner = plan_next_fit if config.algorithm == "next-fit" else plan_first_fit
            packs = planner(columns.tokens, config.max_length, costs=cols, limits=[limits[j] for j in used],
                            names=[FLAGS[j] for j in used], counts=counts, max_examples=config.max_examples_per_pack,
                            refine=config.refine, seed=config.seed)
        elif plans_tokens_only(config):
            lengths = columns.tokens if sampled is None else sampled.planned(columns.tokens)
            packs = plan_bulk(lengths, config.max_length, seed=config.seed, refine=config.refine)
            del lengths
        else:
            packs = plan_budgeted(columns.tokens, config.max_length, costs=cols, limits=[limits[j] for j in used],
                                  names=[FLAGS[j] for j in used], counts=counts,
                                  max_examples=config.max_examples_per_pack, refine=config.refine, seed=config.seed)
        if copies:  # copies apart, by separate_copies' swaps (the bounded budgets: all of ``used``)
            packs = separate_copies_bulk(packs, sampled, columns.tokens, capacity=config.max_length,
                                         seed=config.seed, costs=cols, limits=[limits[j] for j in used])
        return Plan(sampled=sampled, order=packs.order, bounds=packs.bounds, columns=columns, loss=loss)
    index = None if sampled is None else sampled.index()  # the row of each planned example
    lengths = columns.tokens if index is None else columns.tokens[index]
    costs = np.zeros((len(lengths), len(used)), dtype=np.int64)  # (n, b) the per-example planner's input
    for c, j in enumerate(used):
        values = columns.count(BUDGETS[j].column)
        if values is not None:
            costs[:, c] = values if index is None else values[index]
    pack_ids = _plan(config, lengths.astype(np.int64), costs)
    if copies:  # the same swaps: separate_copies checks only the bounded budgets, all among ``used``
        pack_ids = separate_copies(index, pack_ids, lengths.astype(np.int64), costs=costs,
                                   limits=[limits[j] for j in used], capacity=config.max_length, seed=config.seed)
    del costs, index, lengths
    order = np.argsort(pack_ids, kind="stable").astype(np.int32 if len(pack_ids) < 2**31 else np.int64)
    sizes = np.bincount(pack_ids, minlength=int(pack_ids.max()) + 1 if len(pack_ids) else 0)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(order.dtype)
    return Plan(sampled=sampled, order=order, bounds=bounds, columns=columns, loss=loss)


BULK_ALGORITHMS = ("bfd", "ffd", "next-fit")
"""The algorithms ``plan_packs`` plans at bulk memory (``balance_vision`` included); the ``binpacking`` reference
takes ``packing.plan``."""


def _used(config: BuildConfig) -> list[int]:
    """The budgets (``BUDGETS`` indices) the planner sees: those ``config`` sets, and the vision tokens where it
    balances them."""
    return [j for j, limit in enumerate(limits_of(config))
            if limit is not None or (j == VISION and config.balance_vision)]


def _plan(config: BuildConfig, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """``packing.plan`` with ``config``'s options: (n,) pack id per example. ``costs``: (n, len(_used(config)))
    only the budgets the planner sees, not all of them (8 bytes per example each)."""
    from packer.packing import plan

    limits = limits_of(config)
    used = _used(config)
    return plan(
        lengths, config.max_length, costs=costs, limits=[limits[j] for j in used],
        names=[FLAGS[j] for j in used], algorithm=config.algorithm,
        balance=used.index(VISION) if config.balance_vision else None,
        max_examples=config.max_examples_per_pack, refine=config.refine, seed=config.seed,
    )


class _NoPandas:
    """A finder that answers "absent" for pandas (``arrow_without_pandas``)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas: not for pyarrow in this process (stages.arrow_without_pandas)")
        return None


class _NoScipyLinalg:
    """A finder that answers "absent" for ``scipy.linalg`` to one thread's imports (``numba_without_scipy``)."""

    def __init__(self, thread: int):
        self.thread = thread

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if (name == "scipy.linalg" or name.startswith("scipy.linalg.")) and threading.get_ident() == self.thread:
            raise ImportError("scipy.linalg: not for numba's start in this thread (stages.numba_without_scipy)")
        return None


@contextmanager
def numba_without_scipy() -> Iterator[None]:
    """numba's CPU target, where it starts inside this block (a process's first kernel load or compile), started
    without ``scipy.linalg``: numba imports it there (~0.25 of the ~0.75 CPU-s that start costs on the bench box,
    numpy.f2py included: docs/benchmarks.md, "Repack") only to decide, once per process, whether ``np.correlate``
    and ``np.convolve`` of floats call BLAS (``numba.np.arraymath._HAVE_BLAS``); no packer kernel uses them.
    What else numba does with BLAS (``np.dot``, ``np.linalg`` in a kernel) imports scipy when that kernel is
    compiled, as before. Only the calling thread's imports are refused, only while numba has not started; a
    process that holds scipy.linalg already is left alone."""
    import sys

    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        yield
        return
    finder = _NoScipyLinalg(threading.get_ident())
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def arrow_without_pandas() -> None:
    """Tell pyarrow, before its first conversion, that pandas is absent from this process (and the workers it
    forks later): pyarrow imports pandas (~0.2 CPU-s, ~40 MiB resident, docs/benchmarks.md) at its first
    ``to_numpy`` or ``pa.array`` only to ask whether the object is a pandas one, and asks once per process.

    Only for a build that reads nothing but packer's own files (a reused encode cache: ``packer repack``, a
    rebuild with other packing options), whose shards are then the same bytes: without pandas pyarrow gives
    nanosecond timestamps as ``datetime`` (or an error), not ``pandas.Timestamp``, which a user's Parquet rows
    could hold. pandas stays importable: ``import pandas`` and pyarrow's ``to_pandas`` still load it."""
    import sys

    if "pandas" in sys.modules:  # loaded already: pyarrow uses it, at no further cost
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # pyarrow's one attempt at ``import pandas`` fails, and it does not retry
    finally:
        sys.meta_path.remove(finder)


def warm_planner(config: BuildConfig) -> None:
    """Load what ``plan_packs`` will need (numba and its cached kernels for ``config``'s options, pandas,
    which pyarrow imports at its first ``to_numpy`` unless ``arrow_without_pandas`` ran) by planning one
    example; ``build`` runs this in a thread while the workers encode, so those imports and kernel loads leave
    the plan's critical path.

    Example: ``warm_planner(config)`` then ``plan_packs(columns, config)``: the same plan,
    without the loads. Errors are left to the real plan, which raises them with the real data.
    """
    with numba_without_scipy():
        _warm_planner(config)


def _warm_planner(config: BuildConfig) -> None:
    one = np.ones(1, dtype=np.int64)
    try:
        pa.chunked_array([pa.array([1], pa.int64())]).to_numpy()
        if config.algorithm not in BULK_ALGORITHMS:  # plan()'s per-example kernels
            _plan(config, one, np.zeros((1, len(_used(config))), dtype=np.int64))
        from packer.packing.bulk import PackOrder, plan_bulk

        dtype = length_dtype(config.max_length)
        used = _used(config)
        limits = limits_of(config)
        if plans_tokens_only(config):  # plan_bulk's kernels (~10 CPU-s to compile) for the build's dtype
            plan_bulk(one.astype(dtype), config.max_length)

        def zeros(k: int) -> list[np.ndarray]:  # each budget's column in read_chunk's dtype (an item count: uint8)
            return [np.zeros(k, dtype if BUDGETS[j].tokens else np.uint8) for j in used]

        if config.balance_vision and config.algorithm in BULK_ALGORITHMS:  # plan_balanced's kernels
            from packer.packing.bulk_balance import plan_balanced

            bound = [j for j in used if limits[j] is not None]
            for counts in (None, np.ones(3, dtype=np.uint8)):
                plan_balanced(np.full(3, 2, dtype=dtype), 3, vision=np.array([1, 1, 0], dtype=dtype),
                              costs=[np.zeros(3, dtype if BUDGETS[j].tokens else np.uint8) for j in bound],
                              limits=[limits[j] for j in bound], vision_at=bound.index(VISION) if VISION in bound
                              else -1, counts=counts, max_examples=config.max_examples_per_pack,
                              algorithm=config.algorithm, refine=config.refine)
        elif config.algorithm in ("next-fit", "ffd"):  # their bulk kernels (every row planned, or some left out)
            from packer.packing.bulk_budgets import plan_first_fit, plan_next_fit

            planner = plan_next_fit if config.algorithm == "next-fit" else plan_first_fit
            for counts in (None, np.ones(3, dtype=np.uint8)):  # three packs of one: refine's kernels run
                planner(np.full(3, 2, dtype=dtype), 3, costs=zeros(3),
                        limits=[limits[j] or 1 for j in used], counts=counts,
                        max_examples=config.max_examples_per_pack, refine=config.refine)
        elif used or config.max_examples_per_pack is not None:
            from packer.packing.bulk_budgets import plan_budgeted

            three = np.full(3, 2, dtype=dtype)  # three examples of 2 in packs of 3: three packs, refine's kernels run
            for counts in (None, np.ones(3, dtype=np.uint8)):  # every row planned once, or through counts
                plan_budgeted(three, 3, costs=zeros(3), limits=[limits[j] or 1 for j in used],
                              counts=counts, max_examples=config.max_examples_per_pack, refine=config.refine)
        if any(s.weight != 1.0 for s in config.sources):  # up-sampled copies: separate_copies_bulk's kernels
            from packer.packing.bulk_budgets import separate_copies_bulk
            from packer.packing.mixing import Sampled

            two = PackOrder(order=np.arange(2, dtype=np.int32), bounds=np.array([0, 2], dtype=np.int32))  # 2 in 1
            separate_copies_bulk(two, Sampled.of(np.full(1, 2, np.uint8)), np.ones(1, dtype), capacity=config.max_length,
                                 seed=0, costs=zeros(1), limits=[limits[j] or 1 for j in used])
    except Exception:  # noqa: BLE001 - only a warm-up: plan_packs reports any problem with the real lengths
        return


# ------------------------------------------------------------------------------------------ exchange
EXCHANGE_MIN_SHARDS = 4  # fewer shards: each writer reads the chunk files itself (few visits in all)
EXCHANGE_MIN_FAN = 4  # the exchange runs only where each map output stands for this many chunk files or more
EXCHANGE_MIN_VISITS = 16_384
"""Where one process writes every shard, the exchange runs only where shards x chunk files reach this: below it
the writers read the chunk files themselves, each file's layout remembered after its first visit
(``take_rows(remember=True)``, ~0.2 ms a visit), and that costs less than writing and reading every planned row
once more (200k examples, 8 shards x 391 files: a repack 10.2 -> 6.7 CPU-s; docs/benchmarks.md, "Repack")."""


@dataclass(frozen=True)
class MapTask:
    """One map task of the exchange: the cache chunks ``first_chunk`` .. ``end_chunk - 1`` read once, their
    planned examples written in write order (``exchange/map-NNNNNN.arrow``), so that each shard's rows are
    one contiguous section of each map output. With writer groups (consecutive shards written on one machine:
    ``Executor.write_groups``) one output per group (``map-NNNNNN-gGGGG.arrow``), so that a machine downloads
    only its groups' rows from an object store."""

    index: int
    first_chunk: int
    end_chunk: int  # exclusive
    rows: np.ndarray | None  # (k,) cache row of each of its planned examples (input order); None: every row once
    positions: np.ndarray  # (k,) write position of each (its place in ``Plan.order``)
    group_starts: tuple[int, ...] = (0,)  # the first write position of each writer group


@dataclass(frozen=True)
class Exchange:
    """Where a shard's rows are in the map outputs: what a writer needs instead of the chunk files."""

    root: Any  # OUT/.packer/exchange (a Path or an ObjectPath)
    cache_starts: np.ndarray  # (M + 1,) first cache row each map task reads, then the total
    out_starts: np.ndarray  # (M + 1,) first row of each map output in their concatenation, then the total
    sections: np.ndarray  # (shards of the range, M) where each shard's rows start in each map output
    # (``ShardRanges`` counts them as it makes the ranges: the driver holds no (M, S) table)
    group: int = 0  # the range's writer group: its map outputs are the group's (``MapTask``)
    groups: int = 1

    def take(self, sel: np.ndarray, j: int, *, remember: bool = False) -> pa.Table:
        """``cache.take(sel)`` for the range's shard ``j`` (``sel``: its cache rows in write order), read
        from one contiguous section of each map output."""
        return take_rows(self._files(), self.out_starts, self._where(sel, j), remember=remember)

    def gather(self, sel: np.ndarray, j: int) -> Callable[[int, int], pa.Table]:
        """``take`` in parts: a function of (a, b) -> ``take(sel)``'s rows a..b, each map output's layout kept
        from its first visit (``take_rows``' ``remember``: a shard's slices visit the same few files)."""
        files, where = self._files(), self._where(sel, j)
        return lambda a, b: take_rows(files, self.out_starts, where[a:b], remember=True)

    def _where(self, sel: np.ndarray, j: int) -> np.ndarray:
        """Each row's index in the map outputs' concatenation."""
        m = np.searchsorted(self.cache_starts, sel, side="right") - 1  # (k,) map task of each row
        by_map = np.argsort(m, kind="stable")  # the shard's rows map by map, each map's in write order
        ms = m[by_map]
        rank = np.arange(len(ms)) - np.searchsorted(ms, ms)  # k-th row of the shard from map m
        where = np.empty(len(sel), dtype=np.int64)
        where[by_map] = self.out_starts[ms] + self.sections[j][ms] + rank
        return where

    def _files(self) -> list[Any]:
        return [map_file(self.root, i, self.group, self.groups) for i in range(len(self.out_starts) - 1)]


def exchange_dir(cache: EncodeCache) -> Any:
    """OUT/.packer/exchange, beside the encode cache: the map outputs, deleted once every shard is written."""
    return cache.root.parent / "exchange"


def map_file(root: Any, i: int, group: int = 0, groups: int = 1) -> Any:
    return root / (f"map-{i:06d}.arrow" if groups == 1 else f"map-{i:06d}-g{group:04d}.arrow")


def writer_groups(shards: int, groups: int) -> np.ndarray:
    """(G + 1,) the first shard of each of ``groups`` writer groups of consecutive shards (as even as they
    divide), then ``shards``; one group of every shard where there are fewer shards than groups."""
    g = max(1, min(groups, shards))
    return (np.arange(g + 1, dtype=np.int64) * shards) // g


def map_tasks(plan: Plan, starts: np.ndarray, *, rows_per_shard: int, one_process: bool = False,
              groups: int = 1) -> tuple[list[MapTask], np.ndarray] | None:
    """The exchange's map tasks for ``plan`` over a cache whose chunk ``c`` starts at row ``starts[c]``, and
    the write position of each planned example (4 bytes per example, held while the map tasks run); None
    where the writers should read the chunk files themselves (few shards, few chunks per map output, or, where
    ``one_process`` writes every shard, fewer than ``EXCHANGE_MIN_VISITS`` shards x chunk files whose layouts
    it can remember). ``groups``: writer groups (``writer_groups``), each map task's output split by group.

    A map task reads consecutive chunks holding about one shard's examples (n / shards), so it holds no more
    than a writer does, and the files a writer opens drop from the chunks (n / 512) to the map outputs
    (about the number of shards)."""
    n, shards = plan.num_examples, -(-len(plan.pack_sizes) // rows_per_shard)
    num_chunks = len(starts) - 1
    if shards < EXCHANGE_MIN_SHARDS or n == 0:
        return None
    if one_process and shards * num_chunks < EXCHANGE_MIN_VISITS and num_chunks <= LAYOUTS_MAX:
        return None
    target = max(1, -(-int(starts[-1]) // shards))  # cache rows per map task
    edges = [0]
    for c in range(1, num_chunks):
        if starts[c] - starts[edges[-1]] >= target:
            edges.append(c)
    edges.append(num_chunks)
    if (len(edges) - 1) * EXCHANGE_MIN_FAN > num_chunks:
        return None
    positions = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
    for a in range(0, n, 1 << 20):  # the inverse of ``order``, a block at a time (no (n,) arange)
        b = min(n, a + (1 << 20))
        positions[plan.order[a:b]] = np.arange(a, b, dtype=positions.dtype)
    first = writer_groups(shards, groups)[:-1] * rows_per_shard  # each group's first pack
    group_starts = tuple(int(x) for x in plan.bounds[np.minimum(first, len(plan.pack_sizes))])
    tasks = []
    for i, (c0, c1) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        r0, r1 = int(starts[c0]), int(starts[c1])
        if plan.sampled is None:
            lo, hi, rows = r0, r1, None
        else:  # planned examples are in input order: those of these chunks are one slice
            lo, hi = plan.sampled.first(r0), plan.sampled.first(r1)
            rows = r0 + plan.sampled.index_part(r0, r1)
        tasks.append(MapTask(i, c0, c1, rows, positions[lo:hi], group_starts))
    return tasks, positions


def exchange_map(task: MapTask, *, cache: EncodeCache, hooks: Hooks) -> tuple[int, ...]:
    """Run one map task: write its planned examples in write order, one output per writer group that has
    rows (atomically: a half-written output is a temp file, never the map output), unless a committed output
    of the same positions is there; return how many rows each group's holds. An output's metadata holds the
    sha256 of its positions, so an output of another plan is never read as this one's."""
    with stage(f"exchange (map {task.index}: chunks {task.first_chunk}..{task.end_chunk - 1})"):
        return _exchange_map(task, cache=cache, hooks=hooks)


def _exchange_map(task: MapTask, *, cache: EncodeCache, hooks: Hooks) -> tuple[int, ...]:
    import hashlib

    by_position = np.argsort(task.positions, kind="stable")
    positions = task.positions[by_position].astype(np.int64)
    groups = len(task.group_starts)
    cuts = np.searchsorted(positions, [*task.group_starts, np.iinfo(np.int64).max]).tolist()  # each group's rows
    todo = []  # (path, first row, end row, key) of each group's output not committed yet
    for g in range(groups):
        a, b = cuts[g], cuts[g + 1]
        if a == b:  # no row for this group: no output
            continue
        key = hashlib.sha256(positions[a:b].tobytes()).hexdigest()
        path = map_file(exchange_dir(cache), task.index, g, groups)
        if not committed_ipc(path, {"positions_sha256": key}):
            todo.append((path, a, b, key))
    if todo:
        a0, b0 = todo[0][1], todo[-1][2]  # the rows that go to an output: read from the chunks once
        starts = cache.starts[task.first_chunk : task.end_chunk + 1]
        part = by_position[a0:b0]
        rows = part if task.rows is None else task.rows[part] - starts[0]
        table = take_rows([cache.arrow(c) for c in range(task.first_chunk, task.end_chunk)], starts - starts[0],
                          rows)
        del rows
        for path, a, b, key in todo:
            write_ipc_atomic(path, table.slice(a - a0, b - a), {"positions_sha256": key})
        hooks.at("exchange", task.index)
    return tuple(b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True))


# --------------------------------------------------------------------------------------------- write
@dataclass(frozen=True)
class ShardRange:
    """Consecutive shards of a plan, self-contained: writing them needs nothing else of the plan."""

    first: int  # index of the first shard
    pack_sizes: np.ndarray  # (P,) examples per pack, the range's packs in write order
    examples: np.ndarray  # (sum(pack_sizes),) cache row of each example, pack by pack
    copies: np.ndarray | None  # (sum(pack_sizes),) copy number of each; None: no copy
    exchange: Exchange | None = None  # where the rows are in the exchange's map outputs; None: the cache's chunks
    remember: bool = False  # this process writes the other ranges too: take_rows keeps each file's layout


@dataclass(frozen=True)
class ShardRanges(Sequence[ShardRange]):
    """A plan's shard ranges, one per shard (progress and resume are per shard), each made when it is read:
    as its write task is sent, so the driver never holds every shard's rows and copy numbers at once (issue
    32: int32 + uint8 per planned example with up-sampled copies). Without sampling a range's examples are a
    view of ``plan.order``. ``write_shard_range`` takes longer ranges too.

    With the exchange, where shard s's rows start in each map output of its writer group is the rows of the
    group's shards before s read from it: counted as the ranges are made, each group's in order (one (M,) count
    a group; a range made out of order counts again from its group's first shard), never an (M, S) table (at 1B
    ~39k x 39k, ~12 GB of int64)."""

    plan: Plan
    rows_per_shard: int
    remember: bool = False  # every range is written by one process: take_rows keeps each file's layout
    exchange: MapOutputs | None = None  # each range's ``Exchange``; None: the cache's chunks
    _counted: dict[int, _Counted] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return -(-(len(self.plan.bounds) - 1) // self.rows_per_shard)

    @property
    def num_examples(self) -> int:
        return self.plan.num_examples

    def num_packs(self, s: int) -> int:
        """Packs in range ``s`` (without making it)."""
        return min(len(self.plan.bounds) - 1, (s + 1) * self.rows_per_shard) - s * self.rows_per_shard

    def group(self, s: int) -> int:
        """The writer group of range ``s`` (``Executor.write_groups``): 0 without the exchange or groups."""
        if self.exchange is None:
            return 0
        return int(np.searchsorted(self.exchange.group_first, s, side="right")) - 1

    @property
    def groups(self) -> int:
        return 1 if self.exchange is None else len(self.exchange.group_first) - 1

    def __getitem__(self, s: int) -> ShardRange:  # type: ignore[override]
        n = len(self)
        if not -n <= s < n:
            raise IndexError(s)
        s %= n
        examples, copies = self.plan.rows(self._planned(s))
        found = None
        if (outputs := self.exchange) is not None:
            g = self.group(s)
            found = Exchange(outputs.root, outputs.cache_starts, outputs.out_starts[g],
                             self._sections(s, g, examples)[None, :], g, self.groups)
        p0 = s * self.rows_per_shard
        sizes = np.diff(self.plan.bounds[p0 : p0 + self.num_packs(s) + 1].astype(np.int64))
        return ShardRange(first=s, pack_sizes=sizes, examples=examples, copies=copies, exchange=found,
                          remember=self.remember)

    def _planned(self, s: int) -> np.ndarray:
        """Shard ``s``'s planned examples, in write order (a view of ``plan.order``)."""
        p0 = s * self.rows_per_shard
        return self.plan.order[self.plan.bounds[p0] : self.plan.bounds[p0 + self.num_packs(s)]]

    def _sections(self, s: int, g: int, examples: np.ndarray) -> np.ndarray:
        """(M,) where shard ``s``'s rows (``examples``, its cache rows) start in each map output of group ``g``."""
        cache_starts = self.exchange.cache_starts
        m = len(cache_starts) - 1

        def read(rows: np.ndarray) -> np.ndarray:  # how many rows each map output gives them
            return np.bincount(np.searchsorted(cache_starts, rows, side="right") - 1, minlength=m)

        with self._lock:
            counted = self._counted.setdefault(g, _Counted())
            if counted.before is None or s < counted.next:
                counted.before, counted.next = np.zeros(m, dtype=np.int64), int(self.exchange.group_first[g])
            while counted.next < s:  # the group's shards not made yet, in order
                counted.before += read(self.plan.rows(self._planned(counted.next))[0])
                counted.next += 1
            starts = counted.before.copy()
            counted.before += read(examples)
            counted.next = s + 1
            return starts


@dataclass(frozen=True)
class MapOutputs:
    """The exchange's map outputs as the write stage reads them (``build._exchange``)."""

    root: Any  # OUT/.packer/exchange
    cache_starts: np.ndarray  # (M + 1,) first cache row each map task reads, then the total
    out_starts: np.ndarray  # (G, M + 1) first row of each map output of group g in their concatenation
    group_first: np.ndarray  # (G + 1,) first shard of each writer group, then the shard count


@dataclass
class _Counted:
    """``ShardRanges``' count, per map output of a writer group, of the rows of its shards before ``next``."""

    before: np.ndarray | None = None
    next: int = 0


def shard_ranges(plan: Plan, *, rows_per_shard: int) -> ShardRanges:
    """The plan's shard ranges (``ShardRanges``: each made when it is read)."""
    return ShardRanges(plan, rows_per_shard)


def planned_examples(ranges: Sequence[ShardRange]) -> int:
    """The planned examples ``ranges`` write, without making a ``ShardRanges``' ranges."""
    return ranges.num_examples if isinstance(ranges, ShardRanges) else sum(len(r.examples) for r in ranges)


def write_shard_range(
    shards: ShardRange, *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
) -> list[dict[str, Any]]:
    """Gather and write the range's shards (``config.rows_per_shard`` packs each); return their manifest
    entries. A shard whose marker (``.packer/shards/NNNNN.json``, its sha256) matches its file is kept."""
    out = store_path(config.output, config.storage_options)
    markers = out / WORK_DIR / "shards"
    markers.mkdir(exist_ok=True)
    pack_bounds = np.concatenate([[0], np.cumsum(shards.pack_sizes)])
    entries = []
    for j, p0 in enumerate(range(0, len(shards.pack_sizes), config.rows_per_shard)):
        with stage(f"write (shard {shards.first + j})"):
            entries.append(_write_shard(shards, j, p0, pack_bounds, out=out, markers=markers, cache=cache,
                                        config=config, hooks=hooks))
    return entries


def _write_shard(shards: ShardRange, j: int, p0: int, pack_bounds: np.ndarray, *, out: Any, markers: Any,
                 cache: EncodeCache, config: BuildConfig, hooks: Hooks) -> dict[str, Any]:
    """Shard ``shards.first + j`` (its packs start at ``p0`` of the range): kept if its marker matches its
    file, else gathered and written, then its marker."""
    s = shards.first + j
    p1 = min(len(shards.pack_sizes), p0 + config.rows_per_shard)
    path = out / shard_name(s)
    marker = markers / f"{s:05d}.json"
    if marker.exists() and path.exists():
        entry = json.loads(marker.read_text())
        if sha256_file(path) == entry["sha256"]:
            return entry
    sel = shards.examples[pack_bounds[p0] : pack_bounds[p1]]
    if shards.exchange is None:  # the chunk files: one gather for the shard (a slice's would visit them all again)
        rows = cache.take(sel, remember=shards.remember)
        gather = _rows_slice(rows)
    else:  # the few map outputs: a gather per slice, their layouts kept from the first
        gather = shards.exchange.gather(sel, j)
    dup = None if shards.copies is None else shards.copies[pack_bounds[p0] : pack_bounds[p1]]
    slices = _assembled(gather, dup, shards.pack_sizes[p0:p1], config)
    first = next(slices)
    hooks.at("shard-write", s, table=first, path=path)
    entry = write_shard(chain((first,), slices), path, rows_per_row_group=config.rows_per_row_group)
    hooks.at("shard", s)
    write_json_atomic(marker, entry)
    return entry


def _rows_slice(rows: pa.Table) -> Callable[[int, int], pa.Table]:
    """A function of (a, b) -> ``rows``' rows a..b (``_assembled``'s ``gather`` of rows gathered already)."""
    return lambda a, b: rows.slice(a, b - a)


def _assembled(gather: Callable[[int, int], pa.Table], dup: np.ndarray | None, pack_sizes: np.ndarray,
               config: BuildConfig) -> Iterator[pa.Table]:
    """A shard's rows (``assemble_packs``) slice by slice, each made once the one before is written: whole row
    groups of at most ``SLICE_TOKENS`` tokens at ``max_length`` a pack (one at least), their examples
    ``gather(a, b)`` (the shard's examples a..b), their dense labels and positions in one pair of buffers
    (``derived.Buffers``): no (T,) arrays for the whole shard. The file is the same bytes (``write_shard``).
    ``dup``: each example's copy number (up-sampled copies get unique ids: path:line#k)."""
    group = config.rows_per_row_group
    per = group * max(1, SLICE_TOKENS // (group * config.max_length))  # packs a slice
    bounds = np.zeros(len(pack_sizes) + 1, dtype=np.int64)
    np.cumsum(pack_sizes, out=bounds[1:])
    buffers = derived.Buffers()
    for q0 in range(0, len(pack_sizes), per):
        q1 = min(len(pack_sizes), q0 + per)
        e0, e1 = int(bounds[q0]), int(bounds[q1])
        rows = gather(e0, e1)
        if dup is not None and dup[e0:e1].any():
            rows = rows.set_column(rows.schema.get_field_index("example_id"), "example_id",
                                   copy_ids(rows.column("example_id"), dup[e0:e1]))
        yield assemble_packs(rows, pack_sizes[q0:q1], buffers=buffers)
