"""``packer verify``: a real build passes; each broken invariant of docs/format.md is reported with its file,
row and what, and the CLI exits 4 (1 when there is no finished build to check)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.errors import ShardError
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.shards.io import read_shard, write_json_atomic, write_shard
from tests.helpers import random_example, stored_table, write_shardset

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731


def _records(names: list[str]) -> list[dict]:
    img = lambda n, t: [{"type": "image", "image": f"images/{n}"}, {"type": "text", "text": t}]  # noqa: E731
    recs: list[dict] = []
    for i in range(14):
        recs.append({"messages": [U(f"Question {i}?" + " more" * (i * 9)), A(f"Answer {i}.")]})
        n = names[i % len(names)]
        recs.append({"messages": [U(img(n, "Caption it.")), A(f"Caption {i}.")],
                     "branches": [[A("Short.")], {"messages": [A("Longer, with a follow-up.")],
                                                  "branches": [[U("Why?"), A("Because.")], [U("Sure?"), A("Yes.")]]}]})
        if i % 3 == 0:
            recs.append({"conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "X."}],
                         "image": f"images/{names[(i + 1) % len(names)]}"})
            recs.append({"messages": [U(img(names[0], "One") + img(names[1], "two.")), A("Two images.")]})
            recs.append({"text": f"Plain text {i}. " * 20})
    recs.append({"messages": [U("no answer")]})  # two rejects, so rejects.jsonl is not empty
    recs.append("{broken")
    return recs


@pytest.fixture(scope="module")
def built(tmp_path_factory, coco_images) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("verify")
    (root / "images").mkdir()
    for im in coco_images[:3]:
        shutil.copy(im, root / "images" / im.name)
    data = root / "data.jsonl"
    data.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in _records([im.name for im in coco_images[:3]])))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2-vl", max_length=1000,
                                     max_pixels=100 * 28 * 28, rows_per_shard=2, rows_per_row_group=1)
    build(config, progress=False)
    return root / "out", data


@pytest.fixture
def copy(built, tmp_path) -> tuple[Path, Path]:
    out, data = built
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "out", data


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _rows(out: Path) -> list[tuple[int, int, dict]]:
    """(shard, row, row dict) of every row."""
    found = []
    for s, entry in enumerate(_manifest(out)["shards"]):
        for r, row in enumerate(read_shard(out / entry["file"]).to_pylist()):
            found.append((s, r, row))
    return found


def _rewrite(out: Path, shard: int, rows: list[dict], schema: pa.Schema | None = None) -> None:
    """Write a shard's rows back and record its new checksum (so only the content check can object)."""
    manifest = _manifest(out)
    entry = manifest["shards"][shard]
    table = stored_table(rows) if schema is None else pa.Table.from_pylist(rows, schema=schema)
    new = write_shard(table, out / entry["file"], rows_per_row_group=2)
    manifest["shards"][shard] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", manifest)


def _rewrite_table(out: Path, shard: int, table: pa.Table) -> None:
    """Write a stored (raw) table as a shard and record its new checksum."""
    manifest = _manifest(out)
    entry = manifest["shards"][shard]
    new = write_shard(table, out / entry["file"], rows_per_row_group=2)
    manifest["shards"][shard] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", manifest)


def _mutate(out: Path, where: Callable[[dict], bool], change: Callable[[dict], None]) -> tuple[str, int]:
    """Apply ``change`` to the first row satisfying ``where``; return (shard file, row)."""
    for s, r, row in _rows(out):
        if where(row):
            rows = read_shard(out / _manifest(out)["shards"][s]["file"]).to_pylist()
            change(rows[r])
            _rewrite(out, s, rows)
            return _manifest(out)["shards"][s]["file"], r
    raise AssertionError("no row to mutate")


def _multi(row: dict) -> bool:
    return len(row["example_ids"]) >= 2


def _later_tree(row: dict) -> bool:
    """A row whose second or later example has child nodes."""
    return sum(p == -1 for p in row["node_parents"]) >= 2 and row["node_parents"][-1] != -1


def _with_image(row: dict) -> bool:
    return bool(row["images"])


