"""``packer build``: JSONL -> encoded examples -> global plan -> Parquet shards, resumable at every stage.

Stages (``stages.py``) and what each leaves in ``OUT/.packer`` (the work area):

1. scan    split every input file into chunks of lines (byte ranges); cheap, redone on every run. A streamed
           file (compressed, a JSON array, .txt, a tar: formats/files.py) is read once into chunk files
           ``inputs/NNNNN-JJJJJJ.jsonl``, which a resumed build reuses.
2. encode  each chunk -> ``encode/chunk-NNNNNN.arrow`` (EXAMPLE_SCHEMA) + ``.rejects.jsonl``, as executor
           tasks, each written atomically; a rerun skips chunks already encoded. Token data stays on disk.
3. plan    each chunk's lengths read as it lands into compact arrays (``columns.py``, ~4 bytes per example)
           -> ``packing.bulk.plan_bulk`` (or ``packing.plan`` for budgets) -> ``order`` / ``bounds``.
4. write   shard ranges as executor tasks: rows gathered chunk file by chunk file, each shard written
           atomically; a rerun skips shards whose marker (sha256) matches. A build of many shards first
           runs the exchange (``stages.map_tasks``): map tasks each read consecutive chunks once and write
           their rows in write order (``exchange/map-NNNNNN.arrow``), and the writers read one section of
           each map output instead of every chunk file; the map outputs are deleted once the shards are.
5. finish  rejects.jsonl, stats.json, README.md (a dataset card: ``datasets.load_dataset(OUT)`` works),
           then manifest.json LAST.

Everything is a pure function of (inputs, config, tokenizer, chat template), so an interrupted and resumed
build writes the same bytes as an uninterrupted one, whatever executor ran its tasks.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.compute as pc

from packer import __version__
from packer.config import BuildConfig, chat_template_source, make_encoder
from packer.core import arrays
from packer.core.media import medium
from packer.errors import ConfigError, RejectRateError, ShardError
from packer.models import get_profile
from packer.packing.budgets import FLAGS, limits_of
from packer.pipeline.cache import CACHE_FORMAT, ChunkCounts, EncodeCache
from packer.pipeline.card import write_card
from packer.pipeline.columns import ColumnsBuilder, ColumnsFile, chunk_table, read_chunk
from packer.pipeline.executor import Executor
from packer.pipeline.faults import Hooks
from packer.pipeline.local import LocalExecutor
from packer.pipeline.output import (
    build_fingerprint,
    encode_ceiling,
    encode_fingerprint,
    prepare_output,
    read_encode_mark,
    recorded_tokenizer,
    remove_stale_shards,
    reusable,
    tokenizer_record,
    write_encode_mark,
    write_rejects,
)
from packer.pipeline.stages import (
    Chunk,
    MapOutputs,
    Plan,
    ShardRanges,
    arrow_without_pandas,
    exchange_dir,
    map_tasks,
    plan_packs,
    progress_bar,
    scan_chunks,
    shard_ranges,
    streamed_inputs,
    warm_planner,
    writer_groups,
)
from packer.shards.io import shard_name, write_json_atomic, write_text_atomic
from packer.shards.schema import (
    MANIFEST,
    REJECTS,
    SCHEMA_VERSION,
    STATS,
    WORK_DIR,
    Manifest,
    ShardEntry,
    TokenizerRef,
    Totals,
)
from packer.shards.store import ObjectPath, remove_tree, store_path, write_atomic

if TYPE_CHECKING:  # the encoder's modules load where one is made (make_encoder): not in a repack, which encodes nothing
    from packer.encode.encoder import Encoder


@dataclass
class BuildResult:
    output: Path | ObjectPath
    manifest: dict[str, Any]
    stats: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # what the rejects suggest (reject_notes), for the CLI to print


def build(
    config: BuildConfig, *, progress: bool = True, executor: Executor | None = None, hooks: Hooks | None = None,
    trust_cache: bool = False,
) -> BuildResult:
    """Run the whole pipeline for ``config`` and return the manifest and stats.

    ``executor`` runs the encode and write tasks: an ``Executor`` (executor.py; default:
    ``make_executor(config)``), started here and closed when the build ends; ``hooks`` is called
    at the named points of ``faults.POINTS`` (default: no-ops; tests inject faults there).
    ``trust_cache``: an encode cache whose every chunk is committed is taken with the tokenizer its mark records,
    its files unchecked (``packer repack``, ``output.recorded_tokenizer``).
    """
    executor = executor if executor is not None else make_executor(config)
    if not isinstance(executor, Executor):
        raise TypeError(f"executor must be a packer.pipeline.executor.Executor (subclass it and define encode "
                        f"and write), not {type(executor).__qualname__}")
    hooks = hooks if hooks is not None else Hooks()
    try:  # _build starts it (now, or for a reused cache at its first stage); closed when the build ends
        return _build(config, executor=executor, hooks=hooks, progress=progress, trust_cache=trust_cache)
    finally:
        executor.close()


def _build(config: BuildConfig, *, executor: Executor, hooks: Hooks, progress: bool,
           trust_cache: bool = False) -> BuildResult:
    """``build`` once its executor is started."""
    from packer.encode.tokenizers import load_tokenizer
    from packer.formats.read import expand_inputs
    from packer.report.stats import compute_stats, format_stats

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = store_path(config.output, config.storage_options)
    inputs = sorted({p for s in config.sources for p in expand_inputs(s.paths)})
    # an encode cache whose every chunk is committed (a finished build, packer repack's copy) needs no scan when
    # this build may reuse it (the check below, once the tokenizer is loaded); else the scan runs after all
    prior = read_encode_mark(out / WORK_DIR)
    prior = prior if prior is not None and prior.get("chunks") is not None and prior.get("inputs") == inputs else None
    if prior is None:  # workers to encode: started before the tokenizer loads. A reused cache (a repack, a
        # rebuild with other packing options) encodes nothing: the executor starts at its first stage, where
        # LocalExecutor may find the write too small to pay for a pool (``local.POOL_MIN_EXAMPLES``)
        executor.start()
    streamed = streamed_inputs(config)
    # the scan runs on a worker while this process loads the tokenizer (Executor's default: here, after it);
    # streamed inputs (formats/files.py) are spilled into the work dir, so their scan waits for that dir
    scanned = None if streamed or prior is not None else executor.submit(scan_chunks, config, progress=progress)
    known = None  # the tokenizer as the prior cache's mark records it (``output.recorded_tokenizer``)
    record: dict[str, Any] | None = None
    if prior is None:
        encoder: Encoder | None
        encoder, record = executor.load_encoder(config, max_length=encode_ceiling(config))
        tokenizer, profile = encoder.tokenizer, encoder.profile  # tokenizer: None where the load ran elsewhere
    else:  # a reused cache needs no encoder (its tables take seconds to build), and no tokenizer where its mark
        # records it (the transformers import and the load: seconds, a repack's largest fixed cost): made below
        # if the cache cannot serve after all
        encoder = None
        known = recorded_tokenizer(prior, config.tokenizer_name(), trust=trust_cache)
        tokenizer = None if known is not None else load_tokenizer(config.tokenizer_name())
        profile = get_profile(config.profile, **config.profile_overrides())
    preloaded = encoder is not None
    if record is None:
        record = known if tokenizer is None else tokenizer_record(tokenizer, profile, config.tokenizer_name())
    tokenizer_fp = record["fingerprint"]
    template = chat_template_source(config)  # the template used: the config's, else the tokenizer's (as Encoder's)
    template_sha256 = (hashlib.sha256(template.encode()).hexdigest() if template is not None
                       else record["chat_template_sha256"])
    if scanned is not None:
        chunks = scanned()
        files = sorted({c.path for c in chunks})
    else:
        files = prior["files"] if prior is not None else inputs
    fingerprint = build_fingerprint(config, tokenizer_fp=tokenizer_fp, chat_template_sha256=template_sha256,
                                    files=files)
    encoding = (encode_fingerprint(config, tokenizer_fp=tokenizer_fp, chat_template_sha256=template_sha256,
                                   files=files), encode_ceiling(config))
    work = prepare_output(out, fingerprint, overwrite=config.overwrite, encoding=encoding)
    mark = read_encode_mark(work)
    if not reusable(mark, *encoding):  # a new cache (or one older than its mark, of this very build)
        mark = {"fingerprint": encoding[0], "keeps_up_to": encoding[1], "format": CACHE_FORMAT}
        write_encode_mark(work, mark)
    cache = EncodeCache(work / "encode", mark.get("chunks") or 0)
    complete = (prior is not None and mark.get("inputs") == inputs and mark.get("totals") is not None
                and all(cache.arrow(i).exists() for i in range(cache.num_chunks)))
    if complete:  # nothing to encode: every chunk of these inputs is in the cache
        files = mark["chunked"]
        arrow_without_pandas()  # only packer's own files are read from here on, here and in the workers
    else:
        ceiling = mark["keeps_up_to"] or config.max_length  # the cache keeps more than max_length: so does
        # what is encoded into it; an encoder made elsewhere (``load_encoder``) came without its tokenizer
        if tokenizer is None and (encoder is None or encoder.max_length != ceiling):
            tokenizer = load_tokenizer(config.tokenizer_name())  # the recorded one: the very tokenizer, or an error
            record = tokenizer_record(tokenizer, profile, config.tokenizer_name())
            if record["fingerprint"] != tokenizer_fp:
                raise ConfigError(f"{out}: the tokenizer {config.tokenizer_name()!r} changed since its encode cache "
                                  "was made, and the cache cannot serve this build: run `packer build`")
        if encoder is None or encoder.max_length != ceiling:
            encoder = make_encoder(config, tokenizer=tokenizer, max_length=ceiling)
            preloaded = False
        if not preloaded:
            executor.preload(encoder)
        fingerprinted = files
        if scanned is None:
            chunks = executor.submit(scan_chunks, config, progress=progress,
                                     spill=str((work / "inputs").resolve()))()
            files = sorted({c.path for c in chunks})
            if prior is not None and not streamed and files != fingerprinted:  # the prior cache's list, but a file emptied since
                fingerprinted = files
                fingerprint = build_fingerprint(config, tokenizer_fp=tokenizer_fp,
                                                chat_template_sha256=template_sha256, files=files)
                write_text_atomic(work / "fingerprint", fingerprint + "\n")
        cache = EncodeCache(work / "encode", len(chunks))
        cache.root.mkdir(exist_ok=True)

    # numba's kernels and the imports the plan needs load in a thread while this process waits on the workers
    warm = threading.Thread(target=warm_planner, args=(config,), name="warm-planner", daemon=True)
    warm.start()
    if complete:
        sources = mark.get("sources") or _chunk_sources(cache, config)
        totals, built = _cached(cache, ChunkCounts(*mark["totals"]), sources, config=config, progress=progress,
                                columns_size=mark.get("columns_bytes"))
    else:
        kept = ColumnsFile(cache.root) if isinstance(cache.root, Path) else None
        totals, built = _encode(executor, chunks, encoder=encoder, cache=cache, config=config, hooks=hooks,
                                progress=progress, kept=kept)
        sources = [c.source for c in chunks]
        write_encode_mark(work, {**mark, "chunks": len(chunks), "inputs": inputs, "files": fingerprinted,
                                 "chunked": files, "totals": [totals.records, totals.encoded, totals.rejected],
                                 "sources": sources, "tokenizer": record,
                                 "columns_bytes": kept.commit() if kept is not None else None})
        # ^ a rebuild with other packing options needs no scan, no encoder, no tokenizer, no count, and reads
        # one columns file
    columns = built.finish(sources)
    budget_rejected = columns.rejects
    rejected = totals.rejected + len(budget_rejected)
    if not totals.records:
        named = sorted({p for s in config.sources for p in expand_inputs(s.paths)})
        raise ConfigError(f"the inputs ({', '.join(named)}) hold no record: nothing to pack")
    if totals.records and (rejected / totals.records > config.max_reject_fraction
                           or columns.num_rows == len(columns.over)):
        notes = reject_notes(_encode_rejects(cache, config) + budget_rejected, files)
        if len(notes) < 2 and rejected < totals.records:
            notes = []  # a count without a hint about the file adds nothing to the rejects' own file
        why = (f"{rejected / totals.records:.1%} > --max-reject-fraction {config.max_reject_fraction}"
               if rejected < totals.records else "nothing to pack: a build of no example fails whatever "
               "--max-reject-fraction says")
        raise RejectRateError(
            f"{rejected} of {totals.records} input records were rejected ({why}); "
            + "".join(f"{n}; " for n in notes)
            + f"see {cache.root}/*.rejects.jsonl for the reasons, fix the input or the config"
        )
    _join_warm(warm, progress=progress)
    plan = plan_packs(columns, config)
    _save_plan(work, plan)
    hooks.at("plan")

    indexed = cache.indexed(columns.rows.tolist())
    ranges = _exchange(executor, plan, shard_ranges(plan, rows_per_shard=config.rows_per_shard), out=out,
                       cache=indexed, config=config, hooks=hooks, progress=progress)
    shard_entries = _write(executor, ranges, cache=indexed, config=config, hooks=hooks, progress=progress)
    del ranges
    remove_stale_shards(out, {e["file"] for e in shard_entries})
    if exchange_dir(cache).exists():  # the map outputs: a copy of the cache, needed by no later stage
        remove_tree(exchange_dir(cache))
    if isinstance(cache.root, ObjectPath):  # every machine's copies of the cache's objects (store.local_file)
        executor.drop_copies([cache.root, exchange_dir(cache)])

    rejects = sorted(_encode_rejects(cache, config) + budget_rejected, key=lambda r: (r["path"], r["line"]))
    write_rejects(out / REJECTS, rejects)
    hooks.at("rejects")
    names = [s.name for s in config.sources]
    stats = compute_stats(
        **plan.stats_columns(names), packs=(plan.order, plan.bounds), capacity=config.max_length,
        input_records=totals.records,
        rejects=rejects, image_units=_image_units(cache, plan, profile),
        video=plan.planned(columns.count("num_video_tokens")), videos=_budgeted_counts(plan, config, "video"),
        **_audio_stats(cache, plan),
    )
    write_json_atomic(out / STATS, stats)
    write_card(out, title=out.resolve().name, packer_version=__version__, profile=config.profile,
               tokenizer=config.tokenizer_name(), max_length=config.max_length,
               stats_table=format_stats(stats), num_rows=int(len(plan.pack_sizes)), shards=shard_entries,
               trl_exact=_all_rows_linear_text(plan, profile))
    hooks.at("manifest")
    manifest = manifest_dict(
        config=config, fingerprint=fingerprint, token_ids=record["token_ids"], tokenizer_fp=tokenizer_fp,
        chat_template_sha256=template_sha256, inputs=files, input_records=totals.records, rejected=len(rejects),
        plan=plan, stats=stats, shards=shard_entries,
    )
    write_json_atomic(out / MANIFEST, manifest)  # last: its presence means the build is complete
    return BuildResult(output=out, manifest=manifest, stats=stats, notes=reject_notes(rejects, files))


def reject_notes(rejects: list[dict[str, Any]], files: list[str]) -> list[str]:
    """What to tell a user whose rejects are mostly one reason: that reason's count, and a hint for each
    file it hit whose bytes look like another kind than its name says (``files.sniff``: an array, gzip bytes
    under a plain name, plain text). Empty when no reason holds half the rejects."""
    from collections import Counter

    from packer.formats.files import sniff

    if not rejects:
        return []
    (reason, count), = Counter(r["reason"] for r in rejects).most_common(1)
    if count * 2 < len(rejects):
        return []
    notes = [f"{count} of the {len(rejects)} rejects are {reason!r}"]
    hit = sorted({r["path"] for r in rejects if r["reason"] == reason})
    for path in hit[:5]:
        hint = sniff(path) if os.path.isfile(path) else None
        if hint:
            notes.append(hint)
    return notes


def _all_rows_linear_text(plan: Plan, profile: Any) -> bool:
    """Does every packed row get ``seq_lengths`` (shards.assemble._seq_lengths): no mRoPE, and every planned example
    one node with no medium (image, video, audio) or loss weight? Then the card's view is the one TRL's padding-free
    path trains exactly. Read from the compact columns' per-row flag (``columns.read_chunk``)."""
    if profile.positions.mrope:
        return False
    linear = plan.planned(plan.columns.linear)
    return bool(linear is None or linear.all())


