"""``packer build``: JSONL -> encoded examples -> global plan -> Parquet shards, resumable at every stage.

Stages and what each leaves in ``OUT/.packer`` (the work area):

1. scan    split every input file into chunks of lines (byte ranges); cheap, redone on every run.
2. encode  each chunk -> ``encode/chunk-NNNNNN.arrow`` (EXAMPLE_SCHEMA) + ``.rejects.jsonl``, in parallel,
           each written atomically; a rerun skips chunks already encoded. Token data stays on disk.
3. plan    lengths only (memory-mapped columns) -> ``packing.plan`` -> pack id per example.
4. write   shards gathered from the memory-mapped cache with Arrow ``take``, one at a time, atomically;
           a rerun skips shards whose marker (sha256) matches.
5. finish  rejects.jsonl, stats.json, then manifest.json LAST.

Everything is a pure function of (inputs, config, tokenizer), so an interrupted and resumed build writes
the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer import __version__
from packer.config import BuildConfig
from packer.errors import REJECT_REASONS, ConfigError, PackerError, RecordError
from packer.shards.assemble import assemble_packs, encoded_table
from packer.shards.io import sha256_file, shard_name, write_json_atomic, write_shard
from packer.shards.schema import EXAMPLE_SCHEMA, I32_LIST, MANIFEST, REJECTS, SCHEMA_VERSION, STATS, WORK_DIR

CHUNK_LINES = 512  # lines per encode task: small enough to resume finely, large enough to amortize IPC
# Test-only crash hook (docs/reliability.md): "STAGE:N[:SIGNAL]" sends SIGNAL (KILL, INT, STOP; default KILL) to
# the build at a named point, so tests can interrupt it deterministically. Stages: encode:N (N chunks done), encode-partial:N
# (chunk N's rejects written, its .arrow not), plan:0, shard-partial:N (shard N's temp file half written),
# shard:N (shard N renamed, its marker not written), rejects:0, manifest:0 (everything but the manifest).
CRASH_ENV = "PACKER_CRASH_AFTER"
_BUILD_PID_ENV = "_PACKER_BUILD_PID"  # the main build process, for a crash point reached in a worker


class RejectRateError(PackerError):
    """More of the input was rejected than --max-reject-fraction allows."""


@dataclass(frozen=True)
class Chunk:
    """A contiguous range of lines of one input file."""

    index: int
    path: str
    source: str
    start: int  # byte offset
    end: int  # byte offset (exclusive)
    first_line: int  # 1-based number of the first line
    num_lines: int = CHUNK_LINES  # lines in the chunk (blank ones included)


@dataclass
class BuildResult:
    output: Path
    manifest: dict[str, Any]
    stats: dict[str, Any]


def crash_point(stage: str, n: int = 0) -> None:
    """Interrupt the build here if ``$PACKER_CRASH_AFTER`` names this point (test-only; a no-op otherwise)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    name, _, rest = spec.partition(":")
    count, _, sig = rest.partition(":")
    if name != stage or int(count or 0) != n:
        return
    signum = getattr(signal, f"SIG{sig or 'KILL'}")  # STOP: freeze here, for a test to signal the group
    main = int(os.environ.get(_BUILD_PID_ENV, os.getpid()))
    os.kill(main, signum)  # a worker takes the whole build down, as a kill -9 of the command would
    if main != os.getpid() and signum == signal.SIGKILL:
        os.kill(os.getpid(), signal.SIGKILL)


def _progress(iterable=None, *, enabled: bool, **kw):
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, dynamic_ncols=True, **kw)


# ---------------------------------------------------------------------------------------------- scan
def scan_chunks(config: BuildConfig, *, progress: bool = False) -> list[Chunk]:
    """Split every input file into chunks of ``CHUNK_LINES`` lines, in source / file order."""
    from packer.formats.records import expand_inputs

    chunks: list[Chunk] = []
    seen: set[str] = set()
    for source in config.sources:
        for path in expand_inputs(source.paths):
            if path in seen:
                raise ConfigError(f"{path} is named by two sources; each file may belong to one source only")
            seen.add(path)
            size = os.path.getsize(path)
            with open(path, "rb") as f, _progress(
                total=size, enabled=progress, unit="B", unit_scale=True, desc=f"scan {Path(path).name}", leave=False
            ) as bar:
                start, line_no, lines = 0, 1, 0
                pos = 0
                for raw in f:
                    pos += len(raw)
                    lines += 1
                    if lines == CHUNK_LINES:
                        chunks.append(Chunk(len(chunks), path, source.name, start, pos, line_no))
                        bar.update(pos - start)
                        start, line_no, lines = pos, line_no + CHUNK_LINES, 0
                if lines:
                    chunks.append(Chunk(len(chunks), path, source.name, start, pos, line_no, lines))
                    bar.update(pos - start)
    return chunks


