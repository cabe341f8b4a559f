"""Example ids (packer/core/ids.py): the copy marks a shard's writer appends, against the id forms' rule."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.ids import ID_PATTERN, chunk_id, copy_ids, id_location

_IDS = st.lists(st.tuples(st.text(min_size=1, max_size=12).filter(lambda p: "\n" not in p),
                          st.integers(1, 10**9), st.one_of(st.none(), st.integers(0, 99)), st.integers(0, 300)),
                min_size=1, max_size=40)


@settings(deadline=None, max_examples=60)
@given(_IDS)
def test_copy_ids_append_the_copy_mark_where_a_copy_number_is_set(rows):
    ids = [f"{p}:{line}" if c is None else chunk_id(f"{p}:{line}", c) for p, line, c, _ in rows]
    copies = np.array([k for *_, k in rows], dtype=np.int64)
    chunked = pa.chunked_array([pa.array(ids[: len(ids) // 2], pa.string()), pa.array(ids[len(ids) // 2 :], pa.string())])
    got = copy_ids(chunked, copies).to_pylist()
    assert got == [i if k == 0 else f"{i}#{k}" for i, k in zip(ids, copies.tolist(), strict=True)]
    for one, (path, line, chunk, k) in zip(got, rows, strict=True):
        m = re.match(ID_PATTERN, one, re.DOTALL)
        assert m and m["path"] == path and int(m["line"]) == line and id_location(one) == (path, line)
        assert m["chunk"] == (None if chunk is None else str(chunk))
        assert m["copy"] == (None if k == 0 else str(k))