def _bump(key: str, i: int, by: float = 1):
    def change(row: dict) -> None:
        row[key][i] += by
    return change


def _set(key: str, value):
    def change(row: dict) -> None:
        row[key] = value(row) if callable(value) else value
    return change


def _label_at_second_start(row: dict) -> None:
    s = row["cu_seqlens"][1]
    row["labels"][s] = row["input_ids"][s]
    row["num_loss_tokens"] += 1


def _wrong_label(row: dict) -> None:
    k = next(i for i, v in enumerate(row["labels"]) if v != IGNORE_INDEX)
    row["labels"][k] = row["input_ids"][k] + 1


def _parent_in_other_example(row: dict) -> None:
    par = row["node_parents"]
    par[len(par) - 1] = 0  # the last node (a child in a later example) -> the first example's root


def _shift_later_root(row: dict) -> None:
    par, off = row["node_parents"], row["node_offsets"]
    k = [i for i, p in enumerate(par) if p == -1][1]
    off[k] += 1  # still inside the row and increasing: only "roots at starts" breaks


def _extra_root(row: dict) -> None:
    row["node_parents"][-1] = -1


def _self_parent(row: dict) -> None:
    row["node_parents"][-1] = len(row["node_parents"]) - 1


MUTATIONS = {
    # name: (row filter, change, text the violation must contain)
    "cu start": (_multi, _bump("cu_seqlens", 0), "cu_seqlens starts at 1, not 0"),
    "cu end": (_multi, _bump("cu_seqlens", -1, -1), "cu_seqlens ends at"),
    "cu increasing": (_multi, _set("cu_seqlens", lambda r: [0, 0, *r["cu_seqlens"][2:]]), "not strictly increasing"),
    "cu length": (_multi, _set("cu_seqlens", lambda r: r["cu_seqlens"][:-2] + r["cu_seqlens"][-1:]), "want E+1"),
    "label at start": (_multi, _label_at_second_start, "first label is not -100"),
    "label value": (_multi, _wrong_label, "neither -100 nor the token's own id"),
    "labels length": (_multi, _set("labels", lambda r: r["labels"][:-1]), "labels has"),
    "num_loss_tokens": (_multi, lambda r: r.__setitem__("num_loss_tokens", r["num_loss_tokens"] + 1),
                        "num_loss_tokens is"),
    "num_tokens": (_multi, lambda r: r.__setitem__("num_tokens", r["num_tokens"] - 1), "num_tokens is"),
    "num_vision_tokens": (_with_image, lambda r: r.__setitem__("num_vision_tokens", 0), "num_vision_tokens is 0"),
    "position": (_multi, _bump("position_ids", 3), "position_ids differ from the tree positions"),
    "node parent index": (_later_tree, _self_parent, "node_parents must be -1 or an earlier node"),
    "parent example": (_later_tree, _parent_in_other_example, "parent belongs to another example"),
    "root shifted": (_later_tree, _shift_later_root, "a root node does not start where its example starts"),
    "extra root": (_later_tree, _extra_root, "root nodes (parent -1) for"),
    "node offsets": (_later_tree, _set("node_offsets", lambda r: [0, *reversed(r["node_offsets"][1:])]),
                     "node_offsets do not start at 0 and rise strictly"),
    "image offset": (_with_image, lambda r: r["images"][0].__setitem__("offset", r["images"][0]["offset"] + 1),
                     "image tokens (id 151655) disagree"),
    "image outside": (_with_image, lambda r: r["images"][-1].__setitem__("offset", r["num_tokens"]), "outside the row"),
    "image grid": (_with_image, lambda r: r["images"][0].__setitem__("grid_h", r["images"][0]["grid_h"] + 2),
                   "does not match its grid"),
    "mrope value": (_with_image, _bump("mrope_position_ids", 31), "mrope_position_ids differ from get_rope_index"),
    # schema v5 stores float32: half a position on an integer family is a difference, never truncated away
    "mrope fraction": (_with_image, _bump("mrope_position_ids", 31, 0.5), "mrope_position_ids differ from get_rope_index"),
    "mrope length": (_multi, _set("mrope_position_ids", lambda r: r["mrope_position_ids"][:-3]), "want 3*T"),
    "mrope null": (_multi, _set("mrope_position_ids", None), "null but the profile uses mRoPE"),
    "example sources": (_multi, _set("example_sources", lambda r: r["example_sources"][:-1]), "example_sources has"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_broken_row_invariant_is_reported(copy, name):
    out, _ = copy
    where, change, text = MUTATIONS[name]
    file, row = _mutate(out, where, change)
    report = verify_build(out)
    assert not report.ok
    hits = [v for v in report.violations if text in v.what]
    assert hits, f"{name}: no violation mentions {text!r}; got {report.lines()}"
    assert any(v.file == file and v.row == row for v in hits), report.lines()


def test_a_v4_build_still_verifies_and_reads(copy):
    """A build written before v5: int32 mRoPE positions, the audio struct without padded_samples, metadata 4."""
    import torch

    from packer.shards.schema import SCHEMAS
    from packer.train.collate import collate
    from packer.train.dataset import PackedDataset

    out, data = copy
    v5 = [collate([r])["position_ids"] for r in PackedDataset(out, shuffle=False, load_images=False)]
    manifest = _manifest(out)
    for s, entry in enumerate(manifest["shards"]):
        table = read_shard(out / entry["file"])
        _rewrite(out, s, pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in SCHEMAS[4]],
                                              schema=SCHEMAS[4]).to_pylist(), schema=SCHEMAS[4])
    write_json_atomic(out / "manifest.json", {**_manifest(out), "schema_version": 4})
    assert pq.ParquetFile(out / manifest["shards"][0]["file"]).schema_arrow.metadata[b"packer.schema_version"] == b"4"
    report = verify_build(out, inputs=[str(data)])
    assert report.ok, report.lines()
    v4 = [collate([r])["position_ids"] for r in PackedDataset(out, shuffle=False, load_images=False)]
    assert all(a.dtype == b.dtype == torch.int64 and torch.equal(a, b) for a, b in zip(v4, v5, strict=True))
    assert all(p.dim() == 3 for p in v4)


