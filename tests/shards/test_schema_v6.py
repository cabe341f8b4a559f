"""Shard schema v6: the mRoPE positions stored sparse (``packer.shards.mrope``) and read back dense, bit for bit,
by every reader (the shard files of ``packer.shards.io``, the HF datasets collator); a damaged encoding is refused.
The v5-written build read as the same tensors: tests/report/test_verify.py::test_a_v5_build_reads_as_the_same_tensors_and_verifies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import ShardError
from packer.models.shared.mrope import mrope_position_ids
from packer.shards import mrope
from packer.shards.io import read_shard
from packer.shards.schema import ROW_SCHEMA, SCHEMA, SCHEMA_VERSION, SCHEMAS
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.trainer import PackedCollator
from tests.helpers import random_example, write_shardset

IMAGE_PAD = 151655


def _roundtrip(rows: list[np.ndarray]) -> tuple:
    row_tokens = np.concatenate([[0], np.cumsum([len(r) // 3 for r in rows])]).astype(np.int64)
    flat = np.concatenate(rows).astype(np.float32) if rows else np.zeros(0, np.float32)
    parts = mrope.sparse(flat, row_tokens)
    off, values = mrope.dense(*parts)
    assert np.array_equal(off, 3 * row_tokens)
    assert np.array_equal(values.view(np.uint32), flat.view(np.uint32))  # every bit, fractions and signs too
    return parts


def test_schema_v6_is_v5_with_the_mrope_column_sparse():
    assert SCHEMA_VERSION == 6 and SCHEMAS[6] is SCHEMA and SCHEMAS[5] is ROW_SCHEMA
    at = ROW_SCHEMA.names.index("mrope_position_ids")
    assert SCHEMA.names == [*ROW_SCHEMA.names[:at], *mrope.SPARSE_COLUMNS, *ROW_SCHEMA.names[at + 1:]]
    assert [SCHEMA.field(c).type for c in mrope.SPARSE_COLUMNS] == [
        pa.list_(pa.int32()), pa.list_(pa.float32()), pa.list_(pa.float32())]


def test_a_qwen2_vl_row_stores_its_text_as_runs_and_its_image_as_it_is():
    """Text, an image of 1x4x6 patches (6 tokens), text: two runs, the image's (t, h, w) in mrope_rest, but its
    first patch's (3, 3, 3), which the text run before it gives as well."""
    ids = np.array([1, 2, 151652, *[IMAGE_PAD] * 6, 151653, 3, 4, 5])
    dense = mrope_position_ids(ids, np.array([0]), np.array([-1]), [(1, 4, 6)], image_token_id=IMAGE_PAD)
    (run_off, runs), (_, bases), (_, rest) = _roundtrip([np.ascontiguousarray(dense.T).reshape(-1)])
    assert runs.tolist() == [0, 4, 9, 4] and bases.tolist() == [0, dense[0, 9]]
    assert rest.reshape(-1, 3).tolist() == dense[:, 4:9].T.tolist()


def test_text_only_rows_are_one_run_per_example():
    rows = [np.repeat(np.arange(n, dtype=np.float32), 3) for n in (5, 0, 7)]
    rows[2] = np.concatenate([rows[2], np.repeat(np.arange(4, dtype=np.float32), 3)])  # two examples in one row
    (run_off, runs), (_, bases), (rest_off, _) = _roundtrip(rows)
    assert run_off.tolist() == [0, 2, 2, 6] and runs.tolist() == [0, 5, 0, 7, 7, 4] and bases.tolist() == [0, 0, 0]
    assert rest_off.tolist() == [0, 0, 0, 0]


