"""Builds on an object store: a real S3-compatible server (moto in server mode, started here on 127.0.0.1 and
spoken to over HTTP by s3fs, as AWS would be), never a mocked client.

A build to ``s3://bucket/prefix`` writes the same bytes as the same build on a local disk, its readers
(``PackedDataset``, ``packer verify/stats/inspect``) read it there, and a build killed mid-write (the fault
hooks of tests/pipeline/crashing_build.py, in a real ``packer build`` subprocess) leaves no shard under its
final name that is not complete, no manifest, and resumes from its markers on the store to the same bytes.
(The moto server answers a request in ~10-50 ms, so the builds here stay a few shards small.)
"""

from __future__ import annotations

import hashlib
import json
import pickle
import signal
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("s3fs")
from moto.server import ThreadedMotoServer  # noqa: E402

from packer.cli import cli  # noqa: E402
from packer.config import BuildConfig  # noqa: E402
from packer.errors import ConfigError, ShardError  # noqa: E402
from packer.pipeline.build import build  # noqa: E402
from packer.report.verify import verify_build  # noqa: E402
from packer.shards.io import open_shards  # noqa: E402
from packer.shards.store import ObjectPath, store_path, write_atomic  # noqa: E402
from packer.train.dataset import PackedDataset  # noqa: E402
from tests.pipeline.crash_setup import run_build, word_records, word_tokenizer  # noqa: E402

