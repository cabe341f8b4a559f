"""Pack assembly: every example's arrays come back exactly from the row, offsets shifted correctly."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import ShardError
from packer.shards.assemble import assemble_packs, encoded_table
from packer.shards.io import open_shards
from packer.shards.mrope import to_dense
from packer.shards.schema import SCHEMA
from tests.helpers import random_example, write_shardset


def _reference_row(examples):
    """The row built the obvious way, with Python loops (independent of assemble_packs)."""
    starts = np.cumsum([0] + [e.num_tokens for e in examples])
    node_base = np.cumsum([0] + [len(e.node_offsets) for e in examples])
    return {
        "input_ids": np.concatenate([e.input_ids for e in examples]).tolist(),
        "labels": np.concatenate([e.labels for e in examples]).tolist(),
        "position_ids": np.concatenate([e.position_ids for e in examples]).tolist(),
        "cu_seqlens": starts.tolist(),
        "node_offsets": [int(o + s) for e, s in zip(examples, starts, strict=False) for o in e.node_offsets],
        "node_parents": [int(p + b) if p >= 0 else -1
                         for e, b in zip(examples, node_base, strict=False) for p in e.node_parents],
        "image_offsets": [im.offset + int(s) for e, s in zip(examples, starts, strict=False) for im in e.images],
        "example_ids": [e.example_id for e in examples],
        "num_loss_tokens": sum(e.num_loss_tokens for e in examples),
    }


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6),
       mrope=st.booleans())
def test_assemble_matches_reference(seed, sizes, mrope):
    rng = np.random.default_rng(seed)
    examples = [random_example(rng, i, images=True, mrope=mrope) for i in range(sum(sizes))]
    packed = assemble_packs(encoded_table(examples), np.array(sizes))
    assert packed.schema == SCHEMA
    assert packed.num_rows == len(sizes)
    rows = to_dense(packed).to_pylist()  # as the shard files read it back
    bounds = np.cumsum([0] + sizes)
    for p, row in enumerate(rows):
        group = examples[bounds[p] : bounds[p + 1]]
        ref = _reference_row(group)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents", "example_ids"):
            assert row[key] == ref[key], key
        assert [im["offset"] for im in row["images"]] == ref["image_offsets"]
        assert row["num_tokens"] == ref["cu_seqlens"][-1]
        assert row["num_loss_tokens"] == ref["num_loss_tokens"]
        if mrope:
            got = np.array(row["mrope_position_ids"]).reshape(-1, 3).T  # token-major in the shard
            np.testing.assert_array_equal(got, np.concatenate([e.mrope_position_ids for e in group], axis=1))
        else:
            assert row["mrope_position_ids"] is None


def test_assemble_rejects_bad_sizes():
    rng = np.random.default_rng(0)
    table = encoded_table([random_example(rng, i) for i in range(3)])
    with pytest.raises(ValueError, match="add up to 2"):
        assemble_packs(table, np.array([1, 1]))


def test_shard_files_follow_schema(tmp_path):
    rng = np.random.default_rng(1)
    examples = [random_example(rng, i) for i in range(10)]
    root = write_shardset(tmp_path / "out", examples, [3, 3, 2, 2], rows_per_shard=3)
    shards = open_shards(root)
    assert [s.rows for s in shards.shards] == [3, 1]
    f = pq.ParquetFile(root / "shard-00000.parquet")
    assert f.schema_arrow.equals(SCHEMA, check_metadata=False)
    assert f.metadata.num_row_groups == 2  # rows_per_row_group=2
    assert f.metadata.row_group(0).column(0).compression == "ZSTD"
    assert not list(root.glob("*.tmp-*"))


def test_open_shards_refuses_unfinished(tmp_path):
    (tmp_path / "shard-00000.parquet").write_bytes(b"")
    with pytest.raises(ShardError, match="did not finish"):
        open_shards(tmp_path)


def test_a_shard_written_in_slices_of_whole_row_groups_is_the_same_bytes(tmp_path):
    """``write_shard`` of a table's slices (each but the last whole row groups) == of the table; a slice that
    starts inside a row group is refused, and leaves no file."""
    import pyarrow as pa

    from packer.shards.io import write_shard

    rng = np.random.default_rng(0)
    lists = [rng.integers(0, 1000, rng.integers(1, 50)).astype(np.int32) for _ in range(23)]
    table = pa.table({"input_ids": pa.array(lists, pa.list_(pa.int32())),
                      "num_tokens": pa.array([len(x) for x in lists], pa.int32()),
                      "example_sources": pa.array([["a"] * (i % 3 + 1) for i in range(23)], pa.list_(pa.string()))})
    whole = write_shard(table, tmp_path / "whole.parquet", rows_per_row_group=3)
    parts = write_shard((table.slice(0, 6), table.slice(6, 3), table.slice(9)), tmp_path / "parts.parquet",
                        rows_per_row_group=3)
    assert (tmp_path / "whole.parquet").read_bytes() == (tmp_path / "parts.parquet").read_bytes()
    assert parts["rows"] == whole["rows"] == 23 and parts["sha256"] == whole["sha256"]
    with pytest.raises(ValueError, match="inside a row group"):
        write_shard((table.slice(0, 4), table.slice(4)), tmp_path / "bad.parquet", rows_per_row_group=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts.parquet", "whole.parquet"]


def test_buffers_are_reused_until_a_longer_pair_is_asked():
    from packer.shards.derived import Buffers

    b = Buffers()
    first = b.pair(10)
    assert [a.shape for a in first] == [(10,), (10,)] and all(a.dtype == np.int32 for a in first)
    assert all(x is y for x, y in zip(b.pair(7), first, strict=True))
    longer = b.pair(11)
    assert longer[0].shape == (11,) and longer[0] is not first[0]
