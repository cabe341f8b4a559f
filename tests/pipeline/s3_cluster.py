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

    tmps = [Path(tempfile.mkdtemp(prefix=f"packer-node{k}-")) for k in range(workers + 1)]
    base = {**(env or {}), "TOKENIZERS_PARALLELISM": "false"}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "env_vars": {**base, "TMPDIR": str(tmps[0])}})
    for k in range(workers):
        cluster.add_node(num_cpus=1, env_vars={**base, "TMPDIR": str(tmps[k + 1])})
    cluster.wait_for_nodes()
    return cluster, tmps


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