def test_a_v5_build_reads_as_the_same_tensors_and_verifies(copy):
    """A build written as v5 (the dense mRoPE column, metadata 5) from the same rows as this v6 build: verify
    accepts both, and the reader's tensors (every key collate gives, images decoded) are identical."""
    import torch

    from packer.shards.schema import SCHEMAS
    from packer.train.collate import collate
    from packer.train.dataset import PackedDataset

    out, data = copy
    assert verify_build(out, inputs=[str(data)]).ok
    v6 = [collate([r]) for r in PackedDataset(out, shuffle=False)]
    manifest = _manifest(out)
    for s, entry in enumerate(manifest["shards"]):
        _rewrite(out, s, read_shard(out / entry["file"]).to_pylist(), schema=SCHEMAS[5])
    write_json_atomic(out / "manifest.json", {**_manifest(out), "schema_version": 5})
    first = pq.ParquetFile(out / manifest["shards"][0]["file"]).schema_arrow
    assert first.metadata[b"packer.schema_version"] == b"5" and "mrope_runs" not in first.names
    report = verify_build(out, inputs=[str(data)])
    assert report.ok, report.lines()
    v5 = [collate([r]) for r in PackedDataset(out, shuffle=False)]
    assert len(v5) == len(v6) and any(b["position_ids"].dim() == 3 for b in v6)
    for a, b in zip(v5, v6, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], torch.Tensor):
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
            else:
                assert a[k] == b[k], k


def test_a_damaged_sparse_mrope_column_is_a_violation(copy):
    """v6's runs overlapping: verify names the file and row group (the reader refuses it), it does not crash."""
    out, _ = copy
    file = _manifest(out)["shards"][0]["file"]
    table = pq.read_table(out / file)
    runs = table.column("mrope_runs").to_pylist()
    runs[0] = [0, 5, 2, 5] + runs[0][4:]  # the second run starts inside the first
    table = table.set_column(table.column_names.index("mrope_runs"), "mrope_runs", pa.array(runs, pa.list_(pa.int32())))
    _rewrite_table(out, 0, table)
    report = verify_build(out)
    assert not report.ok and any("mrope_runs" in v.what and v.file == file for v in report.violations), report.lines()


