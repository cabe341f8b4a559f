"""Interrupted builds: a real ``packer build`` subprocess is killed (-9, or Ctrl-C) at every stage, the
directory is refused as unfinished, and rerunning the same command finishes it with shards byte-identical
to an uninterrupted build, reusing what was done.

An interrupted run is ``python -m tests.pipeline.crashing_build POINT:N[:SIGNAL] ARGS``: the real ``packer
build ARGS`` with a fault hook injected at the named point (packer/pipeline/faults.py), so each crash lands
exactly where named, in the parent or in a pool worker. With ``:STOP`` the build freezes there and the test
signals the whole process group from outside, as a terminal's Ctrl-C or ``kill -9 -PGID`` would, while spawn
workers are encoding.
A small word-level tokenizer keeps each subprocess at a few seconds (the pipeline is what is under test);
each subprocess still pays the torch import of ``AutoTokenizer``, so there are as few as the points need.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.errors import RecordError, ShardError
from packer.formats.read import parse_line
from packer.pipeline.build import build
from packer.pipeline.stages import CHUNK_LINES
from packer.report.verify import verify_build
from packer.train.dataset import PackedDataset
from tests.pipeline.crash_setup import ENV, REPO, build_command, run_build, word_records, word_tokenizer

WORDS = [f"w{i}" for i in range(3000)]
NUM_LINES = 3 * CHUNK_LINES + 60  # 4 encode chunks
BAD_LINE = CHUNK_LINES + 77  # in the second chunk: under --num-proc 2 a worker, not the parent, meets it
OPTS = ["--profile", "text", "--max-length", "1024", "--rows-per-shard", "30", "--rows-per-row-group", "8"]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> str:
    return word_tokenizer(tmp_path_factory.mktemp("tok") / "tiny", words=WORDS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Text records, a chat every 7th line and a bad record every 97th (so rejects exist)."""  # ~1.3 ms/record
    lines = word_records(np.random.default_rng(0), NUM_LINES, words=WORDS, lengths=(5, 400), chat_every=7,
                         bad_every=97, question_chars=200)
    path = tmp_path_factory.mktemp("corpus") / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(corpus: Path, out: Path, tokenizer: str) -> BuildConfig:
    """The config of the CLI command below (num_proc is no part of a build's identity)."""
    return BuildConfig.from_inputs([str(corpus)], str(out), profile="text", tokenizer=tokenizer, max_length=1024,
                                   rows_per_shard=30, rows_per_row_group=8)