WORDS = [f"w{i}" for i in range(500)]
OPTS = dict(profile="text", max_length=256, rows_per_shard=40, rows_per_row_group=16)
CLI_OPTS = ["--profile", "text", "--max-length", "256", "--rows-per-shard", "40", "--rows-per-row-group", "16"]
COMPARED = ("stats.json", "rejects.jsonl")  # beside the shards (the card and the manifest name the output)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with the bucket ``packer``; the AWS environment points at it (what a user
    sets for MinIO or any S3-compatible store), so the CLI and subprocesses find it with no options."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        import boto3

        boto3.client("s3").create_bucket(Bucket="packer")
        yield env
    server.stop()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    return word_tokenizer(tmp_path_factory.mktemp("tok") / "tiny", words=WORDS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """700 records (two encode chunks): texts, a chat every 5th line, a bad record every 61st."""
    lines = word_records(np.random.default_rng(0), 700, words=WORDS, lengths=(3, 120), chat_every=5, bad_every=61,
                         question_chars=60)
    path = tmp_path_factory.mktemp("corpus") / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def local_build(corpus, tokenizer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local") / "out"
    build(BuildConfig.from_inputs([str(corpus)], str(out), tokenizer=tokenizer, **OPTS), progress=False)
    return out


def _digests(root: Path | ObjectPath) -> dict[str, str]:
    """sha256 of every shard and of the files beside them."""
    files = [p.name for p in root.glob("shard-*")] + list(COMPARED)
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in sorted(files)}


def _keys(url: str) -> list[str]:
    root = store_path(url)
    return sorted(k[len(root.key) + 1:] for k in root.fs.find(root.key))


@pytest.mark.slow
def test_a_build_on_s3_is_byte_identical_and_reads_back(s3, corpus, tokenizer, local_build):
    url = "s3://packer/runs/identical"
    # explicit storage_options (what YAML `storage_options:` passes)
    config = BuildConfig.from_inputs([str(corpus)], url, tokenizer=tokenizer,
                                     storage_options={"endpoint_url": s3["AWS_ENDPOINT_URL"]}, **OPTS)
    result = build(config, progress=False)
    assert result.output == ObjectPath(url)
    assert _digests(ObjectPath(url)) == _digests(local_build)
    assert len([k for k in _digests(local_build) if k.startswith("shard-")]) >= 3
    keys = _keys(url)
    assert "manifest.json" in keys and not [k for k in keys if ".tmp-" in k]
    manifest = json.loads(ObjectPath(url + "/manifest.json").read_text())
    assert "storage_options" not in manifest["config"]  # may hold credentials: never written
    assert manifest["shards"] == json.loads((local_build / "manifest.json").read_text())["shards"]

    report = verify_build(url, inputs=[str(corpus)])
    assert report.ok, report.lines()
    remote, local = PackedDataset(url, shuffle=False), PackedDataset(local_build, shuffle=False)
    assert len(remote) == len(local)
    for a, b in zip(remote, local, strict=True):
        assert a["example_ids"] == b["example_ids"]
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(a[key], b[key])

    runner = CliRunner()
    stats = runner.invoke(cli, ["stats", url, "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout) == json.loads((local_build / "stats.json").read_text())
    row = runner.invoke(cli, ["inspect", url, "--row", "0", "--ids", "--json"])
    assert row.exit_code == 0, row.output
    assert json.loads(row.stdout)["examples"]


@pytest.mark.slow
def test_a_build_on_s3_written_a_row_group_at_a_time_is_byte_identical(s3, corpus, tokenizer, local_build,
                                                                        monkeypatch):
    """Each shard uploaded from the slices of ``stages._assembled`` (``SLICE_TOKENS`` 1: one row group of 16 packs
    a slice), written into one in-memory Parquet file: the local build's bytes (its shards one slice each)."""
    from packer.pipeline import stages

    monkeypatch.setattr(stages, "SLICE_TOKENS", 1)
    url = "s3://packer/runs/slices"
    config = BuildConfig.from_inputs([str(corpus)], url, tokenizer=tokenizer,
                                     storage_options={"endpoint_url": s3["AWS_ENDPOINT_URL"]}, **OPTS)
    build(config, progress=False)
    assert _digests(ObjectPath(url)) == _digests(local_build)
    assert not [k for k in _keys(url) if ".tmp-" in k]


@pytest.mark.slow
def test_an_object_path_pickles_to_a_working_client(s3):
    """What a pool worker, a Ray task or a DataLoader worker receives: the URL and options, its own client."""
    path = ObjectPath("s3://packer/pickled/a.json", {"endpoint_url": s3["AWS_ENDPOINT_URL"]})
    write_atomic(path, b"{}")
    copy = pickle.loads(pickle.dumps(path))
    assert copy == path and copy.storage_options == path.storage_options
    assert copy.read_bytes() == b"{}" and not [p for p in copy.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
def test_a_build_killed_on_s3_shows_no_partial_shard_and_resumes(s3, corpus, tokenizer, local_build):
    url = "s3://packer/runs/killed"
    # killed in the middle of writing shard 1: a half-written temp object, nothing under the shard's name
    args = [corpus, "-o", url, "--tokenizer", tokenizer, "-q", *CLI_OPTS]
    assert run_build(args, "shard-partial:1", env=s3).returncode == -signal.SIGKILL
    keys = _keys(url)
    assert [k for k in keys if k.startswith("shard-") and ".tmp-" not in k] == ["shard-00000.parquet"]
    assert any(k.startswith("shard-00001.parquet.tmp-") for k in keys)
    assert ".packer/shards/00000.json" in keys and "manifest.json" not in keys
    with pytest.raises(ShardError, match="did not finish"):
        open_shards(url)
    with pytest.raises(ShardError, match="did not finish"):
        PackedDataset(url)

    kept = ObjectPath(url).fs.info("packer/runs/killed/shard-00000.parquet")["ETag"]

    build(BuildConfig.from_inputs([str(corpus)], url, tokenizer=tokenizer, **OPTS), progress=False)  # env only
    assert _digests(ObjectPath(url)) == _digests(local_build)
    assert ObjectPath(url).fs.info("packer/runs/killed/shard-00000.parquet")["ETag"] == kept
    assert not [k for k in _keys(url) if ".tmp-" in k]  # the rerun removed the stale temp object
    assert verify_build(url).ok


def test_s3_without_s3fs_is_a_config_error(tmp_path, monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if the `s3` extra were not installed
    # fsspec's table of loaded filesystem classes (the package's `registry` attribute is a read-only view of it)
    monkeypatch.delitem(importlib.import_module("fsspec.registry")._registry, "s3", raising=False)
    monkeypatch.setattr("packer.core.location._FILESYSTEMS", {})
    with pytest.raises(ConfigError, match=r"s3:// paths need .*pip install 'packer\[s3\]'"):
        open_shards("s3://packer/anything")
