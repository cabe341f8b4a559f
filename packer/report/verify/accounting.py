"""Accounting across the whole build: example ids unique, rejects.jsonl well formed, the manifest's totals and
stats.json equal to what the shards hold, and (with ``inputs``) every input record packed or rejected exactly
once, with its source's copy count, a split text's chunks each counted like a record."""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.core.ids import ID_PATTERN
from packer.errors import REJECT_REASONS, ConfigError
from packer.report.split_docs import ChunkDigests, check_split_documents
from packer.report.tokenizer_check import RecordDigests, check_tokens
from packer.report.verify.report import VerifyReport
from packer.shards.schema import MANIFEST, REJECTS, STATS, Manifest


def check_unique_example_ids(ids: pa.ChunkedArray, where: list[tuple[str, np.ndarray]], rep: VerifyReport) -> None:
    """Every example id appears once in the dataset; each duplicate is listed where it lies (file, row)."""
    if len(ids) == 0:
        return
    counts = pc.value_counts(ids.combine_chunks())
    dup_values = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(dup_values) == 0:
        return
    for chunk, (file, rows) in zip(ids.chunks, where, strict=True):
        hit = pc.is_in(chunk, value_set=dup_values).to_numpy(zero_copy_only=False)
        for k in np.flatnonzero(hit):
            rep.add(file, int(rows[k]), f"example id {chunk[int(k)].as_py()!r} appears more than once in the dataset",
                    "duplicate example id")


def read_rejects(root: Path, rep: VerifyReport) -> list[dict[str, Any]]:
    """rejects.jsonl's records; a line that is not a reject (path, line, known reason) is a violation."""
    path = root / REJECTS
    if not path.exists():
        rep.add(REJECTS, None, "missing", "rejects")
        return []
    out = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                r = json.loads(raw)
                ok = isinstance(r, dict) and r.get("reason") in REJECT_REASONS and isinstance(r.get("path"), str) \
                    and isinstance(r.get("line"), int) and r["line"] >= 1
            except json.JSONDecodeError:
                ok = False
            if not ok:
                rep.add(REJECTS, n, f"not a reject record with path, line and a known reason: {raw[:120]!r}", "rejects")
                continue
            out.append(r)
    return out


def check_totals(manifest: Manifest, root: Path, rep: VerifyReport, sums: Counter,
                  rejects: list[dict[str, Any]], later_chunks: int = 0) -> None:
    """The manifest's totals and stats.json equal the sums over the shards (``sums``) and the rejects; the
    input records are the examples (less the later chunks of split texts) plus the rejects."""
    totals = manifest.totals
    by_reason = dict(sorted(Counter(r["reason"] for r in rejects).items()))
    if totals is None:
        rep.add(MANIFEST, None, "has no 'totals': the whole-build counts cannot be checked", "totals")
    else:
        want = {"packs": rep.rows, "examples": rep.examples, **sums, "rejected": len(rejects)}
        for key, value in want.items():
            if getattr(totals, key) != value:
                rep.add(MANIFEST, None, f"totals.{key} is {getattr(totals, key)}, the build holds {value}", "totals")
        if totals.rejects_by_reason != by_reason:
            rep.add(MANIFEST, None, f"totals.rejects_by_reason is {totals.rejects_by_reason}, rejects.jsonl has "
                    f"{by_reason}", "totals")
        records = rep.examples - later_chunks  # a split text is one record, n examples
        if all(s.weight == 1.0 for s in manifest.config.sources) and totals.input_records != records + len(rejects):
            chunks = f" - {later_chunks} later chunks of split texts" if later_chunks else ""
            rep.add(MANIFEST, None, f"totals.input_records is {totals.input_records}, but {rep.examples} examples"
                    f"{chunks} + {len(rejects)} rejects = {records + len(rejects)}", "totals")
    stats_path = root / STATS
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        rep.add(STATS, None, f"unreadable: {e}", "stats")
        return
    for key in ("examples", "packs", "rejected", "input_records", "tokens"):
        if key in stats and totals is not None and stats[key] != getattr(totals, key):
            rep.add(STATS, None, f"{key} is {stats[key]}, the manifest says {getattr(totals, key)}", "stats")
    if "rejects_by_reason" in stats and stats["rejects_by_reason"] != by_reason:
        rep.add(STATS, None, f"rejects_by_reason is {stats['rejects_by_reason']}, rejects.jsonl has {by_reason}", "stats")


def input_lines(path: str) -> np.ndarray:
    """1-based numbers of the records of an input file: a JSONL file's non-blank lines, by the build's own
    rule, every row of a Parquet/Arrow file (counted from its metadata), or a streamed file's records.

    Lines split at ``\\n`` only; a line of ASCII whitespace (incl. a CRLF's ``\\r``, or a lone BOM on line 1)
    is blank.
    """
    from packer.formats.files import is_streamed, records
    from packer.formats.tables import is_table, unit_rows

    if is_table(path):
        return np.arange(1, sum(unit_rows(path)) + 1, dtype=np.int64)
    if is_streamed(path):  # an array's elements, a compressed file's lines, a tar's samples (formats/files.py)
        return np.fromiter((n for n, _ in records(path)), dtype=np.int64)
    numbers = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if raw.strip():
                numbers.append(n)
    return np.asarray(numbers, dtype=np.int64)


