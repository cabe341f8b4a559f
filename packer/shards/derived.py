"""The encode cache's labels and 1-D positions, stored only where they cannot be derived (cache format 3).

Most examples' labels are their own token ids on a few spans (the assistant turns) and -100 elsewhere, and their
positions count 0, 1, ... L-1. Writing those twice more beside ``input_ids`` tripled the bytes every chunk file,
exchange map output and gather moves (docs/benchmarks.md, "Build throughput", session 21). So an example holds

    labels       []    where its labels are ``input_ids`` on the spans of ``label_runs`` and -100 elsewhere,
                 else its L labels (``label_runs`` then empty)
    label_runs   2·S   (start, length) of each loss span, example-relative, increasing
    position_ids []    where its positions are 0 .. L-1, else its L positions (a tree's branches)

``compact`` (the encode's side, one compiled pass over a chunk: ``derived_runs.split_derived``) decides per
example, keeping the full column wherever the rule would not give back every value; ``expand`` (the write's
side, ``derived_runs.fill_derived``) makes the dense columns of the rows, refusing an example whose columns do
not describe its tokens. Shards are unchanged: they hold the
dense columns every reader expects.
"""

from __future__ import annotations

import numpy as np

from packer.errors import ShardError


def compact(ids: np.ndarray, labels: np.ndarray, positions: np.ndarray, offsets: np.ndarray
            ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(offsets, values) of the cache's ``labels``, ``label_runs`` and ``position_ids`` columns of n examples
    whose tokens lie back to back in ``ids``, ``labels``, ``positions`` (T,), example i at ``offsets[i]`` ..
    ``offsets[i + 1]`` ((n+1,), from 0)."""
    from packer.shards.derived_runs import SPLIT, readonly, split_derived  # numba: at the first use only

    offsets = np.asarray(offsets, dtype=np.int64)
    n, T = len(offsets) - 1, int(offsets[-1])
    lengths = np.diff(offsets)
    pos_kept = np.empty(n, dtype=np.bool_)
    lab_kept = np.empty(n, dtype=np.bool_)
    runs = np.empty(T + 2 * n, dtype=np.int32)  # a span is a token at least, and spans are apart: <= T/2 + n
    per_example = np.empty(n, dtype=np.int64)
    w = split_derived(*readonly(offsets, ids, labels, positions, dtypes=SPLIT), pos_kept, lab_kept, runs,
                      per_example)
    run_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_example, out=run_off[1:])
    return _kept(labels, lengths, lab_kept), (run_off, runs[:w]), _kept(positions, lengths, pos_kept)


def _kept(values: np.ndarray, lengths: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list column holding the examples ``kept`` in full and the others empty."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.where(kept, lengths, 0), out=off[1:])
    if kept.all():
        return off, np.asarray(values, dtype=np.int32)
    if not kept.any():
        return off, np.zeros(0, dtype=np.int32)
    return off, np.asarray(values[np.repeat(kept, lengths)], dtype=np.int32)


def expand(tok_off: np.ndarray, ids: np.ndarray, labels: tuple[np.ndarray, np.ndarray],
           runs: tuple[np.ndarray, np.ndarray], positions: tuple[np.ndarray, np.ndarray],
           out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The dense labels and positions (T,) int32 of examples back to back (``tok_off``: (n+1,) their token
    starts in ``ids``), from their cache columns (each (offsets from 0, values)). ShardError naming the
    example whose columns do not describe its tokens (a damaged chunk file). ``out``: two int32 arrays of at
    least T to write them into (the writer's reused buffers), else new ones."""
    from packer.shards.derived_runs import fill_derived, readonly  # numba: the writer's import only

    T = int(tok_off[-1])
    if out is None:
        out_labels = np.empty(T, dtype=np.int32)
        out_positions = np.empty(T, dtype=np.int32)
    else:
        out_labels, out_positions = out[0][:T], out[1][:T]
    bad = fill_derived(*readonly(tok_off, ids, *labels, *runs, *positions), out_labels, out_positions)
    if bad >= 0:
        raise ShardError(f"example {bad} has labels, label runs or positions that do not describe its "
                         f"{int(tok_off[bad + 1] - tok_off[bad])} tokens (a damaged encode cache chunk)")
    return out_labels, out_positions


class Buffers:
    """Two int32 arrays a shard's write reuses for the dense labels and positions of each slice of its rows
    (``assemble_packs``' ``buffers``), grown to the largest slice: a (T,) pair for the whole shard was 8 bytes a
    token of fresh pages, each faulted in and zeroed by the kernel (docs/benchmarks.md, "Build throughput",
    session 22). What ``pair`` gives is valid until its next call."""

    def __init__(self) -> None:
        self._pair: tuple[np.ndarray, np.ndarray] | None = None

    def pair(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Two int32 arrays of at least ``n`` (the same two as before where they are long enough)."""
        if self._pair is None or self._pair[0].shape[0] < n:
            self._pair = (np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32))
        return self._pair
