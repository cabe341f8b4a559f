"""Bad input never breaks a build: the fuzz corpus (tests/data/bad) gives every line its exact fate, counts
add up (input records = packed + rejected) in the manifest and stats, and the CLI's --strict,
--max-reject-fraction and --overwrite behave as documented (docs/reliability.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig
from packer.errors import REJECT_REASONS, ShardError
from packer.pipeline.build import build
from packer.report.verify import input_lines, verify_build
from packer.shards.io import sha256_file
from packer.train.dataset import PackedDataset

CORPUS = Path(__file__).resolve().parents[1] / "data" / "bad"
SPEC: dict = json.loads((CORPUS / "expected.json").read_text())["files"]


def _cli_args(config: dict) -> list[str]:
    """A corpus file's build config as command-line options."""
    args = []
    for key, value in config.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    out = {}
    for name, spec in SPEC.items():
        dest = tmp_path_factory.mktemp("bad") / "out"
        config = BuildConfig.from_inputs([str(CORPUS / name)], str(dest), **spec["config"])
        out[name] = (dest, build(config, progress=False))
    return out


def _fates(out: Path) -> tuple[Counter, dict[int, dict]]:
    """(times each line is packed, line -> its reject record) of a build."""
    packed = Counter(int(e.rsplit(":", 1)[1]) for row in PackedDataset(out, shuffle=False, load_images=False)
                     for e in row["example_ids"])
    rejects: dict[int, dict] = {}
    for raw in (out / "rejects.jsonl").read_text().splitlines():
        r = json.loads(raw)
        assert r["line"] not in rejects, f"line {r['line']} rejected twice"
        rejects[r["line"]] = r
    return packed, rejects


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPEC))
def test_every_line_meets_its_expected_fate(built, name):
    out, _ = built[name]
    spec = SPEC[name]
    packed, rejects = _fates(out)
    wrong = []
    for key, want in spec["expect"].items():
        line = int(key)
        got = "packed" if packed[line] == 1 and line not in rejects else \
            rejects[line]["reason"] if line in rejects and not packed[line] else \
            "blank" if line not in rejects and not packed[line] else f"packed {packed[line]}x, rejects {rejects.get(line)}"
        if got != want:
            wrong.append(f"line {line} ({spec['cases'][key]}): want {want}, got {got}")
    assert not wrong, "\n".join(wrong)
    assert set(rejects) <= {int(k) for k in spec["expect"]}
    for line, r in rejects.items():  # each reject says where and why, in words
        assert r["path"] == str(CORPUS / name) and r["line"] == line and r["message"]


def test_corpus_covers_every_reject_reason():
    covered = {v for spec in SPEC.values() for v in spec["expect"].values()} - {"packed", "blank"}
    assert covered == set(REJECT_REASONS)


def test_corpus_bytes_keep_their_traps():
    """An editor re-saving the corpus would silently remove these cases."""
    raw = (CORPUS / "records.jsonl").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw and not raw.endswith(b"\n")
    assert b"\n\n" in raw and b"caf\xe9" in raw


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPEC))
def test_inputs_equal_packed_plus_rejected_in_manifest_and_stats(built, name):
    _, result = built[name]
    expect = SPEC[name]["expect"]
    by_reason = Counter(v for v in expect.values() if v not in ("packed", "blank"))
    records = sum(1 for v in expect.values() if v != "blank")
    assert len(input_lines(str(CORPUS / name))) == records  # verify's line rule agrees with the corpus
    totals, stats = result.manifest["totals"], result.stats
    assert totals["input_records"] == stats["input_records"] == records
    assert totals["examples"] + totals["rejected"] == records
    assert totals["examples"] == sum(1 for v in expect.values() if v == "packed")
    assert totals["rejects_by_reason"] == stats["rejects_by_reason"] == dict(sorted(by_reason.items()))


