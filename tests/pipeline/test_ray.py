"""``--executor ray`` (packer/pipeline/ray_executor.py) on a local Ray cluster of 2 CPUs started here, no
external service: the same bytes as the local executor; a Ray worker killed (by its pid, from this test)
in the middle of an encode chunk and of a shard write is run again by Ray and the build ends byte-identical;
a killed driver resumes by rerunning the command.

The corpus is three JSONL files (three encode chunks, so tasks run side by side) of text, chats, LLaVA
conversations, message trees, real COCO images and one reject of each common reason, named by relative
paths from its directory: Ray workers start in the cluster's working directory, not the driver's, so this
also checks that relative paths resolve as on the driver.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle

from packer.config import BuildConfig
from packer.errors import ConfigError, RecordError
from packer.pipeline.build import build, make_executor
from packer.pipeline.faults import Hooks
from packer.report.verify import verify_build
from tests.pipeline.test_build import _mixed_records, _write_jsonl

REPO = Path(__file__).resolve().parents[2]
FILES = ("a.jsonl", "b.jsonl", "c.jsonl")
OPTS = dict(profile="qwen2-vl", max_length=1024, max_pixels=128 * 28 * 28, rows_per_shard=2, rows_per_row_group=2)
RUN_TIME = ("output", "executor", "ray_address", "num_proc")  # config keys that may differ between two runs

# This module's hooks go to Ray workers, which cannot import a test module by name: pickle them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    """A 2-CPU Ray started for the module (``address="local"``: not another test's cluster on this machine); its
    address, for a second driver to join."""
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # a new one, never a cluster another test left
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, coco_images) -> Path:
    """The corpus directory (three JSONL files + images/)."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "images").mkdir()
    records = _mixed_records(root / "images", coco_images[:4])
    for k, name in enumerate(FILES):
        _write_jsonl(root / name, records[k:] + records[:k])
    return root


def _config(corpus: Path, out: Path, **kw: Any) -> BuildConfig:
    return BuildConfig.from_inputs(list(FILES), str(out), **{**OPTS, **kw})


def _digests(out: Path) -> dict[str, str]:
    """sha256 of every output file but the manifest, and the manifest less its run-time fields."""
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())
            if p.is_file() and p.name != "manifest.json"}
    manifest = json.loads((out / "manifest.json").read_text())
    for k in RUN_TIME:
        manifest["config"].pop(k)
    sums["manifest.json"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return sums


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    """Digests of the local executor's build."""
    out = tmp_path_factory.mktemp("local") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(corpus)
        build(_config(corpus, out), progress=False)
    digests = _digests(out)
    assert sum(k.startswith("shard-") for k in digests) >= 3  # shard 2 exists for the kill below
    return digests


@pytest.mark.slow
def test_ray_build_is_byte_identical_to_local(cluster, corpus, reference, tmp_path, monkeypatch):
    monkeypatch.chdir(corpus)
    result = build(_config(corpus, tmp_path / "out", executor="ray"), progress=False)
    assert _digests(tmp_path / "out") == reference
    assert result.manifest["config"]["executor"] == "ray"
    assert result.stats["rejected"] == 3 * 5  # each file's five bad lines, as the local build
    assert verify_build(tmp_path / "out", inputs=list(FILES)).ok


@pytest.mark.slow
def test_ray_builds_a_streamed_input_as_the_local_executor(cluster, corpus, tmp_path, monkeypatch):
    """A gzipped JSON array: the scan spills it on a Ray worker (into the work dir of a relative --output),
    Ray workers encode the spilled chunks, and the bytes are the local executor's."""
    import gzip

    monkeypatch.chdir(corpus)
    recs = []
    for line in (corpus / "a.jsonl").read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            continue
    (corpus / "array.json.gz").write_bytes(gzip.compress(json.dumps(recs, indent=1).encode()))
    outs = {}
    for executor in ("local", "ray"):
        out = os.path.relpath(tmp_path / executor / "out", corpus)  # one name: the card's title
        build(BuildConfig.from_inputs(["array.json.gz"], out, executor=executor, **OPTS), progress=False)
        outs[executor] = _digests(tmp_path / executor / "out")
    assert outs["ray"] == outs["local"]
    assert verify_build(tmp_path / "ray" / "out", inputs=["array.json.gz"]).ok


class KillWhenReported(Hooks):
    """At each named (point, n), the first time only: write this process's pid to a file, then wait for the
    test to kill it. At ``shard-write`` it first writes half of the shard's temp file, as a killed write
    leaves it. A retry of the task finds the file and goes on."""

    def __init__(self, pid_files: dict[tuple[str, int], Path]):
        self.pid_files = pid_files

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        pid_file = self.pid_files.get((point, n))
        if pid_file is None or pid_file.exists():
            return
        if point == "shard-write":
            import pyarrow as pa
            import pyarrow.parquet as pq

            sink = pa.BufferOutputStream()
            pq.write_table(state["table"], sink)
            data = sink.getvalue().to_pybytes()
            state["path"].with_name(f"{state['path'].name}.tmp-{os.getpid()}").write_bytes(data[: len(data) // 2])
        tmp = pid_file.with_name(f"{pid_file.name}.tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, pid_file)
        time.sleep(300)  # killed long before this ends


def _kill_when_reported(pid_files: list[Path], stop: threading.Event, killed: list[int]) -> None:
    """Kill -9 each process that reports its pid in one of ``pid_files``."""
    pending = list(pid_files)
    while pending and not stop.is_set():
        for f in [f for f in pending if f.exists()]:
            pid = int(f.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            pending.remove(f)
        time.sleep(0.02)


@pytest.mark.slow
def test_a_ray_worker_killed_mid_encode_and_mid_write_is_retried(cluster, corpus, reference, tmp_path, monkeypatch):
    monkeypatch.chdir(corpus)
    pid_files = {("encode-partial", 1): tmp_path / "encode.pid", ("shard-write", 2): tmp_path / "write.pid"}
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_reported, args=(list(pid_files.values()), stop, killed))
    killer.start()
    try:
        build(_config(corpus, tmp_path / "out", executor="ray"), progress=False, hooks=KillWhenReported(pid_files))
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 2 and os.getpid() not in killed  # two Ray workers died, by their pids
    assert _digests(tmp_path / "out") == reference
    assert not list((tmp_path / "out").rglob("*.tmp-*"))  # the killed write's half file is cleaned up


@pytest.mark.slow
def test_a_killed_driver_resumes_by_rerunning_the_command(cluster, corpus, reference, tmp_path, monkeypatch):
    """``packer build --executor ray --ray-address`` (a second driver on the module's cluster) killed -9 while
    its Ray tasks write shards (shard 1 renamed, its marker not written); the same build run again finishes
    it, reusing every encoded chunk. (The rerun is ``build()`` in this process, what the command calls: a
    second subprocess would load the tokenizer again.)"""
    monkeypatch.chdir(corpus)
    out = tmp_path / "out"
    args = [*FILES, "-o", str(out), "-q", "--executor", "ray", "--ray-address", cluster, "--profile", "qwen2-vl",
            "--max-length", "1024", "--max-pixels", str(OPTS["max_pixels"]), "--rows-per-shard", "2",
            "--rows-per-row-group", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    crashed = subprocess.run([sys.executable, "-m", "tests.pipeline.crashing_build", "shard:1", *args], env=env,
                             capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (out / "manifest.json").exists() and (out / "shard-00001.parquet").exists()
    encoded = {p.name: p.stat().st_mtime_ns for p in (out / ".packer" / "encode").glob("chunk-*.arrow")}
    assert len(encoded) == len(FILES)

    build(_config(corpus, out, executor="ray", ray_address=cluster), progress=False)
    assert _digests(out) == reference
    assert {p.name: p.stat().st_mtime_ns for p in (out / ".packer" / "encode").glob("chunk-*.arrow")} == encoded


class TouchOnExchange(Hooks):
    """Leaves ``dir/N`` for each map output a Ray worker commits (``exchange:N``)."""

    def __init__(self, dir: Path):
        self.dir = dir

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        if point == "exchange":
            (self.dir / str(n)).touch()


@pytest.mark.slow
def test_ray_runs_the_exchange_to_the_local_builds_bytes(cluster, corpus, reference, tmp_path, monkeypatch):
    """Chunks of 4 lines and the exchange on for 2+ shards: Ray tasks run the map tasks (images in the rows:
    the media columns go through the map outputs), and the bytes are the local build's (512-line chunks, no
    exchange)."""
    from packer.pipeline import stages

    monkeypatch.chdir(corpus)
    monkeypatch.setattr(stages, "CHUNK_LINES", 4)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_SHARDS", 2)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_FAN", 1)
    (tmp_path / "maps").mkdir()
    build(_config(corpus, tmp_path / "out", executor="ray"), progress=False, hooks=TouchOnExchange(tmp_path / "maps"))
    assert len(list((tmp_path / "maps").iterdir())) >= 2
    assert _digests(tmp_path / "out") == reference


@pytest.mark.slow
def test_strict_raises_the_record_error_itself(cluster, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(corpus)
    with pytest.raises(RecordError) as e:
        build(_config(corpus, tmp_path / "out", executor="ray", strict=True), progress=False)
    assert e.value.path == FILES[0] and e.value.reason == "malformed_json"


@pytest.mark.slow
def test_without_ray_the_error_names_the_extra(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    with pytest.raises(ConfigError, match=r"pip install 'packer\[ray\]'"):
        make_executor(_config(corpus, tmp_path / "out", executor="ray"))


@pytest.mark.slow
def test_a_driver_without_the_clusters_token_is_refused_naming_it(cluster, corpus, tmp_path):
    """A second driver holding another token (a cluster with token auth, Ray's default) fails with exit 1 and
    says where the token goes; nothing is written. (``RAY_NUM_REDIS_GET_RETRIES=1``: Ray tries to reach the
    GCS 20 times about a second apart (the same refusal each time) before it raises; one attempt is enough.)"""
    out = tmp_path / "out"
    env = {**os.environ, "RAY_AUTH_TOKEN": "0" * 64, "PYTHONPATH": str(REPO), "RAY_NUM_REDIS_GET_RETRIES": "1"}
    run = subprocess.run([sys.executable, "-m", "packer.cli", "build", *FILES, "-o", str(out), "-q", "--executor",
                          "ray", "--ray-address", cluster, "--profile", "qwen2-vl"], cwd=corpus, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert f"cannot join the Ray cluster at '{cluster}'" in run.stderr and "RAY_AUTH_TOKEN" in run.stderr
    assert not (out / "manifest.json").exists()
