"""The encode cache's per-example sparse mRoPE columns merged into packed rows (``mrope.row_columns``) equal the
rows' own split (``mrope.sparse_columns`` of their dense positions), value for value, wherever a run of the row
would cross from one example into the next: continued positions, a lone text token before the next example's
run, fractions, floats that round past 2^24, -0.0, NaN, an example of no token."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from packer.errors import ShardError
from packer.shards.mrope import SPARSE_COLUMNS, example_columns, row_columns, sparse_columns


def _example(rng: np.random.Generator, start: float) -> np.ndarray:
    """(L, 3) positions: text stretches counting up from ``start`` (or from a jump), image-like blocks, odd tokens."""
    parts, pos = [], start
    for _ in range(int(rng.integers(0, 5))):
        kind = rng.integers(0, 6)
        n = int(rng.integers(1, 6))
        if kind <= 1:  # text: t = h = w counting up
            v = pos + np.arange(n)
            parts.append(np.stack([v, v, v], axis=1))
            pos += n
        elif kind == 2:  # an image block: t fixed, h and w a grid
            parts.append(np.stack([np.full(n, pos), pos + np.arange(n) // 2, pos + np.arange(n) % 2], axis=1))
            pos += 2
        elif kind == 3:  # a jump (a tree's branch starting again)
            pos = float(rng.integers(0, 4))
        elif kind == 4:  # a lone token t = h = w, then a gap
            parts.append(np.array([[pos, pos, pos]]))
            pos += 2
        else:  # values no run takes: -0.0, NaN, fractions, floats past 2^24 that round
            v = rng.choice(np.array([-0.0, np.nan, 0.5, 1.25, 2.0**24 - 1, 2.0**24 + 2, 1.1], np.float64), n)
            parts.append(np.stack([v, v, v], axis=1))
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, 3), np.float32)


def _merged_and_reference(examples: list[np.ndarray], pack_sizes: list[int]) -> tuple[dict, dict]:
    lengths = np.array([len(e) for e in examples], np.int64)
    values = np.concatenate([e.reshape(-1) for e in examples]).astype(np.float32)
    cols = example_columns(values, lengths)
    parts = {c: (cols[c].offsets.to_numpy().astype(np.int64), cols[c].values.to_numpy()) for c in SPARSE_COLUMNS}
    bounds = np.concatenate([[0], np.cumsum(pack_sizes)]).astype(np.int64)
    got = row_columns(lengths, parts["mrope_runs"], parts["mrope_bases"], parts["mrope_rest"], bounds)
    row_tokens = np.concatenate([[0], np.cumsum(lengths)])[bounds]
    return got, sparse_columns(values, row_tokens)


def _same(got: dict[str, pa.Array], want: dict[str, pa.Array]) -> None:
    for c in SPARSE_COLUMNS:
        g, w = got[c], want[c]
        assert g.offsets.to_pylist() == w.offsets.to_pylist(), c
        assert g.values.to_numpy().tobytes() == w.values.to_numpy().tobytes(), c  # bit for bit: NaN, -0.0


@pytest.mark.parametrize("seed", range(40))
def test_rows_from_example_columns_equal_the_rows_split(seed):
    rng = np.random.default_rng(seed)
    examples, prev_end = [], 0.0
    for _ in range(int(rng.integers(1, 14))):
        # starts at 0 (every family's text), or right after the previous example's last position: a run crosses
        start = prev_end if rng.random() < 0.4 else float(rng.choice([0.0, 0.5, 2.0**24 - 3]))
        e = _example(rng, start)
        examples.append(e)
        if len(e):
            prev_end = float(e[-1, 0]) + 1
    sizes, left = [], len(examples)
    while left:
        sizes.append(int(rng.integers(1, left + 1)))
        left -= sizes[-1]
    got, want = _merged_and_reference(examples, sizes)
    _same(got, want)


def test_a_run_crossing_examples_is_split_as_the_row():
    """Positions 0..3 then 4..6 in two examples: one run of 7 tokens in the row, not two; a lone token 9 then
    an example starting 10, 11: one run of three."""
    text = [np.repeat(np.arange(a, b, dtype=np.float32)[:, None], 3, axis=1) for a, b in ((0, 4), (4, 7))]
    got, want = _merged_and_reference(text, [2])
    _same(got, want)
    assert got["mrope_runs"].values.to_pylist() == [0, 7]
    lone = [np.array([[5, 6, 7], [9, 9, 9]], np.float32), np.array([[10, 10, 10], [11, 11, 11]], np.float32)]
    got, want = _merged_and_reference(lone, [2])
    _same(got, want)
    assert got["mrope_runs"].values.to_pylist() == [1, 3]


@pytest.mark.parametrize("pairs", [[2, 2, 0, 2], [0, 2, 1, 2], [0, 5], [0, 0]])
def test_columns_that_do_not_describe_the_tokens_are_refused(pairs):
    """Runs out of order, overlapping, past the example's end or empty: a ShardError naming the example, before
    anything is read through them."""
    ex_tokens = np.array([3, 4], np.int64)
    runs = (np.array([0, 0, len(pairs)]), np.array(pairs, np.int32))
    bases = (np.array([0, 0, len(pairs) // 2]), np.zeros(len(pairs) // 2, np.float32))
    rest_n = 3 * (4 - sum(pairs[1::2]))
    rest = (np.array([0, 9, 9 + max(rest_n, 0)]), np.zeros(9 + max(rest_n, 0), np.float32))
    with pytest.raises(ShardError, match="example 1 has mRoPE runs"):
        row_columns(ex_tokens, runs, bases, rest, np.array([0, 2]))