def test_a_real_build_verifies(built):
    out, data = built
    report = verify_build(out, inputs=[str(data)])
    assert report.ok, report.lines()
    manifest = _manifest(out)
    assert report.shards == len(manifest["shards"]) >= 3 and report.rows >= 5
    assert report.rows == manifest["totals"]["packs"]
    assert report.input_records == manifest["totals"]["input_records"]
    assert report.tokenized == min(64, report.examples) == 43  # re-tokenized with the HF tokenizer: equal
    rows = [row for _, _, row in _rows(out)]
    assert any(_later_tree(r) for r in rows) and any(_with_image(r) for r in rows)  # the mutations have targets


def test_duplicate_example_id_across_rows(copy):
    out, _ = copy
    rows = _rows(out)
    first = rows[0][2]["example_ids"][0]
    s, r, _ = rows[-1]
    shard_rows = read_shard(out / _manifest(out)["shards"][s]["file"]).to_pylist()
    shard_rows[r]["example_ids"][0] = first
    _rewrite(out, s, shard_rows)
    what = [v.what for v in verify_build(out).violations]
    assert sum(f"example id {first!r} appears more than once" in w for w in what) == 2


def test_budgets_from_the_manifest_config(copy):
    out, _ = copy
    manifest = _manifest(out)
    longest = max(len(row["input_ids"]) for _, _, row in _rows(out))
    manifest["config"].update(max_length=longest - 1, max_vision_tokens=1, max_images=1, max_examples_per_pack=1)
    write_json_atomic(out / "manifest.json", manifest)
    text = "\n".join(verify_build(out).lines())
    for expected in (f"{longest} tokens > max_length {longest - 1}", "vision tokens > max_vision_tokens 1",
                     "images > max_images 1", "examples > max_examples_per_pack 1"):
        assert expected in text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["checksum", "missing", "stray", "temp", "totals", "reject reason", "row count",
                                  "schema", "stats"])
def test_each_broken_file_invariant_is_reported(copy, name):
    out, _ = copy
    manifest = _manifest(out)
    first = out / manifest["shards"][0]["file"]
    if name == "checksum":
        manifest["shards"][0]["sha256"] = "0" * 64
        text = "sha256 differs"
    elif name == "missing":
        first.unlink()
        text = "listed in the manifest but missing"
    elif name in ("stray", "temp"):
        shutil.copy(first, out / ("shard-00099.parquet" if name == "stray" else f"{first.name}.tmp-123"))
        text = "the manifest does not list"
    elif name == "totals":
        manifest["totals"]["tokens"] += 1
        text = "totals.tokens is"
    elif name == "reject reason":
        with open(out / "rejects.jsonl", "a") as f:
            f.write(json.dumps({"path": "x", "line": 1, "reason": "bogus", "message": "?"}) + "\n")
        text = "not a reject record with path, line and a known reason"
    elif name == "row count":
        manifest["shards"][0]["rows"] += 1
        text = "rows, the manifest says"
    elif name == "schema":
        table = read_shard(first).drop_columns(["example_sources"])
        entry = write_shard(table, first, rows_per_row_group=2)
        manifest["shards"][0].update(sha256=entry["sha256"], bytes=entry["bytes"])
        text = "schema differs from packer.shards.schema"
    else:
        stats = json.loads((out / "stats.json").read_text())
        stats["examples"] += 1
        write_json_atomic(out / "stats.json", stats)
        text = "examples is"
    write_json_atomic(out / "manifest.json", manifest)
    lines = verify_build(out).lines()
    assert any(text in line for line in lines), lines


