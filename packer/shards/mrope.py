"""Shard schema v6's sparse mRoPE columns, and the one rule that turns them back into the dense positions.

A row's dense mRoPE positions (3·T float32, token-major: what v5 stored and every reader gets) are stored as

    mrope_runs   list<int32>    2·S: (start, length) of S runs, row-relative, increasing, not overlapping
    mrope_bases  list<float32>  S: each run's first position
    mrope_rest   list<float32>  3·(T − Σ length): (t, h, w) of every token outside the runs, in token order

Token ``start + k`` of a run has the position ``float32(float64(base) + k)`` on all three rows (t = h = w: a
text stretch counting up by one); a row's T is Σ length + len(rest) / 3. The writer (``sparse``: one numba
pass, ``mrope_runs.py``) puts in runs only what this rule gives back bit for bit, so the stored positions are
exact for any family, fractional ones (``Positions.fractional``) included; images, video and audio runs (t, h, w
differing) go to ``mrope_rest``. ``dense`` is the reader's side: ``packer.shards.io``'s shard files call it on
every table they read, so a v6 row reads as the same arrays a v5 row holds (docs/format.md, "mRoPE positions").
The encode cache holds each example's columns by the same rule (``example_columns``), which the write merges into
its rows' (``row_columns``) without the dense positions: a text stretch is three numbers there, not three a token.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from packer.core import arrays
from packer.errors import ShardError
from packer.shards.schema import SCHEMA

RUNS, BASES, REST = "mrope_runs", "mrope_bases", "mrope_rest"
SPARSE_COLUMNS = (RUNS, BASES, REST)
DENSE = "mrope_position_ids"


def sparse(values: np.ndarray, row_tokens: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Dense token-major positions (3·T float32 of consecutive rows; ``row_tokens``: (R+1,) each row's first
    token, ending at T) as ((offsets, values) of ``mrope_runs``, of ``mrope_bases``, of ``mrope_rest``), per row.

    Runs are the stretches of at least two tokens with t = h = w that ``dense``'s rule gives back with identical
    bits (a stretch is cut where float32 would round otherwise), found in one compiled pass
    (``mrope_runs.split_runs``)."""
    from packer.shards.mrope_runs import split_runs  # numba: the writer's import only

    values = np.ascontiguousarray(values, dtype=np.float32)
    row_tokens = np.asarray(row_tokens, dtype=np.int64)
    n = values.shape[0] // 3
    R = len(row_tokens) - 1
    starts = np.empty(n // 2 + 1, dtype=np.int32)
    lengths = np.empty(n // 2 + 1, dtype=np.int32)
    rest = np.empty(3 * n, dtype=np.float32)
    runs_per_row = np.empty(R, dtype=np.int64)
    rest_per_row = np.empty(R, dtype=np.int64)
    S, Q = split_runs(values, row_tokens, starts, lengths, rest, runs_per_row, rest_per_row)
    run_off = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(runs_per_row, out=run_off[1:])
    rest_off = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(rest_per_row, out=rest_off[1:])
    pairs = np.empty((S, 2), dtype=np.int32)
    pairs[:, 0] = starts[:S]
    pairs[:, 1] = lengths[:S]
    row = np.repeat(np.arange(R), runs_per_row)
    bases = values[3 * (row_tokens[row] + starts[:S])]
    return (2 * run_off, pairs.reshape(-1)), (run_off, bases), (rest_off, rest[:Q])


def example_columns(values: np.ndarray | None, lengths: np.ndarray, null: np.ndarray | None = None
                    ) -> dict[str, pa.Array]:
    """The encode cache's mRoPE columns (``EXAMPLE_SCHEMA``): each example's dense positions (``values``: 3·L
    float32 of every example with mRoPE, back to back; ``lengths``: (n,) each example's tokens; ``null``: (n,)
    the examples without, None: none) stored as a shard row stores them, example-relative: the write packs
    them into rows (``row_columns``) without the dense positions or a pass over them. None: no mRoPE at all."""
    n = len(lengths)
    if values is None:
        return sparse_columns(None, np.zeros(n + 1, np.int64))
    have = np.asarray(lengths, np.int64) if null is None else np.where(null, 0, lengths)
    row_tokens = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(have, out=row_tokens[1:])
    if len(values) != 3 * row_tokens[-1]:  # the compiled pass reads 3 values per token, unchecked
        raise ShardError(f"{len(values)} mRoPE values for {row_tokens[-1]} tokens (want 3 per token)")
    parts = sparse(values, row_tokens)
    mask = None if null is None or not null.any() else pa.array(null)
    return {c: pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), pa.array(v), mask=mask)
            for c, (off, v) in zip(SPARSE_COLUMNS, parts, strict=True)}