# -------------------------------------------------------------------------------------------- encode
_WORKER: dict[str, Any] = {}


def _renderer(config: BuildConfig):
    """One Encoder per process and config (tokenizer loading is the expensive part); a pool worker gets the
    parent's, pickled (see ``_worker_init``)."""
    if _WORKER.get("config") != config:
        from packer.encode.encoder import Encoder
        from packer.encode.tokenizers import load_tokenizer
        from packer.models import get_profile

        profile = get_profile(config.profile, **config.profile_overrides())
        tokenizer = load_tokenizer(config.tokenizer or profile.default_tokenizer)
        template = config.chat_template
        if template and Path(template).is_file():
            template = Path(template).read_text()
        _WORKER.update(
            config=config,
            renderer=Encoder(
                tokenizer, profile, max_length=config.max_length, overlong=config.overlong, chat_template=template
            ),
        )
    return _WORKER["renderer"]


def _read_chunk_lines(chunk: Chunk) -> Iterator[tuple[int, bytes]]:
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        data = f.read(chunk.end - chunk.start)
    lines = data.split(b"\n")  # the same rule the scan counted lines by (not splitlines: \r is no break)
    if lines and lines[-1] == b"":
        lines.pop()
    for i, raw in enumerate(lines):
        yield chunk.first_line + i, raw


def _reject_record(err: RecordError, source: str) -> dict[str, Any]:
    return {"path": err.path, "line": err.line, "reason": err.reason, "message": err.message, "source": source}


def encode_chunk(chunk: Chunk, config: BuildConfig, work: str) -> dict[str, Any]:
    """Encode one chunk into the cache; return its counts. Idempotent: a finished chunk is not redone."""
    from packer.formats.records import parse_line

    out = Path(work) / "encode" / f"chunk-{chunk.index:06d}.arrow"
    rej = out.with_suffix(".rejects.jsonl")
    if out.exists() and rej.exists():
        return _chunk_counts(out, rej)
    renderer = _renderer(config)
    base_dir = os.path.dirname(os.path.abspath(chunk.path))
    parsed: list[Any] = []  # Example or RecordError, in line order
    for line_no, raw in _read_chunk_lines(chunk):
        if not raw.strip():
            continue  # blank lines are not records
        try:
            parsed.append(parse_line(
                raw, path=chunk.path, line=line_no, base_dir=base_dir, image_root=config.image_root,
                source_name=chunk.source,
            ))
        except RecordError as e:
            parsed.append(e if e.path else e.located(chunk.path, line_no))
    # One tokenizer call for the whole chunk: ~1.8x cheaper than one call per record (Encoder.encode_batch).
    results = iter(renderer.encode_batch([p for p in parsed if not isinstance(p, RecordError)]))
    encoded, rejects = [], []
    for p in parsed:
        result = p if isinstance(p, RecordError) else next(results)
        if isinstance(result, RecordError):
            if config.strict:
                raise result
            rejects.append(_reject_record(result, chunk.source))
        else:
            result.source_name = chunk.source
            encoded.append(result)
    lines = len(parsed)
    table = encoded_table(encoded)
    tmp_rej = rej.with_name(rej.name + f".tmp-{os.getpid()}")
    tmp_rej.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rejects))
    os.replace(tmp_rej, rej)
    crash_point("encode-partial", chunk.index)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, EXAMPLE_SCHEMA) as writer:
        writer.write_table(table)
    os.replace(tmp, out)  # the .arrow file is the chunk's commit marker: rejects are already in place
    return {"records": lines, "encoded": table.num_rows, "rejected": len(rejects)}


