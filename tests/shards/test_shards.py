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
