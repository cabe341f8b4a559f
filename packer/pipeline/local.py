"""``LocalExecutor``: runs a build's tasks on this machine (an ``Executor``, ``pipeline/executor.py``).

Encode tasks, the exchange's map tasks and shard ranges run in this process (``num_proc=1``) or in ONE pool of ``num_proc``
workers that serves both stages (the write stage reuses the encode stage's workers instead of starting its own).
On Linux the pool is forked once the encoder exists (``preload``), from this process with the encoder and
fastokens' native tokenizer built once: the workers start with everything they need, instead of each importing
packer and building the native tokenizer (~2 CPU-s per worker for a 151k vocabulary; docs/benchmarks.md, "Build
throughput"). Fork is taken only where it is safe (``_forkable``): no other Python thread, no fastokens encode
has run here (rayon's pool has no fork handler); else, and elsewhere than Linux, the pool is spawned when the
build begins (``start``), so the workers' interpreter start and imports overlap the parent's tokenizer load.
Where the pool is forked and an earlier build kept fastokens' tokenizer.json for this tokenizer (``kept.engine_file``),
``load_encoder`` overlaps the two serial steps before the fork: a forked helper loads the tokenizer and makes the
encoder while a thread of this process builds the native tokenizer and this one scans the inputs and starts
numba for the workers to inherit (docs/benchmarks.md, "Where a build's wall goes", "Where a 200k text-chat build's CPU goes"). Where an
earlier build kept the helper's result for the same tokenizer files, options, packer source and installed versions
(``kept.encoder_entry``: the pickled encoder and its tokenizer record), no helper runs: the pool is forked from it.
Resuming needs nothing here: the tasks skip what a previous run committed (encode-cache chunks, shard markers).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from packer.config import BuildConfig
from packer.pipeline import kept
from packer.pipeline.cache import ChunkCounts, EncodeCache
from packer.pipeline.executor import Executor
from packer.pipeline.faults import Hooks
from packer.pipeline.stages import (
    Chunk,
    MapTask,
    ShardRange,
    encode_chunk,
    exchange_map,
    planned_examples,
    write_shard_range,
)

if TYPE_CHECKING:
    from multiprocessing.pool import Pool

    from packer.encode.encoder import Encoder

T = TypeVar("T")
POOL_MIN_EXAMPLES = 250_000
"""A write (or exchange) stage whose pool is not running yet (a repack, a rebuild that reuses its encode cache)
starts one only for at least this many planned examples per worker; fewer are written by workers forked from
this process once it holds what they need (``LocalExecutor._write_forked``: no start), or in it. A
worker's start (interpreter, imports, numba's kernels) is ~1 CPU-s, and at 200k bench records (200k examples)
two workers took ~14 CPU-s and no less wall for a write this process does in ~10 (docs/benchmarks.md,
"Repack"): each worker's share must be several times its start."""
_WORKER: dict[str, Any] = {}  # a pool worker's encoder and the file it came from (encode_file), set by _encoder


ORPHAN_AGE_S = 3600.0
"""An encoder file in the temp dir older than this whose process is gone is an orphan: its build was killed
(SIGKILL, the OOM killer) before it could remove it. The age spares a live build of another PID namespace
sharing the temp dir, whose workers load the file within seconds of its writing."""


def remove_orphan_encoder_files(here: Path, *, max_age_s: float = ORPHAN_AGE_S) -> list[Path]:
    """Delete the encoder files (``encoder.pkl.tmp-PID-...``, ~8 MB each) that killed builds left in ``here``:
    the temp dir, which no later run of those builds cleans (a work dir's temp files go with
    ``output.remove_stale_temp_files``). A file goes when its PID is no live process and it is older than
    ``max_age_s``; returns what went."""
    import time

    gone = []
    for p in here.glob("encoder.pkl.tmp-*"):
        try:
            pid = int(p.name.split("-")[1])
            old = time.time() - p.stat().st_mtime > max_age_s
        except (ValueError, IndexError, OSError):
            continue
        if old and pid != os.getpid() and not _alive(pid):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