@pytest.fixture(scope="module")
def reference(corpus, tiny_tokenizer, tmp_path_factory) -> dict[str, bytes]:
    """Shard bytes of an uninterrupted build (in-process)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    build(_config(corpus, out, tiny_tokenizer), progress=False)
    shards = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}
    assert len(shards) >= 6  # enough shards for the write-stage crash points below
    return shards


def _args(corpus: Path, out: Path, tokenizer: str, *extra: str) -> list[str]:
    """``packer build`` arguments."""
    return [str(corpus), "-o", str(out), "--tokenizer", tokenizer, "-q", *OPTS, *extra]


def _assert_unfinished(out: Path) -> None:
    assert not (out / "manifest.json").exists()
    with pytest.raises(ShardError, match="did not finish"):
        PackedDataset(out)
    with pytest.raises(ShardError):
        verify_build(out)


def _assert_identical(out: Path, reference: dict[str, bytes], corpus: Path) -> None:
    got = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}
    assert got.keys() == reference.keys()
    assert all(got[k] == reference[k] for k in got), "resumed shards differ from an uninterrupted build"
    assert not list(out.rglob("*.tmp-*")), "stale temp files survived the rerun"
    report = verify_build(out, inputs=[str(corpus)])
    assert report.ok, report.lines()


def _stamps(paths) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in paths}


@pytest.mark.slow
def test_killed_at_every_stage_then_rerun_is_byte_identical(corpus, tiny_tokenizer, reference, tmp_path):
    out = tmp_path / "out"
    args = _args(corpus, out, tiny_tokenizer)
    encode, shards_dir = out / ".packer" / "encode", out / ".packer" / "shards"

    # 1. inside chunk 2: chunks 0, 1 committed; chunk 2's rejects written, its .arrow (the commit) not
    assert run_build(args, "encode-partial:2").returncode == -signal.SIGKILL
    _assert_unfinished(out)
    assert sorted(p.name for p in encode.glob("chunk-*.arrow")) == ["chunk-000000.arrow", "chunk-000001.arrow"]
    assert (encode / "chunk-000002.rejects.jsonl").exists()
    done = _stamps(encode.glob("chunk-*.arrow"))

    # 2. in the middle of writing shard 2: a half-written temp file, no shard-00002.parquet; chunks 0, 1 reused
    assert run_build(args, "shard-partial:2").returncode == -signal.SIGKILL
    _assert_unfinished(out)
    assert list(out.glob("shard-00002.parquet.tmp-*")) and not (out / "shard-00002.parquet").exists()
    assert {k: v for k, v in _stamps(encode.glob("chunk-*.arrow")).items() if k in done} == done
    assert len(list(encode.glob("chunk-*.arrow"))) == NUM_LINES // CHUNK_LINES + 1
    written = _stamps(out.glob("shard-*.parquet"))
    assert sorted(written) == ["shard-00000.parquet", "shard-00001.parquet"]

    # 3. shard 4 renamed into place, its marker not written; the temp file is gone, shards 0, 1 reused
    assert run_build(args, "shard:4").returncode == -signal.SIGKILL
    _assert_unfinished(out)
    assert not list(out.glob("*.tmp-*"))
    assert (out / "shard-00004.parquet").exists() and not (shards_dir / "00004.json").exists()
    assert {k: v for k, v in _stamps(out.glob("shard-*.parquet")).items() if k in written} == written

    # 4. everything but the manifest: shards, rejects.jsonl, stats.json
    assert run_build(args, "manifest:0").returncode == -signal.SIGKILL
    _assert_unfinished(out)
    assert (out / "rejects.jsonl").exists() and (out / "stats.json").exists()
    assert sorted(p.name for p in out.glob("shard-*.parquet")) == sorted(reference)

    # the same command, uninterrupted, finishes it
    final = run_build(args)
    assert final.returncode == 0, final.stderr
    _assert_identical(out, reference, corpus)
    PackedDataset(out)  # readable now


def _as_from_a_shell() -> None:
    """The child's Ctrl-C as a shell starts a command: SIGINT handled by default and not blocked. The test
    process's own state is inherited otherwise (an ignored or blocked SIGINT left by a library in this pytest
    worker would make the build deaf to it: it then finished with 0 under the full suite)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _sigint_state(pid: int) -> str:
    """The process's blocked / ignored / caught signal masks (/proc/PID/status), for a failure message."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return " ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _stopped_build(args: list[str]) -> subprocess.Popen:
    """Start ``packer build ARGS`` in its own process group, frozen (SIGSTOP) right after its first encode
    chunk."""
    proc = subprocess.Popen(build_command(args, "encode:1:STOP"), env=ENV, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_shell)  # noqa: PLW1509 (a test's child, no threads to race)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return proc
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"the build did not stop at encode:1 (rc {proc.poll()}): {proc.stderr.read()[-2000:]}")


def _group_gone(pgid: int) -> bool:
    for _ in range(200):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _killed_in_the_pool(corpus: Path, out: Path, tokenizer: str, hook: str) -> None:
    """Run ``packer build --num-proc 2`` into ``out`` with the fault hook ``hook``, which SIGKILLs the worker
    that reaches it; kill the worker it orphans with it, and check the whole process group is gone."""
    proc = subprocess.Popen(build_command(_args(corpus, out, tokenizer, "--num-proc", "2"), hook),
                            env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, stderr
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the other worker, orphaned mid-work
    assert _group_gone(proc.pid)


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_exits_130_and_resumes(corpus, tiny_tokenizer, reference, tmp_path):
    """Ctrl-C in a terminal signals the parent and every spawn worker: exit 130, one line, no traceback."""
    out = tmp_path / "out"
    proc = _stopped_build(_args(corpus, out, tiny_tokenizer, "--num-proc", "2"))
    state = _sigint_state(proc.pid)  # bit 2 of each mask is SIGINT
    os.killpg(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"{state}\n{stderr}"
    assert "interrupted: rerun the same command to resume" in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert _group_gone(proc.pid), "pool workers outlived the interrupted build"
    _assert_unfinished(out)
    build(_config(corpus, out, tiny_tokenizer), progress=False)  # the same build, resumed
    _assert_identical(out, reference, corpus)


@pytest.mark.slow
def test_kill_9_of_the_process_group_during_parallel_encode(corpus, tiny_tokenizer, reference, tmp_path):
    """kill -9 of the whole group while workers encode: nothing survives, the rerun finishes it."""
    out = tmp_path / "out"
    proc = _stopped_build(_args(corpus, out, tiny_tokenizer, "--num-proc", "2"))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _group_gone(proc.pid)
    _assert_unfinished(out)
    build(_config(corpus, out, tiny_tokenizer), progress=False)
    _assert_identical(out, reference, corpus)


@pytest.mark.slow
def test_killed_inside_a_pool_worker_then_rerun_is_byte_identical(corpus, tiny_tokenizer, reference, tmp_path):
    """The fault hook reaches the spawn workers: the worker encoding chunk 2 (under --num-proc 2 never the
    parent) kills the build between the chunk's rejects and its commit; the rerun finishes it."""
    out = tmp_path / "out"
    encode = out / ".packer" / "encode"
    _killed_in_the_pool(corpus, out, tiny_tokenizer, "encode-partial:2")
    assert (encode / "chunk-000002.rejects.jsonl").exists() and not (encode / "chunk-000002.arrow").exists()
    _assert_unfinished(out)
    build(_config(corpus, out, tiny_tokenizer), progress=False)
    _assert_identical(out, reference, corpus)


