"""Builds from every streamed file kind (formats/files.py) give the rows a JSONL build of the same records
gives: same ids (up to the file name), tokens, labels, positions, media tokens and image counts; a build that
packs nothing fails, naming the likely cause; a resumed build reuses the spilled chunks."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig
from packer.errors import ConfigError, RejectRateError
from packer.pipeline import stages
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.dataset import PackedDataset

OPTS = dict(profile="qwen2-vl", max_length=512, max_pixels=64 * 28 * 28, rows_per_shard=2, rows_per_row_group=2)
COMPRESS = {".gz": gzip.compress, ".zst": lambda b: zstandard.ZstdCompressor().compress(b), ".bz2": bz2.compress,
            ".xz": lzma.compress}


def _records(names: list[str]) -> list[dict]:
    recs: list[dict] = []
    for i in range(11):
        if i % 3 == 0:
            content = [{"type": "image", "image": f"images/{names[i % len(names)]}"}]
            if i % 2:
                content.append({"type": "image", "image": f"images/{names[(i + 1) % len(names)]}"})
            recs.append({"messages": [{"role": "user", "content": content},
                                      {"role": "assistant", "content": f"caption {i}" + " word" * i}]})
        else:
            recs.append({"messages": [{"role": "user", "content": f"question {i}" + " more" * (5 * i)},
                                      {"role": "assistant", "content": f"answer {i}"}]})
    recs.append({"unknown": 1})  # a reject in every form
    return recs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, coco_images) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("streamed")
    (root / "images").mkdir()
    for im in coco_images[:3]:
        shutil.copy(im, root / "images" / im.name)
    return root, _records([im.name for im in coco_images[:3]])


def _rows(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """Record number -> its example's arrays, from the shards (the id's file name dropped)."""
    got = {}
    for row in PackedDataset(out, shuffle=False, load_images=False):
        cu = row["cu_seqlens"]
        for k, ex_id in enumerate(row["example_ids"]):
            lo, hi = int(cu[k]), int(cu[k + 1])
            line = ex_id.rsplit(":", 1)[1]  # LINE or LINE@CHUNK
            assert line not in got
            got[line] = {"input_ids": row["input_ids"][lo:hi], "labels": row["labels"][lo:hi],
                         "position_ids": row["position_ids"][lo:hi]}
            if "mrope_position_ids" in row:
                got[line]["mrope"] = row["mrope_position_ids"][:, lo:hi]
    return got


def _build(path: Path, out: Path, **kw) -> dict:
    opts = {**OPTS, **kw}
    if opts["profile"] == "text":
        opts.pop("max_pixels")
    return build(BuildConfig.from_inputs([str(path)], str(out), **opts), progress=False).manifest


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for line in a:
        for key in a[line]:
            np.testing.assert_array_equal(a[line][key], b[line][key], err_msg=f"record {line} {key}")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The JSONL build (one record per line, numbered as the array's elements)."""
    root, recs = corpus
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path_factory.mktemp("ref") / "out"
    manifest = _build(path, out)
    return manifest, _rows(out)


@pytest.mark.parametrize("name", ["array.json", "one-line.jsonl", "array.json.bz2", "lines.jsonl.gz",
                                  "lines.jsonl.zst", "lines.jsonl.xz"])
def test_every_kind_packs_the_rows_jsonl_packs(corpus, reference, tmp_path, monkeypatch, name):
    monkeypatch.setattr(stages, "CHUNK_LINES", 4)  # several spilled chunks per file
    root, recs = corpus
    ref_manifest, ref_rows = reference
    if "array" in name or "one-line" in name:
        data = json.dumps(recs, indent=None if "one-line" in name else 2).encode()
    else:
        data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    suffix = Path(name).suffix
    path = root / name
    path.write_bytes(COMPRESS[suffix](data) if suffix in COMPRESS else data)
    manifest = _build(path, tmp_path / "out")
    for key in ("input_records", "rejected", "examples", "tokens", "loss_tokens", "vision_tokens"):
        assert manifest["totals"][key] == ref_manifest["totals"][key], key
    _assert_same(_rows(tmp_path / "out"), ref_rows)
    images = [sum(len(r["images"]) for r in PackedDataset(o, shuffle=False, load_images=False))
              for o in (tmp_path / "out", Path(ref_manifest["config"]["output"]))]
    assert images[0] == images[1] == sum(len(r["messages"][0]["content"]) for r in recs if "messages" in r
                                         and isinstance(r["messages"][0]["content"], list))
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["path"], r["line"], r["reason"]) for r in rejects] == [(str(path), len(recs), "unknown_format")]
    report = verify_build(tmp_path / "out", inputs=[str(path)])
    assert report.ok, report.violations[:3]
    assert report.input_records == len(recs)