def make_executor(config: BuildConfig) -> Executor:
    """The executor ``config.executor`` names: ``LocalExecutor(config.num_proc)`` or a ``RayExecutor`` on
    ``config.ray_address`` (Ray is imported only here, and only then)."""
    if config.executor == "ray":
        from packer.pipeline.ray_executor import RayExecutor

        return RayExecutor(config.ray_address)
    return LocalExecutor(config.num_proc)


def manifest_dict(
    *, config: BuildConfig, fingerprint: str, token_ids: dict[str, int | None], tokenizer_fp: str,
    chat_template_sha256: str, inputs: list[str], input_records: int, rejected: int, plan: Plan,
    stats: dict[str, Any], shards: list[dict[str, Any]],
) -> dict[str, Any]:
    """The manifest of a finished build (docs/format.md), as ``manifest.json`` holds it (``token_ids``: the
    profile's image, video and audio tokens' ids in the build's tokenizer, ``output.tokenizer_record``'s)."""
    return Manifest(
        schema_version=SCHEMA_VERSION,
        packer_version=__version__,
        fingerprint=fingerprint,
        config=config,
        profile=config.profile,
        tokenizer=TokenizerRef(name=config.tokenizer_name(), fingerprint=tokenizer_fp),
        chat_template_sha256=chat_template_sha256,
        inputs=tuple(inputs),
        base_dir=os.getcwd(),  # relative input paths (and example ids) resolve here (packer verify --input)
        image_token_id=token_ids["image"],
        video_token_id=token_ids["video"],
        audio_token_id=token_ids["audio"],
        totals=Totals(
            input_records=input_records,
            rejected=rejected,
            rejects_by_reason=stats["rejects_by_reason"],
            examples=plan.num_examples,
            packs=int(len(plan.pack_sizes)),
            tokens=stats["tokens"],  # the planned examples' sums, as the stats made them (no per-example copy)
            loss_tokens=stats["loss_tokens"],
            vision_tokens=stats["vision_tokens"],
        ),
        shards=tuple(ShardEntry(**entry) for entry in shards),
    ).to_dict()