positions = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.floats(-1e6, 1e7, width=32)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(positions, max_size=4), st.integers(0, 2**31 - 1))
def test_any_positions_read_back_bit_for_bit(rows, seed):
    """Stretches counting up (whole or fractional bases, large magnitudes where float32 steps are coarse), tokens
    with t, h, w apart, non-finite values: whatever the writer is given comes back with the same bits."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in rows:
        parts = []
        for kind, n, base in spec:
            if kind == 0:  # a text stretch
                parts.append(np.repeat((np.float32(base) + np.arange(n, dtype=np.float32)), 3))
            elif kind == 1:  # vision: t, h, w apart
                parts.append(rng.integers(0, 100, 3 * n).astype(np.float32))
            elif kind == 2:  # a fractional stretch in float64 steps (the rule's own arithmetic)
                parts.append(np.repeat((np.float64(base) + 0.625 + np.arange(n)).astype(np.float32), 3))
            else:
                parts.append(np.array([np.nan, np.inf, -0.0] * n, np.float32))
        out.append(np.concatenate(parts) if parts else np.zeros(0, np.float32))
    _roundtrip(out)


@pytest.mark.parametrize("runs, rest, message", [
    ([0, 5, 3, 2], None, "increasing, non-overlapping"),  # the second run starts inside the first
    ([0, 5, 7, 2], None, "inside the row's tokens"),  # it ends past the row's 8 tokens
    ([0, 5], None, "two values"),  # two bases, one run
    (None, [7, 8], "three values"),
    ([0, 0, 5, 2], None, "no token"),
])
def test_a_damaged_encoding_is_refused(runs, rest, message):
    dense = np.concatenate([np.repeat(np.concatenate([np.arange(5), np.arange(2)]), 3), [7, 8, 9]]).astype(np.float32)
    (_, r), (_, b), (_, s) = _roundtrip([dense])
    assert r.tolist() == [0, 5, 5, 2] and s.tolist() == [7, 8, 9]
    with pytest.raises(ShardError, match=message):
        mrope.dense_row(r if runs is None else runs, b, s if rest is None else rest)


def _example(i: int):
    """An example with qwen-like positions: t = h = w on text, a vision stretch apart on odd examples."""
    e = random_example(np.random.default_rng(i), i, mrope=True)
    e.mrope_position_ids = np.stack([e.position_ids] * 3).astype(np.int32)
    if i % 2 and e.num_tokens > 4:
        e.mrope_position_ids[1:, 1:3] += np.array([[4], [7]], np.int32)
    return e


def test_every_reader_gets_the_dense_positions(tmp_path):
    """A v6 shard: the raw file holds the sparse columns, ``read_shard``, ``PackedDataset`` and the datasets
    collator (``PackedCollator.row`` on the stored lists) the dense ones; a text-profile build has all three null."""
    examples = [_example(i) for i in range(6)]
    root = write_shardset(tmp_path / "out", examples, [2, 3, 1], profile="qwen2-vl")
    want = [np.concatenate([e.mrope_position_ids for e in examples[a:b]], axis=1) for a, b in ((0, 2), (2, 5), (5, 6))]
    shards = sorted(root.glob("shard-*.parquet"))
    raw = pq.read_table(shards[0])
    stored = pq.ParquetFile(shards[0]).schema_arrow
    assert stored.equals(SCHEMA) and stored.metadata[b"packer.schema_version"] == b"6"
    dense = read_shard(shards[0])
    assert dense.column_names == ROW_SCHEMA.names
    got = [np.asarray(m, np.float32).reshape(-1, 3).T for m in dense.column("mrope_position_ids").to_pylist()]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    rows = list(PackedDataset(root, shuffle=False, load_images=False))
    assert all(np.array_equal(r["mrope_position_ids"], w) for r, w in zip(rows, want, strict=True))
    collator = PackedCollator(root)
    plain = raw.to_pylist()  # what a `datasets` row holds: the stored lists
    assert np.array_equal(collator.row(plain[0])["mrope_position_ids"], want[0])
    assert mrope.to_dense(raw.select(["input_ids"])).column_names == ["input_ids"]  # nothing to densify
    text = write_shardset(tmp_path / "text", [random_example(np.random.default_rng(9), 9)], [1])
    t = pq.read_table(next(text.glob("shard-*.parquet")))
    assert all(t.column(c).null_count == 1 for c in mrope.SPARSE_COLUMNS)
    assert read_shard(next(text.glob("shard-*.parquet"))).column("mrope_position_ids").null_count == 1
    assert "position_ids" in collate(list(PackedDataset(text, shuffle=False)))
