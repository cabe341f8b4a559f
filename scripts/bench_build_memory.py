"""Peak RSS per example of `packer build`, every process of it, on tiny text records (issue 32).

Writes N tiny text records (2-40 words each, ``{"text": ...}``), builds them with ``--profile text
--num-proc 2`` in a fresh child process, and samples the RSS of every process of the build's tree (the
driver and each worker) every 0.1 s. Prints per size: the largest process's peak RSS, the driver's peak in
each stage (scan, encode, plan, exchange where it runs, write, finish: the driver's high-water mark, reset at
each boundary), the largest worker's RSS and USS in each of those stages (USS: its unique pages, read every
1 s; a forked worker's RSS also counts the driver's pages it shares), wall and CPU seconds (the whole tree),
and, over all sizes, the slope of peak RSS against records (bytes per example: a straight-line fit) and the
time per record.

    nice -n 10 python scripts/bench_build_memory.py --sizes 1e6 5e6 2e7
    python scripts/bench_build_memory.py --sizes 1e5            # smoke run (~1 min)
    python scripts/bench_build_memory.py --driver-only 1e6 2e7 1e8   # the driver after the encode, alone
    python scripts/bench_build_memory.py --driver-only --budgets 1e6 5e6   # the same with budgets (below)
    python scripts/bench_build_memory.py --driver-only --algorithm ffd --budgets 1e6 5e6   # ffd / next-fit
    python scripts/bench_build_memory.py --driver-only --algorithm ffd --budgets --no-copies 1e6   # no copies
    python scripts/bench_build_memory.py --driver-only --budgets --no-copies --balance 1e6   # balance_vision
    nice -n 10 python scripts/bench_build_memory.py --driver-only --copies 1e6 5e6 2e7   # budgets + copies only
    BENCH_CALL_PEAKS=1 python scripts/bench_build_memory.py --driver-only --copies 5e6   # + each planner call's
    BENCH_ONE_BUDGET=1 python scripts/bench_build_memory.py --driver-only --copies 5e6   # max_vision_tokens only
    nice -n 10 python scripts/bench_build_memory.py --shape image --sizes 5e5 2e6   # multimodal-shaped
    python scripts/bench_build_memory.py --sizes 2e7 --rows-per-shard 12   # the 1B regime: shards x map outputs
    python scripts/bench_build_memory.py --sizes 2e7 --rows-per-shard 12 --tree DIR   # DIR: git archive REV

``--shape image``: chats of 2-40 words a turn where 30% of the records open with one of 16 real COCO photos
(``PACKER_SHARED``'s coco-mini, reused: the header probe is per record), built with ``--profile qwen2-vl``.

``--driver-only --budgets``: 30% of the examples carry one image of 64-1280 vision tokens (their lengths
that plus 3-42 text tokens), planned with ``max_vision_tokens`` 2048, ``max_images`` 4 and
``max_examples_per_pack`` 32 (``refine`` on, the default); then the same where every 4th chunk is a second
source of weight 2 (up-sampled: each of its examples planned twice).

The records are kept in ``--dir`` (default a temp dir) between runs of the same size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WORDS = ("the a cat dog runs over under blue red house tree sky water fast slow big small green man woman "
         "child eats sees").split()


def make_records(path: Path, n: int, seed: int = 0) -> None:
    """n records ``{"text": "w w ..."}`` of 2-40 words each, assembled as bytes with numpy (20M in ~1 min)."""
    if path.exists():
        return
    rng = np.random.default_rng(seed)
    pieces = [w.encode() for w in WORDS] + [b" ", b'{"text": "', b'"}\n']  # words, space, prefix, suffix
    table = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    size = np.array([len(p) for p in pieces])
    first = np.concatenate([[0], np.cumsum(size)[:-1]])
    space, prefix, suffix = len(WORDS), len(WORDS) + 1, len(WORDS) + 2
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for a in range(0, n, 1_000_000):
            counts = rng.integers(2, 41, size=min(n, a + 1_000_000) - a)
            words = rng.integers(0, len(WORDS), size=int(counts.sum()))
            # piece ids per record: prefix, w, space, w, ..., w, suffix (2 * count + 1 pieces)
            per = 2 * counts + 1
            ends = np.cumsum(per)
            ids = np.full(int(ends[-1]), space, dtype=np.int64)
            ids[ends - per] = prefix
            ids[ends - 1] = suffix
            record = np.repeat(np.arange(len(counts)), counts)
            k = np.arange(len(words)) - np.repeat(np.cumsum(counts) - counts, counts)  # word number in its record
            ids[(ends - per)[record] + 1 + 2 * k] = words
            lens = size[ids]
            offs = np.cumsum(lens) - lens
            f.write(table[np.repeat(first[ids], lens) + np.arange(int(lens.sum())) - np.repeat(offs, lens)].tobytes())
    tmp.rename(path)


def make_image_records(path: Path, n: int, coco: Path, seed: int = 0) -> None:
    """n chat records, 30% with a COCO photo in the user turn (``--shape image``)."""
    if path.exists():
        return
    rng = np.random.default_rng(seed)
    photos = sorted(str(p) for p in (coco / "train2017").glob("*.jpg"))[:16]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for a in range(0, n, 100_000):
            m = min(n, a + 100_000) - a
            counts, pick, has = rng.integers(2, 41, size=(m, 2)), rng.integers(0, len(photos), m), rng.random(m)
            words = np.array(WORDS)[rng.integers(0, len(WORDS), size=int(counts.sum()))]
            ends = np.cumsum(counts.ravel())
            texts = [" ".join(words[e - c:e]) for e, c in zip(ends, counts.ravel(), strict=True)]
            for i in range(m):
                user: object = texts[2 * i]
                if has[i] < 0.3:
                    user = [{"type": "image", "image": photos[pick[i]]}, {"type": "text", "text": texts[2 * i]}]
                f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                                 {"role": "assistant", "content": texts[2 * i + 1]}]}) + "\n")
    tmp.rename(path)


def _child(path: str, out: str, num_proc: int, profile: str = "text", rows_per_shard: str = "0") -> None:
    """One build in this process; print the driver's peak RSS per stage (MiB) and the stage wall times."""
    from packer.config import BuildConfig
    from packer.pipeline.build import build, make_executor

    # Each stage's peak from the kernel's high-water mark, reset at every stage boundary (no sampler thread:
    # a thread in this process would have the build spawn its pool instead of forking it, as the CLI does)
    stage = ["scan"]
    peaks: dict[str, int] = {}
    walls: dict[str, float] = {}

    def mark(name: str) -> None:
        walls[stage[0]] = time.perf_counter() - t0
        status = open("/proc/self/status").read()
        peaks[stage[0]] = int(status.split("VmHWM:")[1].split()[0]) * 1024
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        stage[0] = name

    extra = {"max_pixels": 256 * 28 * 28} if profile != "text" else {}
    if int(rows_per_shard):
        extra.update(rows_per_shard=int(rows_per_shard), rows_per_row_group=int(rows_per_shard))
    config = BuildConfig.from_inputs([path], out, profile=profile, num_proc=num_proc, overwrite=True, **extra)
    inner = make_executor(config)

    class Timed(type(inner)):  # the stage boundaries, as the build crosses them
        def encode(self, chunks, **kw):
            mark("encode")
            yield from inner.encode(chunks, **kw)
            mark("plan")

        def exchange(self, tasks, **kw):
            mark("exchange")
            yield from inner.exchange(tasks, **kw)

        def write(self, ranges, **kw):
            mark("write")
            yield from inner.write(ranges, **kw)
            mark("finish")

    timed = Timed.__new__(Timed)
    timed.__dict__ = inner.__dict__
    t0 = time.perf_counter()
    build(config, progress=False, executor=timed)
    mark("end")
    ends = {k: t0 + v for k, v in walls.items()}  # perf_counter is system-wide: the sampler maps its samples
    print(json.dumps({"driver_peak_mib": {k: v / 2**20 for k, v in peaks.items()}, "stage_end_s": walls,
                      "stage_end_abs": ends}))


