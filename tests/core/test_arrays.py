"""``core.arrays``: the segments' indices, back to back, against the Python loop they replace."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from packer.core.arrays import ranges, spans

counts_st = st.lists(st.integers(0, 6), max_size=12)


@given(counts_st)
def test_ranges_is_each_segment_counted_from_zero(counts):
    got = ranges(np.asarray(counts, dtype=np.int32))
    assert got.dtype == np.int64
    assert got.tolist() == [k for n in counts for k in range(n)]


@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 6)), max_size=12))
def test_spans_are_each_segment_from_its_start(pairs):
    starts, counts = [s for s, _ in pairs], [n for _, n in pairs]
    got = spans(np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == [s + k for s, n in pairs for k in range(n)]


def test_docstring_examples():
    assert ranges([2, 0, 3]).tolist() == [0, 1, 0, 1, 2]
    assert spans([5, 9, 20], [2, 0, 3]).tolist() == [5, 6, 20, 21, 22]
    assert ranges(np.zeros(0, dtype=np.int64)).shape == (0,)