def _chunk_counts(arrow_path: Path, rejects_path: Path) -> dict[str, Any]:
    with pa.memory_map(str(arrow_path)) as src:
        n = ipc.open_file(src).read_all().num_rows
    r = sum(1 for _ in open(rejects_path, "rb"))
    return {"records": n + r, "encoded": n, "rejected": r}


def _encode_task(args: tuple[Chunk, BuildConfig, str]) -> dict[str, Any]:
    return encode_chunk(*args)  # under --strict a RecordError propagates (it pickles) to the parent


def encode_all(chunks: list[Chunk], config: BuildConfig, work: Path, *, progress: bool) -> dict[str, int]:
    """Encode every chunk (in parallel with ``num_proc``), in order; return the totals."""
    (work / "encode").mkdir(parents=True, exist_ok=True)
    totals = {"records": 0, "encoded": 0, "rejected": 0}
    tasks = [(c, config, str(work)) for c in chunks]
    # counted in input lines (what users know their files by), advanced a chunk at a time
    bar = _progress(total=sum(c.num_lines for c in chunks), enabled=progress, desc="encode", unit="line",
                    unit_scale=True)
    pool = None
    # Workers load the parent's Encoder from this file (Rust tokenizer only, 8 MB): ~0.5 s each, against
    # ~5 s to import transformers and load the tokenizer in every worker. A file, not initargs: spawn writes
    # initargs through a pipe the child drains only after its imports, so workers would start one by one.
    blob = work / f"renderer.pkl.tmp-{os.getpid()}"
    try:
        if config.num_proc == 1 or len(chunks) <= 1:
            results: Iterator[dict[str, Any]] = map(_encode_task, tasks)
        else:
            import multiprocessing as mp
            import pickle

            blob.write_bytes(pickle.dumps(_renderer(config), protocol=pickle.HIGHEST_PROTOCOL))
            # spawn, not fork: the parent may hold tokenizer threads and locks that fork would copy mid-state.
            pool = mp.get_context("spawn").Pool(config.num_proc, initializer=_worker_init, initargs=(config, str(blob)))
            results = pool.imap(_encode_task, tasks, chunksize=1)
        for done, counts in enumerate(results, start=1):
            for k in totals:
                totals[k] += counts[k]
            bar.update(chunks[done - 1].num_lines)
            bar.set_postfix(examples=totals["encoded"], rejects=totals["rejected"], refresh=False)
            crash_point("encode", done)
        if pool is not None:
            pool.close()
            pool.join()
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    finally:
        bar.close()
        blob.unlink(missing_ok=True)
    return totals


def _worker_init(config: BuildConfig, renderer_file: str) -> None:
    import pickle

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER.update(config=config, renderer=pickle.loads(Path(renderer_file).read_bytes()))
    # Ctrl-C reaches the whole process group: the parent alone handles it (terminates the pool, exit 130),
    # so workers do not print a KeyboardInterrupt traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def open_encoded(work: Path, num_chunks: int) -> pa.Table:
    """The whole encode cache as one memory-mapped table (token data is not read into memory)."""
    tables = []
    for i in range(num_chunks):
        src = pa.memory_map(str(work / "encode" / f"chunk-{i:06d}.arrow"))
        tables.append(ipc.open_file(src).read_all())
    if not tables:
        return EXAMPLE_SCHEMA.empty_table()
    return pa.concat_tables(tables)


# ---------------------------------------------------------------------------------------------- plan
def sample_sources(sources: np.ndarray, config: BuildConfig) -> tuple[np.ndarray, np.ndarray]:
    """Apply source weights: (example index, copy number) per planned example, deterministic in the seed.

    Weight w keeps floor(w) copies of every example plus a seeded (w - floor(w)) fraction once more.
    """
    rng = np.random.default_rng([config.seed, 1])  # its own stream: independent of the pack shuffle
    index_parts, copy_parts = [], []
    for s in config.sources:
        idx = np.flatnonzero(sources == s.name)
        whole, frac = int(np.floor(s.weight)), s.weight - np.floor(s.weight)
        for k in range(whole):
            index_parts.append(idx)
            copy_parts.append(np.full(len(idx), k))
        if frac > 0 and len(idx):
            extra = np.sort(rng.choice(idx, size=int(round(frac * len(idx))), replace=False))
            index_parts.append(extra)
            copy_parts.append(np.full(len(extra), whole))
    if not index_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    index = np.concatenate(index_parts).astype(np.int64)
    copies = np.concatenate(copy_parts).astype(np.int64)
    order = np.lexsort((copies, index))  # input order, copies of one example together
    return index[order], copies[order]


