"""Benchmark the bulk planner (packer.packing.bulk.plan_bulk) at 10M / 100M lengths against today's plan().

Every measurement is one fresh child process: it loads the lengths (.npy, uint16), compiles the kernels on
a slice, resets the peak-RSS mark (/proc/self/clear_refs, then VmHWM is the peak from there), and times
the call --repeats times (wall: best; CPU: best process_time, which counts page faults too). Peak RSS is
the first call's (each result is freed before the next call). Prints markdown tables, the source of
docs/benchmarks.md "Planner at 10M / 100M lengths", and a linear extrapolation to 1B.

    python scripts/bench_scale.py                           # 10M and 100M, lognormal and Wikipedia (~10 min)
    python scripts/bench_scale.py --sizes 1e7 1e8 1e9       # + 1B (needs ~10 GiB free; ~15 min more)
    python scripts/bench_scale.py --sizes 1e6 --repeats 1   # smoke run (~30 s)

Lengths: lognormal around 300 tokens (sigma 1, scripts/bench_packing.py's workload) at capacity 8192, and
the Wikipedia/BERT histogram (Krell et al. 2021) at capacity 512 sampled to n (rng.choice with the
histogram's frequencies). Both drawn in chunks straight to uint16 so the parent stays small.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HISTOGRAMS = Path(__file__).resolve().parents[2] / "shared" / "data" / "length-histograms"
CHUNK = 10_000_000  # lengths drawn per call: 80 MB of float64 at a time

_PROBE = r"""
import json, sys, time
import numpy as np
from packer.packing import kernels
from packer.packing.bulk import plan_bulk
from packer.packing.planner import plan

path, mode, capacity, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])  # KiB

lengths = np.load(path)
calls = {
    "bulk": lambda x: plan_bulk(x, capacity).num_packs,
    # the one-at-a-time kernel plan() used before it handed its tokens-only path to plan_bulk
    "plan": lambda x: kernels.bfd_fast(np.ascontiguousarray(x, dtype=np.int64), capacity, 0)[1],
    "refine": lambda x: int(plan(x, capacity, refine=True).max()) + 1,
}
if mode == "verify":  # element-wise: the bulk plan's pack ids against plan()'s, same seed
    assign, num_packs = kernels.bfd_fast(np.ascontiguousarray(lengths, dtype=np.int64), capacity, 0)
    same = bool(np.array_equal(plan_bulk(lengths, capacity).pack_ids(),
                               np.random.default_rng(0).permutation(num_packs)[assign]))
    print(json.dumps({"equal": same}))
    sys.exit()
calls[mode](lengths[:1000])  # compile / load the numba cache before the baseline
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
base = status("VmRSS")
walls, cpus, peak = [], [], None
for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    packs = calls[mode](lengths)
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
    peak = peak or status("VmHWM")
print(json.dumps({"wall": min(walls), "cpu": min(cpus), "base_kib": base, "peak_kib": peak, "packs": packs}))
"""


def lognormal_lengths(n: int, capacity: int = 8192, seed: int = 0) -> np.ndarray:
    """bench_packing.lognormal_lengths, drawn in chunks (the same values) and stored as uint16."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.uint16)
    for a in range(0, n, CHUNK):
        raw = rng.lognormal(np.log(300), 1.0, min(CHUNK, n - a))
        out[a : a + raw.size] = np.clip(np.rint(raw), 1, capacity)
    return out


def wikipedia_lengths(n: int, seed: int = 0) -> np.ndarray:
    """n lengths drawn from the Wikipedia/BERT-512 histogram's frequencies (16.3M sequences there)."""
    table = np.loadtxt(HISTOGRAMS / "wikipedia_bert_512.csv", delimiter=",", skiprows=1, dtype=np.int64)
    values, freq = table[:, 0], table[:, 1] / table[:, 1].sum()
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.uint16)
    for a in range(0, n, CHUNK):
        out[a : min(n, a + CHUNK)] = rng.choice(values, size=min(CHUNK, n - a), p=freq)
    return out


WORKLOADS = {"lognormal": (lognormal_lengths, 8192), "wikipedia": (wikipedia_lengths, 512)}


def mem_available_kib() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable"):
            return int(line.split()[1])
    return 0