def source_weights(manifest: Manifest, rep: VerifyReport) -> dict[str, float]:
    """Resolved input file -> its source's weight (files the config's paths match now).

    A source whose paths match no file any more is a violation: its records' copy counts cannot be checked.
    """
    from packer.formats.read import expand_inputs

    out = {}
    for s in manifest.config.sources:
        try:
            files = expand_inputs([manifest.resolve(p) for p in s.paths])
        except ConfigError as e:
            rep.add(MANIFEST, None, f"source {s.name!r} (weight {s.weight}): {e}; the copy counts of its records "
                    "cannot be checked", "source weights")
            continue
        for f in files:
            out[os.path.realpath(f)] = s.weight
    return out


def check_inputs(manifest: Manifest, root: Path, ids: pa.ChunkedArray, rejects: list[dict[str, Any]],
                 inputs: list[str], rep: VerifyReport, digests: ChunkDigests | None = None,
                 records: RecordDigests | None = None, sample: int | None = None) -> None:
    """Every non-blank line of ``inputs`` is packed (with its source's copy count) or rejected, exactly once;
    a split text's chunks each count as a record (``@k``, k = 0..n-1), its tokens checked by ``digests``."""
    from packer.formats.read import expand_inputs

    def resolve(path: str) -> str:
        return os.path.realpath(manifest.resolve(path))

    files = {os.path.realpath(f): f for f in expand_inputs(inputs)}
    weights = source_weights(manifest, rep)
    lines = {real: input_lines(f) for real, f in files.items()}
    rep.input_records = int(sum(len(v) for v in lines.values()))
    parsed = _parse_ids(ids, rep)
    rej_by_path: dict[str, list[int]] = defaultdict(list)
    for r in rejects:
        rej_by_path[r["path"]].append(r["line"])
    for real, numbers in lines.items():
        mine = [idx for p, idx in parsed.by_path.items() if resolve(p) == real]
        rejected_lines = [ln for p, lns in rej_by_path.items() if resolve(p) == real for ln in lns]
        _check_file_records(files[real], numbers, parsed, np.concatenate(mine) if mine else np.zeros(0, np.int64),
                            rejected_lines, weights.get(real, 1.0), rep)
    if digests is not None:
        check_split_documents(manifest, digests, files, lambda file, what: rep.add(file, None, what, "split documents"))
    if records is not None:
        rep.tokenized = check_tokens(manifest, records, files, lambda file, what: rep.add(file, None, what, "tokenizer"),
                                     sample=sample)
    # Records of build inputs not passed here are not checked (the caller's choice); records of files that
    # are no input of this build at all cannot be right.
    build_inputs = {resolve(p) for p in manifest.inputs} | set(files)
    for p in sorted({p for p in list(parsed.by_path) + list(rej_by_path) if resolve(p) not in build_inputs}):
        rep.add("<dataset>", None, f"holds records of {p!r}, which is not an input of this build", "unknown input")


@dataclass(frozen=True)
class _Ids:
    """The dataset's example ids parsed: line, #copy (0 without) and @chunk (-1 for a record packed whole) of
    each, and the indices of each id path's ids."""

    lines: np.ndarray
    copies: np.ndarray
    chunks: np.ndarray
    by_path: dict[str, np.ndarray]  # id path as written -> indices of its ids


def _parse_ids(ids: pa.ChunkedArray, rep: VerifyReport) -> _Ids:
    """Parse ids "path:line[@chunk][#copy]" (core/ids.py) in bulk (Arrow regex), then group them by path."""
    empty = np.zeros(0, np.int64)
    if not len(ids):
        return _Ids(empty, empty, empty, {})
    parts = pc.extract_regex(ids.combine_chunks(), ID_PATTERN)
    unparsed = len(parts) - int(pc.sum(pc.is_valid(parts)).as_py() or 0)
    if unparsed:
        rep.add("<dataset>", None, f"{unparsed} example ids are not of the form path:line[@chunk][#copy]",
                "example id form")
        parts = parts.filter(pc.is_valid(parts))
    copy = parts.field("copy")  # "" when there is no #copy suffix
    chunk = parts.field("chunk")  # "" for a record packed whole: -1
    enc = pc.dictionary_encode(parts.field("path"))
    codes = enc.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(enc.dictionary)))])
    return _Ids(
        lines=pc.cast(parts.field("line"), pa.int64()).to_numpy(),
        copies=pc.cast(pc.if_else(pc.equal(copy, ""), "0", copy), pa.int64()).to_numpy(),
        chunks=pc.cast(pc.if_else(pc.equal(chunk, ""), "-1", chunk), pa.int64()).to_numpy(),
        by_path={p: order[bounds[k]:bounds[k + 1]] for k, p in enumerate(enc.dictionary.to_pylist())},
    )