def separate_copies(
    index: np.ndarray, pack_ids: np.ndarray, lengths: np.ndarray, vision: np.ndarray, images: np.ndarray,
    config: BuildConfig, *, max_tries: int = 4096,
) -> np.ndarray:
    """Move up-sampled copies out of their original's pack by swapping with another pack's example.

    Best-fit stacks equal lengths into one bin, so an example's copies (same length) land together: the
    same sequence twice in one row. Each swap keeps both packs within capacity and budgets, so the pack
    count and every budget hold; a conflict with no feasible partner within ``max_tries`` stays.
    """
    pack_ids = pack_ids.copy()
    num_packs = int(pack_ids.max()) + 1
    key = index * num_packs + pack_ids  # (n,) equal keys: the same example twice in one pack
    by_key = np.argsort(key, kind="stable")
    dup = by_key[1:][key[by_key[1:]] == key[by_key[:-1]]]
    if not len(dup):
        return pack_ids
    load = np.bincount(pack_ids, weights=lengths, minlength=num_packs).astype(np.int64)
    vload = np.bincount(pack_ids, weights=vision, minlength=num_packs).astype(np.int64)
    iload = np.bincount(pack_ids, weights=images, minlength=num_packs).astype(np.int64)
    members: dict[int, dict[int, int]] = {}  # pack -> example index -> copies in it
    for pk, ex in zip(pack_ids.tolist(), index.tolist(), strict=True):
        m = members.setdefault(pk, {})
        m[ex] = m.get(ex, 0) + 1
    vcap = config.max_vision_tokens if config.max_vision_tokens is not None else np.iinfo(np.int64).max
    icap = config.max_images if config.max_images is not None else np.iinfo(np.int64).max
    cap = config.max_length
    candidates = np.random.default_rng([config.seed, 2]).permutation(len(index)).tolist()
    cursor = 0
    for p in dup.tolist():
        a, ea = int(pack_ids[p]), int(index[p])
        for _ in range(min(max_tries, len(candidates))):
            q = candidates[cursor]
            cursor = (cursor + 1) % len(candidates)
            b, eb = int(pack_ids[q]), int(index[q])
            if a == b or eb in members[a] or ea in members[b]:
                continue
            dl, dv, di = int(lengths[q] - lengths[p]), int(vision[q] - vision[p]), int(images[q] - images[p])
            if (load[a] + dl > cap or load[b] - dl > cap or vload[a] + dv > vcap or vload[b] - dv > vcap
                    or iload[a] + di > icap or iload[b] - di > icap):
                continue
            pack_ids[p], pack_ids[q] = b, a
            load[a] += dl
            load[b] -= dl
            vload[a] += dv
            vload[b] -= dv
            iload[a] += di
            iload[b] -= di
            for pk, old_ex, new_ex in ((a, ea, eb), (b, eb, ea)):
                m = members[pk]
                m[old_ex] -= 1
                if not m[old_ex]:
                    del m[old_ex]
                m[new_ex] = m.get(new_ex, 0) + 1
            break
    return pack_ids


def budget_rejects(table: pa.Table, config: BuildConfig) -> np.ndarray:
    """Examples that can never fit a pack's vision budget (reported as `overlong`)."""
    bad = np.zeros(table.num_rows, dtype=bool)
    if config.max_vision_tokens is not None:
        bad |= table.column("num_vision_tokens").to_numpy() > config.max_vision_tokens
    if config.max_images is not None:
        bad |= table.column("num_images").to_numpy() > config.max_images
    return bad