def _encode(
    executor: Executor, chunks: list[Chunk], *, encoder: Encoder, cache: EncodeCache, config: BuildConfig, hooks: Hooks,
    progress: bool, kept: ColumnsFile | None = None,
) -> tuple[ChunkCounts, ColumnsBuilder]:
    """Run the encode tasks; return the totals over all chunks and each chunk's compact columns
    (``columns.read_chunk``), read as it lands: this process is idle while the workers encode, so the plan
    does not wait on a pass over every chunk file. ``kept``: where each chunk's ``chunk_table`` is also
    written (committed by the caller once the mark can name it)."""
    records = encoded = rejected = 0
    parts = ColumnsBuilder(sum(c.num_lines for c in chunks))  # rows <= lines but for split texts
    # counted in input lines (what users know their files by), advanced a chunk at a time
    with progress_bar(total=sum(c.num_lines for c in chunks), enabled=progress, desc="encode", unit="line",
                      unit_scale=True) as bar, \
            closing(executor.encode(chunks, encoder=encoder, cache=cache, config=config, hooks=hooks)) as results, \
            _discarded_on_error(kept):
        for done, counts in enumerate(results, start=1):
            records, encoded, rejected = records + counts.records, encoded + counts.encoded, rejected + counts.rejected
            chunk = chunks[done - 1]
            table = chunk_table(cache, chunk.index)
            if kept is not None:
                kept.write(table)
            parts.add(read_chunk(cache, chunk.index, config, chunk.source, table))
            bar.update(chunks[done - 1].num_lines)
            bar.set_postfix(examples=encoded, rejects=rejected, refresh=False)
            hooks.at("encode", done)
    return ChunkCounts(records=records, encoded=encoded, rejected=rejected), parts


