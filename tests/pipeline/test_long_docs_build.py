"""Builds with ``--long-docs split`` and with each ``--overlong`` policy: ``packer verify --input`` passes
(every line accounted for, a split text's chunks re-tokenized: tokens lost = 0), the chunks put back together
are the document, and a changed document is caught."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.formats.read import parse_line
from packer.models import get_profile
from packer.pipeline.build import build
from packer.report.verify import verify_build

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def _corpus(path: Path) -> Path:
    recs = []
    for i in range(6):  # texts of ~0.3x to ~3.5x max_length (64 tokens)
        recs.append({"text": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(12 + 38 * i))})
        recs.append({"messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "An early question " + "and more " * (3 * i)},
                                  {"role": "assistant", "content": "An early answer."},
                                  {"role": "user", "content": f"Question {i}?"},
                                  {"role": "assistant", "content": f"Answer {i}."}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _ids_and_tokens(out: Path) -> dict[str, np.ndarray]:
    got = {}
    for f in sorted(out.glob("shard-*.parquet")):
        for row in pq.read_table(f).to_pylist():
            for k, eid in enumerate(row["example_ids"]):
                a, b = row["cu_seqlens"][k], row["cu_seqlens"][k + 1]
                got[eid] = np.asarray(row["input_ids"][a:b])
    return got


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0, 5])
def test_split_build_verifies_and_loses_no_token(tmp_path, overlap):
    data = _corpus(tmp_path / "data.jsonl")
    config = BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="text", max_length=64,
                                     overlong="keep_last_turns", long_docs="split", long_docs_overlap=overlap,
                                     rows_per_shard=3)
    result = build(config, progress=False)
    report = verify_build(tmp_path / "out", inputs=[str(data)])
    assert report.ok, report.lines()
    assert result.manifest["totals"]["input_records"] == 12 and result.manifest["totals"]["rejected"] == 0
    got = _ids_and_tokens(tmp_path / "out")
    assert sum("@" in k for k in got) >= 8  # the longer texts were split
    whole = Encoder(load_tokenizer("qwen2-vl"), get_profile("text"))
    for n, raw in enumerate(data.read_bytes().splitlines(), start=1):
        if b'"text"' not in raw:
            continue
        doc = whole.encode(parse_line(raw, path=str(data), line=n, base_dir=str(tmp_path))).input_ids
        chunks = sorted((k for k in got if k.startswith(f"{data}:{n}@")), key=lambda k: int(k.rpartition("@")[2]))
        if doc.shape[0] <= 64:
            assert not chunks and f"{data}:{n}" in got
            continue
        parts = [got[k] for k in chunks]
        # rebuild: each later chunk ends its predecessor's window + stride later (or at the document's end)
        rebuilt, end = list(parts[0]), len(parts[0])
        for p in parts[1:]:
            new = min(64 - overlap, len(doc) - end)  # tokens this chunk adds; the rest is context
            assert doc[end - (len(p) - new) : end].tolist() == p[: len(p) - new].tolist()  # the context repeats
            rebuilt += p[len(p) - new :].tolist()
            end += new
        assert rebuilt == doc.tolist()  # tokens lost = 0
    # a resumed build counts a split text as one record too (the encode cache's counts)
    again = build(config, progress=False)
    assert again.manifest["totals"] == result.manifest["totals"]


@pytest.mark.slow
def test_split_build_with_up_sampling_and_a_changed_document(tmp_path):
    data = _corpus(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["build", "--source", f"docs={data}@2", "-o", str(out), "--profile", "text",
                                   "--max-length", "64", "--long-docs", "split", "--long-docs-overlap", "3",
                                   "--overlong", "truncate_left", "-q"])
    assert res.exit_code == 0, res.output
    ids = _ids_and_tokens(out)
    assert f"{data}:11@2#1" in ids and f"{data}:11@2" in ids  # a copy of a chunk: @k#c
    res = CliRunner().invoke(cli, ["verify", str(out), "--input", str(data)])
    assert res.exit_code == 0, res.output
    # a document changed after the build: its chunks no longer reproduce it
    lines = data.read_text().splitlines()
    lines[10] = lines[10].replace("fox", "cat", 1)
    data.write_text("\n".join(lines) + "\n")
    report = verify_build(out, inputs=[str(data)])
    assert [v.what for v in report.violations] == [
        "line 11 chunk 0 differs from the document's tokens [0, 64) (tokens or labels changed)"]


@pytest.mark.slow
@pytest.mark.parametrize("overlong", ["truncate", "truncate_left", "keep_last_turns"])
def test_each_overlong_policy_builds_and_verifies(tmp_path, overlong):
    data = _corpus(tmp_path / "data.jsonl")
    config = BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="text", max_length=64,
                                     overlong=overlong)
    result = build(config, progress=False)
    assert verify_build(tmp_path / "out", inputs=[str(data)]).ok
    assert result.manifest["totals"]["input_records"] == 12
