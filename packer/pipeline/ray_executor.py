"""``RayExecutor``: runs a build's encode and write tasks on a Ray cluster (an ``Executor``, ``executor.py``).

    packer build 'data/*.jsonl' -o /shared/out --executor ray --ray-address ray://head:10001

Each encode chunk, each map task of the exchange and each shard range is one Ray task running the same stage
function as the local executor (``stages.encode_chunk``, ``stages.exchange_map``, ``stages.write_shard_range``), so the bytes are the same. Plain tasks,
not Ray Data: a build's tasks are already independent, idempotent and ordered by index, and what returns to
the driver is a few counts per chunk and a manifest entry per shard; Ray Data's blocks, operators and
streaming would add a data model (rows in the object store) that a build does not need and whose order it
would have to undo. Ray gives what the local pool cannot: many nodes, and a task whose worker dies (OOM,
preemption, ``kill -9``) is run again (``max_retries``); a rerun of the command resumes from the same
markers as a local build (the tasks skip committed chunks and shards).

The encoder travels once: ``ray.put`` on the driver, then each worker process loads it on its first task
and keeps it (~0.5 s per worker instead of per task). Every node needs packer installed (the driver's
version); inputs and output may be object-store URLs alone (``s3://``: nothing shared between the nodes but the
store; a record's relative media paths resolve against its input's URL), or local paths every node sees at
the same place (relative ones resolve against the driver's working directory where a node has it).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.pipeline.cache import ChunkCounts, EncodeCache
from packer.pipeline.executor import Executor
from packer.pipeline.faults import Hooks
from packer.pipeline.output import remove_stale_temp_files
from packer.pipeline.stages import Chunk, MapTask, ShardRange, encode_chunk, exchange_map, write_shard_range
from packer.shards.store import ObjectPath, drop_mirrors

if TYPE_CHECKING:
    import numpy as np

    from packer.encode.encoder import Encoder

MAX_RETRIES = 3  # runs of a task whose worker process died, after the first (Ray's default, made explicit)
TASKS_PER_CPU = 4  # tasks in flight per cluster CPU: enough to keep every CPU busy behind a slow one
_ENCODER: dict[str, Encoder] = {}  # a worker's encoder, by the object id it came from (one at a time)


def _ray():
    """The ``ray`` module; ConfigError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError("executor 'ray' needs Ray: pip install 'packer[ray]'") from None
    return ray