def row_columns(ex_tokens: np.ndarray, runs: tuple[np.ndarray, np.ndarray], bases: tuple[np.ndarray, np.ndarray],
                rest: tuple[np.ndarray, np.ndarray], pack_bounds: np.ndarray) -> dict[str, pa.Array]:
    """The v6 columns of packed rows from their examples' (``example_columns``, each (offsets, values) of the
    examples in pack order; ``pack_bounds``: (P+1,) each pack's first example), equal to ``sparse_columns`` of the
    rows' dense positions (``mrope_runs.merge_runs``). ShardError naming the example whose columns do not
    describe its tokens (counts, runs out of order)."""
    from packer.shards.mrope_runs import merge_runs  # numba: the writer's import only

    ex_tokens = np.asarray(ex_tokens, np.int64)
    T = int(ex_tokens.sum())
    P = len(pack_bounds) - 1
    base_off = np.asarray(bases[0], np.int64)
    out_pairs = np.empty(2 * (T // 2 + P + 1), dtype=np.int32)  # at most one run per two tokens of a row
    out_bases = np.empty(T // 2 + P + 1, dtype=np.float32)
    out_rest = np.empty(3 * T, dtype=np.float32)  # untouched pages are never committed
    runs_per_row = np.empty(P, dtype=np.int64)
    rest_per_row = np.empty(P, dtype=np.int64)
    widest = int(np.max(np.add.reduceat(ex_tokens, pack_bounds[:-1]), initial=0)) if P and len(ex_tokens) else 0
    S, Q, bad = merge_runs(ex_tokens, base_off, np.asarray(runs[1], np.int32), np.asarray(bases[1], np.float32),
                           np.asarray(rest[0], np.int64), np.asarray(rest[1], np.float32),
                           np.asarray(pack_bounds, np.int64), out_pairs, out_bases, out_rest, runs_per_row,
                           rest_per_row, np.empty(3 * widest, dtype=np.float32))
    if bad >= 0:
        raise ShardError(f"example {bad} has mRoPE runs and values that do not describe its {ex_tokens[bad]} tokens "
                         "(a damaged encode cache chunk)")
    run_off = np.zeros(P + 1, dtype=np.int32)
    np.cumsum(runs_per_row, out=run_off[1:])
    rest_off = np.zeros(P + 1, dtype=np.int32)
    np.cumsum(rest_per_row, out=rest_off[1:])
    return {RUNS: pa.ListArray.from_arrays(pa.array(2 * run_off), pa.array(out_pairs[: 2 * S])),
            BASES: pa.ListArray.from_arrays(pa.array(run_off), pa.array(out_bases[:S])),
            REST: pa.ListArray.from_arrays(pa.array(rest_off), pa.array(out_rest[:Q]))}


def dense(runs: tuple[np.ndarray, np.ndarray], bases: tuple[np.ndarray, np.ndarray],
          rest: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sparse columns of R rows, each (offsets (R+1,), values), as (offsets, values) of the dense column
    (3·T float32 per row, token-major). ShardError naming the row when they do not describe one row of positions
    (a count, a run outside its row or overlapping another): a damaged shard is never read as other positions."""
    run_off, pairs = np.asarray(runs[0], np.int64), np.asarray(runs[1], np.int64)
    base_off, base = np.asarray(bases[0], np.int64), np.asarray(bases[1], np.float32)
    rest_off, rest_values = np.asarray(rest[0], np.int64), np.asarray(rest[1], np.float32)
    R = len(run_off) - 1

    def fail(bad: np.ndarray, what: str) -> None:
        if bad.any():
            raise ShardError(f"row {int(np.flatnonzero(bad)[0])}: {what}")

    fail(np.diff(run_off) != 2 * np.diff(base_off), f"{RUNS} must hold two values (start, length) per base")
    fail(np.diff(rest_off) % 3 != 0, f"{REST} must hold three values (t, h, w) per token")
    S = len(base)
    starts, lengths = pairs[0::2], pairs[1::2]
    row = np.repeat(np.arange(R), np.diff(base_off))
    fail(np.bincount(row[lengths < 1], minlength=R) > 0, f"{RUNS} has a run of no token")
    covered = np.bincount(row, weights=lengths, minlength=R).astype(np.int64)
    T = covered + np.diff(rest_off) // 3
    row_tokens = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(T, out=row_tokens[1:])
    ends = starts + lengths
    first = np.zeros(S, dtype=bool)
    first[base_off[:-1][np.diff(base_off) > 0]] = True
    prev_end = np.concatenate([[0], ends[:-1]])
    order_bad = (starts < 0) | (~first & (starts < prev_end)) | (ends > T[row])
    fail(np.bincount(row[order_bad], minlength=R) > 0,
         f"{RUNS} are not increasing, non-overlapping runs inside the row's tokens")
    out = np.empty((int(row_tokens[-1]), 3), dtype=np.float32)
    in_run = np.zeros(len(out), dtype=bool)
    if S:
        k = arrays.ranges(lengths)
        at = np.repeat(row_tokens[row] + starts, lengths) + k
        out[at] = (np.repeat(base.astype(np.float64), lengths) + k).astype(np.float32)[:, None]
        in_run[at] = True
    out[~in_run] = rest_values.reshape(-1, 3)
    return 3 * row_tokens, out.reshape(-1)


def _parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets from 0, flat values, null mask) of a list column."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    off = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0])).to_numpy(zero_copy_only=False)
    return off - off[0], values, arr.is_null().to_numpy(zero_copy_only=False)


def dense_column(runs: pa.ChunkedArray | pa.Array, bases: pa.ChunkedArray | pa.Array,
                 rest: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The three sparse columns of some rows as the dense ``mrope_position_ids`` column (list<float32>, null
    where the row has no mRoPE: all three null)."""
    r, b, s = _parts(runs), _parts(bases), _parts(rest)
    if not (np.array_equal(r[2], b[2]) and np.array_equal(r[2], s[2])):
        raise ShardError(f"row {int(np.flatnonzero((r[2] != b[2]) | (r[2] != s[2]))[0])}: "
                         f"{RUNS}, {BASES} and {REST} must be null together")
    null = r[2]
    off, values = dense((r[0], r[1]), (b[0], b[1]), (s[0], s[1]))
    if null.all():
        return pa.nulls(len(null), pa.list_(pa.float32()))
    return pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), pa.array(values, pa.float32()),
                                    mask=pa.array(null) if null.any() else None)


def sparse_columns(dense_values: np.ndarray | None, row_tokens: np.ndarray) -> dict[str, pa.Array]:
    """The v6 columns of R rows from their dense positions (None: a profile without mRoPE, every row null)."""
    R = len(row_tokens) - 1
    if dense_values is None:
        return {RUNS: pa.nulls(R, pa.list_(pa.int32())), BASES: pa.nulls(R, pa.list_(pa.float32())),
                REST: pa.nulls(R, pa.list_(pa.float32()))}
    (ro, rv), (bo, bv), (so, sv) = sparse(dense_values, row_tokens)
    return {RUNS: pa.ListArray.from_arrays(pa.array(ro.astype(np.int32)), pa.array(rv, pa.int32())),
            BASES: pa.ListArray.from_arrays(pa.array(bo.astype(np.int32)), pa.array(bv, pa.float32())),
            REST: pa.ListArray.from_arrays(pa.array(so.astype(np.int32)), pa.array(sv, pa.float32()))}


def to_dense(table: pa.Table) -> pa.Table:
    """``table`` (any columns of a shard) with v6's sparse columns replaced by the dense ``mrope_position_ids``
    at the place of ``mrope_runs``; a table without them (v2-v5, or the column not read) is returned as is."""
    names = table.column_names
    if RUNS not in names:
        return table
    column = dense_column(*(table.column(c) for c in SPARSE_COLUMNS))
    at = names.index(RUNS)
    keep = [c for c in names if c not in SPARSE_COLUMNS]
    fields = [table.schema.field(c) for c in keep]
    arrays = [table.column(c) for c in keep]
    fields.insert(at, pa.field(DENSE, pa.list_(pa.float32())))
    arrays.insert(at, column)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))


