"""What the multi-node tests start and share: a moto S3 server, a Ray cluster of a head and worker nodes on this
machine (``ray.cluster_utils.Cluster``, how Ray tests multi-node behaviour), each node with its own temp
directory, and hooks that fail a task which opens a file under the driver's directories.

    with s3_server() as (env, proxy):             # AWS_ENDPOINT_URL ... set in os.environ, bucket "packer"
        cluster, node_tmps = start_cluster(workers=2)
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packer.pipeline.faults import Hooks
from tests.pipeline.s3_faults import FaultProxy

BUCKET = "packer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server(max_attempts: int = 4) -> Iterator[tuple[dict[str, str], FaultProxy]]:
    """A moto S3 server on 127.0.0.1 with the bucket ``packer``, behind a ``FaultProxy``; the AWS environment of
    this process (and so of the Ray nodes and pool workers started after it) points at the proxy, with
    botocore's standard retries of ``max_attempts`` attempts per request (exponential backoff with jitter)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    proxy = FaultProxy(f"http://127.0.0.1:{port}").start()
    env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": str(max_attempts)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield env, proxy
    finally:
        proxy.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def upload(local: Path, url: str) -> None:
    """Every file under ``local`` to the prefix ``url`` (same relative names)."""
    from packer.shards.store import store_path

    root = store_path(url)
    for p in sorted(local.rglob("*")):
        if p.is_file():
            (root / p.relative_to(local).as_posix()).write_bytes(p.read_bytes())


def start_cluster(workers: int = 2, *, env: dict[str, str] | None = None) -> tuple[Any, list[Path]]:
    """A Ray head with no CPU (the driver's node runs no task) and ``workers`` nodes of 1 CPU, each with its own
    ``TMPDIR`` (the shard writers' local mirror of the encode cache lives there) outside pytest's temp root;
    the cluster and those directories. The driver connects with ``ray.init(address=cluster.address)``."""
    from ray.cluster_utils import Cluster

    head = Path(tempfile.mkdtemp(prefix="packer-head-"))
    base = {**(env or {}), "TOKENIZERS_PARALLELISM": "false"}
    # shutdown_at_exit=False: the test stops it (a removed node's own exit hook fails in Ray 2.60)
    cluster = Cluster(initialize_head=True, shutdown_at_exit=False, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "env_vars": {**base, "TMPDIR": str(head)}})
    tmps = [head] + [add_worker(cluster, base) for _ in range(workers)]
    cluster.wait_for_nodes()
    return cluster, tmps


def add_worker(cluster: Any, env: dict[str, str]) -> Path:
    """A 1-CPU worker node with its own ``TMPDIR``; that directory."""
    tmp = Path(tempfile.mkdtemp(prefix="packer-node-"))
    cluster.add_node(num_cpus=1, env_vars={**env, "TOKENIZERS_PARALLELISM": "false", "TMPDIR": str(tmp)})
    return tmp


class StallOnNode(Hooks):
    """At each named (point, n), the first time only: report this task's Ray node in ``signals/POINT-N`` and
    stall until the test removes that node. At ``shard-write`` it first uploads half of the shard as its temp
    object, as a node lost mid-upload leaves it. The retry (on another node) finds the signal and goes on.
    ``signals`` is the test's control channel, outside the directories the tasks may not read."""

    def __init__(self, signals: str, points: list[tuple[str, int]]):
        self.signals, self.points = signals, points

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        if (point, n) not in self.points:
            return
        flag = Path(self.signals) / f"{point}-{n}"
        if flag.exists():
            return
        if point == "shard-write":
            import pyarrow as pa
            import pyarrow.parquet as pq

            sink = pa.BufferOutputStream()
            pq.write_table(state["table"], sink)
            data = sink.getvalue().to_pybytes()
            state["path"].with_name(f"{state['path'].name}.tmp-{os.getpid()}-halfdone").write_bytes(data[: len(data) // 2])
        import ray

        tmp = flag.with_name(flag.name + ".tmp")
        tmp.write_text(ray.get_runtime_context().get_node_id())
        os.replace(tmp, flag)
        import time

        time.sleep(120)  # the node is removed long before this ends


def remove_reporting_nodes(cluster: Any, signals: Path, expected: int, stop: Any, removed: list[str]) -> None:
    """Remove each node that reports in ``signals`` (``StallOnNode``)."""
    import time

    seen: set[str] = set()
    while len(seen) < expected and not stop.is_set():
        for flag in sorted(signals.glob("*")):
            if flag.name.endswith(".tmp") or flag.name in seen:
                continue
            seen.add(flag.name)
            node_id = flag.read_text()
            try:
                node = next(w for w in cluster.worker_nodes if w.node_id == node_id)
                cluster.remove_node(node, allow_graceful=False)
                removed.append(node_id)
            except Exception as e:  # noqa: BLE001 - reported to the test, which asserts on ``removed``
                removed.append(f"failed on {flag.name}: {type(e).__name__}: {e} "
                               f"(nodes: {[w.node_id for w in cluster.worker_nodes]})")
        time.sleep(0.05)


class NoLocalReads(Hooks):
    """Hooks that, once unpickled in a task's process (a Ray worker: the driver keeps its own instance), make
    every ``open`` of a path under ``roots`` raise PermissionError naming it (a Python audit hook), so a build
    whose task read a file of the driver's disk fails instead of passing. ``inner``: hooks to run as well."""

    def __init__(self, roots: list[str], inner: Hooks | None = None):
        self.roots = [os.path.realpath(r) for r in roots]
        self.inner = inner or Hooks()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _forbid(tuple(self.roots))

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        self.inner.at(point, n, **state)


def _forbid(roots: tuple[str, ...]) -> None:
    # kept on ``sys``: this module reaches Ray workers pickled by value, so its own globals are not one per process
    installed = sys.__dict__.setdefault("_packer_forbidden_roots", set())
    if roots in installed:
        return
    installed.add(roots)

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if any(path == r or path.startswith(r + os.sep) for r in roots):
                raise PermissionError(f"a task opened {path}, a file of the driver's disk")

    sys.addaudithook(audit)