@contextmanager
def _discarded_on_error(kept: ColumnsFile | None) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if kept is not None:
            kept.discard()
        raise


def _cached(cache: EncodeCache, totals: ChunkCounts, sources: list[str], *, config: BuildConfig,
            progress: bool, columns_size: int | None = None) -> tuple[ChunkCounts, ColumnsBuilder]:
    """``_encode``'s result for a cache whose every chunk is committed (a repack, a rebuild with other packing
    options): ``totals`` as the encode mark holds them, each chunk's compact columns read here as ``_encode``
    reads them (``columns.read_chunk``; ``sources``: each chunk's) from the cache's ``ColumnsFile`` of
    ``columns_size`` bytes (the mark's), else from every chunk's file (a cache older than that file); no task
    runs."""
    parts = ColumnsBuilder(totals.encoded)
    kept = ColumnsFile(cache.root) if isinstance(cache.root, Path) and columns_size else None
    table = kept.reader(cache.num_chunks, columns_size) if kept is not None else None
    for i in progress_bar(range(cache.num_chunks), enabled=progress, desc="cached", unit="chunk"):
        parts.add(read_chunk(cache, i, config, sources[i], None if table is None else table(i)))
    if parts.n != totals.encoded:
        raise ShardError(f"{cache.root} holds {parts.n} examples, its mark "
                         f"{totals.encoded}: the encode cache is corrupt; delete {cache.root} and rerun")
    return totals, parts


