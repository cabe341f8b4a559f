"""Repack vs full build (issue 32): `packer repack` of a finished build against the full build it reuses, on
bench_build.py's corpus (COCO-caption text, ~30% of records with a real COCO image, 10% caption trees).

Three commands, each in a fresh process, timed in wall and CPU seconds of its whole process tree (workers
included; the repack's also split into its main process and its workers, which write the shards): the full
build (--max-length 8192), its repack to --max-length 4096 --seed 1, and a fresh build with those options, whose
shards the repack's must equal byte for byte. ``--before REV``: first the full build and the repack with the
packer of git revision REV (``git archive``, on PYTHONPATH), so a change is measured before/after in one run.

    python scripts/bench_repack.py --records 200000 --num-proc 2 [--before main]
    python scripts/bench_repack.py --records 200000 --num-proc 2 --before a2e2c77 --in-place
    python scripts/bench_repack.py --records 200000 --num-proc 2 --before 59a178f --warm-records 200000
    python scripts/bench_repack.py --records 50000 --profile-write [--keep DIR] [--no-exchange | --exchange]

``--in-place``: also, last, the full build's OUT rebuilt with only packing options changed (``packer build ...
--max-length 4096 --seed 1 --overwrite`` on it: it reuses the encode cache), with each tree (REV's first), timed
as the repack and compared with the fresh build. The full build's ``encode/columns.arrow`` (the plan columns a
repack reads) is printed with its size per example.

``--ab REV [REV2] --pairs N`` (with ``--keep DIR``): only repacks of one full build (made there once), N
alternated pairs of REV's packer and this checkout's (or REV2's), each in a fresh process; CPU seconds of each
run and the pairs' mean and median difference: a change of a few percent, on a loaded box whose single runs vary
by ~10%, measured in minutes instead of three full builds.

    python scripts/bench_repack.py --records 200000 --keep /tmp/rp --ab 6fd0468 --pairs 6 [--full-runs 1]

Every run also gets a **quiet-wall estimate**: every thread of its process tree sampled every 0.05 s (/proc), each
interval charged ``max(its busiest thread's CPU, its CPU / --num-proc)`` (bench_build.py ``--breakdown``'s critical
path: a loaded box stretches every thread alike, so it holds under load where the wall does not); ``--ab`` prints
each pair's and the means of CPU, the estimate and the (loaded) wall. ``--full-runs K``: then K fresh full builds of
the kept corpus (this tree), timed the same way: the repacks' CPU and quiet-wall estimate as a share of theirs.

``--own-builds``: each tree repacks a full build it made itself (DIR/full-N-0, DIR/full-N-1, each timed once):
for a change of the encode cache's format, which the other tree's cache would not serve.

``--breakdown`` (with ``--keep DIR``): repacks of the kept full build, each in a fresh process as ``packer repack``
runs (no profiler: ``getrusage`` of the calling thread around each phase, user and system CPU apart, and the page
faults; the build's warm-planner thread, which loads numba's kernels while the main thread reads the cached columns,
apart; the cyclic GC's collections by ``gc.callbacks``), ``--pairs`` of them: where a repack's CPU goes, the fixed
costs (the interpreter and packer's imports; numba, pandas and ``pyarrow.parquet``, imported up front here as the
repack would on its way) against the per-row work (the gathers, pack assembly, the Parquet encode).

    python scripts/bench_repack.py --records 200000 --keep /tmp/rp --breakdown --pairs 3

``--perf`` (with ``--keep``): one repack of the kept full build under Linux ``perf record`` (user and kernel
samples, no profiler in the process), its samples summed by kind: the kernel's page faults (of them the zeroing of
fresh anonymous pages, ``clear_page_erms``, and the file mappings' faults), ``munmap``, the interpreter, zstd, libparquet, numba's compiled kernels (perf's ``[JIT]`` addresses), memcpy: what ``--breakdown``'s
phases do not split (their system time). perf names a sample in a stripped library by the symbol before it, so
the GC is timed by ``--breakdown`` (``gc.callbacks``), not here.

    python scripts/bench_repack.py --records 200000 --keep /tmp/rp --perf

``--profile-write``: only the repack, in this process with ``--num-proc 1`` (the write stage's map tasks and
writers run here, as a pool worker runs them), CPU seconds per phase of the write stage from cProfile with a
process-time clock: the exchange's map tasks (their chunk-file reads, their IPC writes), the writers'
gathers (map-output or chunk-file reads and copies), pack assembly, the Parquet encode (``pq.write_table``),
the shard checksum, and what a pool worker pays to start (its interpreter, imports and initializer, timed
apart). ``--keep DIR``: the full build is made there once and reused by later runs (a fast loop). The exchange
runs as the build decides (``stages.map_tasks``: in one process, only past ``EXCHANGE_MIN_VISITS`` shards x chunk
files); ``--no-exchange`` never, ``--exchange`` wherever it has enough shards and chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import REPO, _thread_cpu, _timeline, _tree_usage, make_corpus  # noqa: E402

BUILD = ["--profile", "qwen2-vl", "--max-pixels", str(256 * 28 * 28), "-q"]


def timed(args: list[str], code: Path | None = None, cores: int = 2) -> dict[str, float]:
    """``packer ARGS`` in a fresh process (the packer package under ``code``, else this checkout's): wall
    seconds, CPU seconds of its process tree and of its main process alone, peak RSS (MiB), and ``quiet``: the
    wall a quiet box of ``cores`` cores would take, from every thread's CPU sampled every 0.05 s (bench_build's
    ``_timeline``: each interval ``max(its busiest thread's CPU, its CPU / cores)``; load stretches every thread
    alike). Threads of one process that wait on each other's GIL idle unseen there: the estimate is a lower
    bound for them, the observed wall at a low load the check (docs/benchmarks.md, "Repack")."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(code if code is not None else REPO)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "packer.cli", *args], env=env, cwd=code or REPO)
    peak, cpu = 0, {}
    samples: list[tuple[float, dict[str, float]]] = [(t0, {})]  # (wall, CPU-s of every thread of the tree)
    done = None
    while done is None:
        peak = max(peak, _tree_usage(proc.pid, cpu))
        for _ in range(2):
            samples.append((time.perf_counter(), _thread_cpu(proc.pid)))
            time.sleep(0.05)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                done = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
                break
    wall = time.perf_counter() - t0
    proc.returncode = done[0]
    if proc.returncode:
        raise SystemExit(f"packer {' '.join(args)} failed with exit code {proc.returncode}")
    # the tree's CPU from wait4 (the process and the workers it reaped, to its last instant); what it spent after
    # the last sample (its exit) is one more interval, serial
    total = max(done[1], sum(c for _, c in cpu.values()))
    samples = samples[:1] + [s for s in samples[1:] if s[1]]  # not those taken as it exited
    seen: dict[str, float] = {}  # every thread's CPU when last sampled, those that ended since too
    for _, threads in samples:
        seen.update(threads)
    samples.append((time.perf_counter(), {**samples[-1][1], "exit": max(0.0, total - sum(seen.values()))}))
    quiet = sum(v[2] for v in _timeline(samples, [], cores).values())
    return {"wall": wall, "cpu": total, "rss_mib": peak / 2**20, "main": cpu.get(proc.pid, ("", 0.0))[1],
            "quiet": quiet, "load": os.getloadavg()[0]}


def checkout(rev: str, into: Path) -> Path:
    """The packer package of git revision ``rev`` under ``into`` (``git archive``: no checkout of this tree)."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "packer"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def profile_write(full: Path, out: Path, repack_args: list[str], *, exchange: bool | None = None,
                  top: int = 0) -> None:
    """The repack of ``full`` into ``out`` in this process under cProfile (process-time clock): CPU seconds
    per phase of its write stage (``--profile-write``), then a pool worker's start, timed in a fresh one."""
    import cProfile
    import pstats

    from packer.cli import cli
    from packer.pipeline import stages

    shutil.rmtree(out, ignore_errors=True)
    if exchange is False:  # every build size's writers read the chunk files themselves
        stages.EXCHANGE_MIN_SHARDS = 1 << 62
    elif exchange:  # the exchange also where this one process writes every shard
        stages.EXCHANGE_MIN_VISITS = 0
    prof = cProfile.Profile(time.process_time)
    t0 = time.process_time()
    prof.enable()
    try:
        cli(["repack", str(full), "-o", str(out), *repack_args, "--num-proc", "1"], standalone_mode=False)
    except SystemExit as e:
        if e.code:
            raise
    prof.disable()
    total = time.process_time() - t0
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)

    def cum(name: str, file: str = "", caller: str = "") -> float:
        found = 0.0
        for (f, _, fn), (_, _, _, ct, callers) in stats.items():
            if fn != name or file not in f:
                continue
            if not caller:
                found += ct
            else:
                found += sum(edge[3] for (cf, _, cfn), edge in callers.items() if cfn == caller)
        return found

    rows = [
        ("exchange: map tasks (all)", cum("_exchange_map", "stages.py")),
        ("  their reads + copies (take_rows)", cum("take_rows", "assemble.py", "_exchange_map")),
        ("  their IPC writes (write_ipc_atomic)", cum("write_ipc_atomic", "cache.py", "_exchange_map")),
        ("write: shards (all)", cum("_write_shard", "stages.py")),
        ("  gather from map outputs (Exchange.gather)", cum("take_rows", "assemble.py", "<lambda>")),
        ("  gather from chunk files (EncodeCache.take)", cum("take", "cache.py", "_write_shard")),
        ("  pack assembly (assemble_packs)", cum("assemble_packs", "assemble.py", "_assembled")),
        ("  Parquet encode (ParquetWriter.write_table)", cum("write_table", "parquet", "_write_parquet")),
        ("  shard checksum (sha256_file)", cum("sha256_file", "io.py", "write_shard")),
        ("  marker json", cum("write_json_atomic", "io.py", "_write_shard")),
        ("take_rows: file opens (read)", cum("read", "assemble.py", "take_rows")),
        ("take_rows: copy_ranges", cum("copy_ranges", "gather.py")),
        ("plan (plan_packs)", cum("plan_packs", "stages.py")),
        ("the whole repack (process time)", total),
    ]
    for name, v in rows:
        print(f"{name:46s} {v:7.2f} CPU-s", flush=True)
    if top:
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    code = ("import time; t = time.process_time(); from packer.pipeline.local import _worker_init; "
            "import packer.pipeline.stages; _worker_init(); print(time.process_time() - t)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    print(f"{'a pool worker: imports + initializer':46s} {float(start.stdout):7.2f} CPU-s (once per worker)")


PHASES = (("warm-planner thread (kernel loads)", "packer.pipeline.build", "warm_planner"),
          ("cached columns (build._cached)", "packer.pipeline.build", "_cached"),
          ("plan (stages.plan_packs)", "packer.pipeline.build", "plan_packs"),
          ("gather (assemble.take_rows)", "packer.pipeline.cache", "take_rows"),
          ("pack assembly (assemble_packs)", "packer.pipeline.stages", "assemble_packs"),
          ("Parquet + checksum (io.write_shard)", "packer.pipeline.stages", "write_shard"))


def breakdown_child(full: Path, out: Path, repack_args: list[str]) -> None:
    """``--breakdown``'s fresh process: the repack of ``full`` into ``out``, CPU (user, system) and minor page faults
    of each phase, as JSON on the last line of stdout."""
    import importlib
    import resource

    def usage(who: int = resource.RUSAGE_THREAD) -> tuple[float, float, int]:
        """The calling thread's CPU (a phase's own: the build loads numba's kernels in a thread meanwhile), or
        the process's (``RUSAGE_SELF``)."""
        r = resource.getrusage(who)
        return r.ru_utime, r.ru_stime, r.ru_minflt

    got: dict[str, list[float]] = {}

    def add(name: str, a: tuple[float, float, int], b: tuple[float, float, int]) -> None:
        got.setdefault(name, [0.0, 0.0, 0])
        for i in range(3):
            got[name][i] += b[i] - a[i]

    start = (0.0, 0.0, 0)
    import gc

    collecting: list[tuple[float, float, int]] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:  # every collection, automatic or not, in any phase
        if phase == "start":
            collecting.append(usage())
        elif collecting:
            add("cyclic GC (counted in the rows below too)", collecting.pop(), usage())
    gc.callbacks.append(on_gc)
    from packer.cli import cli
    add("interpreter, this script + packer.cli imports", start, usage(resource.RUSAGE_SELF))
    t0 = usage()
    import numba  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    add("import numba, pandas, pyarrow.parquet", t0, usage())

    def wrap(name: str, module: str, attr: str) -> None:
        mod = importlib.import_module(module)
        f = getattr(mod, attr)

        def timed_phase(*a: object, **k: object) -> object:
            u = usage()
            try:
                return f(*a, **k)
            finally:
                add(name, u, usage())
        setattr(mod, attr, timed_phase)

    for name, module, attr in PHASES:
        wrap(name, module, attr)
    t1 = usage()
    try:
        cli(["repack", str(full), "-o", str(out), *repack_args], standalone_mode=False)
    except SystemExit as e:
        if e.code:
            raise
    add("the repack's main thread (its command)", t1, usage())
    add("the whole process", start, usage(resource.RUSAGE_SELF))
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    got["pool workers, if any"] = [r.ru_utime, r.ru_stime, r.ru_minflt]
    print(json.dumps(got))


def breakdown(args: argparse.Namespace, root: Path, repack_args: list[str]) -> None:
    """``--breakdown``: ``--pairs`` repacks of the kept full build, each in a fresh process, CPU per phase."""
    import statistics

    if args.keep is None:
        raise SystemExit("--breakdown needs --keep DIR (the full build it repacks, made there once)")
    corpus, full = args.keep / f"corpus-{args.records}.jsonl", args.keep / f"full-{args.records}"
    if not (full / "manifest.json").exists():
        if not corpus.exists():
            make_corpus(corpus, args.coco, args.records)
        show("full build (8192)", timed(["build", str(corpus), "-o", str(full), "--max-length", "8192", "--overwrite",
                                         *BUILD, "--num-proc", str(args.num_proc)]))
    print(cache_size(full), flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    runs = []
    for k in range(args.pairs + 1):  # the first untimed: the kernels compiled and cached
        shutil.rmtree(root / "repack", ignore_errors=True)
        res = subprocess.run([sys.executable, __file__, "--breakdown-child", str(full), str(root / "repack"),
                              *repack_args], env=env, cwd=REPO, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"the repack failed:\n{res.stderr}")
        if k:
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    names = list(runs[0])
    for name in names:
        u = statistics.median(r[name][0] for r in runs)
        s = statistics.median(r[name][1] for r in runs)
        f = statistics.median(r[name][2] for r in runs)
        print(f"{name:40s} {u + s:6.2f} CPU-s (user {u:5.2f}, system {s:5.2f}; {f:9,.0f} minor faults)")
    whole = [sum(r["the whole process"][:2]) for r in runs]
    print(f"median of {len(runs)} fresh processes; the whole process: {', '.join(f'{w:.2f}' for w in whole)} CPU-s")


_PERF_KINDS: tuple[tuple[str, str, str], ...] = (  # (what, how perf report is read, the symbol or dso)
    ("kernel: page faults, all", "children", "asm_exc_page_fault"),
    ("... zeroing fresh anonymous pages", "self", "clear_page_erms"),
    ("... file mappings' faults (filemap)", "children", "do_fault"),
    ("kernel: munmap", "children", "__x64_sys_munmap"),
    ("kernel: writes", "children", "ksys_write"),
    ("kernel: everything", "dso", "[kernel.kallsyms]"),
    ("the interpreter (libpython; its GC: --breakdown)", "dso", "libpython3"),
    ("zstd (in libarrow)", "prefix", "ZSTD_ HUF_ FSE_ HIST_"),
    ("libparquet", "dso", "libparquet"),
    ("libarrow (zstd included)", "dso", "libarrow.so"),
    ("numba's compiled kernels ([JIT])", "dso", "[JIT]"),
    ("libc memcpy/memmove", "prefix", "__memmove __memcpy"),
)


def perf(args: argparse.Namespace, root: Path, repack_args: list[str]) -> None:
    """``--perf``: one fresh repack of the kept full build under ``perf record``, its samples by kind."""
    import re

    if args.keep is None or shutil.which("perf") is None:
        raise SystemExit("--perf needs --keep DIR and Linux perf on PATH")
    full = args.keep / f"full-{args.records}"
    if not (full / "manifest.json").exists():
        raise SystemExit(f"--perf repacks {full}: make it first (--breakdown or --ab with the same --keep)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "packer.cli", "repack", str(full), "-o", str(root / "repack"), *repack_args]
    subprocess.run(cmd, env=env, cwd=REPO, check=True)  # untimed: the kernels compiled and cached
    shutil.rmtree(root / "repack")
    data = root / "perf.data"
    subprocess.run(["perf", "record", "-q", "-F", "999", "-g", "-o", str(data), "--", *cmd], env=env, cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL)
    line = re.compile(r"^\s*([0-9.]+)%\s+(?:([0-9.]+)%\s+)?(\S.*?)\s+\[([.k])\]\s+(\S+)")
    rows = {}
    for mode in ("self", "children"):
        out = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "-g", "none", "--sort", "dso,sym",
                              "--children" if mode == "children" else "--no-children"],
                             capture_output=True, text=True, check=True).stdout
        rows[mode] = [(float(m[1]), m[3], m[5]) for m in map(line.match, out.splitlines()) if m]
    events = re.search(r"Event count \(approx\.\): ([0-9]+)", out)  # cpu-clock: nanoseconds
    cpu = int(events[1]) / 1e9 if events else 0.0
    print(f"one repack under perf record (999 Hz): {cpu:.2f} CPU-s sampled")
    for what, how, names in _PERF_KINDS:
        keys = names.split() if how in ("self", "prefix", "children") else [names]
        if how == "dso":
            pct = sum(p for p, dso, _ in rows["self"] if dso.startswith(names))
        elif how == "prefix":
            pct = sum(p for p, _, sym in rows["self"] if sym.startswith(tuple(keys)))
        else:
            pct = sum(p for p, _, sym in rows[how] if sym in keys) if how == "self" else \
                max((p for p, _, sym in rows[how] if sym in keys), default=0.0)
        print(f"{what:44s} {pct:5.1f}%  ~{pct / 100 * cpu:5.2f} CPU-s")


def show(name: str, r: dict[str, float], full: dict[str, float] | None = None) -> None:
    share = f"  = {r['cpu'] / full['cpu']:.1%} of the full build's CPU, {r['quiet'] / full['quiet']:.1%} of its " \
        f"quiet wall estimate ({r['wall'] / full['wall']:.1%} of its wall)" if full else ""
    print(f"{name:34s} wall {r['wall']:7.1f} s (quiet estimate {r['quiet']:6.2f} s, load {r['load']:.1f})  CPU "
          f"{r['cpu']:7.1f} s (main {r['main']:5.1f}, workers {r['cpu'] - r['main']:5.1f})  peak RSS "
          f"{r['rss_mib']:6.0f} MiB{share}", flush=True)


def sums(out: Path) -> list[str]:
    return [s["sha256"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


def cache_size(full: Path) -> str:
    """The encode cache's chunk files of the build ``full``: bytes in all, per example."""
    size = sum(p.stat().st_size for p in (full / ".packer" / "encode").glob("chunk-*.arrow"))
    rows = json.loads((full / "stats.json").read_text())["examples"]
    return f"encode cache {size:,} bytes in its chunk files ({size / rows:,.0f} B per example, {rows:,} examples)"


def ab(args: argparse.Namespace, root: Path, repack_args: list[str]) -> None:
    """``--ab``: alternated repacks of the kept full build with two trees, CPU seconds per pair."""
    import statistics

    if args.keep is None:
        raise SystemExit("--ab needs --keep DIR (the full build it repacks, made there once)")
    corpus = args.keep / f"corpus-{args.records}.jsonl"
    if not corpus.exists():
        make_corpus(corpus, args.coco, args.records)
    names = [args.ab[0], args.ab[1] if len(args.ab) > 1 else "this tree"]
    trees = [checkout(rev, root / f"tree-{i}") for i, rev in enumerate(args.ab)] + [None] * (2 - len(args.ab))
    # --own-builds: each tree repacks a full build of its own (a change of the encode cache's format)
    fulls = [args.keep / (f"full-{args.records}" + (f"-{i}" if args.own_builds else "")) for i in (0, 1)]
    for i, full in enumerate(fulls):
        if not (full / "manifest.json").exists():
            r = timed(["build", str(corpus), "-o", str(full), "--max-length", "8192", "--overwrite", *BUILD,
                       "--num-proc", str(args.num_proc)], trees[i] if args.own_builds else None)
            show(f"{names[i] if args.own_builds else 'both'}: full build (8192)", r)
    for name, full in zip(names, fulls, strict=True):
        print(f"{name}: {cache_size(full)}", flush=True)
    out = [root / "repack-a", root / "repack-b"]
    for tree, o, full in zip(trees, out, fulls, strict=True):  # untimed: each tree's kernels compiled and cached
        timed(["repack", str(full), "-o", str(o), *repack_args], tree)
    if sums(out[0]) != sums(out[1]):
        raise SystemExit(f"{names[0]}'s and {names[1]}'s repacked shards differ")
    runs: list[list[dict[str, float]]] = [[], []]
    for k in range(args.pairs):
        for i in (0, 1) if k % 2 == 0 else (1, 0):
            shutil.rmtree(out[i])
            runs[i].append(timed(["repack", str(fulls[i]), "-o", str(out[i]), *repack_args], trees[i],
                                 args.num_proc))
        a, b = runs[0][-1], runs[1][-1]
        print(f"pair {k + 1}: {names[0]} {a['cpu']:5.2f}  {names[1]} {b['cpu']:5.2f} CPU-s; quiet wall estimate "
              f"{a['quiet']:5.2f} / {b['quiet']:5.2f} s (wall {a['wall']:5.2f} / {b['wall']:5.2f} s, load "
              f"{a['load']:.1f} / {b['load']:.1f}); peak RSS {a['rss_mib']:.0f} / {b['rss_mib']:.0f} MiB", flush=True)
    for key, what in (("cpu", "CPU-s"), ("quiet", "s quiet wall estimate"), ("wall", "s wall (loaded)")):
        x, y = ([r[key] for r in rs] for rs in runs)
        diff = [b - a for a, b in zip(x, y, strict=True)]
        print(f"mean {names[0]} {statistics.mean(x):.2f}, {names[1]} {statistics.mean(y):.2f} {what}; "
              f"{names[1]} - {names[0]}: mean {statistics.mean(diff):+.2f} ({statistics.mean(diff) / statistics.mean(x):+.1%}), "
              f"median {statistics.median(diff):+.2f}, {sum(d < 0 for d in diff)}/{len(diff)} pairs lower")
    print(f"shards equal; peak RSS {max(r['rss_mib'] for r in runs[0]):.0f} / "
          f"{max(r['rss_mib'] for r in runs[1]):.0f} MiB", flush=True)
    if args.full_runs:  # the ratio's denominator in the same run: fresh full builds of the kept corpus (this tree)
        fulls_timed = []
        for k in range(args.full_runs):
            shutil.rmtree(root / "full-timed", ignore_errors=True)  # --overwrite alone would reuse its encode cache
            r = timed(["build", str(corpus), "-o", str(root / "full-timed"), "--max-length", "8192", "--overwrite",
                       *BUILD, "--num-proc", str(args.num_proc)], None, args.num_proc)
            show(f"full build (8192) {k + 1}", r)
            fulls_timed.append(r)
        full = {key: statistics.mean(r[key] for r in fulls_timed) for key in ("cpu", "quiet", "wall")}
        for name, rs in zip(names, runs, strict=True):
            cpu, quiet = statistics.mean(r["cpu"] for r in rs), statistics.mean(r["quiet"] for r in rs)
            print(f"{name}: repack / full build (means): CPU {cpu:.2f} / {full['cpu']:.2f} = {cpu / full['cpu']:.1%}; "
                  f"quiet wall estimate {quiet:.2f} / {full['quiet']:.2f} s = {quiet / full['quiet']:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--before", help="a git revision: its full build and repack first, for a before/after")
    ap.add_argument("--coco", type=Path,
                    default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    ap.add_argument("--in-place", action="store_true",
                    help="also rebuild each full build's OUT with only packing options changed (--overwrite)")
    ap.add_argument("--profile-write", action="store_true",
                    help="only the repack, in this process: CPU per phase of its write stage")
    ap.add_argument("--keep", type=Path, help="with --profile-write: make the full build here once, reuse it")
    ap.add_argument("--no-exchange", action="store_true",
                    help="with --profile-write: no exchange whatever the build's size (what it saves or costs)")
    ap.add_argument("--exchange", action="store_true",
                    help="with --profile-write: the exchange even where one process writes few shards x chunks")
    ap.add_argument("--ab", nargs="+", metavar="REV", help="with --keep: alternated repacks of REV vs this tree "
                    "(or vs a second REV)")
    ap.add_argument("--pairs", type=int, default=6, help="with --ab: how many alternated pairs")
    ap.add_argument("--full-runs", type=int, default=0, help="with --ab: then this many fresh full builds of the kept "
                    "corpus (this tree), timed: the repacks' CPU and quiet wall estimate as a share of theirs")
    ap.add_argument("--own-builds", action="store_true", help="with --ab: each tree repacks a full build it made "
                    "itself (kept as DIR/full-N-0, -1): a change of the encode cache's format")
    ap.add_argument("--warm-records", type=int, default=2000,
                    help="with --before: the untimed build that compiles REV's numba kernels first, of this many "
                         "records (a small one leaves some of a large build's kernels to compile in its timed build)")
    ap.add_argument("--breakdown", action="store_true", help="with --keep: CPU per phase of fresh repacks")
    ap.add_argument("--perf", action="store_true", help="with --keep: one repack under perf record, by kind")
    ap.add_argument("--breakdown-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ap.add_argument("--top", type=int, default=0, help="with --profile-write: also the N functions of most own time")
    args = ap.parse_args()
    if args.breakdown_child:
        full, out, *rest = args.breakdown_child
        breakdown_child(Path(full), Path(out), rest)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        n = ["--num-proc", str(args.num_proc)]
        repack_args = ["--max-length", "4096", "--seed", "1", "-q"]
        if args.ab:
            ab(args, root, repack_args + n)
            return
        if args.breakdown:
            breakdown(args, root, repack_args + n)
            return
        if args.perf:
            perf(args, root, repack_args + n)
            return
        if args.profile_write:
            base = args.keep or root
            full = base / f"full-{args.records}"
            if not (full / "manifest.json").exists():
                make_corpus(base / f"corpus-{args.records}.jsonl", args.coco, args.records)
                show("full build (8192)", timed(["build", str(base / f"corpus-{args.records}.jsonl"), "-o", str(full),
                                                 "--max-length", "8192", "--overwrite", *BUILD, *n]))
            profile_write(full, root / "repack", repack_args, top=args.top,
                          exchange=False if args.no_exchange else True if args.exchange else None)
            return
        make_corpus(corpus, args.coco, args.records)
        full_args = [str(corpus), "--max-length", "8192", *BUILD, *n]
        repack_args += n
        code = full_before = None
        if args.before:
            code = checkout(args.before, root / "before")
            # untimed: a build and a repack of a small corpus compile the fresh checkout's numba kernels
            # (cached beside its sources), which this checkout has cached already
            make_corpus(root / "warm.jsonl", args.coco, args.warm_records)
            timed(["build", str(root / "warm.jsonl"), "-o", str(root / "warm"), "--max-length", "8192", *BUILD, *n],
                  code)
            timed(["repack", str(root / "warm"), "-o", str(root / "warm-repack"), *repack_args], code)
            full_before = timed(["build", *full_args, "-o", str(root / "full-before")], code)
            show(f"{args.before}: full build (8192)", full_before)
            rep = timed(["repack", str(root / "full-before"), "-o", str(root / "repack-before"), *repack_args], code)
            show(f"{args.before}: repack -> 4096, seed 1", rep, full_before)
        full = timed(["build", *full_args, "-o", str(root / "full")])
        show("full build (8192)", full)
        print(cache_size(root / "full"))
        kept = root / "full" / ".packer" / "encode" / "columns.arrow"
        if kept.exists():
            rows = json.loads((root / "full" / "stats.json").read_text())["examples"]
            print(f"encode/columns.arrow: {kept.stat().st_size:,} bytes ({kept.stat().st_size / rows:.1f} B per "
                  f"example, {rows:,} examples)")
        rep = timed(["repack", str(root / "full"), "-o", str(root / "repack"), *repack_args])
        show("repack -> 4096, seed 1", rep, full)
        fresh = timed(["build", str(corpus), "-o", str(root / "fresh"), "--max-length", "4096", "--seed", "1", *BUILD,
                       *n])
        show("fresh build (4096, seed 1)", fresh)
        same = sums(root / "repack") == sums(root / "fresh")
        before = "" if not args.before else \
            f"; {args.before}'s repack {'==' if sums(root / 'repack-before') == sums(root / 'fresh') else '!='} it"
        print(f"repack / fresh build: CPU {rep['cpu'] / fresh['cpu']:.1%}; repacked shards {'==' if same else '!='} "
              f"fresh build's ({len(sums(root / 'fresh'))} shards){before}")
        if args.in_place:  # OUT rebuilt with the repack's options: the encode cache reused in place
            rebuild = [str(corpus), "--max-length", "4096", "--seed", "1", "--overwrite", *BUILD, *n]
            for name, tree, out in ((args.before, code, "full-before"), ("this tree", None, "full")):
                if name is None:
                    continue
                base = full_before if tree is not None else full
                r = timed(["build", *rebuild, "-o", str(root / out)], tree)
                show(f"{name}: rebuild in place -> 4096, seed 1", r, base)
                print(f"  its shards {'==' if sums(root / out) == sums(root / 'fresh') else '!='} the fresh build's")

if __name__ == "__main__":
    main()