# --------------------------------------------------------------------------------------------- build
def build_fingerprint(config: BuildConfig, tokenizer_fp: str, files: list[str]) -> str:
    """sha256 of what determines the output: config (less run-time knobs), tokenizer, input files."""
    cfg = config.to_dict()
    for k in ("output", "num_proc", "overwrite", "strict", "max_reject_fraction"):
        cfg.pop(k)
    h = hashlib.sha256()
    # CHUNK_LINES: the encode cache is indexed by chunk, so a cache of another chunking must not be reused.
    h.update(json.dumps({"config": cfg, "schema": SCHEMA_VERSION, "packer": __version__, "chunk_lines": CHUNK_LINES},
                        sort_keys=True).encode())
    h.update(tokenizer_fp.encode())
    for f in files:
        st = os.stat(f)
        h.update(f"{os.path.abspath(f)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def prepare_output(out: Path, fingerprint: str, *, overwrite: bool) -> Path:
    """Create or reuse the output directory; refuse to mix with a different build unless ``overwrite``."""
    work = out / WORK_DIR
    marker = work / "fingerprint"
    if out.exists() and any(out.iterdir()) and not _only_empty_work_dir(out, work):
        same = marker.exists() and marker.read_text().strip() == fingerprint
        if not same:
            if not overwrite and ((out / MANIFEST).exists() or work.exists()):
                raise ConfigError(
                    f"{out} holds a different packer build; pass --overwrite to replace it or choose another --output"
                )
            if not overwrite:
                raise ConfigError(f"{out} is not empty; pass --overwrite to replace its contents")
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            if (out / MANIFEST).exists():
                (out / MANIFEST).unlink()  # rebuilding in place: the old manifest must not vouch for new shards
            remove_stale_temp_files(out)
    elif work.is_dir():
        remove_stale_temp_files(out)  # a fingerprint.tmp-PID of a build killed at its very start
    work.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f"fingerprint.tmp-{os.getpid()}")
    tmp.write_text(fingerprint + "\n")
    os.replace(tmp, marker)  # atomic: a half-written fingerprint would read as "a different build"
    return work


def _only_empty_work_dir(out: Path, work: Path) -> bool:
    """True for what a build killed between creating its work dir and writing the fingerprint leaves."""
    return ([p.name for p in out.iterdir()] == [WORK_DIR] and work.is_dir()
            and all(".tmp-" in p.name for p in work.iterdir()))