@pytest.mark.parametrize("name", sorted(SPEC))
def test_corpus_build_verifies_against_its_input(built, name):
    out, _ = built[name]
    report = verify_build(out, inputs=[str(CORPUS / name)])
    assert report.ok, "\n".join(report.lines())
    assert report.input_records == sum(1 for v in SPEC[name]["expect"].values() if v != "blank")


def test_strict_stops_at_the_first_bad_record_with_its_message(built, tmp_path):
    name = "records.jsonl"
    first_bad = min(int(k) for k, v in SPEC[name]["expect"].items() if v not in ("packed", "blank"))
    _, rejects = _fates(built[name][0])
    r = rejects[first_bad]
    result = CliRunner().invoke(cli, ["build", str(CORPUS / name), "-o", str(tmp_path / "out"), "--strict", "-q",
                                      *_cli_args(SPEC[name]["config"])])
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"error: {r['path']}:{r['line']}: {r['reason']}: {r['message']} "
                             "(rerun without --strict to reject such records instead of stopping)\n")


@pytest.mark.parametrize("fraction, code", [(0.5, 3), (0.95, 0)])
def test_max_reject_fraction(tmp_path, fraction, code):
    name = "records.jsonl"
    expect = SPEC[name]["expect"]
    rejected = sum(1 for v in expect.values() if v not in ("packed", "blank"))
    records = sum(1 for v in expect.values() if v != "blank")
    assert 0.5 < rejected / records < 0.95
    result = CliRunner().invoke(cli, ["build", str(CORPUS / name), "-o", str(tmp_path / "out"), "-q",
                                      "--max-reject-fraction", str(fraction), *_cli_args(SPEC[name]["config"])])
    assert result.exit_code == code, result.output
    if code:
        assert f"{rejected} of {records} input records were rejected" in result.stderr
        assert "--max-reject-fraction 0.5" in result.stderr
        assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_another_build_is_not_overwritten_without_overwrite(tmp_path):
    name = "template.jsonl"
    out = tmp_path / "out"
    args = ["build", str(CORPUS / name), "-o", str(out), "-q", *_cli_args(SPEC[name]["config"])]
    runner = CliRunner()
    assert runner.invoke(cli, args).exit_code == 0
    before = {p.name: sha256_file(p) for p in out.iterdir() if p.is_file()}
    other = runner.invoke(cli, [*args, "--max-length", "512"])
    assert other.exit_code == 1
    assert "holds a different packer build; pass --overwrite" in other.stderr
    assert {p.name: sha256_file(p) for p in out.iterdir() if p.is_file()} == before  # untouched
    again = runner.invoke(cli, [*args, "--max-length", "512", "--overwrite"])
    assert again.exit_code == 0, again.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["max_length"] == 512
    assert verify_build(out, inputs=[str(CORPUS / name)]).ok
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "mine.txt").write_text("not a build")
    refused = runner.invoke(cli, ["build", str(CORPUS / name), "-o", str(stranger), "-q",
                                  *_cli_args(SPEC[name]["config"])])
    assert refused.exit_code == 1 and "is not empty; pass --overwrite" in refused.stderr
    assert (stranger / "mine.txt").read_text() == "not a build"


def test_a_corrupt_reject_in_the_encode_cache_is_an_error_not_an_assert(tmp_path):
    """Rejects read back from the encode cache are checked with a real error (an ``assert`` vanishes under
    ``python -O`` and would let an unknown reason into rejects.jsonl): the file, the line and the fix."""
    name = "records.jsonl"
    config = BuildConfig.from_inputs([str(CORPUS / name)], str(tmp_path / "out"), **SPEC[name]["config"])
    build(config, progress=False)
    chunk = tmp_path / "out" / ".packer" / "encode" / "chunk-000000.rejects.jsonl"
    lines = chunk.read_text().splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "reason": "bogus"})
    chunk.write_text("\n".join(lines) + "\n")
    with pytest.raises(ShardError, match=rf"{chunk}:2 has reject reason 'bogus', not one of .*: the encode cache is "
                                         rf"corrupt; delete {chunk.parent} and rerun the same command"):
        build(config, progress=False)
