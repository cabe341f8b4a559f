"""Hugging Face datasets in and out, end to end on real COCO images.

In: a Parquet file (``datasets.Image`` columns, embedded bytes, a list of them per row) packs to exactly the
examples its JSONL twin (the same records, images as data URLs) packs to; a ``save_to_disk`` directory and a
Hub snapshot pack too; ``--columns`` maps LLaVA-style columns; bad rows are rejects at ``file:row``; every
row is accounted for by ``packer verify --input``. Out: ``datasets.load_dataset(OUT)`` with no data arguments
reads the same rows as ``PackedDataset``.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.shards.io import read_shard
from packer.shards.mrope import dense_row
from packer.shards.schema import SCHEMA

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

BUILD = {"profile": "qwen2-vl", "max_length": 768, "max_pixels": 128 * 28 * 28, "rows_per_shard": 2,
         "rows_per_row_group": 1}


def _chat_rows(jpegs: list[bytes]) -> list[dict]:
    """Rows of the TRL/HF vision-chat layout: ``images`` (a list of Image) + ``messages`` with image parts;
    a ``text`` row in the same table (nulls elsewhere), then two bad rows."""
    def msg(role, *parts):
        return {"role": role, "content": [{"type": t, "text": x} for t, x in parts]}

    rows = []
    for i in range(6):
        n_img = 1 + i % 2  # one or two images per row
        rows.append({"messages": [msg("user", *[("image", None)] * n_img, ("text", f"Describe picture {i}." + " more" * i)),
                                  msg("assistant", ("text", f"It is picture number {i}."))],
                     "images": [{"bytes": jpegs[(i + k) % len(jpegs)], "path": f"img{i}_{k}.jpg"} for k in range(n_img)],
                     "text": None})
    rows.append({"messages": None, "images": None, "text": "Plain pretraining text. " * 4})
    rows.append({"messages": None, "images": None, "text": None})  # no field at all: unknown_format at row 8
    rows.append({"messages": [msg("user", ("image", None), ("text", "What?")), msg("assistant", ("text", "Noise."))],
                 "images": [{"bytes": b"\xff\xd8\xff\xe0 not a jpeg", "path": None}], "text": None})  # bad_image, row 9
    return rows


def _features():
    from datasets import Features, Image, List, Value

    part = {"type": Value("string"), "text": Value("string")}
    return Features({"messages": List({"role": Value("string"), "content": List(part)}), "images": List(Image()),
                     "text": Value("string")})


def _as_json(row: dict) -> dict:
    """The JSONL twin of a row: nulls dropped, embedded bytes as data URLs."""
    out = {k: v for k, v in row.items() if v is not None}
    if "images" in out:
        out["images"] = ["data:image/jpeg;base64," + base64.b64encode(im["bytes"]).decode() for im in out["images"]]
    return out


def _row_number(example_id: str) -> int:
    return int(example_id.rpartition(":")[2])


def _examples(out: Path, key=_row_number) -> dict:
    """key(example id) -> (input_ids, labels, position_ids, image bytes) read back from the shards."""
    found = {}
    for shard in sorted(out.glob("shard-*.parquet")):
        for row in read_shard(shard).to_pylist():
            cu = row["cu_seqlens"]
            for k, ex in enumerate(row["example_ids"]):
                a, b = cu[k], cu[k + 1]
                found[key(ex)] = (row["input_ids"][a:b], row["labels"][a:b], row["position_ids"][a:b],
                                                [im["data"] for im in row["images"] if a <= im["offset"] < b])
    return found


@pytest.fixture(scope="module")
def jpegs(coco_images) -> list[bytes]:
    return [p.read_bytes() for p in coco_images[:3]]


@pytest.fixture(scope="module")
def parquet_build(tmp_path_factory, jpegs):
    from datasets import Dataset

    root = tmp_path_factory.mktemp("hf")
    rows = _chat_rows(jpegs)
    ds = Dataset.from_list(rows, features=_features())
    ds.to_parquet(str(root / "chat.parquet"))
    with open(root / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(_as_json(r)) + "\n" for r in rows)
    out = root / "out"
    result = build(BuildConfig.from_inputs([str(root / "chat.parquet")], str(out), **BUILD), progress=False)
    return root, ds, out, result


@pytest.mark.slow
def test_parquet_packs_what_its_jsonl_twin_packs(parquet_build, tmp_path, jpegs):
    root, _, out, result = parquet_build
    twin = build(BuildConfig.from_inputs([str(root / "chat.jsonl")], str(tmp_path / "twin"), **BUILD), progress=False)
    assert result.stats["examples"] == twin.stats["examples"] == 7
    assert _examples(out) == _examples(tmp_path / "twin")  # same tokens, labels, positions, image bytes per row
    # embedded images are carried as they are: the shards hold the COCO files' bytes, not a re-encoding
    stored = {im for ex in _examples(out).values() for im in ex[3]}
    assert stored == set(jpegs)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["path"]).name, r["line"], r["reason"]) for r in rejects] == [
        ("chat.parquet", 8, "unknown_format"), ("chat.parquet", 9, "bad_image")]
    assert "keys: none" in rejects[0]["message"]


def test_verify_input_accounts_for_every_row(parquet_build):
    root, ds, out, _ = parquet_build
    report = verify_build(out, inputs=[str(root / "chat.parquet")])
    assert report.ok, report.lines()
    assert report.input_records == ds.num_rows == 9


def test_load_dataset_reads_the_output_as_packed_dataset_does(parquet_build, tmp_path):
    import datasets

    from packer.pipeline.card import features
    from packer.train.dataset import PackedDataset

    _, _, out, result = parquet_build
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))  # no data_files, no format
    assert list(loaded) == ["train"]
    train = loaded["train"]
    assert train.features == datasets.Features.from_arrow_schema(SCHEMA)
    assert datasets.Features._from_yaml_list(features()) == train.features  # the card's YAML parses to it
    rows = list(PackedDataset(out, shuffle=False))
    assert len(rows) == train.num_rows == result.stats["packs"] > 1
    for got, want in zip(train, rows, strict=True):
        for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents"):
            np.testing.assert_array_equal(np.asarray(got[name]), want[name], err_msg=name)
        dense = dense_row(got["mrope_runs"], got["mrope_bases"], got["mrope_rest"])  # v6: stored sparse
        np.testing.assert_array_equal(dense.reshape(-1, 3).T, want["mrope_position_ids"])
        assert got["example_ids"] == want["example_ids"] and got["images"] == want["images"]
    card = (out / "README.md").read_text()
    assert "profile `qwen2-vl`" in card and "max_length 768" in card and "packing efficiency" in card


def test_save_to_disk_dir_packs_like_the_parquet_file(parquet_build, tmp_path):
    root, ds, out, _ = parquet_build
    ds.save_to_disk(str(tmp_path / "disk"), num_shards=2)  # rows 0-4 and 5-8
    got = build(BuildConfig.from_inputs([str(tmp_path / "disk")], str(tmp_path / "out"), **BUILD), progress=False)
    assert verify_build(tmp_path / "out", inputs=[str(tmp_path / "disk")]).ok
    disk = _examples(tmp_path / "out", key=lambda ex_id: Path(ex_id).name)
    assert sorted(disk) == sorted([*(f"data-00000-of-00002.arrow:{n}" for n in range(1, 6)),
                                   "data-00001-of-00002.arrow:1", "data-00001-of-00002.arrow:2"])
    assert got.stats["rejected"] == 2
    # row n of the second file is row 5 + n of the dataset: the same example as the Parquet build's
    as_rows = {_row_number(k) + 5 * k.startswith("data-00001"): v for k, v in disk.items()}
    assert as_rows == _examples(out)


@pytest.mark.slow
def test_columns_map_llava_style_columns_of_a_hub_snapshot(tmp_path, jpegs):
    """LLaVA-style rows whose columns are named otherwise, in a Hub snapshot (data/train-*.parquet)."""
    from datasets import Dataset, Features, Image, List, Value

    feats = Features({"dialog": List({"from": Value("string"), "value": Value("string")}), "picture": Image()})
    rows = [{"dialog": [{"from": "human", "value": f"<image>\nWhat is in photo {i}?"},
                        {"from": "gpt", "value": f"Photo {i}."}], "picture": {"bytes": jpegs[i % 3], "path": None}}
            for i in range(4)]
    rows.append({"dialog": [{"from": "human", "value": "No image here."}, {"from": "gpt", "value": "Fine."}],
                 "picture": None})
    snap = tmp_path / "snap"
    (snap / "data").mkdir(parents=True)
    Dataset.from_list(rows, features=feats).to_parquet(str(snap / "data" / "train-00000-of-00001.parquet"))
    Dataset.from_list(rows[:1], features=feats).to_parquet(str(snap / "data" / "test-00000-of-00001.parquet"))
    runner = CliRunner()
    args = ["build", str(snap), "-o", str(tmp_path / "out"), "-q", "--max-length", "2048",
            "--max-pixels", str(128 * 28 * 28)]
    res = runner.invoke(cli, [*args, "--columns", "conversations=dialog,image=image_col"])
    assert res.exit_code == 1
    assert "train-00000-of-00001.parquet has no column 'image_col' (named by 'columns'); its columns: dialog, " \
           "picture" in res.output
    res = runner.invoke(cli, [*args, "--overwrite", "--columns", "conversations=dialog,image=picture"])
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert (stats["input_records"], stats["examples"], stats["rejected"]) == (5, 5, 0)  # the test split is not read
    assert {im for ex in _examples(tmp_path / "out").values() for im in ex[3]} == set(jpegs)
    res = runner.invoke(cli, ["verify", str(tmp_path / "out"), "--input", str(snap)])
    assert res.exit_code == 0 and "5 input records" in res.output