def remove_stale_temp_files(out: Path) -> list[Path]:
    """Delete the ``*.tmp-PID`` files an interrupted run of this build left (half-written shards, chunks, JSON).

    Every writer writes ``NAME.tmp-PID`` and renames it; a temp name is never a finished file, so removing
    them loses nothing. (Two builds writing one directory at once are not supported.)
    """
    stale = []
    for d in (out, out / WORK_DIR, out / WORK_DIR / "encode", out / WORK_DIR / "shards"):
        if d.is_dir():
            stale.extend(p for p in d.glob("*.tmp-*") if p.is_file())
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def build(config: BuildConfig, *, progress: bool = True) -> BuildResult:
    """Run the whole pipeline for ``config`` and return the manifest and stats."""
    from packer.encode.tokenizers import fingerprint as tokenizer_fingerprint
    from packer.encode.tokenizers import load_tokenizer
    from packer.models import get_profile
    from packer.packing.planner import plan
    from packer.report.stats import compute_stats

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    profile = get_profile(config.profile, **config.profile_overrides())
    tokenizer = load_tokenizer(config.tokenizer or profile.default_tokenizer)
    tok_fp = tokenizer_fingerprint(tokenizer)
    out = Path(config.output)
    chunks = scan_chunks(config, progress=progress)
    files = sorted({c.path for c in chunks})
    fp = build_fingerprint(config, tok_fp, files)
    work = prepare_output(out, fp, overwrite=config.overwrite)

    if os.environ.get(CRASH_ENV):
        os.environ[_BUILD_PID_ENV] = str(os.getpid())  # spawned workers inherit it (crash_point)
    totals = encode_all(chunks, config, work, progress=progress)
    table = open_encoded(work, len(chunks))

    # Examples that can never fit the vision budget are rejected here (they were encoded fine).
    over_budget = budget_rejects(table, config)
    extra_rejects = []
    for i in np.flatnonzero(over_budget):
        ex_id = table.column("example_id")[int(i)].as_py()
        path, _, line = ex_id.rpartition(":")
        extra_rejects.append(
            {"path": path, "line": int(line), "reason": "overlong", "source": table.column("source_name")[int(i)].as_py(),
             "message": f"{table.column('num_vision_tokens')[int(i)].as_py()} vision tokens / "
             f"{table.column('num_images')[int(i)].as_py()} images exceed --max-vision-tokens / --max-images"}
        )
    rejected = totals["rejected"] + len(extra_rejects)
    if totals["records"] and rejected / totals["records"] > config.max_reject_fraction:
        raise RejectRateError(
            f"{rejected} of {totals['records']} input records were rejected "
            f"({rejected / totals['records']:.1%} > --max-reject-fraction {config.max_reject_fraction}); "
            f"see {work / 'encode'}/*.rejects.jsonl for the reasons, fix the input or the config"
        )
    sources = np.asarray(table.column("source_name").to_numpy(zero_copy_only=False), dtype=object)
    index, copies = sample_sources(sources, config)
    keep = ~over_budget[index]
    index, copies = index[keep], copies[keep]

    lengths = table.column("num_tokens").to_numpy().astype(np.int64)[index]
    vision = table.column("num_vision_tokens").to_numpy().astype(np.int64)[index]
    images = table.column("num_images").to_numpy().astype(np.int64)[index]
    pack_ids = plan(
        lengths, config.max_length, algorithm=config.algorithm,
        vision=vision if config.max_vision_tokens or config.balance_vision else None,
        vision_budget=config.max_vision_tokens,
        images=images if config.max_images else None, max_images=config.max_images,
        max_examples=config.max_examples_per_pack, balance_vision=config.balance_vision,
        refine=config.refine, seed=config.seed,
    )
    if copies.any():
        pack_ids = separate_copies(index, pack_ids, lengths, vision, images, config)
    order = np.argsort(pack_ids, kind="stable")  # examples grouped pack by pack, input order inside a pack
    pack_sizes = np.bincount(pack_ids, minlength=int(pack_ids.max()) + 1 if len(pack_ids) else 0)
    np.save(work / "plan.npy", np.stack([index, copies, pack_ids]))
    crash_point("plan")

    shard_entries = write_shards(table, index[order], copies[order], pack_sizes, config, work, out, progress=progress,
                                 num_chunks=len(chunks))

    rejects = _gather_rejects(work, len(chunks), extra_rejects)
    write_rejects(out / REJECTS, rejects)
    crash_point("rejects")
    stats = compute_stats(
        lengths=lengths, vision=vision, pack_ids=pack_ids, capacity=config.max_length,
        loss_tokens=table.column("num_loss_tokens").to_numpy().astype(np.int64)[index],
        sources=sources[index], input_records=totals["records"], rejects=rejects,
    )
    write_json_atomic(out / STATS, stats)
    crash_point("manifest")
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "packer_version": __version__,
        "fingerprint": fp,
        "config": config.to_dict(),
        "profile": config.profile,
        "tokenizer": {"name": config.tokenizer or profile.default_tokenizer, "fingerprint": tok_fp},
        "chat_template_sha256": hashlib.sha256(str(tokenizer.chat_template or "").encode()).hexdigest(),
        "inputs": files,
        "base_dir": os.getcwd(),  # relative input paths (and example ids) resolve here (packer verify --input)
        "image_token_id": tokenizer.convert_tokens_to_ids(profile.image_token) if profile.image_token else None,
        "totals": {
            "input_records": totals["records"],
            "rejected": len(rejects),
            "rejects_by_reason": stats["rejects_by_reason"],
            "examples": int(len(index)),
            "packs": int(len(pack_sizes)),
            "tokens": int(lengths.sum()),
            "loss_tokens": stats["loss_tokens"],
            "vision_tokens": int(vision.sum()),
        },
        "shards": shard_entries,
    }
    write_json_atomic(out / MANIFEST, manifest)  # last: its presence means the build is complete
    return BuildResult(output=out, manifest=manifest, stats=stats)