def _chunk_sources(cache: EncodeCache, config: BuildConfig) -> list[str]:
    """Each cached chunk's source, for an encode mark written before it kept them: read from the chunk's first
    row (every file belongs to one source); an empty chunk is counted as the first source's."""
    sources = []
    for i in range(cache.num_chunks):
        names = cache.read(i, ("source_name",)).column("source_name")
        sources.append(names[0].as_py() if len(names) else config.sources[0].name)
    return sources


WARM_NOTICE_S = 2.0
"""How long the plan waits on the warm-planner thread before saying why: loading cached kernels takes ~1 s, and
numba compiling them (a first build with this packer install or these options) ~1 min (docs/benchmarks.md, "A
first build: numba compiles the kernels")."""


def _join_warm(warm: threading.Thread, *, progress: bool) -> None:
    """Wait for ``warm_planner``; past ``WARM_NOTICE_S`` a bar says that the wait is numba's kernels, not a hang."""
    warm.join(WARM_NOTICE_S)
    if warm.is_alive():
        with progress_bar(total=1, enabled=progress, desc="kernels (numba compiles them once per install)",
                          unit="wait") as bar:
            warm.join()
            bar.update(1)


_OVERLONG = re.compile(r"([0-9]+) tokens > --max-length [0-9]+")  # Encoder._finish's message under overlong: drop


