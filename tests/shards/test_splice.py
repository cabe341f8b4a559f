"""A shard spliced from part files (``shards/splice.py``) is byte for byte ``pq.write_table``'s whole shard."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packer.shards.io import sha256_file, shard_options
from packer.shards.splice import SpliceError, decode, encode, splice


def _table(rng: np.random.Generator, n: int) -> pa.Table:
    lens = rng.integers(0, 60, n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 152_000, int(lens.sum())).astype(np.int32)))
    sources = pa.ListArray.from_arrays(np.arange(n + 1, dtype=np.int32),
                                       pa.array([f"data-{i}.jsonl" for i in rng.integers(0, 4, n)]))
    return pa.table({
        "input_ids": ids,
        "num_tokens": pa.array(lens.astype(np.int64)),
        "num_loss_tokens": pa.array((lens // 2).astype(np.int64)),
        "example_sources": sources,
        "score": pa.array(rng.random(n)),
        "flag": pa.array(rng.random(n) < 0.5),
        "note": pa.array([None if k % 3 else f"n{k}" for k in range(n)], pa.string()),
    })


@pytest.mark.parametrize("seed", range(12))
def test_spliced_bytes_are_the_whole_shards(tmp_path, seed):
    rng = np.random.default_rng(seed)
    group = int(rng.choice([1, 2, 7, 64]))
    n = int(rng.integers(1, 40 * group))
    table = _table(rng, n)
    opts = shard_options(group)
    pq.write_table(table, tmp_path / "whole.parquet", **opts)
    groups = -(-n // group)
    cuts = sorted(set(rng.integers(1, groups, size=int(rng.integers(1, 4))).tolist())) if groups > 1 else []
    edges = [0, *(c * group for c in cuts), n]
    parts = []
    for k, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        parts.append(tmp_path / f"part-{k}.parquet")
        pq.write_table(table.slice(a, b - a), parts[-1], **opts)
    entry = splice(parts, tmp_path / "spliced.parquet")
    whole = (tmp_path / "whole.parquet").read_bytes()
    assert (tmp_path / "spliced.parquet").read_bytes() == whole, (n, group, edges)
    assert entry == {"rows": n, "sha256": sha256_file(tmp_path / "whole.parquet"), "bytes": len(whole)}
    assert pq.read_table(tmp_path / "spliced.parquet").equals(table)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_footer_reencodes_to_its_bytes(tmp_path):
    pq.write_table(_table(np.random.default_rng(1), 300), tmp_path / "a.parquet", **shard_options(64))
    data = (tmp_path / "a.parquet").read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    raw = data[-8 - n : -8]
    assert encode(decode(raw)) == raw


def test_a_part_it_cannot_splice_exactly_raises_and_leaves_nothing(tmp_path):
    rng = np.random.default_rng(2)
    table = _table(rng, 200)
    pq.write_table(table.slice(0, 128), tmp_path / "p0.parquet", **shard_options(64))
    pq.write_table(table.slice(128), tmp_path / "p1.parquet", **shard_options(64), write_page_index=True)
    with pytest.raises(SpliceError):
        splice([tmp_path / "p0.parquet", tmp_path / "p1.parquet"], tmp_path / "out.parquet")
    other = pa.table({"x": pa.array(range(10))})
    pq.write_table(other, tmp_path / "p2.parquet")
    with pytest.raises(SpliceError):
        splice([tmp_path / "p0.parquet", tmp_path / "p2.parquet"], tmp_path / "out.parquet")
    (tmp_path / "p3.parquet").write_bytes((tmp_path / "p0.parquet").read_bytes()[:-20])  # a truncated part
    with pytest.raises(SpliceError):
        splice([tmp_path / "p3.parquet"], tmp_path / "out.parquet")
    assert sorted(os.listdir(tmp_path)) == ["p0.parquet", "p1.parquet", "p2.parquet", "p3.parquet"]