def _chunk_starts(work: Path, num_chunks: int) -> np.ndarray:
    """(num_chunks + 1,) index of each encode chunk's first example in the whole cache, then the total."""
    rows = []
    for i in range(num_chunks):
        with pa.memory_map(str(work / "encode" / f"chunk-{i:06d}.arrow")) as src:
            reader = ipc.open_file(src)
            rows.append(sum(reader.get_batch(b).num_rows for b in range(reader.num_record_batches)))
    return np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])


_INT_LISTS = ("input_ids", "labels", "position_ids", "mrope_position_ids", "node_offsets", "node_parents")


def _take_rows(work: Path, starts: np.ndarray, sel: np.ndarray) -> pa.Table:
    """``open_encoded(...).take(sel)``, reading from each chunk file only the rows ``sel`` names.

    pyarrow's take on the whole memory-mapped table first concatenates entire columns (measured: a 5% take
    of the 50k-record bench cache touched all 381 MB), so every shard cost the whole cache, and the touched
    pages stayed mapped: peak RSS grew with the corpus. Here the token lists are copied with numpy straight
    from one mapped chunk file at a time into one array per column (a first pass reads only the offsets),
    so memory is the shard plus one chunk file; the small columns use pyarrow's take per chunk.
    """
    n = sel.shape[0]
    chunk = np.searchsorted(starts, sel, side="right") - 1  # (n,) chunk of each selected example
    order = np.argsort(chunk, kind="stable")  # selected examples grouped by chunk
    bounds = np.searchsorted(chunk[order], np.arange(starts.shape[0]))
    used = np.flatnonzero(bounds[1:] > bounds[:-1]).tolist()
    local = {c: sel[order[bounds[c] : bounds[c + 1]]] - starts[c] for c in used}  # rows to read, per chunk
    dest = {c: order[bounds[c] : bounds[c + 1]] for c in used}  # where they go in the output
    small = [f.name for f in EXAMPLE_SCHEMA if f.name not in _INT_LISTS]

    def read(c: int) -> pa.Table:
        with pa.memory_map(str(work / "encode" / f"chunk-{c:06d}.arrow")) as src:
            return ipc.open_file(src).read_all().combine_chunks()  # zero-copy views of the mapping

    # pass 1: the small columns, each list's length, and which list columns are null (no mRoPE)
    parts, lengths, nulls = [], {name: np.empty(n, dtype=np.int64) for name in _INT_LISTS}, dict.fromkeys(_INT_LISTS, 0)
    for c in used:
        table = read(c)
        parts.append(table.select(small).take(pa.array(local[c])))
        for name in _INT_LISTS:
            arr = table.column(name).chunk(0)
            nulls[name] += arr.null_count
            offsets = arr.offsets.to_numpy()
            lengths[name][dest[c]] = offsets[local[c] + 1] - offsets[local[c]]
        del table  # unmapped here: only one chunk file is mapped at a time
    inverse = np.empty_like(order)
    inverse[order] = np.arange(n)  # back from chunk order to ``sel`` order
    empty = pa.schema([EXAMPLE_SCHEMA.field(f) for f in small]).empty_table()
    grouped = pa.concat_tables(parts).combine_chunks() if parts else empty
    columns = dict(zip(small, grouped.take(pa.array(inverse)).columns, strict=True))
    dense = [name for name in _INT_LISTS if nulls[name] == 0]
    for name in _INT_LISTS:
        if nulls[name] == n:
            columns[name] = pa.nulls(n, I32_LIST)  # mRoPE positions of a non-mRoPE build
        elif nulls[name]:  # some null, some not: never written by one build; take it the slow way
            columns[name] = pa.concat_tables([read(c).select([name]).take(pa.array(local[c])) for c in used]
                                             ).column(0).take(pa.array(inverse))
    # pass 2: copy the token lists, one slice per example (~1 us each, cheaper than per-token index arrays)
    out_offsets = {name: np.concatenate([[0], np.cumsum(lengths[name])]) for name in dense}
    values = {name: np.empty(int(out_offsets[name][-1]), dtype=np.int32) for name in dense}
    for c in used:
        table = read(c)
        for name in dense:
            arr = table.column(name).chunk(0)
            src, offsets, out = arr.values.to_numpy(zero_copy_only=True), arr.offsets.to_numpy(), values[name]
            begin, end = offsets[local[c]].tolist(), offsets[local[c] + 1].tolist()
            for a, b, d in zip(begin, end, out_offsets[name][dest[c]].tolist(), strict=True):
                out[d : d + b - a] = src[a:b]
        del table
    for name in dense:
        columns[name] = pa.ListArray.from_arrays(pa.array(out_offsets[name].astype(np.int32)), pa.array(values[name]))
    return pa.Table.from_arrays([columns[f.name] for f in EXAMPLE_SCHEMA], schema=EXAMPLE_SCHEMA)


