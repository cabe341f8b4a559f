"""``Executor``: what runs a build's tasks (``build.py`` calls it; ``LocalExecutor`` in ``local.py`` and
``RayExecutor`` in ``ray_executor.py`` are two).

A new executor subclasses ``Executor`` and defines ``encode`` and ``write``; ``start``, ``submit``,
``preload`` and ``close`` are optional steps whose defaults do nothing (``submit``: runs the function when
its result is asked for), overridden where the executor has something to do early or late.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from packer.config import BuildConfig
    from packer.encode.encoder import Encoder
    from packer.pipeline.cache import ChunkCounts, EncodeCache
    from packer.pipeline.faults import Hooks
    from packer.pipeline.stages import Chunk, MapTask, ShardRange
    from packer.shards.store import ObjectPath

T = TypeVar("T")
E = TypeVar("E", bound="Executor")


class Executor(ABC):
    """Runs the task stages of a build (``stages.encode_chunk``, ``stages.exchange_map`` where the build has
    many shards, ``stages.write_shard_range``); ``build`` does the rest (scan, plan, finish) in its own process.

    ``build`` calls, in order: ``start()`` before it loads the tokenizer (``LocalExecutor`` spawns its workers
    then, so their start-up overlaps the load; a build that reuses a complete encode cache does not call it, and
    an executor starts what its first stage needs); ``submit(scan_chunks, ...)`` to scan the inputs during that
    load; ``load_encoder`` (by default: makes the encoder, then ``preload(encoder)``) as soon as it has the
    encoder, before it fingerprints the tokenizer (workers may load it meanwhile); ``encode``, then ``exchange``
    (builds of many shards; ``write_groups`` first), then ``write``; and ``close()`` when it ends, also on an
    error. An executor is also a context manager (``with LocalExecutor(2) as ex:`` starts and closes it).

    ``encode`` and ``write`` are generators: each runs its tasks wherever and in whatever order it likes and
    yields their results in task order, in the calling process; ``build`` closes it early on an error or
    Ctrl-C, and it then stops its workers. Tasks are independent and idempotent (each skips what is already
    committed), so running one twice is safe and the bytes never depend on the executor. ``encoder`` (the
    Encoder, ~8 MB pickled) and ``hooks`` must reach every process that runs a task, and the output
    directory (``config.output``, its work area included) must be one file system for all of them: a shared
    disk, or an object store (``s3://...``, shards/store.py) that every node reaches.
    """

    def start(self) -> None:  # noqa: B027 (optional: a no-op unless overridden)
        """Get ready to run tasks (spawn workers, join a cluster); by default nothing."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Callable[[], T]:
        """Start ``fn(*args, **kwargs)`` and return a function that waits for its result (or raises its
        error). By default nothing starts: ``fn`` runs in this process when its result is asked for."""
        return lambda: fn(*args, **kwargs)

    def preload(self, encoder: Encoder) -> None:  # noqa: B027 (optional: a no-op unless overridden)
        """Ship ``encoder`` to the workers ahead of the first encode task; by default nothing."""

    def load_encoder(self, config: BuildConfig, *, max_length: int | None) -> tuple[Encoder, dict[str, Any]]:
        """The build's encoder, preloaded (``preload``), and its tokenizer's ``output.tokenizer_record``: the
        encoder an earlier build kept under this build's key where there is one (``kept.encoder_entry``: the
        same entries and key a forked pool's build keeps and reads), else made (``_make_encoder``) and kept for
        the next build. A kept one costs no transformers import, no tokenizer load and no tables (~3 CPU-s for a
        151k vocabulary); it holds no transformers tokenizer (``Encoder.tokenizer`` is None, as in a worker).
        ``LocalExecutor`` overlaps the load with fastokens' native build where it forks its pool."""
        from packer.encode.tokenizers import loaded_tokenizer
        from packer.pipeline import kept

        if loaded_tokenizer(config.tokenizer_name()) is not None:  # loaded here already (a notebook's, a test's
            return self._make_encoder(config, max_length=max_length)  # process): made from it, nothing read
        found = kept.kept_encoder(config, max_length)
        if found.encoder is not None:
            self.preload(found.encoder)
            return found.encoder, found.record
        encoder, record = self._make_encoder(config, max_length=max_length)
        kept.keep_encoder(found, encoder, record)
        return encoder, record

    def _make_encoder(self, config: BuildConfig, *, max_length: int | None) -> tuple[Encoder, dict[str, Any]]:
        """``load_encoder`` without a kept encoder: made (``config.make_encoder``), preloaded, its record."""
        from packer.config import make_encoder
        from packer.pipeline.output import tokenizer_record

        encoder = make_encoder(config, max_length=max_length)
        self.preload(encoder)  # pickles it: its TokenizerView's to_str(), which the fingerprint reuses
        return encoder, tokenizer_record(encoder.tokenizer, encoder.profile, config.tokenizer_name(),
                                         encoder.context.tokens.json())

    def close(self) -> None:  # noqa: B027 (optional: a no-op unless overridden)
        """Stop what ``start`` (or a stage) started; by default nothing. Safe to call twice."""

    @abstractmethod
    def encode(
        self, chunks: Sequence[Chunk], *, encoder: Encoder, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[ChunkCounts, None, None]:
        """Encode each chunk (``stages.encode_chunk``); yield each chunk's counts in chunk order."""

    def exchange(
        self, tasks: Sequence[MapTask], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[tuple[int, ...], None, None]:
        """Run each map task of the exchange (``stages.exchange_map``); yield how many rows each wrote for each
        writer group, in task order. By default in this process (an executor that runs tasks elsewhere
        overrides it)."""
        from packer.pipeline.stages import exchange_map

        for task in tasks:
            yield exchange_map(task, cache=cache, hooks=hooks)

    def drop_copies(self, prefixes: Sequence[ObjectPath]) -> None:
        """Delete the copies of the objects under ``prefixes`` that tasks downloaded (``store.local_file``: the
        encode cache's chunks, the map outputs), once no task needs them: on every machine that ran one. By
        default this machine's (the build's and its pool's)."""
        from packer.shards.store import drop_mirrors

        drop_mirrors(prefixes)

    def write_groups(self, cache: EncodeCache, shards: int) -> int:
        """Into how many groups of consecutive shards the exchange splits its map outputs, each group's shards
        written on one machine (``stages.MapTask``): where the machines share no disk, each downloads only its
        groups' outputs. By default 1 (one machine, or a disk every machine shares)."""
        return 1

    def writes_here(self, examples: int, ranges: int) -> bool:
        """Will ``write`` run ``ranges`` shard ranges of ``examples`` planned examples in this process? Then
        the exchange may not pay (``stages.map_tasks``). By default no: an executor that writes here says so."""
        return False

    @abstractmethod
    def write(
        self, ranges: Sequence[ShardRange], *, cache: EncodeCache, config: BuildConfig, hooks: Hooks
    ) -> Generator[list[dict[str, Any]], None, None]:
        """Write each shard range (``stages.write_shard_range``); yield its manifest entries in range order."""

    def __enter__(self: E) -> E:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
