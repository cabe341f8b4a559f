"""The compiled copy loops of ``assemble.take_rows`` (numba): imported by the write stage only, so ``import
packer.shards`` (verify, the training loaders) does not pay numba's import."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def copy_ranges(src: np.ndarray, offsets: np.ndarray, rows: np.ndarray, out: np.ndarray, out_offsets: np.ndarray,
                dest: np.ndarray) -> None:
    """out[out_offsets[dest[k]]:...] = src[offsets[rows[k]]:offsets[rows[k] + 1]] for every k: one list (or
    string) per row of a list column, ~10 ns per row against ~1 us for a Python slice assignment."""
    for k in range(rows.shape[0]):
        a = offsets[rows[k]]
        b = offsets[rows[k] + 1]
        d = out_offsets[dest[k]]
        for j in range(b - a):
            out[d + j] = src[a + j]


@njit(cache=True)
def visit_lengths(mapped: np.ndarray, fixed_spans: np.ndarray, widths: np.ndarray, flat_spans: np.ndarray,
                  rows: np.ndarray, to: np.ndarray, fixed: np.ndarray, lengths: np.ndarray) -> None:
    """Pass 1 of a remembered visit (``assemble.take_rows``), every column in one call: fixed-width column
    ``f`` (``widths[f]``, 4 or 8, bytes a value; ``fixed_spans[f]``: (byte offset, values) in the file
    ``mapped``, offset -1: not there) row ``rows[k]`` to ``fixed[f]``'s row ``to[k]``; flat column ``c``'s length
    (``flat_spans[c, :2]``: its int32 offsets' (byte offset, count), -1: not there) to ``lengths[c, to[k]]``.
    One call against ~20 numpy ones a visit."""
    for f in range(fixed_spans.shape[0]):
        at, count = fixed_spans[f, 0], fixed_spans[f, 1]
        if at < 0:
            continue
        if widths[f] == 4:
            src, dst = mapped[at : at + 4 * count].view(np.int32), fixed[f].view(np.int32)
            for k in range(rows.shape[0]):
                dst[to[k]] = src[rows[k]]
        else:
            src64, dst64 = mapped[at : at + 8 * count].view(np.int64), fixed[f].view(np.int64)
            for k in range(rows.shape[0]):
                dst64[to[k]] = src64[rows[k]]
    for c in range(flat_spans.shape[0]):
        at, count = flat_spans[c, 0], flat_spans[c, 1]
        if at < 0:
            continue
        offsets = mapped[at : at + 4 * count].view(np.int32)
        for k in range(rows.shape[0]):
            lengths[c, to[k]] = offsets[rows[k] + 1] - offsets[rows[k]]


@njit(cache=True)
def visit_copy(mapped: np.ndarray, columns: np.ndarray, spans: np.ndarray, widths: np.ndarray, rows: np.ndarray,
               dest: np.ndarray, out: np.ndarray, bases: np.ndarray, out_offsets: np.ndarray) -> None:
    """Pass 2 of a remembered visit, every column in one call: output column ``i`` is flat column
    ``columns[i]`` (``spans[c]``: its int32 offsets' (byte offset, count), then its values' (byte offset,
    count) in the file ``mapped``, ``widths[c]`` (1 or 4) bytes a value); each row ``rows[k]``'s values go to
    ``out`` from byte ``bases[i]``, at value ``out_offsets[i, dest[k]]``: ``copy_ranges`` for every column of
    the visit at once."""
    for i in range(columns.shape[0]):
        c = columns[i]
        offsets = mapped[spans[c, 0] : spans[c, 0] + 4 * spans[c, 1]].view(np.int32)
        at, count, base, total = spans[c, 2], spans[c, 3], bases[i], out_offsets[i, -1]
        if widths[c] == 4:
            _copy(mapped[at : at + 4 * count].view(np.int32), offsets, rows,
                  out[base : base + 4 * total].view(np.int32), out_offsets[i], dest)
        else:
            _copy(mapped[at : at + count], offsets, rows, out[base : base + total], out_offsets[i], dest)


@njit(cache=True, inline="always")
def _copy(src: np.ndarray, offsets: np.ndarray, rows: np.ndarray, out: np.ndarray, out_offsets: np.ndarray,
          dest: np.ndarray) -> None:
    """``copy_ranges`` inlined into ``visit_copy`` for one column (its values typed: int32 or bytes)."""
    for k in range(rows.shape[0]):
        a, d = offsets[rows[k]], out_offsets[dest[k]]
        for j in range(offsets[rows[k] + 1] - a):
            out[d + j] = src[a + j]


def warm(mrope: bool = False) -> None:
    """numba started and ``copy_ranges`` loaded from its cache for the columns every shard write copies (the
    strings' bytes, int32 lists; offsets and values read-only, as mapped from a chunk file), a remembered
    visit's two calls (``visit_lengths``, ``visit_copy``: one signature each, whatever the columns), the derived
    labels' and positions' passes (``derived_runs``: every chunk's encode and every shard's rows), and with ``mrope``
    (a profile with mRoPE positions) the float32 lists and the encode's ``split_runs`` (``mrope.sparse``) too:
    ``local.LocalExecutor.load_encoder`` runs this before it forks the pool, so the workers inherit them instead
    of each paying numba's start (~0.5-0.7 CPU-s quiet; another kernel's first load ~0.1) at their first shard
    write or mRoPE encode (docs/benchmarks.md, "Where a 200k text-chat build's CPU goes"). Only what an earlier
    build of that kind compiled into the cache: a signature no build used would compile here."""
    offsets = np.zeros(2, np.int32)
    offsets.flags.writeable = False
    index = np.zeros(1, np.int64)
    for dtype in (np.uint8, np.int32) + ((np.float32,) if mrope else ()):
        src = np.zeros(1, dtype)
        src.flags.writeable = False
        copy_ranges(src, offsets, np.zeros(1, np.int64), np.zeros(1, dtype), np.array([0, 1], np.int64), index)
    mapped = np.zeros(8, np.uint8)
    mapped.flags.writeable = False  # as ``assemble._mapped`` maps a file
    one, none = np.zeros(1, np.int64), np.full((1, 2), -1, np.int64)
    visit_lengths(mapped, none, one, none, one, one, np.zeros((1, 8), np.uint8), np.zeros((1, 1), np.int64))
    visit_copy(mapped, np.zeros(0, np.int64), np.zeros((1, 4), np.int64), one, one, one, np.zeros(1, np.uint8),
               one, np.zeros((1, 2), np.int64))
    from packer.shards.derived_runs import warm as warm_derived

    warm_derived()
    if mrope:
        from packer.shards.mrope import sparse

        sparse(np.zeros(3, np.float32), np.array([0, 1], np.int64))