def _alive(pid: int) -> bool:
    """Whether ``pid`` names a process (another user's counts: signalling it is refused, not failed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class LocalExecutor(Executor):
    """One machine: ``num_proc`` processes (1: this one) encode chunks, then write shard ranges."""

    def __init__(self, num_proc: int = 1):
        self.num_proc = num_proc
        self._pool: Pool | None = None
        self._encodes = 0  # encoder files written so far: numbers each one
        self._preloaded: tuple[Encoder, Path] | None = None  # the encoder ``preload`` shipped, and its file
        self._deferred: list[_Deferred] = []  # ``submit``'s calls made while no pool exists (not asked for yet)

    def start(self) -> None:
        """Spawn the pool now (``build`` calls this before it loads the tokenizer), unless it will be forked
        once the encoder exists (``preload``; Linux, ``_forkable``); a no-op for one process."""
        if self.num_proc > 1 and self._pool is None and not _forkable():
            self._pool = _new_pool(self.num_proc, "spawn")

    def _ensure_pool(self) -> Pool:
        """The pool: spawned by ``start``, else forked now (without an encoder to inherit: tasks load it)."""
        if self._pool is None:
            self._pool = _new_pool(self.num_proc, "fork" if _forkable() else "spawn")
        return self._pool

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Callable[[], T]:
        """Start ``fn(*args, **kwargs)`` on a worker now; return a function that waits for its result (or
        raises its error). ``build`` scans the inputs this way while it loads the tokenizer, on a core that
        would idle; for one process ``fn`` runs when its result is asked for, and so does it while a forked
        pool waits for the encoder (on the pool if it exists by then, else here)."""
        if self.num_proc == 1:
            return super().submit(fn, *args, **kwargs)
        self.start()
        if self._pool is None:  # forked later: run by ``load_encoder`` while fastokens builds, else asked for
            deferred = _Deferred(self, fn, args, kwargs)
            self._deferred.append(deferred)
            return deferred
        return self._pool.apply_async(fn, args, kwargs).get

    def preload(self, encoder: Encoder) -> None:
        """Have every worker hold ``encoder`` now (``build`` calls this as soon as it has made it): a forked
        pool is forked now from a copy made here (the very state a worker unpickles, its native tokenizer
        built once); a spawned pool's workers each unpickle it while this process fingerprints the tokenizer
        and prepares the output, not after the first tasks arrive. ``encode`` with the same encoder reuses
        its file; a no-op for one process."""
        if self.num_proc == 1:
            return
        self.start()
        self._drop_preloaded()
        blob = self._encoder_file(encoder, Path(tempfile.gettempdir()))
        self._preloaded = (encoder, blob)
        if self._pool is None and _forkable():
            self._pool = _forked_with(encoder, str(blob), self.num_proc)
            return
        pool = self._ensure_pool()
        for _ in range(self.num_proc):  # one each while they idle (a worker that takes two loads once)
            pool.apply_async(_preload, (str(blob),))

    def load_encoder(self, config: BuildConfig, *, max_length: int | None) -> tuple[Encoder, dict[str, Any]]:
        """``Executor.load_encoder``, overlapped where the pool will be forked and fastokens' tokenizer.json
        for this tokenizer is kept from an earlier build (``kept.engine_file``): a forked helper process loads the
        tokenizer, makes and pickles the encoder and fingerprints it, while this process builds fastokens'
        native tokenizer from the kept string in a thread (``_NativeBuild``: ~2.5 CPU-s that leave the GIL free for
        most of it); the pool is then forked holding both. Nothing changes what a worker holds: the kept string is
        used only where it equals the encoder's own (else it is built again here, as without this), and the
        encoder is the helper's pickle, which a worker loads anyway. This process never imports transformers.
        Beside the native build this thread imports what a worker needs, runs ``submit``'s deferred calls (the
        build's scan) and starts numba and loads the writers' kernels (``gather.warm``): the workers inherit them
        instead of each paying numba's start (~0.5-0.7 CPU-s quiet) at their first shard write or mRoPE encode.
        Before all that, an entry an earlier build kept under this build's key (``kept.encoder_entry``) replaces the
        helper (``_load_kept``); each build that makes its encoder keeps one (``kept.keep_entry``), after the fork."""
        if self.num_proc == 1 or self._pool is not None or not _forkable():
            return self._load_here(config, max_length)
        try:
            entry = kept.encoder_entry(config, max_length)
        except OSError:  # a tokenizer or packer file gone or unreadable meanwhile: nothing kept, nothing read
            entry = None
        hit = kept.read_entry(*entry) if entry is not None else None
        if hit is not None:
            loaded = self._load_kept(config, *hit)
            if loaded is not None:
                try:  # used now: the last to go (``kept.prune_entries``)
                    os.utime(entry[0])
                except OSError:
                    pass
                return loaded
        engine_path = kept.engine_file(config.tokenizer_name())
        text = kept.read_text(engine_path) if engine_path is not None else None
        if text is None:  # the first build of this tokenizer: the serial way, keeping the string for the next
            encoder, record = self._make_encoder(config, max_length=max_length)
            kept.keep_engine(engine_path, encoder.engine_json(), None)
            if entry is not None and self._preloaded is not None:
                kept.keep_entry(*entry, self._preloaded[1].read_bytes(), record)
            return encoder, record
        import multiprocessing as mp
        import pickle

        self._drop_preloaded()
        blob = self._encoder_path(Path(tempfile.gettempdir()))
        ctx = mp.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        helper = ctx.Process(target=_load_encoder, args=(config, max_length, str(blob), send), daemon=True,
                             name="packer-load-encoder")
        helper.start()
        send.close()
        # fastokens builds in a thread once the helper is forked (its build leaves the GIL free for most of it),
        # while this thread imports what a worker needs, runs ``submit``'s deferred calls (the build's scan) and
        # loads numba's kernels (``gather.warm``), each of which waited for the fork before (or, the kernels, ran
        # in a thread beside the build): the workers inherit them; joined before the fork
        native = _NativeBuild(text)
        try:
            _worker_imports()
            self._run_deferred()
            _warm_kernels(config)
            kind, value = receive.recv()
        except BaseException as e:  # Ctrl-C: the helper goes too
            helper.terminate()
            helper.join()
            native.join()
            blob.unlink(missing_ok=True)
            if isinstance(e, EOFError):
                raise RuntimeError(f"the process loading the tokenizer exited with code {helper.exitcode}") from None
            raise
        finally:
            receive.close()
            helper.join()
        native.join()
        if kind == "error":
            blob.unlink(missing_ok=True)
            raise value
        data = blob.read_bytes()
        encoder = pickle.loads(data)
        self._preloaded = (encoder, blob)
        kept.keep_engine(engine_path, encoder.engine_json(), text)
        worker = pickle.loads(data)  # the workers' copy (``_forked_with``), as a worker loads it
        _trim_heap()
        self._pool = _forked_with(encoder, str(blob), self.num_proc, built=(text, native.native), worker=worker)
        if entry is not None:  # after the fork: the workers encode while this process writes it
            kept.keep_entry(*entry, data, value)
        return encoder, value

    def _load_here(self, config: BuildConfig, max_length: int | None) -> tuple[Encoder, dict[str, Any]]:
        """``load_encoder`` where no pool is forked from the encoder (``Executor.load_encoder``: kept, else made).
        One process encodes itself: its native tokenizer is the one it built last for the same tokenizer.json
        where there is one (``Encoder.prepare_here``: an encoder from a kept entry is a new one each build, and
        builds in one process, a notebook's, would each build it again), else built now."""
        encoder, record = super().load_encoder(config, max_length=max_length)
        if self.num_proc == 1:
            encoder.prepare_here()
        return encoder, record

    def _load_kept(self, config: BuildConfig, data: bytes, record: dict[str, Any]
                   ) -> tuple[Encoder, dict[str, Any]] | None:
        """``load_encoder`` from an entry an earlier build kept (``kept.encoder_entry``: the encoder's pickle, its
        tokenizer record): no helper, no transformers. fastokens' native tokenizer builds in a thread from the
        string kept beside the entries (``kept.engine_file``; else, once unpickled, the encoder's own), started first:
        its build leaves the GIL free for nearly all of its ~2.5 s, so this thread meanwhile unpickles the
        encoder and the workers' copy of it, imports what a worker needs, runs ``submit``'s deferred calls (the
        build's scan) and loads numba's kernels (``_warm_kernels``), each of which waited for the fork or ran
        beside the build before; the pool is forked once the native build is joined. What a worker holds is the
        same: the workers' copy takes the native tokenizer only where its string is the encoder's own
        (``FastokensBPE.prepare``). None where the pickle does not load (the caller then takes the helper's way,
        which replaces the entry)."""
        import pickle

        # the thread first: the encoder's modules (~0.15 CPU-s, imported by the unpickle) and the kept string's
        # read (~0.05) then run beside its build, not before it
        engine_path = kept.engine_file(config.tokenizer_name())
        native = _NativeBuild(path=engine_path) if engine_path is not None else None
        try:
            from packer.encode.encoder import Encoder

            try:
                encoder = pickle.loads(data)
            except Exception:  # noqa: BLE001 - a stale or damaged entry: made again, as without it
                return None
            if not isinstance(encoder, Encoder) or not kept.same_profile(encoder, config):  # a run-time profile edited
                return None
            if native is not None and native.path_missing():  # no string kept: the encoder's own, built now
                native.join()
                native = None
            if native is None and encoder.engine_json() is not None:
                native = _NativeBuild(encoder.engine_json())
            self._drop_preloaded()
            blob = self._encoder_path(Path(tempfile.gettempdir()))
            blob.write_bytes(data)
            self._preloaded = (encoder, blob)
            worker = pickle.loads(data)  # the workers' copy (``_forked_with``), as a worker loads it
            _worker_imports()
            self._run_deferred()
            _warm_kernels(config)
        finally:
            if native is not None:
                native.join()
        _trim_heap()
        self._pool = _forked_with(encoder, str(blob), self.num_proc,
                                  built=(native.text, native.native) if native is not None else None, worker=worker)
        return encoder, record

    def _run_deferred(self) -> None:
        """Run here, now, the calls ``submit`` deferred while no pool existed (``load_encoder``: while fastokens
        builds on the other core); each keeps its result or error for when it is asked for."""
        deferred, self._deferred = self._deferred, []
        for d in deferred:
            d.run()

    def close(self) -> None:
        """Stop the pool's workers (``build`` calls this when it ends, also on an error); ``start`` again
        makes a new pool."""
        pool, self._pool = self._pool, None
        self._deferred = []
        if pool is not None:
            pool.terminate()
            pool.join()
        self._drop_preloaded()

    def _drop_preloaded(self) -> None:
        if self._preloaded is not None:
            self._preloaded[1].unlink(missing_ok=True)
            self._preloaded = None

    def _encoder_file(self, encoder: Encoder, here: Path) -> Path:
        """``encoder`` pickled into a new file in ``here`` (``_encoder_path``)."""
        import pickle

        blob = self._encoder_path(here)
        blob.write_bytes(pickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL))
        return blob

    def _encoder_path(self, here: Path) -> Path:
        """A new encoder file's name in ``here``, unique per call (a reused executor never keeps an older
        encoder). In the temp dir, the files of killed builds go first (``remove_orphan_encoder_files``)."""
        if here == Path(tempfile.gettempdir()):
            remove_orphan_encoder_files(here)
        self._encodes += 1
        return here / f"encoder.pkl.tmp-{os.getpid()}-{id(self):x}-{self._encodes}"

    def encode(
        self, chunks: Sequence[Chunk], *, encoder: Encoder, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[ChunkCounts, None, None]:
        """Encode the chunks here (``num_proc`` 1) or in the pool; yield each chunk's counts in chunk order."""
        if self.num_proc == 1 or len(chunks) <= 1:
            for chunk in chunks:
                yield encode_chunk(chunk, encoder=encoder, cache=cache, config=config, hooks=hooks)
            return
        # Workers load the parent's encoder from a file (Rust tokenizer only, 8 MB): ~0.5 s each, against
        # ~5 s to import transformers and load the tokenizer in every worker. A file named in each task, not
        # the pool's initargs: the pool is started before the encoder exists, and the file is read once per
        # worker. The one ``preload`` wrote, else one beside the cache (or in the temp dir when the cache is
        # on an object store: the pool is this machine's).
        if self._preloaded is not None and self._preloaded[0] is encoder:
            blob = self._preloaded[1]
        else:
            blob = self._encoder_file(encoder, cache.root if isinstance(cache.root, Path) else Path(tempfile.gettempdir()))
        try:
            yield from self._in_pool(_encode_task, [(chunk, cache, config, hooks, str(blob)) for chunk in chunks])
        finally:
            blob.unlink(missing_ok=True)
            if self._preloaded is not None and self._preloaded[1] == blob:
                self._preloaded = None

    def write(
        self, ranges: Sequence[ShardRange], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[list[dict[str, Any]], None, None]:
        """Write the ranges here (``num_proc`` 1) or in the pool; yield each range's manifest entries in order.

        In the pool each worker gathers and compresses its own shards (the write is CPU-bound: zstd and the
        gather's copies), so the stage runs ``num_proc`` times as fast; the bytes are the same because each
        shard is a pure function of its range.
        """
        if self.writes_here(planned_examples(ranges), len(ranges)):
            self.close()  # the workers' memory is free before this process gathers a shard
            if self.num_proc > 1 and len(ranges) > 1 and _forkable(encodes=False):
                yield from self._write_forked(ranges, cache=cache, config=config, hooks=hooks)
                return
            for shards in ranges:
                yield write_shard_range(shards, cache=cache, config=config, hooks=hooks)
            return
        # a generator: each range is made as the pool's feeder sends it (``stages.ShardRanges``), not all at once
        yield from self._in_pool(_write_task, ((shards, cache, config, hooks) for shards in ranges))

    def _write_forked(
        self, ranges: Sequence[ShardRange], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[list[dict[str, Any]], None, None]:
        """A write too small for a pool of fresh workers (a repack: ``writes_here``) on ``num_proc`` workers
        forked from this process once it holds what a writer needs (``_warm_writer``: the write's numba kernels
        loaded, every chunk file's layout learnt), so that no worker pays a start, an import or a kernel load,
        nor a first visit of a chunk file; each worker takes the next shard as it finishes one (``imap``,
        one shard a task), so both finish together. The same bytes: each shard is a pure function of its
        range, whichever process writes it."""
        import gc

        _warm_writer(ranges, cache)
        gc.freeze()  # the inherited objects stay out of the workers' collections (their pages not copied)
        try:
            self._pool = _new_pool(self.num_proc, "fork", initializer=_forked_writer_init)
        finally:
            gc.unfreeze()
        try:
            yield from self._in_pool(_write_task, ((shards, cache, config, hooks) for shards in ranges))
        finally:
            self.close()  # the workers' memory is free before this process computes the stats

    def writes_here(self, examples: int, ranges: int) -> bool:
        return self.num_proc == 1 or ranges <= 1 or not self._pays(examples)

    def exchange(
        self, tasks: Sequence[MapTask], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[tuple[int, ...], None, None]:
        """Run the exchange's map tasks here (``num_proc`` 1) or in the pool; yield their rows, in order."""
        if self.num_proc == 1 or not self._pays(sum(len(t.positions) for t in tasks)):
            for task in tasks:
                yield exchange_map(task, cache=cache, hooks=hooks)
            return
        yield from self._in_pool(_exchange_task, [(task, cache, hooks) for task in tasks])

    def _pays(self, examples: int) -> bool:
        """Does a stage of ``examples`` planned examples run in the pool: always once it runs (the encode
        stage started it), else only where each worker gets ``POOL_MIN_EXAMPLES`` or more."""
        return self._pool is not None or examples >= POOL_MIN_EXAMPLES * self.num_proc

    def _in_pool(self, task: Callable[[Any], Any], args: Iterable[Any]) -> Generator[Any, None, None]:
        """``task`` over ``args`` in the pool (started here if ``start`` was not called), results in order;
        the pool is terminated on an error, Ctrl-C or the caller closing the generator early."""
        try:
            yield from self._ensure_pool().imap(task, args, chunksize=1)
        except BaseException:
            self.close()
            raise


def _forkable(encodes: bool = True) -> bool:
    """May the pool be forked from this process? Linux only (macOS's system libraries are not fork-safe), no
    other Python thread (its locks would be copied mid-state), and, for workers that will encode
    (``encodes``), no fastokens encode run here yet (``fastokens_bpe.fork_safe``: a forked copy of rayon's pool
    would hang their first encode; writers never tokenize). The native threads a build's process holds at that
    point (OpenBLAS's, jemalloc's) have fork handlers; the HF tokenizer runs without its thread pool
    (TOKENIZERS_PARALLELISM)."""
    import multiprocessing as mp

    from packer.encode.fastokens_bpe import fork_safe

    return (sys.platform == "linux" and "fork" in mp.get_all_start_methods() and threading.active_count() == 1
            and (not encodes or fork_safe()))


def _new_pool(num_proc: int, method: str, initializer: Callable[[], None] | None = None) -> Pool:
    import multiprocessing as mp

    return mp.get_context(method).Pool(num_proc, initializer=initializer or _worker_init)


def _warm_writer(ranges: Sequence[ShardRange], cache: EncodeCache) -> None:
    """What a writer of ``ranges`` needs, loaded in this process before it forks the writers
    (``LocalExecutor._write_forked``): the write's numba kernels for these columns' dtypes (the gather's, the
    mRoPE merge's), by taking and assembling a row as a shard's are, and, where the writers keep each chunk
    file's layout (``ShardRange.remember``, no exchange), every chunk file's (``EncodeCache.learn_layouts``: no
    row taken from each, ~0.9 ms a file less than a take of its first row): a write in one process learns each
    once, and so, inherited, do the forked workers. Nothing is written."""
    import numpy as np

    from packer.shards.assemble import assemble_packs

    try:
        first = ranges[0]
        sel = first.examples[:1]
        if first.exchange is None and first.remember:
            cache.learn_layouts()
            rows = cache.take(sel, remember=True)
        else:
            rows = cache.take(sel) if first.exchange is None else first.exchange.take(sel, 0)
        assemble_packs(rows, np.ones(len(sel), dtype=np.int64))
    except Exception:  # noqa: BLE001 - only a warm-up: the writers report any problem with the real rows
        return


def _forked_writer_init() -> None:
    """A writer forked by ``_write_forked``: it holds everything already; only Ctrl-C is the parent's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _forked_with(encoder: Encoder, path: str, num_proc: int, built: tuple[str, Any] | None = None,
                 worker: Encoder | None = None) -> Pool:
    """A pool forked from this process holding a copy of ``encoder`` as a worker loads it from ``path`` (the
    pickle's round trip: the same state, no transformers tokenizer; ``worker``: that copy, loaded already), its
    native tokenizer built here once (``built``: already, from that tokenizer.json; ``Encoder.prepare_fork``).
    This process drops its copy once the workers exist; a worker the pool starts later loads ``path`` itself."""
    import gc
    import pickle

    _worker_imports()
    if worker is None:
        worker = pickle.loads(Path(path).read_bytes())
    worker.prepare_fork(built)
    _WORKER.update(encoder=worker, encoder_file=path)
    gc.freeze()  # the inherited objects stay out of the workers' collections (as ``_encoder`` does)
    try:
        return _new_pool(num_proc, "fork")
    finally:
        gc.unfreeze()
        _WORKER.clear()
        del worker


class _Deferred:
    """A call ``LocalExecutor.submit`` got while no pool existed (it is forked once the encoder exists): run by
    ``_run_deferred`` where ``load_encoder`` has a core to spare, else when asked for (on the pool if it exists by
    then, else here). Asked for, it returns the result or raises the error, as the pool's would."""

    def __init__(self, executor: LocalExecutor, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]):
        self._executor, self._call = executor, (fn, args, kwargs)
        self._done: tuple[bool, Any] | None = None  # (ok, result or error) once run

    def run(self) -> None:
        fn, args, kwargs = self._call
        try:
            self._done = (True, fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - raised where the result is asked for, as the pool's would be
            self._done = (False, e)

    def __call__(self) -> Any:
        if self in self._executor._deferred:
            self._executor._deferred.remove(self)
        if self._done is None:
            fn, args, kwargs = self._call
            pool = self._executor._pool
            return pool.apply_async(fn, args, kwargs).get() if pool is not None else fn(*args, **kwargs)
        (ok, value), self._done = self._done, None
        if not ok:
            raise value
        return value


def _trim_heap() -> None:
    """Give back to the system the free pages of this process's malloc arenas (glibc's ``malloc_trim``), before
    the fork: the native build's thread parsed the tokenizer.json in its own arena, and what it freed there stays
    this process's (no other thread allocates from that arena) and, forked, every worker's too. Not glibc: nothing."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _NativeBuild(threading.Thread):
    """fastokens' native tokenizer of ``text`` (``build_native``), built in a thread started at once: the build
    releases the GIL for nearly all of its ~2.5 s. ``path``: the text read from that file in the thread first
    (``kept.read_text``; None where it cannot be: ``path_missing``, nothing built). Joined before any fork
    (``_forkable``: no other thread)."""

    def __init__(self, text: str | None = None, *, path: Path | None = None):
        super().__init__(name="packer-native-build", daemon=True)
        import fastokens  # noqa: F401 - imported here, not in the thread (the import lock)

        import packer.encode.fastokens_bpe  # noqa: F401

        self.text, self._path = text, path
        self._read = threading.Event()  # set once ``text`` is final
        if path is None:
            self._read.set()
        self.native: Any = None
        self.start()

    def path_missing(self) -> bool:
        """Whether the kept string could not be read (the thread then ends without a build)."""
        self._read.wait()
        return self.text is None

    def run(self) -> None:
        from packer.encode.fastokens_bpe import build_native

        if self._path is not None:
            try:
                self.text = kept.read_text(self._path)
            finally:
                self._read.set()
        if self.text is not None:
            self.native = build_native(self.text)


def _warm_kernels(config: BuildConfig) -> None:
    """``gather.warm`` in ``load_encoder``'s thread: a warm-up only (the real call reports any problem)."""
    try:
        from packer.models import get_profile
        from packer.shards.gather import warm

        warm(mrope=bool(get_profile(config.profile, **config.profile_overrides()).positions.mrope))
        # the labels' kernels too, for the workers to inherit
        from packer.encode.kernels import warm as warm_encode

        warm_encode()
    except Exception:  # noqa: BLE001
        pass


def _load_encoder(config: BuildConfig, max_length: int | None, blob: str, send: Any) -> None:
    """``LocalExecutor.load_encoder``'s helper process: the encoder pickled into ``blob``; sends ("ok", its
    tokenizer_record) or ("error", the exception)."""
    import pickle

    from packer.config import make_encoder
    from packer.pipeline.output import tokenizer_record

    try:
        encoder = make_encoder(config, max_length=max_length)
        Path(blob).write_bytes(pickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL))
        reply: tuple[str, Any] = ("ok", tokenizer_record(encoder.tokenizer, encoder.profile, config.tokenizer_name(),
                                                         encoder.context.tokens.json()))
    except BaseException as e:  # noqa: BLE001  # raised in the build's process
        reply = ("error", e)
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:  # noqa: BLE001  # an exception that does not pickle (or unpickle): its text
            reply = ("error", RuntimeError(f"{type(e).__name__}: {e}"))
    send.send(reply)
    send.close()


def _worker_init() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Ctrl-C reaches the whole process group: the parent alone handles it (terminates the pool, exit 130),
    # so workers do not print a KeyboardInterrupt traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_imports()


def _worker_imports() -> None:
    # What the first encode task would import (the encoder's and the parsers' modules; pandas, which
    # pyarrow imports at its first conversion from Python objects): imported here, while the parent
    # still loads the tokenizer, not on the critical path (a forked pool: in the parent, once).
    import pyarrow as pa

    import packer.encode.encoder  # noqa: F401
    import packer.formats  # noqa: F401

    pa.array([0])


def _encoder(path: str) -> Encoder:
    """The encoder pickled at ``path``, loaded on this worker's first task of an encode stage and kept."""
    if _WORKER.get("encoder_file") != path:
        import gc
        import pickle

        _WORKER.update(encoder=pickle.loads(Path(path).read_bytes()), encoder_file=path)
        # What this worker holds now (modules, the encoder) lives as long as it does: frozen, the full
        # collections that a chunk's many small objects trigger no longer walk it (docs/benchmarks.md).
        gc.freeze()
    return _WORKER["encoder"]


def _preload(path: str) -> None:
    _encoder(path)  # returns nothing: the encoder is not sent back to the parent


def _encode_task(args: tuple[Chunk, EncodeCache, BuildConfig, Hooks, str]) -> ChunkCounts:
    chunk, cache, config, hooks, encoder_file = args  # under --strict a RecordError propagates (it pickles)
    return encode_chunk(chunk, encoder=_encoder(encoder_file), cache=cache, config=config, hooks=hooks)


def _drop_encoder() -> None:
    """Free this worker's encoder (~160 MiB resident, the Rust tokenizer's tables) before it writes shards:
    the write stage needs none, and its gathered rows are the peak. ``malloc_trim`` hands the freed heap back
    to the system (glibc keeps it otherwise); elsewhere the memory is only reused."""
    if _WORKER.pop("encoder", None) is None:
        return
    _WORKER.pop("encoder_file", None)
    import ctypes
    import gc

    gc.unfreeze()  # the encoder's objects back in the collector's view (frozen by _encoder)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _exchange_task(args: tuple[MapTask, EncodeCache, Hooks]) -> tuple[int, ...]:
    task, cache, hooks = args
    _drop_encoder()
    return exchange_map(task, cache=cache, hooks=hooks)


def _write_task(args: tuple[ShardRange, EncodeCache, BuildConfig, Hooks]) -> list[dict[str, Any]]:
    shards, cache, config, hooks = args
    _drop_encoder()
    return write_shard_range(shards, cache=cache, config=config, hooks=hooks)
