"""Build throughput: `packer build --num-proc N` end to end vs the tokenizer alone, on the same records;
with `--executor local ray`, the Ray executor on a local Ray of N CPUs against the local executor too.

The corpus is synthetic but realistic: English text assembled from COCO captions (real sentences, so BPE
sees real words), lognormal conversation lengths, 1-4 turns, ~30% of records with a real COCO image,
~10% caption trees. The baseline renders the same records with the chat template and batch-encodes them
with the tokenizer in N processes (what any pipeline must do at minimum). Text tokens are compared
(vision tokens are the build's extra output, not tokenizer work). Peak RSS (and PSS: shared pages once) and
CPU seconds are the whole process tree's (a local Ray's processes included).

    python scripts/bench_build.py --records 200000 --num-proc 2
    python scripts/bench_build.py --records 50000 --rss-only
    python scripts/bench_build.py --records 20000 --num-proc 2 --rss-only --budgets   # the budgeted planner
    python scripts/bench_build.py --records 50000 --num-proc 2 --executor local ray --rss-only
    python scripts/bench_build.py --ray-tasks 20000   # what one Ray task costs the driver
    python scripts/bench_build.py --records 200000 --rss-only --input-format jsonl array zst   # issue 30
    python scripts/bench_build.py --records 50000 --profile qwen3-vl   # another family's template and tokenizer
    python scripts/bench_build.py --records 50000 --base ../before --rounds 3   # before / after, alternated
    python scripts/bench_build.py --records 50000 --rss-only --breakdown   # CPU by process and phase
    python scripts/bench_build.py --records 200000 --shape text --profile text --rss-only   # tiny text records
    python scripts/bench_build.py --records 50000 --profile gemma3 --profile-option do_pan_and_scan=true
    python scripts/bench_build.py --records 50000 --profile text --shape text-chat --decomposed 0.01 --rss-only

``--base DIR``: another checkout (``git archive REV | tar -x -C DIR``) built beside this one, the two alternated
for ``--rounds`` pairs in fresh output directories, each tree warmed once on 3,000 records first (numba's cache;
each tree has its own ``PACKER_CACHE``, so the encoder its warm-up keeps is the one its rounds find);
medians of CPU-s, shards identical (``--schema-change``: a base of an older shard schema, the rows this tree's
reader reads from both identical); the ratios below are printed for both. ``--kept-miss``: each round's build
first loses its tree's kept encoder entries (``*.encoder``; fastokens' string stays): the helper's way
(``LocalExecutor.load_encoder``), as a build after a packer update or an option change takes it.

``--profile-option KEY=VALUE`` (repeatable): the builds' ``profile_options``, as ``packer build``'s flag of that
name reads them (Gemma 3's ``do_pan_and_scan=true``). Each build's child reads them from the environment
(``BENCH_BUILD_PROFILE_OPTIONS``), so a ``--base`` tree older than this option needs this script copied over its
own (``cp scripts/bench_build.py DIR/scripts/``: only the harness, its packer stays the base's).

``--array-parse N``: only time reading an N-record pretty-printed array of bench records, ``files.records``
(the stdlib's ``raw_decode``) against ijson's C backend + ``json.dumps`` (the library tried first; needs ijson).

``--scan-only``: only time the scan (``stages.scan_chunks``: byte ranges for JSONL, the spill for the others)
of each ``--input-format``, in this process (wall and CPU seconds).

``--breakdown`` also prints the wall's critical path: every thread of the build's tree sampled every 0.05 s (/proc),
each interval charged ``max(its busiest thread's CPU, its CPU / N)`` (what N quiet cores would need: load stretches
every thread alike), by the build process's step then; the idle core-seconds are the serial work. ``--base`` prints
that estimate per build too, and "cores busy": CPU-s / (N x the estimate), which load changes least.

``--breakdown``: every CPU-second of each build's process tree by process and phase (no profiler: ``time.thread_time``
around the build process's named steps, exclusive of the steps they call, and ``time.process_time`` around each pool
worker's start, tasks and first use of the encoder, the rest of each process from /proc as "other"); the stages'
functions are wrapped in the build's process only (``_BREAKDOWN_STEPS``), the bytes written are the same.

``--input-format``: the same records also as a pretty-printed JSON array (``array``), ``.jsonl.zst`` (``zst``)
or ``.jsonl.gz`` (``gz``), each built with the first executor and compared with the JSONL build.

Each build runs in a fresh process (this script with ``--child``) that times its stages: ``start`` (the
executor: a local Ray cluster of N CPUs for ray), ``scan`` (tokenizer load, scan, fingerprint), ``encode``,
``plan``, ``write`` and ``finish`` (rejects, stats, card, manifest), in wall time and in the build process's
own CPU time (its threads included, its workers not: what it spends on the critical path).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


def make_corpus(path: Path, coco: Path, records: int, seed: int = 0, shape: str = "chat",
                decomposed: float = 0.0) -> None:
    """bench_build's chats (above), with ``shape="text-chat"`` the same chats without their images (a text chat
    build: ``--profile text``), or with ``shape="text"`` bench_build_memory's tiny ``{"text": ...}`` records
    (2-40 words each: issue 32's text corpus, built with ``--profile text``). ``decomposed``: that share of the
    chats has accents written decomposed (not NFC) at the end of its first message, the same chats otherwise."""
    if shape == "text":
        import bench_build_memory

        bench_build_memory.make_records(path, records, seed)
        return
    rng = np.random.default_rng(seed)
    caps = json.loads((coco / "annotations" / "captions_train2017.json").read_text())["annotations"]
    sentences = [c["caption"].strip().rstrip(".") + "." for c in caps]
    images = sorted(str(p) for p in (coco / "train2017").glob("*.jpg"))

    def text(n_sent: int) -> str:
        return " ".join(sentences[i] for i in rng.integers(0, len(sentences), size=max(1, n_sent)))

    marked = np.random.default_rng(seed + 1).random(records) < decomposed  # its own stream: the chats stay the same

    with open(path, "w") as f:
        for r in range(records):
            turns = int(rng.integers(1, 5))
            size = rng.lognormal(np.log(4), 0.9)  # sentences per answer: median 4, long tail
            msgs = []
            for t in range(turns):
                q = text(int(rng.integers(1, 3)))
                if t == 0 and rng.random() < 0.3 and shape == "chat":
                    q = [{"type": "image", "image": images[int(rng.integers(len(images)))]}, {"type": "text", "text": q}]
                msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": text(int(size))}]
            if marked[r]:  # NFC rewrites these: the HF tokenizer encodes the text (packer/encode/fastokens_bpe.py)
                first = msgs[0]["content"]
                if isinstance(first, list):
                    first[-1]["text"] += " Cafe\u0301 na\u0308ive."
                else:
                    msgs[0]["content"] = first + " Cafe\u0301 na\u0308ive."
            rec: dict = {"messages": msgs}
            if rng.random() < 0.1:  # a caption tree: shared prefix, 3 branches
                rec = {"messages": msgs[:1], "branches": [[{"role": "assistant", "content": text(int(size))}]
                                                          for _ in range(3)]}
            f.write(json.dumps(rec) + "\n")


# the profiles that take --max-pixels (the build's is 256 * 28 * 28 there)
PIXEL_PROFILES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5", "qwen3.5-moe", "glm-4.6v", "qwen2.5-omni",
                  "qwen3-omni")

_TOK = None


def _init(profile: str = "qwen2-vl") -> None:
    """Load the tokenizer of ``profile`` (its default one) for the baseline."""
    global _TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from packer.encode.tokenizers import load_tokenizer
    from packer.models import get_profile

    _TOK = load_tokenizer(get_profile(profile).default_tokenizer)


def _render_and_encode(lines: list[str]) -> int:
    """Render each record's (linear) conversations with the template and batch-encode them: token count."""
    texts = []
    for line in lines:
        rec = json.loads(line)
        msgs = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
                if isinstance(m["content"], list) else m for m in rec["messages"]]
        for branch in rec.get("branches", [[]]):
            texts.append(_TOK.apply_chat_template(msgs + branch, tokenize=False))
    return sum(len(ids) for ids in _TOK(texts).input_ids)


