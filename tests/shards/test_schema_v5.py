"""Shard schema v5: mRoPE positions stored as float32 (Qwen3-Omni's video time positions are fractional), whole
numbers exactly for every other family; readers give int64 positions unless the profile's are fractional, refuse
a non-whole position of an integer family, and still read v4 shards (int32 positions)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import torch

from packer.errors import ShardError
from packer.models.qwen_vl import QwenVLProfile
from packer.models.registry import _PROFILES, register_profile
from packer.models.shared.mrope import MRoPE
from packer.shards.assemble import assemble_packs, encoded_table, mrope_values, take_rows
from packer.shards.io import read_shard, write_json_atomic
from packer.shards.mrope import dense_row, to_dense
from packer.shards.schema import (
    AUDIO_TYPE,
    EXAMPLE_SCHEMA,
    MAX_EXACT_POSITION,
    ROW_SCHEMA,
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMAS,
)
from packer.train.collate import collate
from packer.train.dataset import PackedDataset, _decode_block, _row
from packer.train.trainer import PackedCollator
from tests.helpers import random_example, write_shardset


@dataclasses.dataclass(frozen=True, kw_only=True)
class _FractionalQwen(QwenVLProfile):
    """Qwen2-VL's profile saying its positions may be fractional (as Qwen3-Omni's): what the readers key on."""

    @property
    def positions(self) -> MRoPE:
        return _FractionalMRoPE(merge_size=self.merge_size)


@dataclasses.dataclass(frozen=True)
class _FractionalMRoPE(MRoPE):
    fractional = True


@pytest.fixture(scope="module")
def fractional():
    profile = register_profile(_FractionalQwen(name="test-fractional-mrope"))
    yield profile
    del _PROFILES[profile.name]


def _examples(n: int, *, seed: int = 0, fraction: bool = False) -> list:
    """Examples with mRoPE rows; ``fraction``: their t rows moved by a float32 fraction (as Qwen3-Omni's
    ``t * second_per_grid * 13`` and everything after it)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        e = random_example(rng, i, mrope=True)
        if fraction:
            e.mrope_position_ids = e.mrope_position_ids.astype(np.float32)
            e.mrope_position_ids[0] += np.float32(0.625) * (np.arange(e.num_tokens) % 3)
        out.append(e)
    return out


def test_v5_differs_from_v4_in_the_mrope_dtype_and_padded_samples_only():
    assert SCHEMA_VERSION == 6 and set(SCHEMAS) == {2, 3, 4, 5, 6} and SCHEMAS[5] is ROW_SCHEMA
    v4 = SCHEMAS[4]
    assert v4.metadata == {b"packer.schema_version": b"4"} and ROW_SCHEMA.metadata == {b"packer.schema_version": b"5"}
    assert v4.names == ROW_SCHEMA.names
    changed = [f.name for f in ROW_SCHEMA if not f.equals(v4.field(f.name))]
    assert changed == ["mrope_position_ids", "audios"]
    assert ROW_SCHEMA.field("mrope_position_ids").type == pa.list_(pa.float32())
    # the encode cache (format 2) stores mRoPE as v6 shards do, example-relative
    assert [EXAMPLE_SCHEMA.field(c).type for c in ("mrope_runs", "mrope_bases", "mrope_rest")] == [
        SCHEMA.field(c).type for c in ("mrope_runs", "mrope_bases", "mrope_rest")]
    for version in (2, 3, 4):  # older shards: int32 positions, no padded_samples
        assert SCHEMAS[version].field("mrope_position_ids").type == pa.list_(pa.int32())
    v4_audio = v4.field("audios").type.value_type
    assert AUDIO_TYPE.field(AUDIO_TYPE.num_fields - 1).name == "padded_samples"  # appended last, nullable
    assert AUDIO_TYPE.field("padded_samples").nullable
    assert pa.struct(list(AUDIO_TYPE)[:-1]).equals(v4_audio)