def _check_file_records(name: str, numbers: np.ndarray, ids: _Ids, idx: np.ndarray, rejected_lines: list[int],
                        weight: float, rep: VerifyReport) -> None:
    """One input file: each record (``numbers``) packed ``floor(weight)``..``ceil(weight)`` times with suffixes
    #0..n-1, or rejected once, never both; nothing packed or rejected that is not a record (``idx``: its ids)."""
    n_lines = int(numbers[-1]) if len(numbers) else 0
    packed = np.zeros(n_lines + 2, dtype=np.int64)  # copies of the record (of a split text: of chunk 0)
    packed_any = np.zeros(n_lines + 2, dtype=np.int64)  # examples of any chunk
    max_copy = np.full(n_lines + 2, -1, dtype=np.int64)
    rejected = np.zeros(n_lines + 2, dtype=np.int64)
    ln, cp, ck = np.clip(ids.lines[idx], 0, n_lines + 1), ids.copies[idx], ids.chunks[idx]
    first = ck <= 0
    np.add.at(packed, ln[first], 1)
    np.add.at(packed_any, ln, 1)
    np.maximum.at(max_copy, ln[first], cp[first])
    np.add.at(rejected, np.clip(np.asarray(rejected_lines, np.int64), 0, n_lines + 1), 1)
    rec = np.zeros(n_lines + 2, dtype=bool)
    rec[numbers] = True
    lo, hi = math.floor(weight), math.ceil(weight)
    for bad in np.flatnonzero(~rec & ((packed_any > 0) | (rejected > 0))).tolist():
        rep.add(name, None, f"line {bad} is not a record (blank or past the end) but is "
                f"{'packed' if packed_any[bad] else 'rejected'}", "unknown record")
    lost = rec & (packed_any == 0) & (rejected == 0) & (lo > 0)
    wrong_copies = rec & (rejected == 0) & ((packed < lo) | (packed > hi)) & ~lost
    for mask, what in ((lost, "is neither packed nor rejected"),
                       (rec & (packed_any > 0) & (rejected > 0), "is both packed and rejected"),
                       (rec & (rejected > 1), "is rejected more than once"),
                       (wrong_copies, f"is packed the wrong number of times (source weight {weight}: {lo}..{hi})"),
                       (rec & (packed > 0) & (max_copy != packed - 1), "has copies whose #k suffixes are not 0..n-1")):
        for bad in np.flatnonzero(mask).tolist():
            extra = f" ({packed[bad]} times)" if mask is wrong_copies else ""
            rep.add(name, None, f"line {bad} {what}{extra}", "input accounting")
    for what in _chunk_accounting(ln, cp, ck, lo=lo, hi=hi, weight=weight):
        rep.add(name, None, what, "input accounting")


def _chunk_accounting(lines: np.ndarray, copies: np.ndarray, chunks: np.ndarray, *, lo: int, hi: int,
                      weight: float) -> list[str]:
    """What is wrong with one file's split texts: ids of lines (n,), their #copy and @chunk (-1: whole).

    A line is packed whole or split, never both; each chunk k >= 1 is counted like a record (lo..hi copies,
    suffixes 0..n-1; chunk 0 is checked with the line); with lo >= 1 no chunk of 0..max is missing.
    """
    split = chunks >= 0
    if not split.any():
        return []
    out = []
    whole_lines = set(lines[~split].tolist())
    out += [f"line {n} is packed both whole and split" for n in sorted(set(lines[split].tolist()) & whole_lines)]
    later = chunks >= 1
    if later.any():
        key = np.stack([lines[later], chunks[later]], axis=1)
        units, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        top = np.full(len(units), -1, dtype=np.int64)
        np.maximum.at(top, inverse.reshape(-1), copies[later])
        for (n, k), c, t in zip(units.tolist(), counts.tolist(), top.tolist(), strict=True):
            if not lo <= c <= hi:
                out.append(f"line {n} chunk {k} is packed the wrong number of times (source weight {weight}: "
                           f"{lo}..{hi}) ({c} times)")
            elif t != c - 1:
                out.append(f"line {n} chunk {k} has copies whose #k suffixes are not 0..n-1")
    if lo >= 1:
        key = np.unique(np.stack([lines[split], chunks[split]], axis=1), axis=0)
        for n in np.unique(key[:, 0]).tolist():
            have = key[key[:, 0] == n, 1]
            if len(have) != int(have.max()) + 1:
                missing = sorted(set(range(int(have.max()) + 1)) - set(have.tolist()))
                out.append(f"line {n} is split, but chunks {missing[:8]} are missing")
    return out