def test_txt_is_one_text_record_per_line(tmp_path):
    lines = ["First line of prose." * 3, "", "Second line, longer." * 40, "   ", "Third."]
    txt = tmp_path / "wiki.txt.gz"
    txt.write_bytes(gzip.compress("\n".join(lines).encode()))
    jsonl = tmp_path / "wiki.jsonl"
    jsonl.write_text("".join((json.dumps({"text": t}) if t.strip() else "") + "\n" for t in lines))
    kw = dict(profile="text", tokenizer="qwen2-vl", max_length=64, long_docs="split")
    a, b = _build(txt, tmp_path / "a", **kw), _build(jsonl, tmp_path / "b", **kw)
    assert a["totals"] == b["totals"] and a["totals"]["input_records"] == 3
    rows = _rows(tmp_path / "a")
    _assert_same(rows, _rows(tmp_path / "b"))
    assert {k.split("@")[0] for k in rows} == {"1", "3", "5"}  # file lines; line 3 split into chunks 3@k
    assert len(rows) > 3


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_webdataset_tar_packs_as_native_records(corpus, tmp_path):
    root, _ = corpus
    images = sorted((root / "images").iterdir())
    native, members = [], []
    for i, im in enumerate(images * 2):
        caption = f"a photo, number {i}" + " again" * i
        native.append({"messages": [{"role": "user", "content": [{"type": "image", "image": str(im)}]},
                                    {"role": "assistant", "content": caption}]})
        key = f"{i:06d}"
        if i % 2:  # a caption sample
            members += [(f"{key}.jpg", im.read_bytes()), (f"{key}.txt", caption.encode())]
        else:  # a packer record naming its member
            rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": f"{key}.jpg"}]},
                                {"role": "assistant", "content": caption}]}
            members += [(f"{key}.jpg", im.read_bytes()), (f"{key}.json", json.dumps(rec).encode())]
    members += [("999999.json", json.dumps({"messages": [
        {"role": "user", "content": [{"type": "image", "image": "999999.png"}]},
        {"role": "assistant", "content": "x"}]}).encode())]  # its image member is missing
    tar = tmp_path / "shard-000000.tar"
    _tar(tar, members)
    jsonl = tmp_path / "native.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in native))
    a, b = _build(tar, tmp_path / "a"), _build(jsonl, tmp_path / "b")
    assert a["totals"]["rejected"] == 1 and a["totals"]["input_records"] == len(native) + 1
    for key in ("examples", "tokens", "loss_tokens", "vision_tokens"):
        assert a["totals"][key] == b["totals"][key]
    _assert_same(_rows(tmp_path / "a"), _rows(tmp_path / "b"))
    [reject] = [json.loads(line) for line in (tmp_path / "a" / "rejects.jsonl").read_text().splitlines()]
    assert reject["reason"] == "missing_image" and reject["line"] == len(native) + 1
    assert "shard-000000.tar sample 7 (key '999999')" in reject["message"]
    images_a = sum(len(r["images"]) for r in PackedDataset(tmp_path / "a", shuffle=False, load_images=False))
    assert images_a == len(native)
    res = CliRunner().invoke(cli, ["verify", str(tmp_path / "a"), "--input", str(tar), "--tokenizer-check", "all"])
    assert res.exit_code == 0, res.output
    assert f"{len(native) + 1} input records ({len(native)} re-tokenized" in res.output
    res = CliRunner().invoke(cli, ["inspect", str(tmp_path / "a"), "--example", f"{tar}:2"])
    assert res.exit_code == 0 and f"{tar}:2" in res.output and "1 image" in res.output


def test_a_build_of_nothing_fails_with_a_hint(tmp_path):
    path = tmp_path / "c4_demo.jsonl"  # gzip bytes under a plain name
    path.write_bytes(gzip.compress("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(200)).encode()))
    with pytest.raises(RejectRateError, match=r"nothing to pack.*'not_utf8'.*gzip bytes: name it .*c4_demo\.jsonl\.gz"):
        _build(path, tmp_path / "out")
    res = CliRunner().invoke(cli, ["build", str(path), "-o", str(tmp_path / "cli"), "--profile", "text",
                                   "--tokenizer", "qwen2-vl", "-q"])
    assert res.exit_code == 3 and "gzip bytes" in res.output
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ConfigError, match="hold no record"):
        _build(empty, tmp_path / "out2")


def test_mostly_one_reason_prints_a_note(tmp_path):
    path = tmp_path / "wiki.jsonl"  # plain text, named as JSON lines
    path.write_text("".join(f"Plain prose line {i}.\n" for i in range(3)) + '{"text": "one good line"}\n')
    res = CliRunner().invoke(cli, ["build", str(path), "-o", str(tmp_path / "out"), "--profile", "text",
                                   "--tokenizer", "qwen2-vl", "-q"])
    assert res.exit_code == 0
    assert "3 of the 3 rejects are 'malformed_json'" not in res.output  # -q: quiet
    res = CliRunner().invoke(cli, ["build", str(path), "-o", str(tmp_path / "out2"), "--profile", "text",
                                   "--tokenizer", "qwen2-vl"])
    assert res.exit_code == 0, res.output
    assert "3 of the 3 rejects are 'malformed_json'" in res.output and "name it .txt" in res.output


def test_broken_array_fails_the_build_naming_the_element(tmp_path):
    path = tmp_path / "mllm_demo.json"
    path.write_text(json.dumps([{"text": "a"}, {"text": "b"}], indent=2)[:-2])  # no closing bracket
    with pytest.raises(ConfigError, match=r"mllm_demo\.json: the JSON array breaks in element 3"):
        _build(path, tmp_path / "out", profile="text", tokenizer="qwen2-vl")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_resume_reuses_the_spilled_chunks(corpus, tmp_path, monkeypatch):
    root, recs = corpus
    path = root / "resume.json.gz"
    path.write_bytes(gzip.compress(json.dumps(recs).encode()))
    first = _build(path, tmp_path / "out")
    (tmp_path / "out" / "manifest.json").unlink()
    for p in (tmp_path / "out" / ".packer" / "encode").glob("chunk-*"):
        p.unlink()
    shard = tmp_path / "out" / "shard-00000.parquet"
    shard.unlink()

    def unread(*a, **k):
        raise AssertionError("the input was read again")

    monkeypatch.setattr("packer.formats.files.records", unread)
    again = _build(path, tmp_path / "out")
    assert again["shards"] == first["shards"]