def to_sparse(table: pa.Table) -> pa.Table:
    """The writer's side of ``to_dense``: a table with the dense column (v5's layout) with v6's sparse columns in
    its place (a test's rewritten shard; the build makes them in ``assemble_packs``)."""
    names = table.column_names
    if DENSE not in names:
        return table
    off, values, null = _parts(table.column(DENSE))
    lengths = np.diff(off) // 3
    row_tokens = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=row_tokens[1:])
    cols = sparse_columns(None if null.all() else values, row_tokens)
    if null.any() and not null.all():
        mask = pa.array(null)
        cols = {k: pa.ListArray.from_arrays(v.offsets, v.values, mask=mask) for k, v in cols.items()}
    at = names.index(DENSE)
    keep = [c for c in names if c != DENSE]
    fields = [table.schema.field(c) for c in keep]
    arrays = [table.column(c) for c in keep]
    for i, c in enumerate(SPARSE_COLUMNS):
        fields.insert(at + i, pa.field(c, cols[c].type))
        arrays.insert(at + i, cols[c])
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return pa.Table.from_arrays(arrays, schema=SCHEMA if schema.equals(SCHEMA) else schema)


def dense_row(runs: Any, bases: Any, rest: Any) -> np.ndarray:
    """One row's sparse columns (as ``datasets`` gives a v6 row: lists) as its dense positions, 3·T float32."""
    runs, bases, rest = (np.asarray(x) for x in (runs, bases, rest))
    return dense((np.array([0, len(runs)]), runs), (np.array([0, len(bases)]), bases),
                 (np.array([0, len(rest)]), rest))[1]
