"""The compiled copy loop of ``assemble.take_rows`` (numba): imported by the write stage only, so ``import
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


def warm(mrope: bool = False) -> None:
    """numba started and ``copy_ranges`` loaded from its cache for the columns every shard write copies (the
    strings' bytes, int32 lists; offsets and values read-only, as mapped from a chunk file), the derived
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
    from packer.shards.derived_runs import warm as warm_derived

    warm_derived()
    if mrope:
        from packer.shards.mrope import sparse

        sparse(np.zeros(3, np.float32), np.array([0, 1], np.int64))
