"""A local disk that fills (ENOSPC) under a build whose output is on S3: the only local files of such a build are
the shard writers' copies of the encode cache (``$TMPDIR/packer-store``), so ``TMPDIR`` is a 16 KiB tmpfs,
mounted in a user + mount namespace of its own (``unshare -Urm``: no root needed where the kernel allows user
namespaces; skipped where it does not). The build (a real ``packer build`` subprocess) stops with exit 1 and
an error naming the stage, the object and the disk; no shard is under its final name without its marker, no
manifest; the rerun with room resumes from the committed chunks to the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from packer.config import BuildConfig  # noqa: E402
from packer.pipeline.build import build  # noqa: E402
from packer.shards.store import store_path  # noqa: E402
from tests.pipeline.crash_setup import build_command, word_records, word_tokenizer  # noqa: E402
from tests.pipeline.s3_cluster import s3_server, upload  # noqa: E402

WORDS = [f"w{i}" for i in range(500)]
OPTS = dict(profile="text", max_length=256, rows_per_shard=40, rows_per_row_group=16)
CLI_OPTS = ["--profile", "text", "--max-length", "256", "--rows-per-shard", "40", "--rows-per-row-group", "16"]
INPUT = "s3://packer/in/data.jsonl"


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = tempfile.mkdtemp()
    try:
        return subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {probe}"],
                              capture_output=True).returncode == 0
    finally:
        shutil.rmtree(probe, ignore_errors=True)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with s3_server() as (env, _proxy):
        corpus = tmp_path_factory.mktemp("corpus")
        lines = word_records(np.random.default_rng(0), 700, words=WORDS, lengths=(3, 120), chat_every=5, bad_every=61,
                             question_chars=60)
        (corpus / "data.jsonl").write_text("\n".join(lines) + "\n")
        upload(corpus, "s3://packer/in")
        yield env


def _digests(url: str) -> dict[str, str]:
    root = store_path(url)
    names = [p.name for p in root.glob("shard-*")] + ["stats.json", "rejects.jsonl"]
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in sorted(names)}


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -Urm` to mount a small tmpfs")
def test_a_full_local_disk_stops_the_build_clearly_and_the_rerun_resumes(s3, tmp_path_factory):
    import json

    tokenizer = word_tokenizer(tmp_path_factory.mktemp("tok") / "tiny", words=WORDS)
    build(BuildConfig.from_inputs([INPUT], "s3://packer/out/ref", tokenizer=tokenizer, **OPTS), progress=False)
    reference = _digests("s3://packer/out/ref")

    out = "s3://packer/out/full"
    small = Path(tempfile.mkdtemp(prefix="packer-tmpfs-"))
    command = " ".join(f"'{a}'" for a in build_command([INPUT, "-o", out, "--tokenizer", tokenizer, "-q", "--num-proc",
                                                         "1", *CLI_OPTS]))
    env = {**__import__("os").environ, "TMPDIR": str(small), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {small} && exec {command}"],
                         env=env, capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    shutil.rmtree(small, ignore_errors=True)
    assert run.returncode == 1, run.stderr
    error = run.stderr
    assert "write (shard 0)" in error and "No space left on device" in error, error
    assert f"downloading {out}/.packer/encode/chunk-" in error and "rerun the command to resume" in error, error
    root = store_path(out)
    assert not (root / "manifest.json").exists()
    for shard in root.glob("shard-*.parquet"):  # none looks complete without being so
        marker = json.loads((root / ".packer" / "shards" / f"{shard.name[6:11]}.json").read_text())
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == marker["sha256"]
    committed = {p.name: p.fs.info(p.key)["LastModified"] for p in (root / ".packer" / "encode").glob("chunk-*.arrow")}
    assert committed  # the encode stage finished before the disk filled

    build(BuildConfig.from_inputs([INPUT], out, tokenizer=tokenizer, **OPTS), progress=False)
    assert _digests(out) == reference
    again = {p.name: p.fs.info(p.key)["LastModified"] for p in (root / ".packer" / "encode").glob("chunk-*.arrow")}
    assert again == committed  # nothing encoded again