@pytest.mark.slow
def test_strict_bad_record_in_a_pool_worker_reaches_the_cli_intact(corpus, tiny_tokenizer, tmp_path):
    """--strict --num-proc 2: the worker's RecordError reaches the parent: exit 2 and the record's message."""
    lines = corpus.read_text().splitlines()
    lines = [ln if '"content": 5' not in ln else json.dumps({"text": "w1 w2"}) for ln in lines]  # no other bad one
    lines[BAD_LINE - 1] = '{"messages": [{"role": 7, "content": "w1"}, {"role": "assistant", "content": "w2"}]}'
    data = tmp_path / "strict.jsonl"
    data.write_text("\n".join(lines) + "\n")
    proc = run_build(_args(data, tmp_path / "out", tiny_tokenizer, "--strict", "--num-proc", "2"))
    assert proc.returncode == 2, proc.stderr
    with pytest.raises(RecordError) as err:
        parse_line(lines[BAD_LINE - 1].encode(), path=str(data), line=BAD_LINE, base_dir=str(tmp_path))
    assert f"error: {err.value} (rerun without --strict" in proc.stderr
    assert f"{data}:{BAD_LINE}: wrong_type: messages[0] role must be a string" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_build_killed_before_its_fingerprint_is_no_other_build(tmp_path):
    """Killed between creating OUT/.packer and renaming its fingerprint into place: the rerun proceeds."""
    from packer.pipeline.output import prepare_output

    out = tmp_path / "out"
    (out / ".packer").mkdir(parents=True)
    (out / ".packer" / "fingerprint.tmp-4242").write_text("half")
    work = prepare_output(out, "f" * 64, overwrite=False)
    assert sorted(p.name for p in work.iterdir()) == ["fingerprint"]
    assert (work / "fingerprint").read_text() == "f" * 64 + "\n"


@pytest.mark.slow
def test_killed_while_a_pool_worker_writes_shards_then_rerun_is_byte_identical(corpus, tiny_tokenizer, reference,
                                                                                tmp_path):
    """--num-proc 2 writes shards in the pool: the worker that renamed shard 3 into place kills the build
    before its marker; the rerun keeps what is complete and finishes byte-identical."""
    out = tmp_path / "out"
    _killed_in_the_pool(corpus, out, tiny_tokenizer, "shard:3")
    assert (out / "shard-00003.parquet").exists() and not (out / ".packer" / "shards" / "00003.json").exists()
    _assert_unfinished(out)
    build(_config(corpus, out, tiny_tokenizer).replace(num_proc=2), progress=False)
    _assert_identical(out, reference, corpus)