def test_every_input_record_accounted_for(copy, tmp_path):
    out, data = copy
    report = verify_build(out, inputs=[str(data)])
    assert report.ok, report.lines()
    # a record the build never saw (appended afterwards) is neither packed nor rejected
    grown = tmp_path / "grown" / "data.jsonl"
    grown.parent.mkdir()
    grown.write_bytes(data.read_bytes() + b'{"text": "late"}\n\n')
    n = len(data.read_bytes().splitlines()) + 1
    manifest = _manifest(out)
    manifest["inputs"] = [str(grown)]
    write_json_atomic(out / "manifest.json", manifest)
    # ids name the original path; point them at the grown copy through rejects + a rewritten shard
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    dropped = rejects.pop()
    (out / "rejects.jsonl").write_text("".join(json.dumps({**r, "path": str(grown)}) + "\n" for r in rejects))
    for s, entry in enumerate(manifest["shards"]):
        rows = read_shard(out / entry["file"]).to_pylist()
        for row in rows:
            row["example_ids"] = [e.replace(str(data), str(grown)) for e in row["example_ids"]]
        _rewrite(out, s, rows)
    manifest = _manifest(out)
    manifest["totals"]["rejected"] -= 1
    manifest["totals"]["rejects_by_reason"] = {}
    write_json_atomic(out / "manifest.json", manifest)
    lines = verify_build(out, inputs=[str(grown)]).lines()
    assert f"{grown}: line {n} is neither packed nor rejected" in lines
    assert f"{grown}: line {dropped['line']} is neither packed nor rejected" in lines


def test_cli_exit_codes_and_lines(copy, tmp_path):
    out, data = copy
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", str(out), "--input", str(data)])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("ok: ") and "input records" in ok.stdout
    file, row = _mutate(out, _multi, _bump("cu_seqlens", 0))
    bad = runner.invoke(cli, ["verify", str(out)])
    assert bad.exit_code == 4
    assert f"{file}:row {row}: cu_seqlens starts at 1, not 0" in bad.stdout
    assert "violation(s)" in bad.stderr
    (out / "manifest.json").unlink()  # an unfinished build: nothing to verify
    unfinished = runner.invoke(cli, ["verify", str(out)])
    assert unfinished.exit_code == 1 and "did not finish" in unfinished.stderr


def test_schema_version_of_the_manifest(copy):
    out, _ = copy
    manifest = _manifest(out)
    manifest["schema_version"] = 99
    write_json_atomic(out / "manifest.json", manifest)
    with pytest.raises(ShardError, match="schema v99"):
        verify_build(out)


def test_listing_is_capped_but_every_violation_counted(copy):
    out, _ = copy
    manifest = _manifest(out)
    for s, entry in enumerate(manifest["shards"]):
        rows = read_shard(out / entry["file"]).to_pylist()
        for row in rows:
            row["num_tokens"] += 1
        _rewrite(out, s, rows)
    report = verify_build(out, limit=1)
    assert report.num_violations == manifest["totals"]["packs"]  # one per row ...
    assert len(report.violations) == len(manifest["shards"])  # ... but one listed per shard file
    assert any("more 'num_tokens' violations not listed" in line for line in report.lines())


