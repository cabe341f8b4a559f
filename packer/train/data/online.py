"""On-the-fly packing in the DataLoader: ``OnlinePackedDataset`` reads raw JSONL and yields packed rows.

For users who do not want an offline step. Each stream (one per rank x DataLoader worker) reads its share of
the lines, renders and tokenizes them with the build's ``Encoder`` (same formats, profiles, budgets and
rejects as ``packer build``), and packs a bounded pool with ``packing.stream.pack_stream`` (the offline
planner, run on ``pool_size`` examples at a time). Rows have exactly the keys and arrays of
``PackedDataset`` rows (they are assembled by ``shards.assemble``), so ``collate`` works unchanged.

    epoch order of lines:  [c3: l2 l0 l1] [c0: l1 l0 l2] [c2: ...] ...   chunks of CHUNK_LINES, (seed, epoch)
    stream s of S = world_size x num_workers takes positions s, s + S, s + 2S, ...   (s = rank x K + worker)
    stream:  lines -> parse -> encode (batches) -> pool -> plan -> packs -> rows

Measured on 20k mixed chat/image records (scripts/bench_online.py, docs/benchmarks.md): 99.855% efficiency at
pool 1,000 and 99.969% at 10,000, against 99.969% for the offline build; ~57 rows/s per worker. Every epoch
encodes again.

Exact resume: pack_stream is deterministic, so a row is named by (round r, packs of r yielded so far) plus
the pool that round r planned (stream positions and ages, at most ``pool_size``). Resuming re-encodes that
pool, re-plans round r, skips the packs already yielded and reads on after the pool's last line: the rows
are those of the uninterrupted run, none twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.config import BuildConfig, make_encoder
from packer.core.ids import id_location
from packer.core.types import Encoded
from packer.errors import ConfigError, RecordError
from packer.formats.files import is_streamed
from packer.formats.read import expand_inputs, parse_line
from packer.formats.tables import is_table
from packer.packing.budgets import FLAGS, budget_message, encoded_costs, limits_of
from packer.packing.stream import pack_stream
from packer.shards.assemble import assemble_packs, encoded_table
from packer.train.data.dataset import _decode_block, _row

CHUNK_LINES = 512  # shuffle granularity: chunks are permuted, then lines within a chunk (reads stay local)
STATE_VERSION = 1
STATE_KEYS = ("kind", "seed", "shuffle", "rank", "world_size", "pool_size", "num_lines")


@dataclass(frozen=True)
class LineChunk:
    """CHUNK_LINES consecutive lines of one input file (byte range)."""

    path: str
    source: str
    start: int
    end: int
    first_line: int  # 1-based
    num_lines: int


def scan_lines(config: BuildConfig) -> list[LineChunk]:
    """Every input file of ``config`` cut into chunks of CHUNK_LINES lines (split at b"\\n", as the build)."""
    chunks: list[LineChunk] = []
    for source in config.sources:
        for path in expand_inputs(source.paths):
            if is_table(path):
                raise ConfigError(f"{path} is a table: online packing reads JSONL; build tables with `packer build`")
            if is_streamed(path):  # byte ranges of an array or a compressed file are not records
                raise ConfigError(f"{path} is a JSON array, compressed, .txt or a tar (docs/format.md, \"Input "
                                  "files\"): online packing reads plain JSONL; build it with `packer build`")
            with open(path, "rb") as f:
                start = pos = lines = 0
                for raw in f:
                    pos += len(raw)
                    lines += 1
                    if lines % CHUNK_LINES == 0:
                        chunks.append(LineChunk(path, source.name, start, pos, lines - CHUNK_LINES + 1, CHUNK_LINES))
                        start = pos
                if lines % CHUNK_LINES:
                    chunks.append(LineChunk(path, source.name, start, pos, lines - lines % CHUNK_LINES + 1,
                                            lines % CHUNK_LINES))
    return chunks


class OnlinePackedDataset(IterableDataset):
    """Raw JSONL packed on the fly, as a torch ``IterableDataset`` with ``PackedDataset``'s row contract.

    Args:
        inputs: a ``BuildConfig`` (profile, tokenizer, max_length, budgets, chat template, overlong...; its
            ``output`` is not used), or JSONL paths/globs with ``options`` as BuildConfig fields.
        rank, world_size: this process's data-parallel rank and the number of ranks.
        pool_size: examples planned together per stream (memory: that many encoded examples per worker).
        shuffle: a new deterministic line order each epoch from (seed, epoch); False reads lines in order.
        seed: the line-order seed (the packs' seed is the config's ``seed``).
        load_images: decode images in ``collate`` (False leaves only their metadata).
        rejects_path: append every rejected line here as JSONL (path, line, reason, message, source,
            epoch), from every worker; lines read again after a resume may appear twice.
        encode_batch: lines parsed and tokenized per tokenizer call.
        min_fill, max_wait: ``pack_stream``'s (a pack at least this full goes out; a held-back example
            waits at most this many rounds).

    Every line is read by one stream per epoch; ranks may differ by a few rows per epoch (each stream packs
    its own lines), so under DDP wrap the loader in ``packer.train.data.join.EqualSteps``. Source weights other than 1
    are refused (sampling needs the whole input: use ``packer build``). In the process that iterates,
    ``rejects`` counts rejects by reason (with workers, read ``rejects_path``).
    """

    def __init__(
        self,
        inputs: BuildConfig | str | Sequence[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        pool_size: int = 1000,
        shuffle: bool = True,
        seed: int = 0,
        load_images: bool = True,
        rejects_path: str | Path | None = None,
        encode_batch: int = 64,
        min_fill: float = 0.99,
        max_wait: int = 8,
        **options: Any,
    ):
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        if isinstance(inputs, BuildConfig):
            if options:
                raise ConfigError(f"give options in the BuildConfig, not as keywords: {sorted(options)}")
            config = inputs
        else:
            config = BuildConfig.from_inputs([inputs] if isinstance(inputs, str) else list(inputs), output="",
                                             **options)
        weighted = [s.name for s in config.sources if s.weight != 1.0]
        if weighted:
            raise ConfigError(f"sources {weighted} have a weight other than 1: online packing reads each line once "
                              "per epoch; up/down-sample with `packer build` instead")
        if pool_size < 1:
            raise ConfigError(f"'pool_size' must be a positive integer, got {pool_size}")
        self.config = config
        self.rank, self.world_size, self.pool_size = rank, world_size, pool_size
        self.shuffle, self.seed, self.encode_batch = shuffle, seed, encode_batch
        self.min_fill, self.max_wait = min_fill, max_wait
        self.rejects_path = None if rejects_path is None else os.path.abspath(rejects_path)
        self.encoder = make_encoder(config)  # pickles without the transformers wrapper (Encoder.__getstate__)
        self.chunks = scan_lines(config)
        self.num_lines = sum(c.num_lines for c in self.chunks)
        self.profile_options = config.profile_overrides()  # as PackedDataset reads them from the manifest
        self._row_context = {"profile": config.profile, "profile_options": self.profile_options,
                             "load_images": load_images}
        self.epoch = 0
        self.rejects: dict[str, int] = {}
        """Rejected lines by reason, counted in the process that iterates (the main one without workers)."""
        self.progress = OnlineProgress()

    # ------------------------------------------------------------------------------------ epoch order
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose line order is read next (as with DistributedSampler.set_epoch)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.progress = OnlineProgress()

    def _chunk_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.chunks))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.chunks))

    def _inner(self, epoch: int, chunk: int) -> np.ndarray:
        """Line order inside a chunk; its own seed, so any chunk's order is known without the others'."""
        n = self.chunks[chunk].num_lines
        return np.random.default_rng([self.seed, epoch, chunk]).permutation(n) if self.shuffle else np.arange(n)

    def _read_chunk(self, chunk: int) -> list[bytes]:
        c = self.chunks[chunk]
        with open(c.path, "rb") as f:
            f.seek(c.start)
            lines = f.read(c.end - c.start).split(b"\n")  # the rule the scan counted lines by
        return lines[: c.num_lines]

    def stream_lines(self, epoch: int, stream: int, num_streams: int, start: int = 0, stop: int | None = None
                     ) -> Iterator[tuple[int, LineChunk, int, bytes]]:
        """(stream position j, chunk, 1-based line, bytes) of a stream's lines from position ``start``.

        Stream position j is epoch-order position ``stream + j * num_streams``.
        """
        order = self._chunk_order(epoch)
        sizes = np.array([self.chunks[c].num_lines for c in order], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        p0 = stream + start * num_streams
        p1 = self.num_lines if stop is None else min(self.num_lines, stream + stop * num_streams)
        for k in range(int(np.searchsorted(bounds, p0, side="right")) - 1, len(order)):
            a, b = int(bounds[k]), int(bounds[k + 1])
            if a >= p1:
                return
            first = max(a, p0)
            first += (stream - first) % num_streams  # the first position of this stream in the chunk
            if first >= min(b, p1):
                continue
            c = int(order[k])
            lines, inner, chunk = self._read_chunk(c), self._inner(epoch, c), self.chunks[c]
            for p in range(first, min(b, p1), num_streams):
                i = int(inner[p - a])
                yield (p - stream) // num_streams, chunk, chunk.first_line + i, lines[i]

    # ------------------------------------------------------------------------------------ encoding
    def _encoded(self, lines: Iterator[tuple[int, LineChunk, int, bytes]], epoch: int
                 ) -> Iterator[tuple[tuple[int, int], Encoded]]:
        """Lines -> ((stream position, k), Encoded), rejects recorded; ``encode_batch`` lines per tokenizer
        call. k numbers the examples of one line (a long document split by ``long_docs``), else 0."""
        batch: list[tuple[int, LineChunk, int, bytes]] = []
        for item in lines:
            batch.append(item)
            if len(batch) == self.encode_batch:
                yield from self._encode_lines(batch, epoch)
                batch = []
        yield from self._encode_lines(batch, epoch)

    def _encode_lines(self, batch: list[tuple[int, LineChunk, int, bytes]], epoch: int
                      ) -> list[tuple[tuple[int, int], Encoded]]:
        parsed: list[tuple[int, str, Any]] = []  # (position, source, Example or RecordError)
        for j, chunk, line, raw in batch:
            if not raw.strip():
                continue  # blank lines are not records
            try:
                ex = parse_line(raw, path=chunk.path, line=line, base_dir=os.path.dirname(os.path.abspath(chunk.path)),
                                source_name=chunk.source, **self.config.record_options(chunk.source))
            except RecordError as e:
                ex = e if e.path else e.located(chunk.path, line)
            parsed.append((j, chunk.source, ex))
        results = iter(self.encoder.encode_batch([p for _, _, p in parsed if not isinstance(p, RecordError)]))
        out = []
        cfg = self.config
        for j, source, p in parsed:
            result = p if isinstance(p, RecordError) else next(results)
            for k, one in enumerate(result if isinstance(result, list) else [result]):  # a split document: chunks
                if not isinstance(one, RecordError):
                    one.source_name = source
                    message = over_budget(one, cfg)
                    if message is not None:
                        path, line = id_location(one.example_id)
                        one = RecordError("overlong", message, path=path, line=line)
                if isinstance(one, RecordError):
                    if cfg.strict:
                        raise one
                    self._reject(one, source, epoch)
                else:
                    out.append(((j, k), one))
        return out

    def _reject(self, err: RecordError, source: str, epoch: int) -> None:
        self.rejects[err.reason] = self.rejects.get(err.reason, 0) + 1
        if self.rejects_path is not None:
            record = {"path": err.path, "line": err.line, "reason": err.reason, "message": err.message,
                      "source": source, "epoch": epoch}
            fd = os.open(self.rejects_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:  # one write of one line with O_APPEND: workers' lines do not interleave
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)

    def _reencode(self, epoch: int, stream: int, num_streams: int, keys: list[tuple[int, int]]
                  ) -> list[tuple[tuple[int, int], Encoded]]:
        """The pool of a saved round, encoded again (its lines encoded fine before: they do again)."""
        lines_wanted = {j for j, _ in keys}
        lines = [x for x in self.stream_lines(epoch, stream, num_streams, min(lines_wanted), max(lines_wanted) + 1)
                 if x[0] in lines_wanted]
        got = dict(self._encode_lines(lines, epoch))
        if not set(keys) <= set(got):
            raise ValueError("the input changed since the state was saved: a pooled line no longer encodes")
        return [(key, got[key]) for key in keys]

    # ------------------------------------------------------------------------------------ state
    def _header(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "kind": "online", "seed": self.seed, "shuffle": self.shuffle,
                "rank": self.rank, "world_size": self.world_size, "pool_size": self.pool_size,
                "num_lines": self.num_lines, "epoch": self.epoch}

    def state_dict(self) -> dict[str, Any]:
        """Resumable position: per stream, the round its last delivered row came from (the pool that round
        planned) and how many of that round's packs were delivered.

        In the main process, what ``ResumableLoader`` (or the in-process iteration) has delivered; inside a
        DataLoader worker (torchdata's StatefulDataLoader calls it there), that worker's own stream.
        """
        info = get_worker_info()
        p = self.progress
        streams = {str(w): _plain(st) for w, st in p.streams.items() if info is None or w == info.id}
        num_workers = p.num_workers if info is None else info.num_workers
        return {**self._header(), "num_workers": num_workers, "streams": streams}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next pass yields exactly the rows not yet delivered."""
        if state.get("version") != STATE_VERSION or state.get("kind") != "online":
            raise ValueError("not a state of OnlinePackedDataset (or of another packer version)")
        header = self._header()
        for key in STATE_KEYS:
            if state[key] != header[key]:
                raise ValueError(f"state was saved with {key}={state[key]!r}, this dataset has {header[key]!r}; "
                                 "resume with the same inputs, seed, shuffle, rank, world size and pool size")
        self.epoch = int(state["epoch"])
        self.progress = OnlineProgress()
        self.progress.load(state)

    def update(self, batch: dict[str, Any]) -> None:
        """Record that the training loop received ``batch`` (``ResumableLoader`` calls this for you)."""
        self.progress.update(batch.get("packer_state", ()), self.epoch)

    # ------------------------------------------------------------------------------------ reading
    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch
        num_streams = self.world_size * num_workers
        stream = self.rank * num_workers + worker
        saved = self.progress.begin(worker, num_workers)
        cfg = self.config
        snap: dict[str, Any] = {}

        def on_round(rnd: int, pool: list[tuple[tuple[int, int], Encoded]], ages: list[int]) -> None:
            # (3, n) line positions, example of the line, ages: a compact copy per round, carried by its rows
            snap.update(round=rnd, pool=np.array([[j for (j, _), _ in pool], [k for (_, k), _ in pool], ages],
                                                 dtype=np.int64).reshape(3, -1), count=0)

        resume, last, skip = None, (-1, -1), 0
        if saved is not None:
            positions, ks, ages = np.asarray(saved["pool"], dtype=np.int64).reshape(3, -1).tolist()
            keys = list(zip(positions, ks, strict=True))
            resume = (saved["round"], self._reencode(epoch, stream, num_streams, keys), ages)
            last, skip = keys[-1], saved["count"]  # the pool's last example is the last one read
        # read on after it: from its line, whose later chunks (a split document) may not be read yet
        examples = (t for t in self._encoded(self.stream_lines(epoch, stream, num_streams, max(last[0], 0)), epoch)
                    if t[0] > last)
        packs = pack_stream(
            examples, capacity=cfg.max_length, pool_size=self.pool_size, length=lambda t: t[1].num_tokens,
            # every clip counts, a video's own sound track too (the build's num_audios is len(audios))
            costs=lambda t: encoded_costs(t[1]), limits=limits_of(cfg), names=FLAGS,
            max_examples=cfg.max_examples_per_pack,
            algorithm=cfg.algorithm, refine=cfg.refine, seed=cfg.seed, min_fill=self.min_fill,
            max_wait=self.max_wait, on_round=on_round, resume=resume,
        )
        for pack in packs:
            snap["count"] += 1
            if resume is not None and snap["round"] == resume[0] and snap["count"] <= skip:
                continue  # delivered before the checkpoint
            row = self._assemble([e for _, e in pack])
            state = {"epoch": epoch, "worker": worker, "num_workers": num_workers, "round": snap["round"],
                     "pool": snap["pool"], "count": snap["count"]}
            self.progress.streams[worker] = state  # before the yield: a state taken with this row counts it
            row["_state"] = state
            yield row

    def _assemble(self, examples: list[Encoded]) -> dict[str, Any]:
        """One pack -> a row exactly as ``PackedDataset`` yields it (same assembly, same decoding)."""
        table = assemble_packs(encoded_table(examples), np.array([len(examples)], dtype=np.int64),
                               dense_mrope=True)
        row = _row(_decode_block(table), 0)
        row["is_filler"] = False  # ranks are evened out per batch (train/join.py), not per row
        row.update(self._row_context)
        return row


def over_budget(example: Encoded, config: BuildConfig) -> str | None:
    """Why ``example`` can never fit a pack's vision or audio budget (``packing.budgets.budget_message``, the
    build's words; reported as ``overlong``); None if it fits them all."""
    return budget_message(config, encoded_costs(example))


def _plain(state: dict[str, Any]) -> dict[str, Any]:
    """A stream state with its pool as nested lists (JSON-serialisable)."""
    return {**state, "pool": np.asarray(state["pool"]).tolist()}


class OnlineProgress:
    """Per worker stream, the state of the last row delivered (``OnlinePackedDataset.state_dict``)."""

    def __init__(self):
        self.streams: dict[int, dict[str, Any]] = {}  # worker -> {round, pool, count, ...} of its last row
        self.num_workers: int | None = None
        self.pending: dict[int, dict[str, Any]] | None = None  # a loaded state, applied by the next pass

    def load(self, state: dict[str, Any]) -> None:
        self.num_workers = state["num_workers"]
        self.streams = {int(w): st for w, st in state["streams"].items()}
        self.pending = dict(self.streams)

    def begin(self, worker: int, num_workers: int) -> dict[str, Any] | None:
        """The saved state this worker's stream resumes from (None: from the start of the epoch)."""
        if self.pending is None:
            self.streams.pop(worker, None)
            return None
        if self.num_workers is not None and self.pending and self.num_workers != num_workers:
            raise ValueError(f"a state saved with {self.num_workers} workers cannot resume with {num_workers}: "
                             "lines are dealt to rank x worker streams; use the same num_workers")
        saved = self.pending.get(worker)
        self.pending = None
        return saved

    def update(self, states, epoch: int) -> None:
        for st in states:
            if st["epoch"] != epoch:
                continue
            self.pending = None  # the workers have applied it
            self.num_workers = st["num_workers"]
            old = self.streams.get(st["worker"])
            if old is None or (old["round"], old["count"]) < (st["round"], st["count"]):
                self.streams[st["worker"]] = st

    def new_pass(self) -> None:
        """A new iteration of the loader: from the loaded state if not applied yet, else from the start."""
        if self.pending is None:
            self.streams = {}