class RayExecutor(Executor):
    """Encode chunks and write shard ranges as Ray tasks on the cluster at ``address``.

    ``address`` None joins ``RAY_ADDRESS`` or starts Ray on this machine; a program that called
    ``ray.init`` itself keeps its cluster. Example: ``build(config, executor=RayExecutor("auto"))``.
    """

    def __init__(self, address: str | None = None):
        ray = _ray()
        if not ray.is_initialized():
            # a local Ray started for the build needs no dashboard (seconds of start-up, a web server)
            local = {} if address else {"include_dashboard": False}
            try:
                ray.init(address=address, logging_level=logging.WARNING, **local)
            except ConnectionError as e:
                raise ConfigError(f"cannot join the Ray cluster at {address!r}: {e} (is it up? A cluster with token "
                                  "authentication, which Ray 2.60 turns on by default, needs its token here: "
                                  "RAY_AUTH_TOKEN or ~/.ray/auth_token)") from None
        self.window = max(1, int(ray.cluster_resources().get("CPU", 1))) * TASKS_PER_CPU
        self.cwd = os.getcwd()

    def encode(
        self, chunks: Sequence[Chunk], *, encoder: Encoder, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[ChunkCounts, None, None]:
        """One task per chunk; yield each chunk's counts in chunk order."""
        ray = _ray()
        task = ray.remote(max_retries=MAX_RETRIES)(_encode_task)
        boxed = [ray.put(encoder)]  # in a list: Ray passes the reference, the worker fetches it once
        yield from self._ordered(lambda c: task.remote(c, boxed, cache, config, hooks, self.cwd), chunks)
        remove_stale_temp_files(_output(cache), keep_own=True)  # of retried tasks: none is a live write (the
        # driver's own, ColumnsFile's, is)

    def exchange(
        self, tasks: Sequence[MapTask], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[tuple[int, ...], None, None]:
        """One task per map task of the exchange; yield how many rows each wrote per writer group, in order."""
        ray = _ray()
        task = ray.remote(max_retries=MAX_RETRIES)(_exchange_task)
        cache_ref = ray.put(cache)
        yield from self._ordered(lambda t: task.remote(t, cache_ref, hooks, self.cwd), tasks)
        remove_stale_temp_files(_output(cache), keep_own=True)

    def write_groups(self, cache: EncodeCache, shards: int) -> int:
        """One group a node with CPUs where the cache is on an object store (each node then downloads only its
        group's map outputs, about 1/N of them); 1 where every node reads the same disk."""
        if not isinstance(cache.root, ObjectPath):
            return 1
        return max(1, len(_cpu_nodes()))

    def write(
        self, ranges: Sequence[ShardRange], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[list[dict[str, Any]], None, None]:
        """One task per shard range; yield each range's manifest entries in shard order. With writer groups
        (``write_groups``) a group's tasks go to its node (soft: a node that left has them run elsewhere), the
        groups' tasks sent in turn so that every node has work."""
        ray = _ray()
        task = ray.remote(max_retries=MAX_RETRIES)(_write_task)
        # once, not per task: the indexed cache holds 8 bytes per chunk (0.5 MB at 61k chunks); a task reads
        # it from its node's object store without a copy
        cache_ref = ray.put(cache)
        nodes = _cpu_nodes()
        if getattr(ranges, "groups", 1) == 1 or not nodes:
            yield from self._ordered(lambda r: task.remote(r, cache_ref, config, hooks, self.cwd), ranges)
        else:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            def submit(s: int) -> Any:
                on = NodeAffinitySchedulingStrategy(nodes[ranges.group(s) % len(nodes)], soft=True)
                return task.options(scheduling_strategy=on).remote(ranges[s], cache_ref, config, hooks, self.cwd)

            order = _in_turn(ranges.exchange.group_first)
            yield from _in_shard_order(order, self._ordered(submit, order))
        remove_stale_temp_files(_output(cache), keep_own=True)

    def drop_copies(self, prefixes: Sequence[ObjectPath]) -> None:
        """On every live node (a 0-CPU task pinned to each: the head too) and here: each machine's tasks share
        its copies (``store.local_file``), and no other node can delete them. A node that leaves meanwhile
        takes its copies with it."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0, max_retries=0)(drop_mirrors)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                .remote(list(prefixes)) for node in ray.nodes() if node["Alive"]]
        for ref in refs:
            try:
                ray.get(ref)
            except (ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.TaskUnschedulableError):
                pass  # a node that left holds nothing any more
        super().drop_copies(prefixes)  # the driver's machine, which may be no node of the cluster (ray://)

    def _ordered(self, submit: Callable[[Any], Any], items: Iterable[Any]) -> Generator[Any, None, None]:
        """Submit a task per item, at most ``window`` ahead of the one awaited; yield results in item order.
        A task's own exception (a RecordError under --strict) is raised as itself; on any exit before the
        end (an error, Ctrl-C, the caller closing early) the tasks still running are cancelled."""
        ray = _ray()
        pending: deque = deque()
        try:
            for item in items:
                pending.append(submit(item))
                if len(pending) >= self.window:
                    yield _get(ray, pending.popleft())
            while pending:
                yield _get(ray, pending.popleft())
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise


def _cpu_nodes() -> list[str]:
    """The ids of the live nodes that run tasks (a head started with no CPU runs none), sorted."""
    return sorted(n["NodeID"] for n in _ray().nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0)


def _in_turn(group_first: np.ndarray) -> list[int]:
    """Shard indices, each writer group's in order, the groups taking turns: 0, k, 2k, 1, k + 1, ..."""
    spans = list(itertools.pairwise(group_first.tolist()))
    return [a + i for i in range(max(b - a for a, b in spans)) for a, b in spans if a + i < b]


def _in_shard_order(order: list[int], results: Iterable[Any]) -> Generator[Any, None, None]:
    """The results of shards ``order`` (as they come) in shard order 0, 1, ..."""
    waiting: dict[int, Any] = {}
    due = 0
    for s, result in zip(order, results, strict=True):
        waiting[s] = result
        while due in waiting:
            yield waiting.pop(due)
            due += 1


def _output(cache: EncodeCache) -> Any:
    """The output location as the driver resolved it (a directory, or an object-store prefix): the cache
    lives in its ``.packer/encode``."""
    return cache.root.parent.parent


def _get(ray, ref) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, Exception):
            raise e.cause from None  # what the local executor raises (RecordError: exit 2), not Ray's wrapper
        raise


def _enter(cwd: str) -> None:
    """Prepare this worker process for a task: the driver's working directory (relative paths), where this
    node has it, and no tokenizer threads (one task per CPU)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.getcwd() != cwd and os.path.isdir(cwd):
        os.chdir(cwd)


def _encode_task(chunk: Chunk, boxed: list, cache: EncodeCache, config: BuildConfig, hooks: Hooks,
                 cwd: str) -> ChunkCounts:
    import ray

    _enter(cwd)
    key = boxed[0].hex()
    if key not in _ENCODER:
        _ENCODER.clear()  # a worker serves one build at a time: drop an earlier build's encoder
        _ENCODER[key] = ray.get(boxed[0])
    return encode_chunk(chunk, encoder=_ENCODER[key], cache=cache, config=config, hooks=hooks)


def _exchange_task(task: MapTask, cache: EncodeCache, hooks: Hooks, cwd: str) -> tuple[int, ...]:
    _enter(cwd)
    return exchange_map(task, cache=cache, hooks=hooks)


def _write_task(shards: ShardRange, cache: EncodeCache, config: BuildConfig, hooks: Hooks,
                cwd: str) -> list[dict[str, Any]]:
    _enter(cwd)
    return write_shard_range(shards, cache=cache, config=config, hooks=hooks)
