"""Per-token loss weights (issue 24): a message's ``"loss": <weight>`` reaches the shards' ``loss_weights`` column
(schema v4) on exactly its loss tokens, through trees, images and truncation; bad weights are rejects with file and
line; unweighted builds keep the column null; readers of v3 shards see every weight 1; verify checks the column."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packer.core.types import IGNORE_INDEX
from packer.report.verify import verify_build
from packer.shards.io import read_shard, write_json_atomic, write_shard
from packer.shards.schema import SCHEMAS
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.train.trainer_helpers import A, U, build_jsonl

W = lambda c, w: {"role": "assistant", "content": c, "loss": w}  # noqa: E731

RECORDS = [
    {"messages": [U("hi there"), W("weighted answer", 0.5), U("more"), A("plain answer")]},  # 1: 0.5 then 1
    {"messages": [U("q"), A("a b c")]},  # 2: unweighted
    {"messages": [U("pick one")], "branches": [[W("x y", 2.0)], [A("z")], [U("again"), W("w", 3)]]},  # 3: a tree
    {"messages": [U("zero"), W("not learned", 0), A("learned")]},  # 4: a weight of 0 is "loss": false
    {"messages": [{"role": "user", "content": "user turn with loss", "loss": 0.25}, A("ok")]},  # 5: a weighted user turn
]
BAD = [
    ({"messages": [U("bad"), W("n", -1)]}, "finite number >= 0"),
    ({"messages": [U("bad"), W("n", float("inf"))]}, "finite number >= 0"),
    ({"messages": [U("bad"), W("n", "high")]}, "true, false or a weight"),
]


def _rows(out: Path) -> list[dict]:
    return [r for f in sorted(out.glob("shard-*.parquet")) for r in read_shard(f).to_pylist()]


def _examples(out: Path) -> dict[str, dict]:
    """Each example of a build: its labels and weights (ones where the row has none)."""
    found = {}
    for r in _rows(out):
        labels = np.array(r["labels"])
        weights = (np.array(r["loss_weights"], dtype=np.float32) if r["loss_weights"] is not None
                   else (labels != IGNORE_INDEX).astype(np.float32))
        for e, ex in enumerate(r["example_ids"]):
            a, b = r["cu_seqlens"][e], r["cu_seqlens"][e + 1]
            found[ex.rsplit(":", 1)[1]] = {"labels": labels[a:b], "weights": weights[a:b]}
    return found


@pytest.fixture(scope="module")
def weighted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    return build_jsonl(root, "w", RECORDS + [r for r, _ in BAD], max_length=64, max_reject_fraction=1.0)


def test_weights_land_on_their_messages_loss_tokens(weighted):
    ex = _examples(weighted)
    assert sorted(ex) == ["1", "2", "3", "4", "5"]
    for e in ex.values():
        loss = e["labels"] != IGNORE_INDEX
        assert (e["weights"][~loss] == 0).all() and (e["weights"][loss] > 0).all()
    # example 1: the weighted turn's loss tokens (its content and <|im_end|>) weigh 0.5, the plain turn's 1
    w1 = ex["1"]["weights"][ex["1"]["labels"] != IGNORE_INDEX]
    assert w1.tolist() == [0.5] * int((w1 == 0.5).sum()) + [1.0] * int((w1 == 1).sum()) and (w1 == 0.5).sum() >= 3
    assert set(ex["3"]["weights"][ex["3"]["labels"] != IGNORE_INDEX].tolist()) == {2.0, 1.0, 3.0}
    # a weight of 0 is no loss: only "learned" and its end of turn
    assert int((ex["4"]["labels"] != IGNORE_INDEX).sum()) == int((ex["2"]["labels"] != IGNORE_INDEX).sum()) - 1
    assert 0.25 in ex["5"]["weights"].tolist()
    for r in _rows(weighted):  # null exactly on rows of unweighted examples (2; 4's only weight is 0, i.e. false)
        assert (r["loss_weights"] is None) == all(e.rsplit(":", 1)[1] in ("2", "4") for e in r["example_ids"])
    assert verify_build(weighted).ok


def test_bad_weights_are_rejects_with_file_and_line(weighted):
    rejects = [json.loads(line) for line in (weighted / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(len(RECORDS) + i + 1, "wrong_type") for i in range(len(BAD))]
    for r, (_, why) in zip(rejects, BAD, strict=True):
        assert why in r["message"] and r["path"].endswith("w.jsonl")


def test_stats_weigh_loss_tokens(weighted):
    stats = json.loads((weighted / "stats.json").read_text())
    ex = _examples(weighted)
    assert stats["loss_tokens"] == sum(int((e["labels"] != IGNORE_INDEX).sum()) for e in ex.values())
    assert stats["weighted_loss_tokens"] == pytest.approx(sum(float(e["weights"].sum()) for e in ex.values()))
    from packer.report.stats import format_stats

    assert f"weighted {stats['weighted_loss_tokens']:,.1f}" in format_stats(stats)


def test_unweighted_builds_keep_the_column_null(tmp_path):
    out = build_jsonl(tmp_path, "plain", [{"messages": [U("q"), A("a " * (i + 1))]} for i in range(5)])
    assert all(r["loss_weights"] is None for r in _rows(out))
    assert "weighted_loss_tokens" not in json.loads((out / "stats.json").read_text())
    assert all("loss_weights" not in r for r in PackedDataset(out, shuffle=False))
    assert "loss_weights" not in collate(list(PackedDataset(out, shuffle=False)))


@pytest.mark.slow
def test_weights_follow_images_and_truncation(tmp_path, coco_images):
    """A weighted turn around an image (qwen2-vl: the placeholder becomes its run) and a cut conversation: the
    weights stay on the same tokens as the labels."""
    img = str(coco_images[0])
    recs = [{"messages": [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "what"}],
                           "loss": 0.5}, W("a picture " * 3, 2.0)]},
            {"messages": [U("long " * 5), W("answer " * 40, 1.5)]}]
    out = build_jsonl(tmp_path, "vis", recs, profile="qwen2-vl", max_length=400, overlong="truncate",
                      max_vision_tokens=1000)
    ex = _examples(out)
    assert set(ex["1"]["weights"][ex["1"]["labels"] != IGNORE_INDEX].tolist()) == {0.5, 2.0}
    assert set(ex["2"]["weights"][ex["2"]["labels"] != IGNORE_INDEX].tolist()) == {1.5}
    assert verify_build(out).ok


def test_readers_take_weights_and_v3_shards(weighted, tmp_path):
    rows = list(PackedDataset(weighted, shuffle=False))
    batch = collate(rows)
    want = np.concatenate([r["loss_weights"] if "loss_weights" in r else (r["labels"] != IGNORE_INDEX).astype(np.float32)
                           for r in rows])
    assert batch["loss_weights"].shape == batch["labels"].shape
    assert np.array_equal(batch["loss_weights"][0].numpy(), want)
    assert batch["example_sources"] == [""] * len(batch["example_ids"])
    # the same build written as v3 (no loss_weights column): read, every weight 1
    out = tmp_path / "v3"
    shutil.copytree(weighted, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for s, entry in enumerate(manifest["shards"]):
        rows_v3 = read_shard(out / entry["file"]).drop_columns(["loss_weights"]).to_pylist()
        for r in rows_v3:  # v3 gave every linear text row its seq_lengths (v4 leaves weighted rows without)
            linear = len(r["node_offsets"]) == len(r["cu_seqlens"]) - 1
            r["seq_lengths"] = np.diff(r["cu_seqlens"]).tolist() if linear else None
        new = write_shard(pa.Table.from_pylist(rows_v3, schema=SCHEMAS[3]), out / entry["file"],
                        rows_per_row_group=2)
        manifest["shards"][s] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", {**manifest, "schema_version": 3})
    old = list(PackedDataset(out, shuffle=False))
    assert all("loss_weights" not in r for r in old) and "loss_weights" not in collate(old)
    assert verify_build(out).ok


@pytest.mark.parametrize("fault", ["negative", "on a token without loss", "short"])
def test_verify_catches_bad_loss_weights(weighted, tmp_path, fault):
    out = tmp_path / "bad"
    shutil.copytree(weighted, out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][0]
    rows = read_shard(out / entry["file"]).to_pylist()
    row = next(r for r in rows if r["loss_weights"] is not None)
    k = int(np.flatnonzero(np.array(row["labels"]) != IGNORE_INDEX)[0])
    if fault == "negative":
        row["loss_weights"][k] = -1.0
    elif fault == "on a token without loss":
        row["loss_weights"][0] = 1.0
    else:
        row["loss_weights"] = row["loss_weights"][:-1]
    table = pa.Table.from_pylist(rows, schema=pq.read_schema(out / entry["file"]))
    new = write_shard(table, out / entry["file"], rows_per_row_group=2)
    manifest["shards"][0] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", manifest)
    report = verify_build(out)
    assert not report.ok and {c for _, c in report.counts} == {"loss_weights"}, report.lines()


@pytest.mark.slow
def test_the_online_packer_carries_weights(weighted):
    """OnlinePackedDataset assembles rows as the build does: each example's weights equal the build's."""
    from packer.train.online import OnlinePackedDataset

    online = OnlinePackedDataset(str(weighted.parent / "w.jsonl"), pool_size=100, shuffle=False, profile="text",
                                 max_length=64, max_reject_fraction=1.0)
    want = _examples(weighted)
    seen = 0
    for row in online:
        labels = row["labels"]
        weights = row.get("loss_weights", (labels != IGNORE_INDEX).astype(np.float32))
        for e, ex in enumerate(row["example_ids"]):
            a, b = row["cu_seqlens"][e], row["cu_seqlens"][e + 1]
            assert np.array_equal(weights[a:b], want[ex.rsplit(":", 1)[1]]["weights"]), ex
            seen += 1
    assert seen == len(want)


def test_weighted_rows_get_no_seq_lengths(tmp_path):
    """TRL's own padding-free SFT reads seq_lengths and would drop the weights: a row with any weight has none (TRL's
    collator then refuses it), a row of unweighted linear chats keeps it; verify checks both ways."""
    recs = [{"messages": [U(f"q {i}"), W("a " * (1 + i), 0.5 if i % 2 else 1)]} for i in range(6)]
    out = build_jsonl(tmp_path, "lin", recs, max_length=40)
    rows = _rows(out)
    assert {r["loss_weights"] is None for r in rows} == {True, False}
    for r in rows:
        assert (r["seq_lengths"] is None) == (r["loss_weights"] is not None)
    assert verify_build(out).ok