def write_shards(
    table: pa.Table, example_order: np.ndarray, copies: np.ndarray, pack_sizes: np.ndarray,
    config: BuildConfig, work: Path, out: Path, *, progress: bool, num_chunks: int | None = None,
) -> list[dict[str, Any]]:
    """Gather and write every shard; reuse shards a previous run of the same build finished.

    With ``num_chunks`` the rows are read chunk file by chunk file (``_take_rows``), else from ``table``.
    """
    starts = _chunk_starts(work, num_chunks) if num_chunks is not None else None
    pack_bounds = np.concatenate([[0], np.cumsum(pack_sizes)])
    num_packs = len(pack_sizes)
    num_shards = -(-num_packs // config.rows_per_shard)
    markers = work / "shards"
    markers.mkdir(exist_ok=True)
    entries = []
    bar = _progress(total=num_packs, enabled=progress, desc="write", unit="pack")
    for s in range(num_shards):
        p0, p1 = s * config.rows_per_shard, min(num_packs, (s + 1) * config.rows_per_shard)
        path = out / shard_name(s)
        marker = markers / f"{s:05d}.json"
        if marker.exists() and path.exists():
            entry = json.loads(marker.read_text())
            if sha256_file(path) == entry["sha256"]:
                entries.append(entry)
                bar.update(p1 - p0)
                continue
        sel = example_order[pack_bounds[p0] : pack_bounds[p1]]
        rows = table.take(pa.array(sel)) if starts is None else _take_rows(work, starts, sel)
        dup = copies[pack_bounds[p0] : pack_bounds[p1]]
        if dup.any():  # up-sampled copies get unique ids: path:line#k
            ids = rows.column("example_id").to_pylist()
            ids = [i if k == 0 else f"{i}#{k}" for i, k in zip(ids, dup.tolist(), strict=True)]
            rows = rows.set_column(rows.schema.get_field_index("example_id"), "example_id", pa.array(ids, pa.string()))
        packed = assemble_packs(rows, pack_sizes[p0:p1])
        if os.environ.get(CRASH_ENV) == f"shard-partial:{s}":
            _leave_partial_shard(packed, path, config)
        entry = write_shard(packed, path, rows_per_row_group=config.rows_per_row_group)
        crash_point("shard", s)
        write_json_atomic(marker, entry)
        entries.append(entry)
        bar.update(p1 - p0)
    bar.close()
    for stale in out.glob("shard-*.parquet"):  # shards of an earlier, larger plan of this same directory
        if stale.name not in {e["file"] for e in entries}:
            stale.unlink()
    return entries


def _leave_partial_shard(packed: pa.Table, path: Path, config: BuildConfig) -> None:
    """Test-only (``shard-partial:N``): leave on disk what a kill in the middle of writing shard N leaves, a
    half-written ``NAME.tmp-PID``, then die. (A real mid-write kill cannot be timed deterministically.)"""
    scratch = path.with_name(f"{path.name}.scratch")
    write_shard(packed, scratch, rows_per_row_group=config.rows_per_row_group)
    data = scratch.read_bytes()
    scratch.unlink()
    path.with_name(f"{path.name}.tmp-{os.getpid()}").write_bytes(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


def _gather_rejects(work: Path, num_chunks: int, extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rejects = []
    for i in range(num_chunks):
        with open(work / "encode" / f"chunk-{i:06d}.rejects.jsonl") as f:
            rejects.extend(json.loads(line) for line in f)
    rejects.extend(extra)
    rejects.sort(key=lambda r: (r["path"], r["line"]))
    for r in rejects:
        assert r["reason"] in REJECT_REASONS, r
    return rejects


def write_rejects(path: Path, rejects: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        for r in rejects:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, path)
