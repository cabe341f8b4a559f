"""Table inputs (formats/tables.py): row ranges, datasets directories, image structs, column mapping.

The reference for "which rows, in which order" is ``datasets`` itself (``load_from_disk``, ``load_dataset``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packer.config import BuildConfig, parse_columns
from packer.core.types import ImageRef
from packer.errors import ConfigError, RecordError
from packer.formats import parse_record
from packer.formats.read import expand_inputs
from packer.formats.tables import check_columns, dataset_files, read_rows, row_records, unit_rows
from packer.pipeline.stages import CHUNK_LINES, scan_chunks

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


TEXT_SCHEMA = pa.schema([("text", pa.string()), ("n", pa.int64())])


def _text_table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"text": [f"row {i}" for i in range(start, start + n)], "n": list(range(start, start + n))},
                    schema=TEXT_SCHEMA)


def _write_groups(path: Path, sizes: list[int]) -> Path:
    """A Parquet file with one row group per size (rows numbered 0..)."""
    start = 0
    with pq.ParquetWriter(path, TEXT_SCHEMA) as w:
        for n in sizes:
            w.write_table(_text_table(n, start))
            start += n
    return path


@pytest.mark.parametrize("sizes", [[3], [CHUNK_LINES], [CHUNK_LINES + 1], [3, 700, 5, 5], [100] * 12, [1, 2 * CHUNK_LINES + 7]])
def test_table_chunks_cover_every_row_once_in_order(tmp_path, sizes):
    path = _write_groups(tmp_path / "t.parquet", sizes)
    chunks = scan_chunks(BuildConfig.from_inputs([str(path)], str(tmp_path / "out")))
    assert all(c.table and 0 < c.num_lines <= CHUNK_LINES for c in chunks)
    assert [(c.start, c.end) for c in chunks] == list(zip([0] + [c.end for c in chunks[:-1]], [c.end for c in chunks], strict=True))
    assert chunks[-1].end == sum(sizes) and all(c.first_line == c.start + 1 for c in chunks)
    got = [r["n"] for c in chunks for r in row_records(str(path), c.start, c.end)]
    assert got == list(range(sum(sizes)))


def test_arrow_stream_and_file_formats_read_by_batch(tmp_path):
    table = _text_table(10)
    for name, writer in (("s.arrow", pa.ipc.new_stream), ("f.arrow", pa.ipc.new_file)):
        with writer(str(tmp_path / name), table.schema) as w:
            for batch in table.to_batches(max_chunksize=4):
                w.write_batch(batch)
        assert unit_rows(str(tmp_path / name)) == [4, 4, 2]
        rows = pa.Table.from_batches(list(read_rows(str(tmp_path / name), 3, 9)))
        assert rows.column("n").to_pylist() == [3, 4, 5, 6, 7, 8]


def test_nulls_are_absent_fields(tmp_path):
    pq.write_table(pa.table({"text": ["a", None], "messages": [None, [{"role": "user", "content": "hi"}]]}),
                   tmp_path / "m.parquet")
    assert list(row_records(str(tmp_path / "m.parquet"), 0, 2)) == [
        {"text": "a"}, {"messages": [{"role": "user", "content": "hi"}]}]


# ------------------------------------------------------------------------------------- datasets dirs
def _dataset(n: int, offset: int = 0):
    import datasets

    return datasets.Dataset.from_dict({"text": [f"doc {offset + i}" for i in range(n)]})


def test_save_to_disk_dir_gives_its_arrow_files_in_datasets_order(tmp_path):
    import datasets

    _dataset(7).save_to_disk(str(tmp_path / "disk"), num_shards=2)
    files = expand_inputs([str(tmp_path / "disk")])
    assert [Path(f).name for f in files] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    rows = [r["text"] for f in files for r in row_records(f, 0, sum(unit_rows(f)))]
    assert rows == datasets.load_from_disk(str(tmp_path / "disk"))["text"]


def test_dataset_dict_dir_gives_its_train_split(tmp_path):
    import datasets

    datasets.DatasetDict({"train": _dataset(3), "test": _dataset(2, 100)}).save_to_disk(str(tmp_path / "dd"))
    files = expand_inputs([str(tmp_path / "dd")])
    assert [r["text"] for f in files for r in row_records(f, 0, 10)] == ["doc 0", "doc 1", "doc 2"]


def test_hub_snapshot_layouts(tmp_path):
    """data/{split}-*.parquet (the Hub's default layout), and a README whose configs name the files."""
    import datasets

    snap = tmp_path / "snap"
    (snap / "data").mkdir(parents=True)
    _dataset(3).to_parquet(str(snap / "data" / "train-00000-of-00001.parquet"))
    _dataset(2, 100).to_parquet(str(snap / "data" / "test-00000-of-00001.parquet"))
    assert [Path(f).name for f in expand_inputs([str(snap)])] == ["train-00000-of-00001.parquet"]
    assert datasets.load_dataset(str(snap), split="train", cache_dir=str(tmp_path / "c"))["text"] == [
        "doc 0", "doc 1", "doc 2"]  # the same split the Hub reads

    card = tmp_path / "card"
    (card / "x").mkdir(parents=True)
    _dataset(2).to_parquet(str(card / "x" / "a.parquet"))
    _dataset(2, 50).to_parquet(str(card / "x" / "b.parquet"))
    (card / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
                                    "    path: x/b.parquet\n  - split: validation\n    path: x/a.parquet\n---\n# hi\n")
    assert [Path(f).name for f in dataset_files(str(card))] == ["b.parquet"]
    (card / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: dev\n"
                                    "    path: x/b.parquet\n  - split: validation\n    path: x/a.parquet\n---\n")
    with pytest.raises(ConfigError, match=r"splits \['dev', 'validation'\] and none named 'train'"):
        dataset_files(str(card))


def test_mapped_column_missing_from_the_file_names_file_and_columns(tmp_path):
    pq.write_table(_text_table(2), tmp_path / "t.parquet")
    with pytest.raises(ConfigError, match=r"t.parquet has no column 'dialog' \(named by 'columns'\); its columns: text, n"):
        check_columns(str(tmp_path / "t.parquet"), {"conversations": "dialog"})


def test_corrupt_table_is_a_config_error(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ConfigError, match="cannot read .*bad.parquet as Parquet"):
        unit_rows(str(tmp_path / "bad.parquet"))


# ------------------------------------------------------------------------------------- records
def _parse(obj, tmp_path, **kw):
    return parse_record(obj, path="d.parquet", line=3, base_dir=str(tmp_path), **kw)


def test_image_structs_and_bytes_become_refs_without_reencoding(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8 on disk")
    chat = [{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]
    for images, want in [
        ([{"bytes": b"JPEG1", "path": "ignored.jpg"}], [ImageRef(data=b"JPEG1")]),  # bytes win over path
        ([{"bytes": None, "path": "a.jpg"}], [ImageRef(path=str(tmp_path / "a.jpg"))]),  # path-only: like JSONL
        ({"bytes": b"JPEG2", "path": None}, [ImageRef(data=b"JPEG2")]),  # one struct (an Image column)
        ([b"JPEG3"], [ImageRef(data=b"JPEG3")]),  # a binary column
    ]:
        assert _parse({"messages": chat, "images": images}, tmp_path).images == want
    two = [{"role": "user", "content": "<image><image> both"}, {"role": "assistant", "content": "ok"}]
    ex = _parse({"messages": two, "images": [{"bytes": b"A", "path": None}, {"bytes": b"B", "path": None}]}, tmp_path)
    assert [im.data for im in ex.images] == [b"A", b"B"]
    part = [{"role": "user", "content": [{"type": "image", "image": {"bytes": b"C", "path": None}}]},
            {"role": "assistant", "content": "ok"}]
    assert _parse({"messages": part}, tmp_path).images == [ImageRef(data=b"C")]


@pytest.mark.parametrize("images, reason, match", [
    ([{"bytes": b"", "path": None}], "bad_image", "embedded image bytes are empty"),
    ([{"bytes": None, "path": "nope.jpg"}], "missing_image", "nope.jpg does not exist"),
    ([{"bytes": None, "path": None}], "wrong_type", "an image source must be"),
])
def test_bad_image_structs_are_rejects_at_their_row(tmp_path, images, reason, match):
    chat = [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}]
    with pytest.raises(RecordError, match=match) as e:
        _parse({"messages": chat, "images": images}, tmp_path)
    assert (e.value.reason, e.value.path, e.value.line) == (reason, "d.parquet", 3)


def test_columns_map_fields_and_the_mapping_decides(tmp_path):
    obj = {"dialog": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}], "text": "not me"}
    ex = _parse(obj, tmp_path, columns={"conversations": "dialog", "text": "other"})
    assert ex.kind == "llava"  # 'text' is mapped away to a column the row lacks, so it no longer picks the kind
    assert parse_columns("messages=conversations, images=image") == {"messages": "conversations", "images": "image"}
    with pytest.raises(ConfigError, match="'columns': 'messages' is not FIELD=COLUMN"):
        parse_columns("messages")
    cfg = BuildConfig.from_dict({"inputs": ["x"], "output": "o", "columns": "messages=conversations"})
    assert cfg.column_map == {"messages": "conversations"} and cfg.to_dict()["columns"] == {"messages": "conversations"}
    with pytest.raises(ConfigError, match="'columns' maps packer fields to column names"):
        BuildConfig.from_dict({"inputs": ["x"], "output": "o", "columns": {"messages": 3}})
    assert json.dumps(BuildConfig.from_inputs(["x"], "o").to_dict())  # default (None) stays JSON
