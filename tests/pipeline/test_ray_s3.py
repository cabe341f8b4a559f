"""A multi-node Ray build with nothing shared but S3: a cluster of a head (no CPU: the driver's node runs no
task) and two 1-CPU worker nodes (``ray.cluster_utils.Cluster``), each node with its own ``TMPDIR``; inputs
(three JSONL files naming COCO images and an mp4 clip by relative paths, one reject of each common reason)
and output on a moto S3 server started here.

No path of the driver's disk is reachable by a task: the inputs are given only as ``s3://`` URLs, the driver
runs from an empty directory, and every task process carries an audit hook (``s3_cluster.NoLocalReads``) that
makes opening any file under pytest's temp root (the local corpus, the reference builds, the driver's cwd) an
error that fails the build. Relative media paths resolve against the input's URL.

The build is byte-identical to the local executor's build of the same URLs (shards, stats, rejects,
manifest less its run-time fields), and its shards to a local build of the local copy of the corpus once the
input location is mapped (example ids and media sources name where the inputs are).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")
import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402

from packer.config import BuildConfig  # noqa: E402
from packer.pipeline.build import build  # noqa: E402
from packer.pipeline.faults import Hooks  # noqa: E402
from packer.report.verify import verify_build  # noqa: E402
from packer.shards.store import mirror_dir, store_path  # noqa: E402
from tests.media.make_videos import write_clip  # noqa: E402
from tests.pipeline import s3_cluster, s3_faults  # noqa: E402
from tests.pipeline.s3_cluster import (  # noqa: E402
    NoLocalReads,
    StallOnNode,
    add_worker,
    remove_reporting_nodes,
    s3_server,
    start_cluster,
    upload,
)
from tests.pipeline.test_build import _mixed_records, _write_jsonl  # noqa: E402

FILES = ("a.jsonl", "b.jsonl", "c.jsonl")
IN = "s3://packer/in"
OPTS = dict(profile="qwen2-vl", max_length=1024, max_pixels=128 * 28 * 28, rows_per_shard=2, rows_per_row_group=2)
RUN_TIME = ("output", "executor", "ray_address", "num_proc")  # config keys that may differ between two runs
ray.cloudpickle.register_pickle_by_value(s3_cluster)  # its hooks go to Ray workers, which cannot import tests/
ray.cloudpickle.register_pickle_by_value(s3_faults)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def s3():
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    with s3_server() as served:
        yield served


@pytest.fixture
def proxy(s3):
    """The fault proxy in front of the S3 server, its rules cleared after the test."""
    s3[1].clear()
    yield s3[1]
    s3[1].clear()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, coco_images, s3) -> Path:
    """The local corpus (three JSONL files, images/, videos/clip.mp4), uploaded to ``IN``."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "images").mkdir()
    (root / "videos").mkdir()
    write_clip(root / "videos" / "clip.mp4", fps=24, frames=24, width=64, height=48)
    records = _mixed_records(root / "images", coco_images[:4])
    records.append({"messages": [{"role": "user", "content": [{"type": "video", "video": "videos/clip.mp4"},
                                                              {"type": "text", "text": "What moves?"}]},
                                 {"role": "assistant", "content": "Nothing."}]})
    for k, name in enumerate(FILES):
        _write_jsonl(root / name, records[k:] + records[:k])
    upload(root, IN)
    return root


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    """Head + 2 worker nodes; this process is the driver."""
    cluster, tmps = start_cluster(workers=2, env=s3[0])
    cluster.node_tmps = tmps  # a node a test adds puts its TMPDIR here: removed with the others below
    ray.init(address=cluster.address, include_dashboard=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    import shutil

    for t in tmps:
        shutil.rmtree(t, ignore_errors=True)


def _urls() -> list[str]:
    return [f"{IN}/{name}" for name in FILES]


def digests(root: Any) -> dict[str, str]:
    """sha256 of every output file but the card and manifest, and the manifest less its run-time fields."""
    root = store_path(str(root))
    names = [p.name for p in root.iterdir() if p.name.startswith("shard-")] + ["stats.json", "rejects.jsonl"]
    sums = {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in sorted(names)}
    manifest = json.loads((root / "manifest.json").read_text())
    for k in RUN_TIME:
        manifest["config"].pop(k)
    manifest.pop("base_dir")  # the driver's cwd, which no input names (they are URLs)
    sums["manifest.json"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return sums


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    """Digests of the local executor's build of the same ``s3://`` inputs."""
    out = tmp_path_factory.mktemp("ref") / "out"
    build(BuildConfig.from_inputs(_urls(), str(out), **OPTS), progress=False)
    d = digests(out)
    assert sum(k.startswith("shard-") for k in d) >= 3
    return d


def ray_config(out: str, cluster, **kw: Any) -> BuildConfig:
    return BuildConfig.from_inputs(_urls(), out, **{**OPTS, "executor": "ray", "ray_address": cluster.address, **kw})


@pytest.fixture
def driver_cwd(tmp_path, monkeypatch) -> Path:
    """The driver runs from an empty directory."""
    cwd = tmp_path / "driver"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def no_local_reads(tmp_path_factory, inner=None) -> NoLocalReads:
    return NoLocalReads([str(tmp_path_factory.getbasetemp())], inner)


@contextmanager
def nodes_removed_when_they_report(cluster, s3, *, add: int, expected: int) -> Iterator[tuple[Path, list[str]]]:
    """``add`` more worker nodes joined, then, until the block ends, each node that reports in the signals
    directory yielded (``StallOnNode``) removed, ``expected`` of them; the removed nodes' ids in the list."""
    import tempfile
    import threading

    for _ in range(add):
        cluster.node_tmps.append(add_worker(cluster, s3[0]))
    cluster.wait_for_nodes()
    signals = Path(tempfile.mkdtemp(prefix="packer-signals-"))  # outside the roots the tasks may not read
    cluster.node_tmps.append(signals)
    removed: list[str] = []
    stop = threading.Event()
    remover = threading.Thread(target=remove_reporting_nodes, args=(cluster, signals, expected, stop, removed))
    remover.start()
    try:
        yield signals, removed
    finally:
        stop.set()
        remover.join()


@ray.remote(num_cpus=1)
def _read_local(hooks: NoLocalReads, path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.slow
def test_a_multi_node_build_on_s3_is_byte_identical(cluster, corpus, reference, tmp_path_factory, driver_cwd):
    out = "s3://packer/out/multi-node"
    guard = no_local_reads(tmp_path_factory)
    with pytest.raises(PermissionError, match="driver's disk"):  # the guard bites: a task reading the local copy
        ray.get(_read_local.remote(guard, str(corpus / FILES[0])))
    result = build(ray_config(out, cluster), progress=False, hooks=guard)
    assert digests(out) == reference
    assert result.stats["rejected"] == 3 * 5
    assert not list(driver_cwd.iterdir())
    # every node's copies of the encode cache's objects (the writers memory-map them) are gone with the build
    for prefix in (store_path(f"{out}/.packer/encode"), store_path(f"{out}/.packer/exchange")):
        assert not [m for t in cluster.node_tmps if (m := mirror_dir(prefix, t)).exists()]
    # tasks ran on both worker nodes, none on the head (it has no CPU)
    assert len([n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]) == 2
    report = verify_build(out)
    assert report.ok, report.lines()

    # the same shards as a build of the local copy, up to where the inputs are: relative media paths resolved
    # against the input's URL (s3://packer/in/images/...), not a working directory
    local = tmp_path_factory.mktemp("disk") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(corpus)
        build(BuildConfig.from_inputs(list(FILES), str(local), **OPTS), progress=False)
    shards = sorted(p.name for p in local.glob("shard-*.parquet"))
    assert shards == sorted(p.name for p in store_path(out).glob("shard-*.parquet"))
    videos, sources = 0, set()
    for name in shards:
        remote = pq.read_table(store_path(f"{out}/{name}").open("rb")).to_pylist()
        mine = pq.read_table(local / name).to_pylist()
        text = json.dumps(remote, default=repr).replace(IN + "/", "")
        assert text == json.dumps(mine, default=repr).replace(str(corpus) + "/", "")
        videos += sum(len(r["videos"]) for r in remote)
        sources |= {m["source"] for r in remote for m in r["images"] + r["videos"]}
    assert videos > 0  # the clip was probed on a worker node through S3
    assert sources and all(s.startswith((f"{IN}/images/", f"{IN}/videos/")) for s in sources), sources


class MirroredMapOutputs(Hooks):
    """At each shard written (``shard:N``, in the writer's process), leaves ``signals/N.json``: the writer's
    node and the map outputs in that node's copies of ``exchange`` (``store.local_file``). Shard 0's task then
    sleeps 3 s: its node stays busy while the other node is free (a scheduler that does not keep a group on
    its node would give that node group 0's next shards)."""

    def __init__(self, signals: str, exchange: str):
        self.signals, self.exchange = signals, exchange

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        if point != "shard":
            return
        import os

        from packer.shards.store import mirror_dir, store_path

        copies = mirror_dir(store_path(self.exchange))
        maps = sorted(p.name.split("-", 1)[1] for p in copies.glob("*-map-*.arrow")) if copies.exists() else []
        flag = Path(self.signals) / f"{n}.json"
        flag.with_suffix(".tmp").write_text(json.dumps({"node": ray.get_runtime_context().get_node_id(),
                                                        "maps": maps}))
        os.replace(flag.with_suffix(".tmp"), flag)
        if n == 0:
            import time

            time.sleep(3)


class Both(Hooks):
    """Two hooks at every point, in order."""

    def __init__(self, first: Hooks, second: Hooks):
        self.first, self.second = first, second

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        self.first.at(point, n, **state)
        self.second.at(point, n, **state)


@pytest.mark.slow
def test_on_s3_each_node_downloads_only_its_writer_groups_map_outputs(cluster, corpus, reference, tmp_path_factory,
                                                                       driver_cwd, monkeypatch):
    """The exchange on (4-line chunks, map outputs for 2+ shards): one writer group of consecutive shards a
    worker node, each map task writing one output per group, each group's write tasks sent to its node. Each
    node's copies hold only its own group's map outputs (about half of them), and the build is byte-identical."""
    import shutil
    import tempfile

    from packer.pipeline import stages

    monkeypatch.setattr(stages, "CHUNK_LINES", 4)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_SHARDS", 2)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_FAN", 1)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
    out = "s3://packer/out/groups"
    signals = Path(tempfile.mkdtemp(prefix="packer-signals-"))  # outside the roots the tasks may not read
    try:
        hooks = no_local_reads(tmp_path_factory, MirroredMapOutputs(str(signals), f"{out}/.packer/exchange"))
        build(ray_config(out, cluster), progress=False, hooks=hooks)
        seen = [json.loads(p.read_text()) for p in sorted(signals.glob("*.json"))]
    finally:
        shutil.rmtree(signals)
    assert digests(out) == reference
    assert len(seen) == sum(k.startswith("shard-") for k in reference)
    copied: dict[str, set[str]] = {}
    for s in seen:
        copied.setdefault(s["node"], set()).update(s["maps"])
    assert sorted(copied) == sorted(nodes)  # every node wrote shards
    groups = {node: {name.rsplit("-g", 1)[1] for name in maps} for node, maps in copied.items()}
    assert sorted(len(g) for g in groups.values()) == [1] * len(nodes), groups  # one group's outputs a node
    assert len(set.union(*groups.values())) == len(nodes)  # each node its own group
    tasks = {name.split("-g")[0] for maps in copied.values() for name in maps}
    assert len(tasks) >= 4 and all(len(maps) < len(tasks) * len(nodes) for maps in copied.values())


@pytest.mark.slow
def test_with_writer_groups_a_node_removed_mid_write_has_its_shards_written_elsewhere(
        cluster, corpus, reference, s3, tmp_path_factory, driver_cwd, monkeypatch):
    """Writer groups on (a third worker node joins: three groups), and the node writing shard 1 is removed while
    it uploads it: its task runs again on a node left (the affinity is soft), so do the rest of its group's, and
    the build is byte-identical, with no temp."""
    import tempfile

    from packer.pipeline import stages

    monkeypatch.setattr(stages, "CHUNK_LINES", 4)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_SHARDS", 2)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_FAN", 1)
    out = "s3://packer/out/groups-node-lost"
    seen = Path(tempfile.mkdtemp(prefix="packer-signals-"))
    cluster.node_tmps.append(seen)
    with nodes_removed_when_they_report(cluster, s3, add=1, expected=1) as (signals, removed):
        hooks = no_local_reads(tmp_path_factory, Both(StallOnNode(str(signals), [("shard-write", 1)]),
                                                      MirroredMapOutputs(str(seen), f"{out}/.packer/exchange")))
        build(ray_config(out, cluster), progress=False, hooks=hooks)
    assert len(removed) == 1 and not removed[0].startswith("failed"), removed
    assert digests(out) == reference
    written = {int(p.stem): json.loads(p.read_text()) for p in seen.glob("*.json")}
    assert sorted(written) == list(range(sum(k.startswith("shard-") for k in reference)))
    assert written[1]["node"] != removed[0]  # shard 1 written again on a node left
    assert {name.rsplit("-g", 1)[1] for w in written.values() for name in w["maps"]} == {"0000.arrow", "0001.arrow",
                                                                                        "0002.arrow"}
    keys = [p.name for p in store_path(out).iterdir()]
    assert not [k for k in keys if ".tmp-" in k], keys


# every stage's requests: the scan's and the encode's reads of an input, a media header, the encode cache's
# commit (an upload reset halfway), the plan's and the writers' reads of the cache, a shard's upload, the manifest
TRANSIENT = [
    ("GET", r"/packer/in/a\.jsonl", "503", 2),
    ("HEAD", r"/packer/in/images/", "500", 2),
    ("HEAD", r"/packer/in/videos/clip\.mp4", "503", 1),  # its headers: cached by a worker from an earlier build
    ("PUT", r"/\.packer/encode/chunk-\d+\.arrow\.tmp-", "reset", 2),
    ("GET", r"/\.packer/encode/chunk-\d+\.arrow", "short", 2),
    ("PUT", r"/shard-\d+\.parquet\.tmp-", "500", 2),
    ("PUT", r"/\.packer/shards/\d+\.json\.tmp-", "503", 1),
    ("PUT", r"/manifest\.json\.tmp-", "503", 1),
]


@pytest.mark.slow
def test_s3_errors_on_every_stage_are_retried_to_the_same_bytes(cluster, corpus, reference, proxy, tmp_path_factory,
                                                                 driver_cwd):
    """5xx, throttling, a reset upload and short reads, on the driver and on both worker nodes: retried with
    backoff (botocore's standard mode, s3fs's read loop) and the build is byte-identical."""
    out = "s3://packer/out/transient"
    rules = [proxy.arm(*r) for r in TRANSIENT]
    build(ray_config(out, cluster), progress=False, hooks=no_local_reads(tmp_path_factory))
    assert [(r.pattern.pattern, r.fired) for r in rules] == [(r[1], r[3]) for r in TRANSIENT], proxy.log
    proxy.clear()
    assert digests(out) == reference


@pytest.mark.slow
def test_past_the_retry_budget_the_error_names_the_object_and_the_stage_and_a_rerun_resumes(
        cluster, corpus, reference, proxy, tmp_path_factory, driver_cwd):
    from packer.errors import StorageError

    out = "s3://packer/out/budget"
    # chunk 1's commit fails on every attempt (more than AWS_MAX_ATTEMPTS)
    proxy.arm("PUT", r"/out/budget/\.packer/encode/chunk-000001\.arrow\.tmp-", "500", times=100)
    with pytest.raises(StorageError) as e:
        build(ray_config(out, cluster), progress=False, hooks=no_local_reads(tmp_path_factory))
    message = str(e.value)
    assert "encode (chunk 1: s3://packer/in/b.jsonl from line 1)" in message, message
    assert "s3://packer/out/budget/.packer/encode/chunk-000001.arrow.tmp-" in message, message
    assert "rerun the command to resume" in message
    root = store_path(out)
    committed = {p.name: p.fs.info(p.key)["LastModified"] for p in (root / ".packer" / "encode").glob("chunk-*.arrow")}
    assert "chunk-000001.arrow" not in committed and not (root / "manifest.json").exists()

    proxy.clear()
    build(ray_config(out, cluster), progress=False, hooks=no_local_reads(tmp_path_factory))
    assert digests(out) == reference
    again = {p.name: p.fs.info(p.key)["LastModified"] for p in (root / ".packer" / "encode").glob("chunk-*.arrow")}
    assert {k: again[k] for k in committed} == committed  # the chunks committed before were not encoded again


@pytest.mark.slow
def test_a_worker_node_removed_mid_encode_and_mid_write_loses_and_doubles_nothing(
        cluster, corpus, reference, s3, tmp_path_factory, driver_cwd):
    """A node is removed (its raylet and workers killed) while its task encodes chunk 1 (rejects written, rows
    not), then another while its task uploads shard 2 (half of it is a temp object); Ray runs both tasks again
    on the nodes left (two more joined before the build, so two stay), and the build is byte-identical, with
    no temp."""
    out = "s3://packer/out/node-lost"
    with nodes_removed_when_they_report(cluster, s3, add=2, expected=2) as (signals, removed):
        stall = StallOnNode(str(signals), [("encode-partial", 1), ("shard-write", 2)])
        build(ray_config(out, cluster), progress=False, hooks=no_local_reads(tmp_path_factory, stall))
    assert len(removed) == 2 and all(not r.startswith("failed") for r in removed), removed
    assert digests(out) == reference
    keys = [p.name for p in store_path(out).iterdir()]
    assert not [k for k in keys if ".tmp-" in k], keys
    assert verify_build(out).ok


@pytest.mark.slow
def test_a_driver_killed_after_the_plan_or_mid_write_resumes_by_rerunning_the_command(
        cluster, corpus, reference, s3, tmp_path_factory, driver_cwd):
    """``packer build`` on the cluster (a second driver, a subprocess) killed -9 once its plan is written; the
    same command run again resumes from what is committed on S3 and is killed -9 in turn while its tasks on the
    worker nodes write shards (shard 1 published, its marker not); the same build run a third time finishes it.
    Every encoded chunk is reused by both reruns. (One output for both kills: the rerun of the first is the
    second's driver, so two launches and one finishing build check both points.)"""
    import signal

    from tests.pipeline.crash_setup import run_build

    out = "s3://packer/out/driver-killed"
    args = [*_urls(), "-o", out, "-q", "--executor", "ray", "--ray-address", cluster.address, "--profile",
            "qwen2-vl", "--max-length", "1024", "--max-pixels", str(OPTS["max_pixels"]), "--rows-per-shard", "2",
            "--rows-per-row-group", "2"]
    root = store_path(out)

    def chunks() -> dict[str, Any]:
        return {p.name: p.fs.info(p.key)["LastModified"] for p in (root / ".packer" / "encode").glob("chunk-*.arrow")}

    crashed = run_build(args, "plan:0", env=s3[0])
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (root / "manifest.json").exists()
    assert not list(root.glob("shard-*.parquet"))  # killed after the plan, before any shard
    encoded = chunks()
    assert len(encoded) == len(FILES)

    crashed = run_build(args, "shard:1", env=s3[0])  # the rerun resumes from the plan, then dies mid-write
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (root / "manifest.json").exists()
    assert chunks() == encoded

    build(ray_config(out, cluster), progress=False, hooks=no_local_reads(tmp_path_factory))
    assert digests(out) == reference
    assert chunks() == encoded