def convert(corpus: Path, fmt: str) -> Path:
    """The JSONL corpus rewritten as ``fmt`` (streamed: the corpus is never held whole)."""
    if fmt == "jsonl":
        return corpus
    if fmt == "array":
        out = corpus.with_suffix(".json")
        with open(corpus) as f, open(out, "w") as g:
            g.write("[\n")
            for i, line in enumerate(f):
                g.write(("" if i == 0 else ",\n") + json.dumps(json.loads(line), indent=2))
            g.write("\n]\n")
        return out
    out = corpus.with_name(corpus.name + "." + fmt)
    with open(corpus, "rb") as f, open(out, "wb") as g:
        if fmt == "zst":
            import zstandard

            zstandard.ZstdCompressor(level=3).copy_stream(f, g)
        else:
            import gzip
            import shutil

            with gzip.open(g, "wb") as z:
                shutil.copyfileobj(f, z)
    return out


def array_parse(coco: Path, records: int) -> None:
    """Seconds to stream an array's elements as JSON lines: packer's reader vs ijson + json.dumps."""
    import io

    from packer.formats.files import records as read_records

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "c.jsonl"
        make_corpus(corpus, coco, records)
        path = convert(corpus, "array")
        t0 = time.perf_counter()
        n = sum(1 for _ in read_records(str(path)))
        ours = time.perf_counter() - t0
        print(f"{n:,} elements, {path.stat().st_size / 2**20:.1f} MiB: files.records {ours:.2f} s", end="")
        try:
            import ijson
        except ImportError:
            print(" (ijson not installed)")
            return
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            for obj in ijson.items(io.BufferedReader(f), "item", use_float=True):
                json.dumps(obj, ensure_ascii=False).encode()
        print(f", ijson ({ijson.backend}) + json.dumps {time.perf_counter() - t0:.2f} s")


def scan_only(coco: Path, records: int, formats: list[str]) -> None:
    """Seconds the scan of each input format takes: what an array or zst build adds before its encode starts."""
    from packer.config import BuildConfig
    from packer.pipeline.stages import scan_chunks

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "c.jsonl"
        make_corpus(corpus, coco, records)
        for fmt in formats:
            path = convert(corpus, fmt)
            config = BuildConfig.from_inputs([str(path)], str(Path(tmp) / f"out-{fmt}"), profile="qwen2-vl")
            t0, c0 = time.perf_counter(), time.process_time()
            chunks = scan_chunks(config, spill=str(Path(tmp) / f"spill-{fmt}"))
            print(f"{path.name} ({path.stat().st_size / 2**20:.0f} MiB): {len(chunks)} chunks, scan "
                  f"{time.perf_counter() - t0:.2f} s, {time.process_time() - c0:.2f} CPU-s")


def tokenizer_alone(path: Path, num_proc: int, profile: str = "qwen2-vl") -> dict[str, float]:
    lines = path.read_text().splitlines()
    chunks = [lines[i : i + 512] for i in range(0, len(lines), 512)]
    with mp.get_context("spawn").Pool(num_proc, initializer=_init, initargs=(profile,)) as pool:
        pool.map(_render_and_encode, chunks[:num_proc])  # warm: tokenizer loaded in every worker
        t0 = time.perf_counter()
        tokens = sum(pool.imap(_render_and_encode, chunks))
        dt = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt}