def _driver_only(n: int, refine: bool, budgets: bool = False, copies: bool = False, algorithm: str = "bfd",
                 balance: bool = False) -> None:
    """The driver's part after the encode, alone, on n synthetic examples (no tokenizer, no workers): per-chunk
    compact columns as ``build`` reads them (lengths 3-42 tokens, the tiny records' spread), gathered, planned,
    saved (``plan.npz``), cut into shard ranges and summarized by ``compute_stats``. Prints the peak RSS above the imports (VmHWM),
    overall and per phase (columns gathered, plan, save + shard ranges, stats)."""
    from packer.config import BuildConfig
    from packer.pipeline.build import _save_plan
    from packer.pipeline.columns import ChunkColumns, ColumnsBuilder
    from packer.pipeline.stages import CHUNK_LINES, plan_packs, shard_ranges, warm_planner
    from packer.report.stats import compute_stats

    def status(key: str) -> int:
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

    if budgets:
        config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": ["a.jsonl"]},
                                                    {"name": "b", "paths": ["b.jsonl"],
                                                     "weight": 2.0 if copies else 1.0}]},
                                       output="out", profile="qwen2-vl", refine=refine, max_vision_tokens=2048,
                                       algorithm=algorithm, balance_vision=balance,
                                       **({} if os.environ.get("BENCH_ONE_BUDGET") else
                                          {"max_images": 4, "max_examples_per_pack": 32}))
    else:
        config = BuildConfig.from_inputs(["tiny.jsonl"], "out", profile="text", refine=refine, algorithm=algorithm)
    warm_planner(config)
    compute_stats(lengths=np.ones(4, np.uint16), vision=None, packs=(np.arange(4, dtype=np.int32),
                  np.array([0, 4], np.int32)), capacity=8, loss_tokens=np.ones(4, np.uint16))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = status("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    rng = np.random.default_rng(0)
    built = ColumnsBuilder(n)
    for a in range(0, n, CHUNK_LINES):
        tokens = rng.integers(3, 43, size=min(n, a + CHUNK_LINES) - a).astype(np.uint16)
        counts = {}
        if budgets:
            images = (rng.random(len(tokens)) < 0.3).astype(np.uint8)  # as read_chunk narrows an item count
            vision = (images * rng.integers(64, 1281, size=len(tokens))).astype(np.uint16)
            tokens = tokens + vision
            counts = {"num_vision_tokens": vision, "num_images": images}
        built.add(ChunkColumns(tokens=tokens, loss_tokens=tokens - vision - 2 if budgets else tokens - 2,
                               counts=counts, loss_weight=None, linear=None, over=np.zeros(0, np.int64), rejects=[]))
    names = [s.name for s in config.sources]
    columns = built.finish([names[1] if budgets and c % 4 == 3 else names[0] for c in range(len(built.rows))])
    phases: dict[str, float] = {"columns": (status("VmHWM") - base) / 2**20}

    ends: dict[str, float] = {}

    def phase(name: str) -> None:  # this phase's peak above the base, then VmHWM := VmRSS for the next
        phases[name] = (status("VmHWM") - base) / 2**20
        ends[name] = (status("VmRSS") - base) / 2**20
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    phase("columns")
    if os.environ.get("BENCH_CALL_PEAKS"):  # each planner call's own peak above the base (VmHWM reset around it)
        import importlib
        import importlib.util

        def peaks_of(module: object, name: str) -> None:
            call = getattr(module, name)

            def wrapped(*args, **kw):
                phase("before " + name)
                out = call(*args, **kw)
                phase(name)
                return out
            setattr(module, name, wrapped)
        bulk_budgets = importlib.import_module("packer.packing.bulk_budgets")
        for name in ("plan_budgeted", "separate_copies_bulk"):
            peaks_of(bulk_budgets, name)
        if importlib.util.find_spec("packer.packing.bulk_balance"):  # a tree before it balanced with plan()
            peaks_of(importlib.import_module("packer.packing.bulk_balance"), "plan_balanced")
    c1 = time.process_time()
    plan = plan_packs(columns, config)
    plan_cpu = time.process_time() - c1
    phase("plan")
    with tempfile.TemporaryDirectory() as work:
        _save_plan(Path(work), plan)  # as build writes it
    shards = sum(1 for _ in shard_ranges(plan, rows_per_shard=config.rows_per_shard))  # one at a time, as sent
    phase("save")
    stats = compute_stats(**plan.stats_columns(names), packs=(plan.order, plan.bounds),  # as build passes them
                          capacity=config.max_length, input_records=n)
    phase("stats")
    print(json.dumps({"algorithm": algorithm, "balance_vision": balance, "refine": refine, "budgets": budgets, "copies": copies, "examples": n, "planned": plan.num_examples, "packs": stats["packs"], "shards": shards, "base_mib": base / 2**20,
                      "peak_above_base_mib": max(phases.values()), "phase_peaks_mib": phases, "phase_ends_mib": ends,
                      "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "plan_cpu_s": plan_cpu,
                      "plan_us_per_example": plan_cpu / max(plan.num_examples, 1) * 1e6}))


def _tree(pid: int, peaks: dict[int, tuple[str, int]], cpu: dict[int, float],
          samples: list[tuple[float, str, int, int]] | None = None, uss: bool = False) -> None:
    """One sample of the build's process tree: peak RSS and CPU per process; with ``samples``, each worker's
    RSS (and, with ``uss``, its unique set size: the pages no other process shares) with the time."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            with p.oneshot():
                rss = p.memory_info().rss
                t = p.cpu_times()
                name = "driver" if p.pid == pid else "worker"
        except psutil.NoSuchProcess:
            continue
        peaks[p.pid] = (name, max(peaks.get(p.pid, (name, 0))[1], rss))
        cpu[p.pid] = t.user + t.system
        if samples is not None and name == "worker":
            try:
                u = p.memory_full_info().uss if uss else 0
            except psutil.Error:
                u = 0
            samples.append((time.perf_counter(), name, rss, u))


def run_build(path: Path, out: Path, num_proc: int, profile: str = "text", rows_per_shard: int = 0,
              tree: Path = REPO) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path), str(out), str(num_proc), profile,
           str(rows_per_shard)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peaks: dict[int, tuple[str, int]] = {}
    cpu: dict[int, float] = {}
    samples: list[tuple[float, str, int, int]] = []
    progress, last, tick = out.parent / f"progress-{out.name}.json", 0.0, 0
    while proc.poll() is None:
        # a forked worker's RSS counts the driver's pages it shares; its USS (read every 1 s: smaps costs more)
        # is what it adds on its own
        _tree(proc.pid, peaks, cpu, samples, uss=tick % 10 == 0)
        tick += 1
        time.sleep(0.1)
        if time.perf_counter() - last > 10:  # the peaks so far, for a run stopped before it ends
            last = time.perf_counter()
            progress.write_text(json.dumps({"wall_s": last - t0, "cpu_s": sum(cpu.values()), "peaks_mib": {
                f"{name} {pid}": rss / 2**20 for pid, (name, rss) in peaks.items()}}))
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"packer build failed with exit code {proc.returncode}")
    child = json.loads(proc.stdout.read().strip().splitlines()[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    driver = max(v for n, v in peaks.values() if n == "driver")
    workers = [v for n, v in peaks.values() if n == "worker"]
    by_stage: dict[str, list[float]] = {}
    start = t0
    for stage, end in child.get("stage_end_abs", {}).items():  # each stage's largest worker RSS and USS, MiB
        inside = [(rss, u) for t, _, rss, u in samples if start <= t < end]
        if inside:
            by_stage[stage] = [max(r for r, _ in inside) / 2**20, max(u for _, u in inside) / 2**20]
        start = end
    return {"examples": manifest["totals"]["examples"], "packs": manifest["totals"]["packs"], "wall_s": wall,
            "cpu_s": sum(cpu.values()), "peak_mib": max(driver, *workers) / 2**20, "driver_mib": driver / 2**20,
            "worker_mib": max(workers, default=0) / 2**20,
            "worker_uss_mib": max((u for *_, u in samples), default=0) / 2**20,
            "worker_peak_mib_by_stage": by_stage, **child}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:7])
        return
    if sys.argv[1:2] == ["--driver-only"]:
        ap = argparse.ArgumentParser(prog="bench_build_memory.py --driver-only")
        ap.add_argument("--budgets", action="store_true", help="refine on, then the same with copies")
        ap.add_argument("--copies", action="store_true", help="budgets + copies only")
        ap.add_argument("--no-copies", action="store_true", help="budgets without copies only")
        ap.add_argument("--algorithm", choices=("bfd", "ffd", "next-fit"), default="bfd")
        ap.add_argument("--balance", action="store_true", help="balance_vision on (with --budgets / --copies)")
        ap.add_argument("sizes", nargs="+")
        args = ap.parse_args(sys.argv[2:])
        budgets = args.budgets or args.copies
        modes = (("1", "1", "0"), ("1", "1", "1")) if budgets else (("1", "0", "0"), ("0", "0", "0"))
        if args.copies:
            modes = modes[1:]  # the budgets + copies rows only
        elif args.no_copies:
            modes = modes[:1]  # the budgets rows without copies only
        for mode in modes:  # (refine, budgets, copies)
            for size in args.sizes:  # each in a fresh process
                subprocess.run([sys.executable, __file__, "--driver-only-child", size, *mode, args.algorithm,
                                *(["1"] if args.balance else [])], check=True)
        return
    if sys.argv[1:2] == ["--driver-only-child"]:
        _driver_only(int(float(sys.argv[2])), *(flag == "1" for flag in sys.argv[3:6]), *sys.argv[6:7],
                     *(flag == "1" for flag in sys.argv[7:8]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6])
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None, help="where the records (and builds) go")
    ap.add_argument("--shape", choices=("text", "image"), default="text", help="tiny text records, or chats with "
                    "COCO photos in 30%% of them (qwen2-vl)")
    ap.add_argument("--rows-per-shard", type=int, default=0, help="packs a shard (and a row group); 0: the default. "
                    "A few: the shards x map outputs of a 1B build at a small one's size (each shard ~25k "
                    "examples at 1B: ~39k shards, ~39k map outputs)")
    ap.add_argument("--tree", type=Path, default=REPO, help="the packer whose builds are measured (default this "
                    "checkout; a `git archive` of another revision for a before/after)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-build-memory-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        n = int(size)
        if args.shape == "text":
            path, profile = root / f"tiny-{n}.jsonl", "text"
            make_records(path, n)
        else:
            path, profile = root / f"image-{n}.jsonl", "qwen2-vl"
            shared = Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared"))
            make_image_records(path, n, shared / "data" / "coco-mini")
        r = run_build(path, root / f"out-{n}", args.num_proc, profile, args.rows_per_shard, args.tree.resolve())
        rows.append(r)
        stages = ", ".join(f"{k} {v:.0f}" for k, v in r["driver_peak_mib"].items())
        wstages = ", ".join(f"{k} {v[0]:.0f}/{v[1]:.0f}" for k, v in r["worker_peak_mib_by_stage"].items())
        print(f"{n:,} records: {r['examples']:,} examples, {r['packs']:,} packs; peak RSS {r['peak_mib']:.0f} MiB "
              f"(driver {r['driver_mib']:.0f}, largest worker {r['worker_mib']:.0f}, its USS "
              f"{r['worker_uss_mib']:.0f}); driver by stage: {stages}; largest worker RSS/USS by stage: {wstages}; "
              f"{r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} CPU-s ({r['cpu_s'] / n * 1e6:.1f} CPU-us/record)",
              flush=True)
        import shutil

        shutil.rmtree(root / f"out-{n}", ignore_errors=True)
    if len(rows) > 1:
        x = np.array([r["examples"] for r in rows], dtype=float)
        for key in ("peak_mib", "driver_mib", "worker_mib", "worker_uss_mib"):
            slope, icpt = np.polyfit(x, np.array([r[key] for r in rows]) * 2**20, 1)
            print(f"{key}: {slope:.1f} B per example + {icpt / 2**20:.0f} MiB")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
