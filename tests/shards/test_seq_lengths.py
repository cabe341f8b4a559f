"""Shard schema v3's ``seq_lengths`` (docs/format.md): the examples' lengths exactly where TRL's padding-free
collator rebuilds a row right from them (every example linear, no image or video, no mRoPE), null elsewhere;
``packer verify`` checks both ways; a v2 build (no such column) is still read and verified as v2; the card's
``datasets`` view of an all-linear text build has no media columns (which TRL takes for a vision dataset)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packer.config import BuildConfig
from packer.pipeline.build import build
from packer.pipeline.card import CARD, card_text
from packer.report.verify import verify_build
from packer.shards.io import read_shard, write_json_atomic, write_shard
from packer.shards.schema import SCHEMA, SCHEMAS
from packer.train.dataset import PackedDataset
from tests.helpers import stored_table

pytestmark = pytest.mark.slow  # two real builds (~2 s on a busy 2-core box)

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
LINEAR = [{"messages": [U(f"question {i} " + "w " * (i % 11)), A("answer " * (1 + i % 5))]} for i in range(14)]
TREES = [{"messages": [U(f"pick {i}")], "branches": [[A("one")], [A("two " * (1 + i % 3))]]} for i in range(4)]


def _build(root: Path, name: str, records: list[dict]) -> Path:
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    build(BuildConfig.from_inputs([str(data)], str(root / name), profile="text", max_length=96, rows_per_shard=3,
                                  rows_per_row_group=1), progress=False)
    return root / name


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq_lengths")
    return {"linear": _build(root, "linear", LINEAR), "mixed": _build(root, "mixed", LINEAR[:6] + TREES)}


def _rows(out: Path) -> list[dict]:
    return [r for f in sorted(out.glob("shard-*.parquet")) for r in read_shard(f).to_pylist()]


def test_seq_lengths_where_trl_is_exact(builds):
    for name, out in builds.items():
        rows = _rows(out)
        linear = [all(p == -1 for p in r["node_parents"]) for r in rows]
        assert (name == "linear") == all(linear) and any(linear)
        for r, lin in zip(rows, linear, strict=True):
            if lin:
                assert r["seq_lengths"] == np.diff(r["cu_seqlens"]).tolist()
            else:
                assert r["seq_lengths"] is None  # a tree: TRL would lay it out as one causal sequence
        assert verify_build(out).ok


def _rewrite_rows(out: Path, change, schema: pa.Schema | None = None) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    for s, entry in enumerate(manifest["shards"]):
        rows = read_shard(out / entry["file"]).to_pylist()
        for row in rows:
            change(row)
        table = stored_table(rows) if schema is None else pa.Table.from_pylist(rows, schema=schema)
        new = write_shard(table, out / entry["file"], rows_per_row_group=1)
        manifest["shards"][s] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", manifest)


@pytest.mark.parametrize("fault, check", [
    ("null on a linear row", "seq_lengths missing"),
    ("set on a tree row", "seq_lengths set"),
    ("a wrong length", "seq_lengths"),
    ("one value too few", "seq_lengths length"),
])
def test_verify_catches_wrong_seq_lengths(builds, tmp_path, fault, check):
    out = tmp_path / "out"
    shutil.copytree(builds["linear" if fault == "one value too few" else "mixed"], out)
    done = []

    def change(row):
        if done:
            return
        linear = all(p == -1 for p in row["node_parents"])
        if fault == "null on a linear row" and linear:
            row["seq_lengths"] = None
        elif fault == "set on a tree row" and not linear:
            row["seq_lengths"] = np.diff(row["cu_seqlens"]).tolist()
        elif fault == "a wrong length" and linear:
            row["seq_lengths"][0] += 1
        elif fault == "one value too few" and linear and len(row["seq_lengths"]) > 1:
            row["seq_lengths"] = row["seq_lengths"][:-1]
        else:
            return
        done.append(row)

    _rewrite_rows(out, change)
    assert done
    report = verify_build(out)
    assert not report.ok and {c for _, c in report.counts} == {check}, report.lines()


def test_a_v2_build_is_still_read_and_verified(builds, tmp_path):
    """A build written before v3: no seq_lengths column, schema metadata and manifest say 2."""
    import datasets
    import yaml

    from packer.pipeline.card import features

    out = tmp_path / "v2"
    shutil.copytree(builds["mixed"], out)
    _rewrite_rows(out, lambda row: (row.pop("seq_lengths"), row.pop("loss_weights")), schema=SCHEMAS[2])
    manifest = json.loads((out / "manifest.json").read_text())
    write_json_atomic(out / "manifest.json", {**manifest, "schema_version": 2})
    _, front, rest = (out / CARD).read_text().split("---\n", 2)
    meta = yaml.safe_load(front)
    meta["dataset_info"]["features"] = features(SCHEMAS[2])  # what a v2 build's card listed
    (out / CARD).write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + rest)
    assert pq.ParquetFile(next(out.glob("shard-*.parquet"))).schema_arrow.metadata[b"packer.schema_version"] == b"2"
    report = verify_build(out)
    assert report.ok, report.lines()
    v3 = list(PackedDataset(builds["mixed"], shuffle=False))
    v2 = list(PackedDataset(out, shuffle=False))
    assert [r["example_ids"] for r in v2] == [r["example_ids"] for r in v3]
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(v2, v3, strict=True))
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    assert "seq_lengths" not in loaded.column_names and loaded.num_rows == len(v2)
    assert [f["name"] for f in features(SCHEMAS[2])] == SCHEMAS[2].names


def test_card_view_of_a_linear_text_build_has_no_media_columns(builds, tmp_path):
    """TRL's SFTTrainer takes any `images` column for a vision dataset: the all-linear text build's view leaves the
    (always empty) media columns out; a build with trees keeps them, so TRL's padding-free path refuses it."""
    import datasets

    cache = str(tmp_path / "cache")
    linear = datasets.load_dataset(str(builds["linear"]), cache_dir=cache)["train"]
    mixed = datasets.load_dataset(str(builds["mixed"]), cache_dir=cache)["train"]
    assert "images" not in linear.column_names and "videos" not in linear.column_names
    assert linear.column_names == [n for n in SCHEMA.names if n not in ("images", "videos", "audios")]
    assert mixed.column_names == SCHEMA.names
    assert linear["seq_lengths"] == [np.diff(cu).tolist() for cu in linear["cu_seqlens"]]
    text = card_text(title="t", packer_version="0", profile="text", tokenizer="t", max_length=8, stats_table="-",
                     num_rows=1, shards=[], trl_exact=True)
    assert "columns:" in text and "- images" not in text.split("dataset_info")[0]


def test_mrope_rows_get_no_seq_lengths(tmp_path):
    """A Qwen2-VL build of text chats: its rows are linear, but mRoPE positions are three rows TRL would rebuild as
    one, so no row has seq_lengths and the card keeps every column (TRL's padding-free path refuses the view)."""
    import datasets

    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in LINEAR[:6]))
    out = tmp_path / "vl"
    build(BuildConfig.from_inputs([str(data)], str(out), profile="qwen2-vl", max_length=256), progress=False)
    rows = _rows(out)
    assert all(r["mrope_position_ids"] is not None and r["seq_lengths"] is None for r in rows)
    assert verify_build(out).ok
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    assert "images" in loaded.column_names