def _encode_rejects(cache: EncodeCache, config: BuildConfig) -> list[dict[str, Any]]:
    """The cache's rejects, each ``overlong`` one told against this build's ``max_length``: a cache kept up to
    more (``--keep-up-to``, a repack) names its own ceiling, and a build's rejects must not depend on it."""
    rejects = cache.rejects()
    for r in rejects:
        found = _OVERLONG.fullmatch(r["message"]) if r["reason"] == "overlong" else None
        if found:
            r["message"] = f"{found.group(1)} tokens > --max-length {config.max_length}"
    return rejects


def _write(
    executor: Executor, ranges: ShardRanges, *, cache: EncodeCache, config: BuildConfig, hooks: Hooks,
    progress: bool,
) -> list[dict[str, Any]]:
    """Run the write tasks; return every shard's manifest entry, in shard order. Each range is made as its
    task is sent (``ShardRanges``), never all at once."""
    entries = []
    with progress_bar(total=len(ranges.plan.bounds) - 1, enabled=progress, desc="write", unit="pack") as bar, \
            closing(executor.write(ranges, cache=cache, config=config, hooks=hooks)) as results:
        for s, written in enumerate(results):
            entries.extend(written)
            bar.update(ranges.num_packs(s))
    if len(entries) != len(ranges):
        raise RuntimeError(f"the write stage returned {len(entries)} shards of {len(ranges)}")
    return entries


def _exchange(
    executor: Executor, plan: Plan, ranges: ShardRanges, *, out: Path | ObjectPath, cache: EncodeCache,
    config: BuildConfig, hooks: Hooks, progress: bool,
) -> ShardRanges:
    """Run the exchange's map tasks where the build has many shards (``stages.map_tasks``) and return the
    ranges with where their rows are in the map outputs; ``ranges`` as they are where it does not run, or
    where every shard is already written (a resumed build whose writers will only check their markers)."""
    markers = out / WORK_DIR / "shards"
    total = len(ranges)  # one range per shard
    if all((markers / f"{s:05d}.json").exists() and (out / shard_name(s)).exists() for s in range(total)):
        return ranges
    here = executor.writes_here(plan.num_examples, len(ranges))
    if here and len(ranges) > 1:  # this process visits each file once per shard: its layout is kept
        ranges = replace(ranges, remember=True)
    groups = 1 if here else executor.write_groups(cache, total)
    found = map_tasks(plan, cache.starts, rows_per_shard=config.rows_per_shard, one_process=here, groups=groups)
    if found is None:
        return ranges
    tasks, positions = found
    first = writer_groups(total, groups)
    out_starts = np.zeros((len(first) - 1, len(tasks) + 1), dtype=np.int64)  # (G, M + 1) each group's outputs
    with progress_bar(total=len(tasks), enabled=progress, desc="exchange", unit="map") as bar, \
            closing(executor.exchange(tasks, cache=cache, config=config, hooks=hooks)) as results:
        for i, written in enumerate(results):
            out_starts[:, i + 1] = out_starts[:, i] + written
            bar.update(1)
    cache_starts = cache.starts[[t.first_chunk for t in tasks] + [cache.num_chunks]]
    del tasks, positions  # the write positions (4 bytes per example): the writers need only the sections
    return replace(ranges, exchange=MapOutputs(exchange_dir(cache), cache_starts, out_starts, first))