def probe(path: Path, mode: str, capacity: int, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path), mode, str(capacity), str(repeats)],
                         capture_output=True, text=True, env=env)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"probe {mode} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e7, 1e8], help="numbers of lengths")
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["lognormal", "wikipedia"])
    ap.add_argument("--repeats", type=int, default=3, help="calls per child process (best time)")
    ap.add_argument("--plan-max", type=float, default=1e8, help="largest n at which today's plan() runs")
    ap.add_argument("--refine-max", type=float, default=2e7, help="largest n at which plan(refine=True) runs")
    ap.add_argument("--verify-max", type=float, default=1e8, help="largest n for the element-wise check")
    args = ap.parse_args()
    import numba

    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}, "
          f"load average {os.getloadavg()[0]:.1f} at start")  # fmt: skip
    rows, extrapolate = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            make, capacity = WORKLOADS[workload]
            for size in args.sizes:
                n = int(size)
                lengths = make(n)
                lb = -(-int(lengths.sum(dtype=np.int64)) // capacity)
                path = Path(tmp) / "lengths.npy"
                np.save(path, lengths)
                del lengths
                modes = ["bulk"]
                if n <= args.plan_max:
                    # plan() holds ~40 bytes per example (int64 copy, slot table, assignment, ids)
                    if mem_available_kib() * 1024 > 60 * n:
                        modes.append("plan")
                    else:
                        print(
                            f"skip plan() at {n:,}: MemAvailable {mem_available_kib() // 1024} MiB < 60 B/example"
                        )
                if n <= args.refine_max:
                    modes.append("refine")
                results = {}
                for mode in modes:
                    results[mode] = probe(path, mode, capacity, 1 if mode == "refine" else args.repeats)
                    r = results[mode]
                    print(f"  {workload} {n:,} {mode}: {r}", file=sys.stderr, flush=True)
                equal = None
                if n <= args.verify_max and "plan" in modes:
                    equal = probe(path, "verify", capacity, 1)["equal"]
                for mode, r in results.items():
                    rows.append((workload, capacity, n, mode, r, lb, equal if mode == "bulk" else None))
                extrapolate[(workload, n)] = results["bulk"]
                path.unlink()

    label = {"bulk": "plan_bulk", "plan": "plan(bfd)", "refine": "plan(bfd, refine=True)"}
    print("\n| lengths | capacity | examples | planner | wall (s) | CPU (s) | RSS before (lengths) | peak RSS "
          "| above lengths | bytes/example | packs | over LB | same ids as plan |")  # fmt: skip
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for workload, capacity, n, mode, r, lb, equal in rows:
        base, peak = r["base_kib"] / 1024, r["peak_kib"] / 1024
        above = (r["peak_kib"] - r["base_kib"]) * 1024 / n
        same = "" if equal is None else ("yes" if equal else "**no**")
        print(f"| {workload} | {capacity} | {n:,} | {label[mode]} | {r['wall']:.2f} | {r['cpu']:.2f} | {base:,.0f} MiB "
              f"| {peak:,.0f} MiB | {peak - base:,.0f} MiB | {above:.1f} | {r['packs']:,} | +{r['packs'] - lb:,} "
              f"| {same} |")  # fmt: skip

    target = 10**9
    print(
        f"\nExtrapolated to {target:,} examples (linear in n from the two largest sizes below it; uint16 lengths;"
    )
    print("compare with a measured row above when --sizes includes 1e9):\n")
    print("| lengths | from | wall (s) | CPU (s) | peak RSS incl. lengths |")
    print("| --- | --- | ---: | ---: | ---: |")
    for workload in args.workloads:
        sizes = sorted(n for w, n in extrapolate if w == workload and n < target)
        if len(sizes) < 2:
            continue
        (n1, r1), (n2, r2) = [(n, extrapolate[(workload, n)]) for n in sizes[-2:]]
        wall, cpu = (r2[k] + (r2[k] - r1[k]) / (n2 - n1) * (target - n2) for k in ("wall", "cpu"))
        # The interpreter and numba (RSS before minus the lengths) stay; everything else scales with n.
        fixed = r2["base_kib"] * 1024 - 2 * n2
        peak = fixed + (r2["peak_kib"] * 1024 - fixed) / n2 * target
        print(f"| {workload} | {n1:,} and {n2:,} | {wall:.0f} | {cpu:.0f} | {peak / 2**30:.1f} GiB |")


if __name__ == "__main__":
    main()