def _tree_usage(pid: int, cpu: dict[int, tuple[str, float]], pss: list[int] | None = None) -> int:
    """Resident memory of a process and all its descendants, in bytes (from /proc); records each one's name
    and CPU seconds so far (user + system) in ``cpu``, by pid; ``pss``: its one item set to the tree's
    proportional set size (a page shared by k processes counted 1/k in each: a forked pool's shared pages once)."""
    total, stack = 0, [pid]
    if pss is not None:
        pss[:] = [0]
    tick = os.sysconf("SC_CLK_TCK")
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024
            if pss is not None:
                with open(f"/proc/{p}/smaps_rollup") as f:
                    pss[0] += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu[p] = (cpu[p][0] if p in cpu else _process_name(p), (int(fields[11]) + int(fields[12])) / tick)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total


def _timed(inner, marks: dict[str, float]):
    """An executor that times the stages around the one it wraps: when each method is first called and when
    its results run out (``build`` calls encode, then plans, then calls write)."""
    from packer.pipeline.executor import Executor

    class Timed(Executor):
        def start(self):
            inner.start()

        def submit(self, fn, /, *args, **kwargs):
            if os.environ.get("BENCH_BUILD_BREAKDOWN") and getattr(inner, "num_proc", 1) > 1:
                return inner.submit(_bd_call, fn, *args, **kwargs)
            return inner.submit(fn, *args, **kwargs)

        def preload(self, encoder):
            inner.preload(encoder)

        def load_encoder(self, config, **kw):  # the inner executor's (LocalExecutor overlaps it), not Executor's
            return inner.load_encoder(config, **kw)

        def close(self):
            inner.close()

        def writes_here(self, examples, ranges):
            return inner.writes_here(examples, ranges)

        def exchange(self, tasks, **kw):  # the inner executor's (the pool's map tasks), not Executor's default
            yield from inner.exchange(tasks, **kw)

        def encode(self, chunks, **kw):
            marks["encode"] = _now()
            yield from inner.encode(chunks, **kw)
            marks["plan"] = _now()

        def write(self, ranges, **kw):
            marks["write"] = _now()
            yield from inner.write(ranges, **kw)
            marks["finish"] = _now()

    return Timed()


def _now() -> tuple[float, float]:
    """(wall, this process's CPU, all its threads) seconds: the build's own process, not its workers."""
    return time.perf_counter(), time.process_time()


# --breakdown: the build process's steps timed (module, attribute, label); a step's CPU excludes the steps it calls
_BREAKDOWN_STEPS = [
    ("packer.encode.tokenizers", "load_tokenizer", "tokenizer load (transformers import + HF tokenizer)"),
    ("packer.config", "make_encoder", "make_encoder (tables, fastokens probe ids)"),
    ("packer.pipeline.build", "make_encoder", "make_encoder (tables, fastokens probe ids)"),
    ("packer.pipeline.output", "tokenizer_record", "tokenizer fingerprint"),
    ("packer.pipeline.build", "tokenizer_record", "tokenizer fingerprint"),
    ("packer.encode.fastokens_bpe", "build_native", "fastokens' native build (the parent, for its forked workers)"),
    ("packer.pipeline.local.LocalExecutor", "load_encoder",
     "load_encoder's rest (pickle, the helper's wait; its tokenizer load: the helper process's row)"),
    ("packer.pipeline.build", "build_fingerprint", "fingerprints + output dir"),
    ("packer.pipeline.build", "encode_fingerprint", "fingerprints + output dir"),
    ("packer.pipeline.build", "prepare_output", "fingerprints + output dir"),
    ("packer.pipeline.build", "_encode", "encode stage: results in (read_chunk per chunk, columns file)"),
    ("packer.pipeline.build", "warm_planner", "warm planner (a thread: numba kernels, imports)"),
    ("packer.pipeline.columns.ColumnsBuilder", "finish", "columns finish"),
    ("packer.pipeline.build", "plan_packs", "plan"),
    ("packer.pipeline.build", "_save_plan", "plan saved"),
    ("packer.pipeline.cache.EncodeCache", "indexed", "cache index"),
    ("packer.pipeline.build", "_exchange", "exchange + write stage (driver side)"),
    ("packer.pipeline.build", "_write", "exchange + write stage (driver side)"),
    ("packer.pipeline.build", "remove_stale_shards", "exchange + write stage (driver side)"),
    ("packer.pipeline.build", "_encode_rejects", "rejects"),
    ("packer.pipeline.build", "write_rejects", "rejects"),
    ("packer.report.stats", "compute_stats", "stats"),
    ("packer.report.stats", "format_stats", "card"),
    ("packer.pipeline.build", "write_card", "card"),
    ("packer.pipeline.build", "manifest_dict", "manifest"),
    ("packer.pipeline.local", "_forked_with", "fork the pool (the workers' encoder copy and imports)"),
    ("packer.pipeline.local.LocalExecutor", "close", "pool stop"),
]
_STEP_CPU: dict[str, float] = {}  # label -> CPU-s, this process (the build's, or a pool worker's)
_STACK = __import__("threading").local()


_SPANS: list[tuple[str, float, float]] = []  # --timeline: (label, wall start, wall end) of each step, this process