def _save_plan(work: Path | ObjectPath, plan: Plan) -> None:
    """``plan.npz``: the plan as the writers read it (``order``, ``bounds``, and ``counts``, each cache row's
    copies, where sources were sampled or rows left out), for inspection; nothing reads it back. Written from a
    buffer, not a copy of it."""
    import io

    arrays = {"order": plan.order, "bounds": plan.bounds}
    if plan.sampled is not None:
        arrays["counts"] = plan.sampled.counts
    if isinstance(work, ObjectPath):
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        write_atomic(work / "plan.npz", buf.getvalue())  # bytes: an object store takes no memoryview
        return
    # a local file is written straight from the arrays: a buffer and its bytes would be two more copies of
    # ``order`` (8 bytes per example at the driver's peak)
    tmp = work / f"plan.npz.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, work / "plan.npz")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _budgeted_counts(plan: Plan, config: BuildConfig, name: str) -> np.ndarray | None:
    """(n,) items of medium ``name`` per planned example where ``config`` budgets them (stats then report
    them per pack), else None."""
    j = FLAGS.index(medium(name).count_budget)
    if limits_of(config)[j] is None:
        return None
    counts = plan.cost(j)
    return np.zeros(plan.num_examples, dtype=np.uint8) if counts is None else counts


def _audio_stats(cache: Any, plan: Plan) -> dict[str, np.ndarray]:
    """Audio tokens, seconds and clips per planned example for ``compute_stats`` (the seconds read from the
    encode cache's audio entries: samples / rate); nothing for a build without a clip."""
    clips = plan.columns.count("num_audios")
    if clips is None:
        return {}
    audios = cache.open(("audios",)).column("audios").combine_chunks()
    structs = audios.flatten()
    seconds = (structs.field("num_samples").to_numpy(zero_copy_only=False).astype(np.float64)
               / structs.field("sample_rate").to_numpy(zero_copy_only=False))
    counts = pc.list_value_length(audios).to_numpy(zero_copy_only=False).astype(np.int64)
    per_example = np.bincount(np.repeat(np.arange(len(counts)), counts), weights=seconds, minlength=len(counts))
    tokens = plan.columns.count("num_audio_tokens")
    return {"audio": plan.planned(tokens if tokens is not None else np.zeros(len(clips), np.int64)),
            "audio_seconds": plan.planned(per_example), "audios": plan.planned(clips)}


def _image_units(cache: Any, plan: Plan, profile: Any) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(unit name, units per planned example, units per planned image) of the profile's ``image_units``, read
    from the encode cache's image grids (an up-sampled example counts once per copy); None if it has none."""
    import pyarrow.compute as pc

    if profile.image is None or profile.image.units(np.zeros((0, 3), dtype=np.int64)) is None \
            or plan.columns.count("num_images") is None:
        return None  # the family counts no units: the images column is not read
    images = cache.open(("images",)).column("images").combine_chunks()  # list<struct> per cached example
    structs = images.flatten()
    grids = np.stack([structs.field(f).to_numpy(zero_copy_only=False) for f in ("grid_t", "grid_h", "grid_w")],
                     axis=1).astype(np.int64).reshape(-1, 3)  # (I, 3) every cached image
    units = profile.image.units(grids)
    if units is None:
        return None
    name, per_image = units
    index = np.arange(len(images)) if plan.sampled is None else plan.sampled.index()
    counts = pc.list_value_length(images).to_numpy(zero_copy_only=False).astype(np.int64)  # (E,) images each
    starts = np.concatenate([[0], np.cumsum(counts)])
    per_example = np.add.reduceat(np.append(per_image, 0), starts[:-1])  # (E,); 0 where an example has none
    per_example[counts == 0] = 0
    planned = counts[index]
    picked = arrays.spans(starts[index], planned)
    return name, per_example[index], per_image[picked]