def test_weighted_mixture_copies_are_accounted_for(tmp_path):
    """Weight 2.5 packs each record 2 or 3 times as path:line#k; weight 0.5 drops about half: both verify."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"text": f"alpha {i} " * 5}) + "\n" for i in range(20)) + "{bad\n")
    b.write_text("".join(json.dumps({"text": f"beta {i} " * 5}) + "\n" for i in range(20)))
    out = tmp_path / "out"
    config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": [str(a)], "weight": 2.5},
                                                {"name": "b", "paths": [str(b)], "weight": 0.5}],
                                    "output": str(out), "profile": "text", "rows_per_row_group": 1})
    result = build(config, progress=False)
    assert result.manifest["totals"]["examples"] == 50 + 10
    report = verify_build(out, inputs=[str(a), str(b)])
    assert report.ok, report.lines()
    # a copy suffix out of sequence
    s, r, row = next((s, r, row) for s, r, row in _rows(out) if any("#1" in e for e in row["example_ids"]))
    rows = read_shard(out / _manifest(out)["shards"][s]["file"]).to_pylist()
    k = next(i for i, e in enumerate(row["example_ids"]) if e.endswith("#1"))
    bumped = rows[r]["example_ids"][k] = rows[r]["example_ids"][k][:-2] + "#7"
    _rewrite(out, s, rows)
    line = bumped.rsplit(":", 1)[1].split("#")[0]
    assert f"{a}: line {line} has copies whose #k suffixes are not 0..n-1" in verify_build(out, inputs=[str(a)]).lines()
    # had source b weight 1, its dropped half would be lost records
    manifest = _manifest(out)
    manifest["config"]["sources"][1]["weight"] = 1.0
    write_json_atomic(out / "manifest.json", manifest)
    lost = [v for v in verify_build(out, inputs=[str(b)]).lines() if "is neither packed nor rejected" in v]
    assert len(lost) == 10


def test_a_source_whose_files_are_gone_is_reported(tmp_path):
    """A source whose paths match no file any more: its copy counts cannot be checked, and verify says so
    (it used to skip the source silently and judge its records as if their weight were 1)."""
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"text": f"alpha {i} " * 5}) + "\n" for i in range(6)))
    out = tmp_path / "out"
    config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": [str(a)], "weight": 2.0}],
                                    "output": str(out), "profile": "text"})
    build(config, progress=False)
    assert verify_build(out, inputs=[str(a)]).ok
    moved = tmp_path / "moved.jsonl"
    a.rename(moved)
    report = verify_build(out, inputs=[str(moved)])
    assert not report.ok
    gone = [v for v in report.violations if "source 'a' (weight 2.0)" in v.what]
    assert len(gone) == 1 and gone[0].file == "manifest.json"
    assert f"input '{a}' matches no file" in gone[0].what and "cannot be checked" in gone[0].what


def test_a_hand_written_shard_set_verifies(tmp_path):
    """Random trees, several rows per row group (tests.helpers.write_shardset): every layout rule holds, and
    one broken row is found in its group without flagging its neighbours."""
    rng = np.random.default_rng(5)
    examples = [random_example(rng, i) for i in range(40)]
    out = write_shardset(tmp_path / "out", examples, [4] * 10, rows_per_shard=5, rows_per_row_group=3)
    report = verify_build(out)
    assert report.ok, report.lines()
    assert (report.shards, report.rows, report.examples) == (2, 10, 40)
    file, row = _mutate(out, _later_tree, _parent_in_other_example)
    report = verify_build(out)
    assert [(v.file, v.row) for v in report.violations] == [(file, row)]
    assert "parent belongs to another example" in report.violations[0].what


def test_tokenizer_check_all_and_a_mismatch_at_its_line(built):
    """``tokenizer_check="all"`` re-tokenizes every record packed whole; an input line whose text no longer gives
    the packed tokens is reported at file:line (here the input changed after the build; a fast path that is not
    exact shows the same way), and the CLI takes N|all."""
    out, data = built
    packed = sum(1 for _ in data.read_text().splitlines()) - 2  # every record but the two rejects
    report = verify_build(out, inputs=[str(data)], tokenizer_check="all")
    assert report.ok and report.tokenized == packed, report.lines()
    assert verify_build(out, inputs=[str(data)], tokenizer_check=0).tokenized == 0
    original = data.read_text()
    lines = original.splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if "Question 1?" in line)
    lines[n] = lines[n].replace("Question 1?", "Question 1!")  # same structure, other tokens
    try:
        data.write_text("".join(lines))
        report = verify_build(out, inputs=[str(data)], tokenizer_check="all")
        bad = [v for v in report.violations if "the packed tokens/labels" in v.what]
        assert [(v.file, v.what.split(":")[0]) for v in bad] == [(str(data), f"line {n + 1}")], report.lines()
        assert len(report.violations) == 1, report.lines()
        result = CliRunner().invoke(cli, ["verify", str(out), "--input", str(data), "--tokenizer-check", "all"])
        assert result.exit_code == 4 and f"line {n + 1}: the packed tokens/labels" in result.output, result.output
    finally:
        data.write_text(original)
    result = CliRunner().invoke(cli, ["verify", str(out), "--input", str(data), "--tokenizer-check", "5"])
    assert result.exit_code == 0 and "(5 re-tokenized with the HF tokenizer)" in result.output, result.output
    result = CliRunner().invoke(cli, ["verify", str(out), "--tokenizer-check", "some"])
    assert result.exit_code == 2 and "--tokenizer-check" in result.output