def _exclusive(label: str, fn, clock=time.thread_time):
    """``fn`` that adds its CPU (``clock``), less that of the wrapped steps it calls, to ``_STEP_CPU[label]``
    (and its wall span to ``_SPANS``)."""
    import functools

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        stack = _STACK.__dict__.setdefault("frames", [])
        stack.append(0.0)  # the CPU of wrapped steps called from this one
        t0, w0 = clock(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = clock() - t0
            _SPANS.append((label, w0, time.perf_counter()))
            inner = stack.pop()
            _STEP_CPU[label] = _STEP_CPU.get(label, 0.0) + spent - inner
            if stack:
                stack[-1] += spent
    return timed


def _wrap_steps() -> None:
    import importlib

    for where, name, label in _BREAKDOWN_STEPS:
        parts = where.split(".")
        owner = None
        for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes (a class)
            try:
                owner = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                owner = getattr(owner, attr)
            break
        setattr(owner, name, _exclusive(label, getattr(owner, name)))
    import packer.pipeline.local as local

    # the pool's worker functions: this script's, which time the real ones in the worker (spawn pickles them by
    # reference: the worker imports this file as __mp_main__)
    for name in ("_worker_init", "_preload", "_encode_task", "_exchange_task", "_write_task"):
        _REAL[name] = getattr(local, name)
        setattr(local, name, globals()["_bd" + name])


_REAL: dict = {}  # the pool's functions wrapped by _wrap_steps: a forked worker inherits the wrapped ones


def _real(name: str):
    import packer.pipeline.local as local

    return _REAL.get(name) or getattr(local, name)


def _bd_save() -> None:
    """This worker's CPU by phase so far, into ``$BENCH_BUILD_BREAKDOWN/worker-PID.json`` (after every task)."""
    d = Path(os.environ["BENCH_BUILD_BREAKDOWN"])
    tmp = d / f".worker-{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**_STEP_CPU, "_total": time.process_time()}))
    tmp.replace(d / f"worker-{os.getpid()}.json")


def _bd_timed(label: str, fn, *args, **kwargs):
    try:
        return _exclusive(label, fn, time.process_time)(*args, **kwargs)
    finally:
        _bd_save()


def _bd_worker_init() -> None:
    _STEP_CPU.clear()  # a forked worker starts with its parent's
    _STACK.__dict__.pop("frames", None)
    _STEP_CPU["interpreter start + this script as __mp_main__ (spawn; 0 forked)"] = time.process_time()
    _bd_timed("imports (_worker_init)", _real("_worker_init"))


def _bd_call(fn, *args, **kwargs):
    return _bd_timed("scan (submitted to a worker)", fn, *args, **kwargs)


def _bd_preload(path: str) -> None:
    _bd_timed("unpickle the encoder (preload)", _real("_preload"), path)


def _bd_encode_task(args):
    import packer.pipeline.local as local

    encoder = _bd_timed("unpickle the encoder (preload)", local._encoder, args[-1])
    if encoder._fastokens is not None:  # built on the first chunk anyway: timed apart, then cached
        _bd_timed("fastokens start (native tokenizer + probe)", encoder._fastokens.native)
    return _bd_timed("encode chunks", _real("_encode_task"), args)


def _bd_exchange_task(args):
    import packer.pipeline.local as local

    _bd_timed("drop the encoder", local._drop_encoder)
    return _bd_timed("exchange map tasks", _real("_exchange_task"), args)


def _bd_write_task(args):
    import packer.pipeline.local as local

    _bd_timed("drop the encoder", local._drop_encoder)
    return _bd_timed("write shard ranges", _real("_write_task"), args)


def _child(path: str, out: str, num_proc: int, executor: str, profile: str = "qwen2-vl") -> None:
    """One build in this process; print its stage times (s) as JSON."""
    breakdown = bool(os.environ.get("BENCH_BUILD_BREAKDOWN"))
    if breakdown:
        _STEP_CPU["interpreter start + this script's imports"] = time.process_time()
        t0 = time.process_time()
    from packer.config import BuildConfig
    from packer.pipeline.build import build, make_executor

    if breakdown:
        _STEP_CPU["packer imports (build, config)"] = time.process_time() - t0
        _wrap_steps()

    marks = {"start": _now()}
    if executor == "ray":
        import ray

        ray.init(num_cpus=num_proc, include_dashboard=False)  # a local cluster of N CPUs, as --num-proc N
    budgets = {"max_vision_tokens": 4096, "max_images": 8, "max_examples_per_pack": 64} \
        if os.environ.get("BENCH_BUILD_BUDGETS") == "1" else {}
    if profile in PIXEL_PROFILES:  # Qwen's resize bound; another family (gemma3) has its own image size
        budgets["max_pixels"] = 256 * 28 * 28
    if os.environ.get("BENCH_BUILD_PROFILE_OPTIONS"):  # --profile-option
        budgets["profile_options"] = json.loads(os.environ["BENCH_BUILD_PROFILE_OPTIONS"])
    config = BuildConfig.from_inputs([path], out, profile=profile, max_length=8192,
                                     num_proc=num_proc, executor=executor, overwrite=True, **budgets)
    inner = make_executor(config)
    marks["scan"] = _now()
    build(config, progress=False, executor=_timed(inner, marks))
    marks["end"] = _now()
    names = list(marks)
    if breakdown:
        spans = [(k, marks[k][0], marks[b][0]) for k, b in zip(names, names[1:], strict=False)] + _SPANS
        (Path(os.environ["BENCH_BUILD_BREAKDOWN"]) / "spans.json").write_text(json.dumps(spans))
        print(json.dumps({**_STEP_CPU, "_total": time.process_time()}))
    print(json.dumps([{a: marks[b][k] - marks[a][k] for a, b in zip(names, names[1:], strict=False)} for k in (0, 1)]))
    import gc

    gc.freeze()  # as ``packer.cli.main`` ends a build: the exit's full collections are not what a user waits for


def _noop(i: int) -> int:
    return i


def ray_task_cost(num_tasks: int, num_cpus: int) -> dict[str, float]:
    """``num_tasks`` no-op tasks through the Ray executor's ordered window on a local Ray of ``num_cpus``:
    wall and driver CPU per task, the floor under every encode and write task."""
    import ray

    from packer.pipeline.ray_executor import RayExecutor

    ray.init(num_cpus=num_cpus, include_dashboard=False)
    executor, noop = RayExecutor(), ray.remote(_noop)
    for _ in executor._ordered(lambda i: noop.remote(i), range(4 * num_cpus)):  # workers up
        pass
    t0, c0 = time.perf_counter(), time.process_time()
    done = sum(1 for _ in executor._ordered(lambda i: noop.remote(i), range(num_tasks)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ray.shutdown()
    return {"tasks": done, "wall_ms": 1e3 * wall / done, "driver_cpu_ms": 1e3 * cpu / done, "tasks_per_s": done / wall}


def _process_name(pid: int) -> str:
    """``ray workers`` (titled ``ray::TASK``), a Python process's script, else the command."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    if args and args[0].startswith("ray::"):
        return "ray workers"
    script = next((a for a in args[1:] if a.endswith(".py")), None)
    return Path(script).name if script else Path(args[0]).name if args else "?"


def _by_name(cpu: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per process name (a Ray worker is named for its task), most first."""
    out: dict[str, float] = {}
    for name, c in cpu.values():
        out[name] = out.get(name, 0.0) + c
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def packer_build(path: Path, out: Path, num_proc: int, executor: str = "local",
                 profile: str = "qwen2-vl", script: Path | None = None,
                 breakdown: Path | None = None, timeline: bool = False, cache: Path | None = None) -> dict[str, float]:
    """One build by ``script`` (default: this file; another checkout's for ``--base``) in a fresh process;
    ``breakdown``: a new directory for the CPU by process and phase (``--breakdown``, this tree's script only);
    ``timeline`` (implied by ``breakdown``): every thread's CPU sampled, for ``_timeline``'s quiet-box wall;
    ``cache``: the build's ``PACKER_CACHE`` (``against``: each tree its own)."""
    timeline = timeline or breakdown is not None
    script = script or Path(__file__).resolve()
    cmd = [sys.executable, str(script), "--child", str(path), str(out), str(num_proc), executor]
    if "PROFILE" in script.read_text() or profile != "qwen2-vl":  # an older tree's child takes no profile
        cmd.append(profile)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("BENCH_BUILD_BREAKDOWN", None)
    if cache is not None:
        env["PACKER_CACHE"] = str(cache)
    if breakdown is not None:
        breakdown.mkdir(parents=True)
        env["BENCH_BUILD_BREAKDOWN"] = str(breakdown)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peak, peak_pss, pss, cpu = 0, 0, [0], {}
    samples: list[tuple[float, dict[str, float]]] = []  # --breakdown: (wall, CPU-s of every thread of the tree)
    while proc.poll() is None:
        peak = max(peak, _tree_usage(proc.pid, cpu, pss))
        peak_pss = max(peak_pss, pss[0])
        for _ in range(4 if timeline else 1):
            if timeline:
                samples.append((time.perf_counter(), _thread_cpu(proc.pid)))
            time.sleep(0.05 if timeline else 0.2)
    dt = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"packer build failed with exit code {proc.returncode}")
    lines = proc.stdout.read().strip().splitlines()
    stages, parent_cpu = json.loads(lines[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    t = manifest["totals"]
    result = {"seconds": dt, "text_tokens": t["tokens"] - t["vision_tokens"], "tokens": t["tokens"],
              "text_tokens_per_s": (t["tokens"] - t["vision_tokens"]) / dt, "peak_rss_mib": peak / 2**20,
              "peak_pss_mib": peak_pss / 2**20, "cpu_seconds": sum(c for _, c in cpu.values()), "cpu_by_process": _by_name(cpu),
              "examples": t["examples"], "packs": t["packs"], "stages": stages, "parent_cpu": parent_cpu,
              "shards": [s["sha256"] for s in manifest["shards"]], "shard_bytes": sum(s["bytes"] for s in manifest["shards"])}
    if breakdown is not None:
        result["breakdown"] = _breakdown(proc.pid, json.loads(lines[-2]), breakdown, cpu)
    if timeline:
        spans = breakdown / "spans.json" if breakdown is not None else None
        result["timeline"] = _timeline(samples, json.loads(spans.read_text()) if spans and spans.exists() else [])
    return result


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU-s so far of every thread of ``pid`` and its descendants, by ``pid/tid`` (from /proc)."""
    out: dict[str, float] = {}
    tick, stack = os.sysconf("SC_CLK_TCK"), [pid]
    while stack:
        p = stack.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[f"{p}/{task}"] = (int(fields[11]) + int(fields[12])) / tick
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _timeline(samples: list[tuple[float, dict[str, float]]], spans: list[tuple[str, float, float]],
              cores: int = 2) -> dict[str, list[float]]:
    """The build's wall critical path on a quiet box of ``cores`` cores, from the threads' CPU sampled every
    0.05 s: each interval takes at least its busiest thread's CPU and its CPU spread over every core,
    ``max(busiest, sum / cores)`` (load stretches every thread alike, so the estimate holds under load); its
    idle core-seconds are ``cores * that - sum``. By the build process's innermost step (main thread) at the
    interval's middle: [observed wall, CPU-s of the tree, estimated quiet wall, idle core-seconds]."""
    rows: dict[str, list[float]] = {}
    main = [s for s in spans if not s[0].startswith("warm planner")]
    for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
        spent = [b[k] - a.get(k, 0.0) for k in b]
        total, busiest = sum(spent), max(spent, default=0.0)
        quiet = max(busiest, total / cores)
        mid = (t0 + t1) / 2
        inside = [s for s in main if s[1] <= mid < s[2]]
        label = min(inside, key=lambda s: s[2] - s[1])[0] if inside else \
            "(before the build's first mark / exit)" if main else "all"
        row = rows.setdefault(label, [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate((t1 - t0, total, quiet, cores * quiet - total)):
            row[i] += v
    return rows


def print_timeline(b: dict, cores: int = 2) -> None:
    """``--breakdown``'s wall table: where a quiet box of ``cores`` cores would spend the build's wall, and
    how many core-seconds idle there (serial work)."""
    rows = b["timeline"]
    quiet = sum(r[2] for r in rows.values())
    print(f"\n| build process step (main thread) | wall here, s | CPU-s of the tree | quiet {cores}-core wall, s "
          "(estimated) | idle core-s |\n| --- | --- | --- | --- | --- |")
    for label, r in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        if r[0] >= 0.05:
            print(f"| {label} | {r[0]:.2f} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.2f} |")
    print(f"| all | {sum(r[0] for r in rows.values()):.2f} | {sum(r[1] for r in rows.values()):.2f} | {quiet:.2f} | "
          f"{sum(r[3] for r in rows.values()):.2f} |")
    cpu = sum(r[1] for r in rows.values())
    print(f"  estimated quiet {cores}-core wall {quiet:.2f} s: {b['text_tokens'] / quiet / 1e6:.2f} Mtok/s (text tokens); "
          f"the cores busy {cpu / cores / quiet:.1%} of it (CPU-s / ({cores} x that wall): the load-robust share)\n")


def _breakdown(child: int, steps: dict[str, float], where: Path,
               cpu: dict[int, tuple[str, float]]) -> list[tuple[str, str, float]]:
    """(process, phase, CPU-s) rows: the build process's steps, the pool workers' phases summed over workers,
    each process's rest ("other": /proc's total less what its own clock accounted for; /proc is read every 0.2 s,
    so the last moments of a process may be missing) and any other process (the resource tracker)."""
    rows: list[tuple[str, str, float]] = []

    def add(process: str, phases: dict[str, float], total: float) -> None:
        accounted = phases.pop("_total")
        for phase, c in sorted(phases.items(), key=lambda kv: -kv[1]):
            rows.append((process, phase, c))
        rows.append((process, "other (the rest of its own clock)", accounted - sum(phases.values())))
        rows.append((process, "after its last mark (exit; /proc)", total - accounted))

    add("build process", dict(steps), cpu[child][1])
    # a pool worker's file; not the build process's own (a deferred call it ran itself, ``_bd_call``, saved one:
    # its phases are in ``steps`` already)
    workers = {pid: json.loads(f.read_text()) for f in where.glob("worker-*.json")
               if (pid := int(f.stem.split("-")[1])) != child}
    summed: dict[str, float] = {}
    for phases in workers.values():
        for k, v in phases.items():
            summed[k] = summed.get(k, 0.0) + v
    if workers:
        add(f"pool workers (x{len(workers)})", summed, sum(cpu[p][1] for p in workers if p in cpu))
    for pid, (name, c) in cpu.items():
        if pid != child and pid not in workers:
            rows.append((f"{name} (pid {pid})", "all", c))
    return rows


def against(base: Path, corpus: Path, args: argparse.Namespace, tmp: Path) -> dict[str, dict]:
    """``--base``: this tree's build and ``base``'s alternated; each one's median-CPU run, by name."""
    import shutil
    import statistics

    from packer.encode.tokenizers import cache_dir

    scripts = {"base": base.resolve() / "scripts" / "bench_build.py", "this": Path(__file__).resolve()}
    # each tree its own PACKER_CACHE (the builtin tokenizers shared): the encoder a build keeps for the next
    # (pipeline/kept.py, ``encoder_entry``) is keyed by packer's source: each tree's own cache keeps the rounds'
    # entries apart from the user's and from each other's whatever the entry's file name
    caches = {name: tmp / f"cache-{name}" for name in scripts}
    for c in caches.values():
        c.mkdir(exist_ok=True)
        (cache_dir() / "tokenizers").mkdir(parents=True, exist_ok=True)
        if not (c / "tokenizers").exists():
            (c / "tokenizers").symlink_to(cache_dir() / "tokenizers")
    warm = tmp / "warm.jsonl"
    make_corpus(warm, args.coco, 3000, shape=args.shape, decomposed=args.decomposed)
    for name, script in scripts.items():  # numba compiles into each tree's cache once; each keeps its encoder
        packer_build(warm, tmp / f"warm-{name}", args.num_proc, profile=args.profile, script=script,
                     cache=caches[name])
    runs: dict[str, list[dict]] = {name: [] for name in scripts}
    for r in range(args.rounds):
        for name in (list(scripts) if r % 2 == 0 else list(scripts)[::-1]):
            out = tmp / f"ab-{name}"
            shutil.rmtree(out, ignore_errors=True)
            if args.kept_miss:
                for entry in (caches[name] / "engines").glob("*.encoder"):
                    entry.unlink()
            load = os.getloadavg()[0]
            b = packer_build(corpus, out, args.num_proc, profile=args.profile, script=scripts[name], timeline=True,
                             cache=caches[name])
            runs[name].append(b)
            b["quiet_wall"] = sum(v[2] for v in b["timeline"].values())
            busy = sum(v[1] for v in b["timeline"].values()) / args.num_proc / b["quiet_wall"]
            print(f"  round {r + 1} {name}: {b['cpu_seconds']:.1f} CPU-s, {b['seconds']:.1f} s wall "
                  f"(quiet {args.num_proc}-core estimate {b['quiet_wall']:.2f} s, cores busy {busy:.1%}), peak RSS "
                  f"{b['peak_rss_mib']:.0f} MiB (PSS {b['peak_pss_mib']:.0f}), load {load:.1f}-{os.getloadavg()[0]:.1f}", flush=True)
    if args.schema_change:  # other bytes by design: the rows as this tree's reader reads them must be equal
        from packer.shards.io import open_shards, read_shard

        a, b = (open_shards(tmp / f"ab-{name}") for name in scripts)
        assert [e.file for e in a.shards] == [e.file for e in b.shards], "other shard files"
        for i in range(len(a.shards)):
            ta, tb = read_shard(a.shard_path(i)), read_shard(b.shard_path(i))
            assert ta.cast(tb.schema).equals(tb), f"{a.shards[i].file}: the rows read differ"
        same = "rows read identical (the schema changed the bytes)"
    else:
        assert all(b["shards"] == runs["base"][0]["shards"] for bs in runs.values() for b in bs), "the shards differ"
        same = "shards identical"
    out = {}
    for name, bs in runs.items():
        cpu = statistics.median(b["cpu_seconds"] for b in bs)
        out[name] = min(bs, key=lambda b: abs(b["cpu_seconds"] - cpu))
        each = ", ".join(f"{b['cpu_seconds']:.1f}" for b in bs)
        writes = ", ".join(f"{b['stages'].get('write', 0):.2f}" for b in bs)
        quiet = ", ".join(f"{b['quiet_wall']:.2f}" for b in bs)
        print(f"  {name}: median quiet {args.num_proc}-core wall estimate "
              f"{statistics.median(b['quiet_wall'] for b in bs):.2f} s ({quiet})")
        print(f"  {name}: median {cpu:.2f} CPU-s ({each}), wall "
              f"{min(b['seconds'] for b in bs):.1f}-{max(b['seconds'] for b in bs):.1f} s, write stage wall "
              f"{writes} s, shards {bs[0]['shard_bytes'] / 2**20:.2f} MiB; {same}")
    return out


def print_breakdown(b: dict) -> None:
    """``--breakdown``'s table (markdown): every CPU-second of the build's process tree, by process and phase."""
    total = b["cpu_seconds"]
    print("\n| process | phase | CPU-s | share |\n| --- | --- | --- | --- |")
    for process, phase, c in b["breakdown"]:
        if abs(c) >= 0.005:
            print(f"| {process} | {phase} | {c:.2f} | {c / total:.1%} |")
    print(f"| all | the process tree (/proc) | {total:.2f} | 100% |\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, nargs="+", default=[50_000, 200_000])
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--coco", type=Path, default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    ap.add_argument("--rss-only", action="store_true", help="skip the tokenizer-alone baseline")
    ap.add_argument("--executor", nargs="+", choices=["local", "ray"], default=["local"],
                    help="build with each (ray: a local Ray cluster of --num-proc CPUs, started in the build)")
    ap.add_argument("--ray-tasks", type=int, metavar="N", help="only time N no-op tasks through the Ray executor")
    ap.add_argument("--array-parse", type=int, metavar="N", help="only time reading an N-record JSON array")
    ap.add_argument("--scan-only", action="store_true", help="only time the scan of each --input-format")
    ap.add_argument("--input-format", nargs="+", choices=["jsonl", "array", "zst", "gz"], default=["jsonl"],
                    help="build the same records from each file kind too (formats/files.py), first executor only")
    ap.add_argument("--budgets", action="store_true", help="build with --max-vision-tokens 4096 --max-images 8 "
                    "--max-examples-per-pack 64 (the budgeted planner)")
    ap.add_argument("--breakdown", action="store_true", help="the CPU of each build's process tree by process and "
                    "phase (a table); with --base, of this tree's last build")
    ap.add_argument("--base", type=Path, help="another checkout to build beside this one, alternated")
    ap.add_argument("--rounds", type=int, default=3, help="--base: pairs of builds")
    ap.add_argument("--kept-miss", action="store_true", help="--base: no kept encoder entry for any round's build "
                    "(the helper's way)")
    ap.add_argument("--schema-change", action="store_true", help="--base of an older shard schema: compare the rows "
                    "this tree's reader reads from both instead of the bytes")
    ap.add_argument("--profile", default="qwen2-vl", help="the build's profile (its default tokenizer and "
                    "template; the baseline's too)")
    ap.add_argument("--profile-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a profile option for every build (repeatable; e.g. do_pan_and_scan=true for gemma3)")
    ap.add_argument("--shape", choices=("chat", "text-chat", "text"), default="chat", help="the corpus: bench_build's "
                    "chats, the same chats without images (text-chat), or "
                    "tiny text records (bench_build_memory's; build them with --profile text)")
    ap.add_argument("--decomposed", type=float, default=0.0, metavar="SHARE",
                    help="chat shapes: this share of the records (e.g. 0.01) ends its first message with accents "
                         "written decomposed (not NFC), which the HF tokenizer encodes")
    ap.add_argument("--child", nargs=5, metavar=("CORPUS", "OUT", "NUM_PROC", "EXECUTOR", "PROFILE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 0 <= args.decomposed <= 1 or (args.decomposed and args.shape == "text"):
        ap.error("--decomposed is a share in [0, 1] of a chat shape's records (--shape chat or text-chat)")
    sys.path.insert(0, str(REPO))
    if args.budgets:
        os.environ["BENCH_BUILD_BUDGETS"] = "1"  # read by each build's child process
    if args.profile_option:  # read by each build's child process too
        from packer.config import parse_profile_options

        os.environ["BENCH_BUILD_PROFILE_OPTIONS"] = json.dumps(parse_profile_options(args.profile_option))
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]), args.child[3], args.child[4])
        return
    if args.scan_only:
        for n in args.records:
            scan_only(args.coco, n, args.input_format)
        return
    if args.array_parse:
        array_parse(args.coco, args.array_parse)
        return
    if args.ray_tasks:
        r = ray_task_cost(args.ray_tasks, args.num_proc)
        print(f"{r['tasks']:,} no-op Ray tasks on {args.num_proc} CPUs: {r['wall_ms']:.2f} ms wall, "
              f"{r['driver_cpu_ms']:.2f} ms driver CPU per task ({r['tasks_per_s']:,.0f} tasks/s)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            corpus = Path(tmp) / f"corpus-{n}.jsonl"
            make_corpus(corpus, args.coco, n, shape=args.shape, decomposed=args.decomposed)
            print(f"\n{n:,} records ({corpus.stat().st_size / 2**20:.0f} MiB JSONL)")
            builds = {}
            if args.base:
                builds = against(args.base, corpus, args, Path(tmp))
            for executor in ([] if args.base else args.executor):
                b = builds[executor] = packer_build(corpus, Path(tmp) / f"out-{n}-{executor}", args.num_proc, executor,
                                                    args.profile, breakdown=Path(tmp) / f"breakdown-{n}-{executor}"
                                                    if args.breakdown and executor == "local" else None)
                split = ", ".join(f"{k} {v:.1f}" for k, v in b["stages"].items())
                print(f"  packer build --executor {executor} --num-proc {args.num_proc}: {b['seconds']:.1f} s, "
                      f"{b['cpu_seconds']:.1f} CPU-s "
                      f"({split}), {b['text_tokens']:,} text tokens ({b['tokens']:,} with vision), "
                      f"{b['text_tokens_per_s'] / 1e3:.0f}k text tokens/s, peak RSS {b['peak_rss_mib']:.0f} MiB (PSS {b['peak_pss_mib']:.0f}), "
                      f"{b['examples']:,} examples in {b['packs']:,} packs, shards' sha256 "
                      f"{hashlib.sha256(''.join(b['shards']).encode()).hexdigest()[:12]}")
                print("    CPU-s by process: " + ", ".join(f"{k} {v:.1f}" for k, v in b["cpu_by_process"].items()
                                                      if v >= 0.1))
                print("    the build process's CPU-s by stage: " + ", ".join(f"{k} {v:.2f}" for k, v in b["parent_cpu"].items()))
                if "breakdown" in b:
                    print_breakdown(b)
                    print_timeline(b, args.num_proc)
            for fmt in args.input_format:
                if fmt == "jsonl":
                    continue
                path = convert(corpus, fmt)
                b = packer_build(path, Path(tmp) / f"out-{n}-{fmt}", args.num_proc, args.executor[0], args.profile)
                base = builds[args.executor[0]]
                split = ", ".join(f"{k} {v:.1f}" for k, v in b["stages"].items())
                print(f"  {path.name} ({path.stat().st_size / 2**20:.0f} MiB): {b['seconds']:.1f} s, "
                      f"{b['cpu_seconds']:.1f} CPU-s ({split}), peak RSS {b['peak_rss_mib']:.0f} MiB; {fmt} / JSONL "
                      f"throughput {base['seconds'] / b['seconds']:.1%} (per CPU-second "
                      f"{base['cpu_seconds'] / b['cpu_seconds']:.1%}), peak RSS {fmt} / JSONL "
                      f"{b['peak_rss_mib'] / base['peak_rss_mib']:.1%}; same packs: "
                      f"{(b['examples'], b['packs']) == (base['examples'], base['packs'])}")
                path.unlink()
            if {"local", "ray"} <= set(builds):
                local, ray = builds["local"], builds["ray"]
                assert local["shards"] == ray["shards"], "the Ray build's shards differ from the local build's"
                warm = ray["seconds"] - ray["stages"]["start"]  # on a cluster that is already up
                print(f"  ray / local throughput: {local['seconds'] / ray['seconds']:.1%} whole, "
                      f"{local['seconds'] / warm:.1%} without starting Ray (target >= 80%); per CPU-second "
                      f"{local['cpu_seconds'] / ray['cpu_seconds']:.1%}; shards identical")
            if not args.rss_only:
                a = tokenizer_alone(corpus, args.num_proc, args.profile)
                print(f"  tokenizer alone ({args.num_proc} processes): {a['seconds']:.1f} s, {a['tokens']:,} tokens, "
                      f"{a['tokens_per_s'] / 1e3:.0f}k tokens/s")
                for executor, b in builds.items():
                    print(f"  build ({executor}) / tokenizer-alone throughput: "
                          f"{b['text_tokens_per_s'] / a['tokens_per_s']:.1%} (target >= 150%: issue 25; 85% before it)")
                import bench_ceiling  # scripts/bench_ceiling.py: parse, tokenize, write alone, CPU-s per core

                c = bench_ceiling.ceiling(corpus, profile=args.profile, num_proc=args.num_proc, repeats=1)
                print(f"  ceiling on {args.num_proc} cores (orjson + fastokens + Parquet write, CPU-s): "
                      f"{c['ceiling_tokens_per_s'] / 1e6:.2f} Mtok/s; HF tokenizer alone on the rendered texts: "
                      f"{c['hf_alone_tokens_per_s'] / 1e6:.2f} Mtok/s")
                for executor, b in builds.items():
                    rate = b["text_tokens_per_s"]
                    per_cpu = b["text_tokens"] / b["cpu_seconds"] * args.num_proc  # as if its CPU-s were on N cores
                    print(f"  build ({executor}): {rate / 1e6:.2f} Mtok/s wall, "
                          f"{rate / c['hf_alone_tokens_per_s']:.2f}x the HF tokenizer alone, "
                          f"{rate / c['ceiling_tokens_per_s']:.1%} of this machine's ceiling; per CPU-second (the "
                          f"load-robust figures): {per_cpu / c['hf_alone_tokens_per_s']:.2f}x the HF tokenizer "
                          f"alone, {per_cpu / c['ceiling_tokens_per_s']:.1%} of the ceiling")


if __name__ == "__main__":
    main()
