"""``LocalExecutor``: runs a build's tasks on this machine (the ``Executor`` of ``pipeline/build.py``).

Encode tasks and shard ranges run in this process (``num_proc=1``) or in a spawn pool of ``num_proc``
workers, one pool per stage. Resuming needs nothing here: the tasks skip what a previous run committed
(encode-cache chunks, shard markers).
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer.config import BuildConfig
from packer.pipeline.cache import ChunkCounts, EncodeCache
from packer.pipeline.faults import Hooks
from packer.pipeline.stages import Chunk, ShardRange, encode_chunk, write_shard_range

if TYPE_CHECKING:
    from packer.encode.encoder import Encoder

_WORKER: dict[str, Any] = {}  # a pool worker's encoder (encode pools only) and hooks, set once by _worker_init


class LocalExecutor:
    """One machine: ``num_proc`` processes (1: this one) encode chunks, then write shard ranges."""

    def __init__(self, num_proc: int = 1):
        self.num_proc = num_proc

    def encode(
        self, chunks: Sequence[Chunk], *, encoder: Encoder, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[ChunkCounts, None, None]:
        """Encode the chunks here (``num_proc`` 1) or in the pool; yield each chunk's counts in chunk order."""
        if self.num_proc == 1 or len(chunks) <= 1:
            for chunk in chunks:
                yield encode_chunk(chunk, encoder=encoder, cache=cache, config=config, hooks=hooks)
            return
        import pickle

        # Workers load the parent's encoder from this file (Rust tokenizer only, 8 MB): ~0.5 s each, against
        # ~5 s to import transformers and load the tokenizer in every worker. A file, not initargs: spawn
        # writes initargs through a pipe the child drains only after its imports, so workers would start one
        # by one. (The hooks are small: they travel in initargs.)
        # (beside the cache, or in the temp dir when the cache is on an object store: the pool is this machine's)
        here = cache.root if isinstance(cache.root, Path) else Path(tempfile.gettempdir())
        blob = here / f"encoder.pkl.tmp-{os.getpid()}"
        try:
            blob.write_bytes(pickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL))
            yield from self._in_pool(_encode_task, [(chunk, cache, config) for chunk in chunks],
                                     hooks=hooks, encoder_file=str(blob))
        finally:
            blob.unlink(missing_ok=True)

    def write(
        self, ranges: Sequence[ShardRange], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[list[dict[str, Any]], None, None]:
        """Write the ranges here (``num_proc`` 1) or in the pool; yield each range's manifest entries in order.

        In the pool each worker gathers and compresses its own shards (the write is CPU-bound: zstd and the
        gather's copies), so the stage runs ``num_proc`` times as fast; the bytes are the same because each
        shard is a pure function of its range.
        """
        if self.num_proc == 1 or len(ranges) <= 1:
            for shards in ranges:
                yield write_shard_range(shards, cache=cache, config=config, hooks=hooks)
            return
        yield from self._in_pool(_write_task, [(shards, cache, config) for shards in ranges], hooks=hooks)

    def _in_pool(
        self, task: Callable[[Any], Any], args: list[Any], *, hooks: Hooks, encoder_file: str | None = None
    ) -> Generator[Any, None, None]:
        """``task`` over ``args`` in a spawn pool of ``num_proc`` workers, results in order; the pool is
        terminated on an error, Ctrl-C or the caller closing the generator early."""
        import multiprocessing as mp

        pool = None
        try:
            # spawn, not fork: the parent may hold tokenizer threads and locks that fork would copy mid-state.
            pool = mp.get_context("spawn").Pool(min(self.num_proc, len(args)), initializer=_worker_init,
                                                initargs=(encoder_file, hooks))
            yield from pool.imap(task, args, chunksize=1)
            pool.close()
            pool.join()
        except BaseException:
            if pool is not None:
                pool.terminate()
            raise


def _worker_init(encoder_file: str | None, hooks: Hooks) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if encoder_file is not None:
        import pickle

        _WORKER["encoder"] = pickle.loads(Path(encoder_file).read_bytes())
    _WORKER["hooks"] = hooks
    # Ctrl-C reaches the whole process group: the parent alone handles it (terminates the pool, exit 130),
    # so workers do not print a KeyboardInterrupt traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _encode_task(args: tuple[Chunk, EncodeCache, BuildConfig]) -> ChunkCounts:
    chunk, cache, config = args  # under --strict a RecordError propagates (it pickles) to the parent
    return encode_chunk(chunk, encoder=_WORKER["encoder"], cache=cache, config=config, hooks=_WORKER["hooks"])


def _write_task(args: tuple[ShardRange, EncodeCache, BuildConfig]) -> list[dict[str, Any]]:
    shards, cache, config = args
    return write_shard_range(shards, cache=cache, config=config, hooks=_WORKER["hooks"])