def test_mrope_values_are_exact_or_refused():
    ints = np.array([[0, 1, MAX_EXACT_POSITION - 1], [0, 2, 5], [0, 3, 7]], np.int32)  # (3, L)
    got = mrope_values(ints)
    assert got.dtype == np.float32 and got.tolist() == ints.T.reshape(-1).tolist()  # token-major
    frac = np.array([[0.0, 1.625, 3.25], [0, 1, 2], [0, 1, 2]], np.float32)
    assert np.array_equal(mrope_values(frac), frac.T.reshape(-1))
    with pytest.raises(ShardError, match="f.jsonl:3.*float32 exactly"):
        mrope_values(np.array([[0, MAX_EXACT_POSITION + 1]] * 3, np.int64), "f.jsonl:3")
    with pytest.raises(ShardError, match="float32 exactly"):  # the bound: 2^24 itself, whose neighbours are not
        mrope_values(np.array([[0, MAX_EXACT_POSITION]] * 3, np.int32))
    with pytest.raises(ShardError):  # a float64 position float32 would round
        mrope_values(np.array([[0.1, 1.0]] * 3, np.float64))


@pytest.mark.parametrize("fraction", [False, True])
def test_int_and_float_positions_pack_exactly(fraction, tmp_path):
    """A family's int32 (or float32) positions -> the encode cache -> take_rows -> assemble -> a row (the
    online packer's path, ``_row(_decode_block(...))``): every value kept, stored float32."""
    examples = _examples(5, fraction=fraction)
    table = encoded_table(examples)
    assert table.schema.equals(EXAMPLE_SCHEMA)
    path = tmp_path / "chunk.arrow"
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, EXAMPLE_SCHEMA) as writer:
        writer.write_table(table)
    taken = take_rows([path], np.array([0, 5]), np.array([3, 0, 4]))  # the dense numpy copy path
    for k, i in enumerate((3, 0, 4)):
        want = examples[i].mrope_position_ids.T.reshape(-1)
        row = taken.slice(k, 1).to_pylist()[0]  # the cache's sparse columns (format 2) give back every value
        assert np.array_equal(dense_row(row["mrope_runs"], row["mrope_bases"], row["mrope_rest"]), want)
    packed = assemble_packs(taken, np.array([2, 1]))
    assert packed.schema.equals(SCHEMA)
    row = _row(_decode_block(to_dense(packed)), 0)  # as the shard file reads it back
    assert row["mrope_position_ids"].dtype == np.float32
    want = np.concatenate([examples[3].mrope_position_ids, examples[0].mrope_position_ids], axis=1)
    assert np.array_equal(row["mrope_position_ids"], want)


def _rows(root, **kw) -> list[dict]:
    return list(PackedDataset(root, shuffle=False, **kw))


def test_collate_gives_int64_positions_of_an_integer_family(tmp_path):
    examples = _examples(6, seed=1)
    root = write_shardset(tmp_path / "out", examples, [2, 3, 1], profile="qwen2-vl")
    rows = _rows(root)
    assert rows[0]["mrope_position_ids"].dtype == np.float32  # as stored
    batch = collate(rows)
    pos = batch["position_ids"]
    assert pos.shape == (4, 1, sum(e.num_tokens for e in examples)) and pos.dtype == torch.int64
    want = np.concatenate([e.mrope_position_ids for e in examples], axis=1)
    assert np.array_equal(pos[1:, 0].numpy(), want)
    assert np.array_equal(pos[0, 0].numpy(), np.concatenate([e.position_ids for e in examples]))
    # rows without a profile (hand-made, or a text collator) get int64 too
    bare = [{k: v for k, v in r.items() if k not in ("profile", "profile_options")} for r in rows]
    assert torch.equal(collate(bare)["position_ids"], pos)


def test_collate_refuses_fractional_positions_of_an_integer_family(tmp_path):
    root = write_shardset(tmp_path / "out", _examples(3, seed=2, fraction=True), [3], profile="qwen2-vl")
    rows = _rows(root)
    with pytest.raises(ShardError, match="not whole numbers.*qwen2-vl"):
        collate(rows)
    bare = [{k: v for k, v in r.items() if k not in ("profile", "profile_options")} for r in rows]
    with pytest.raises(ShardError, match="not whole numbers"):  # never truncated, profile or not
        collate(bare)


def test_collate_gives_float32_positions_of_a_fractional_family(fractional, tmp_path):
    examples = _examples(4, seed=3, fraction=True)
    root = write_shardset(tmp_path / "out", examples, [3, 1], profile=fractional.name)
    rows = _rows(root)
    batch = collate(rows)
    pos = batch["position_ids"]
    assert pos.dtype == torch.float32 and pos.shape[:2] == (4, 1)
    want = np.concatenate([e.mrope_position_ids for e in examples], axis=1)
    assert np.array_equal(pos[1:, 0].numpy(), want) and (want % 1 != 0).any()
    assert np.array_equal(pos[0, 0].numpy(), np.concatenate([e.position_ids for e in examples]).astype(np.float32))
    # whole-number rows of a fractional family are float32 too: one dtype per family, whatever the batch
    whole = write_shardset(tmp_path / "whole", _examples(2, seed=4), [2], profile=fractional.name)
    assert collate(_rows(whole))["position_ids"].dtype == torch.float32


def test_hf_datasets_rows_keep_their_positions(fractional, tmp_path):
    """The datasets path (PackedCollator.row on list columns) used to cast mRoPE to int32: fractions kept now."""
    examples = _examples(3, seed=5, fraction=True)
    root = write_shardset(tmp_path / "out", examples, [3], profile=fractional.name)
    (shard,) = sorted(root.glob("shard-*.parquet"))
    plain = pq.read_table(shard).to_pylist()  # what a datasets row holds: the stored (v6: sparse) lists
    collator = PackedCollator(root)
    row = collator.row(plain[0])
    want = np.concatenate([e.mrope_position_ids for e in examples], axis=1)
    assert np.array_equal(row["mrope_position_ids"], want)
    assert np.array_equal(collate([row])["position_ids"][1:, 0].numpy(), want)
    assert np.array_equal(collator([plain[0]])["position_ids"], collate(_rows(root))["position_ids"])
    ints = write_shardset(tmp_path / "ints", _examples(2, seed=5), [2], profile="qwen2-vl")
    plain = pq.read_table(next(ints.glob("shard-*.parquet"))).to_pylist()
    assert collate([PackedCollator(ints).row(plain[0])])["position_ids"].dtype == torch.int64


def test_a_v4_shard_with_int32_positions_still_reads(tmp_path):
    examples = _examples(5, seed=6)
    root = write_shardset(tmp_path / "out", examples, [2, 3], profile="qwen2-vl")
    v5 = collate(_rows(root))
    for shard in root.glob("shard-*.parquet"):  # as v4 wrote it: int32 positions, v4 audio struct and metadata
        table = read_shard(shard)
        old = pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in SCHEMAS[4]], schema=SCHEMAS[4])
        pq.write_table(old, shard, row_group_size=2)
    manifest = json.loads((root / "manifest.json").read_text())
    write_json_atomic(root / "manifest.json", {**manifest, "schema_version": 4})
    assert pq.ParquetFile(shard).schema_arrow.field("mrope_position_ids").type == pa.list_(pa.int32())
    rows = _rows(root)
    assert rows[0]["mrope_position_ids"].dtype == np.int32
    v4 = collate(rows)
    assert v4["position_ids"].dtype == torch.int64 and torch.equal(v4["position_ids"], v5["position_ids"])
    plain = read_shard(shard).to_pylist()
    assert torch.equal(collate([PackedCollator(root).row(plain[-1])])["position_ids"],
                       collate(rows[-1:])["position_ids"])
