"""Benchmark the planner (packer.packing.planner.plan) and on-the-fly packing (packer.packing.stream.pack_stream).

Prints markdown tables (the source of docs/benchmarks.md). Every contender runs in the same process on the
same lengths; times are the best of --repeats runs after a warm-up call (numba compiles on first use).

    python scripts/bench_packing.py            # full run (~5 min on 2 cores)
    python scripts/bench_packing.py --quick    # smoke run (~30 s)
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from packer.packing import efficiency, lower_bound, lower_bound_l2, pack_totals, plan
from packer.packing.bulk_budgets import plan_budgeted, plan_first_fit, plan_next_fit
from packer.packing.stream import pack_stream

HISTOGRAMS = Path(__file__).resolve().parents[2] / "shared" / "data" / "length-histograms"


# ----------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------


def lognormal_lengths(n: int, capacity: int = 8192, seed: int = 0) -> np.ndarray:
    """The issue's workload: lognormal around 300 tokens (sigma 1), rounded, clipped to [1, capacity]."""
    raw = np.random.default_rng(seed).lognormal(np.log(300), 1.0, n)
    return np.clip(np.rint(raw), 1, capacity).astype(np.int64)


def histogram_lengths(name: str) -> np.ndarray:
    """Expand a `length,count` histogram into one length per sequence (sorted; the planner does not care)."""
    table = np.loadtxt(HISTOGRAMS / name, delimiter=",", skiprows=1, dtype=np.int64)
    return np.repeat(table[:, 0], table[:, 1])


def synthetic_multimodal(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, vision tokens, images) of a made-up VLM SFT mix, Qwen2-VL-like vision costs.

    Text: lognormal around 200 tokens (sigma 1), clipped to 4096. 60% of the examples have images, 1 + Poisson(0.3)
    of them; each image costs h*w tokens with h, w uniform in 8..48 (a 224..1344 px side / 28 px per merged
    token), i.e. 64..2304 tokens. Examples over 8192 tokens or 4096 vision tokens are dropped, as a build
    with those budgets would reject them.
    """
    rng = np.random.default_rng(seed)
    text = np.clip(np.rint(rng.lognormal(np.log(200), 1.0, n)), 1, 4096).astype(np.int64)
    images = np.where(rng.random(n) < 0.6, 1 + rng.poisson(0.3, n), 0)
    owner = np.repeat(np.arange(n), images)
    grid = rng.integers(8, 49, owner.size) * rng.integers(8, 49, owner.size)
    vision = np.bincount(owner, weights=grid, minlength=n).astype(np.int64)
    tokens = text + vision
    keep = (tokens <= 8192) & (vision <= 4096)
    return tokens[keep], vision[keep], images[keep].astype(np.int64)


# ----------------------------------------------------------------------------------------------------------
# Contenders that are not packer.plan
# ----------------------------------------------------------------------------------------------------------


def python_bfd(lengths: list[int], capacity: int) -> int:
    """Best-fit decreasing in pure Python with a max segment tree over remaining capacities, the way TRL's
    `pack_dataset(strategy="bfd")` runs inside `datasets.map` per batch. Returns the pack count."""
    size = 1
    while size < capacity + 1:
        size *= 2
    tree = [0] * (2 * size)  # leaf r holds r while some pack has exactly r tokens left
    buckets: dict[int, list[int]] = defaultdict(list)

    def update(r: int, value: int) -> None:
        i = size + r
        tree[i] = value
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2

    packs = 0
    for s in sorted(lengths, reverse=True):
        if tree[1] >= s:
            i = 1
            while i < size:  # leftmost leaf >= s = the smallest gap that fits
                i = 2 * i if tree[2 * i] >= s else 2 * i + 1
            r = i - size
            pack = buckets[r].pop()
            if not buckets[r]:
                update(r, 0)
        else:
            r, pack = capacity, packs
            packs += 1
        left = r - s
        if left > 0:
            buckets[left].append(pack)
            update(left, left)
    return packs


def chunked(pack: Callable[[np.ndarray], int], lengths: np.ndarray, chunk: int) -> int:
    """Pack every `chunk` consecutive examples separately (TRL / LLaMA-Factory pack per `map` batch)."""
    return sum(pack(lengths[i : i + chunk]) for i in range(0, lengths.size, chunk))


def lightbinpack_obfd(lengths: list[int], capacity: int) -> int:
    from lightbinpack import obfd

    return len(obfd(lengths, capacity))


def binpacking_library(lengths: np.ndarray, capacity: int) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(plan(lengths, capacity, algorithm="binpacking").max()) + 1


# ----------------------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------------------


def best_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Best wall time of `repeats` calls after one warm-up call; `repeats=0` times a single cold call.
    The best CPU time of the same calls is kept in CPU_SECONDS[0]: on a shared machine it is the better
    estimate of the uncontended time (the planner is single-threaded)."""
    if repeats == 0:
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        CPU_SECONDS[0] = time.process_time() - c0
        return time.perf_counter() - t0, result
    result = fn()  # warm-up: numba compilation, page faults, lazy imports
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    CPU_SECONDS[0] = best_cpu
    return best, result


CPU_SECONDS = [0.0]


def packs_of(ids: np.ndarray) -> int:
    return int(ids.max()) + 1 if ids.size else 0


def row(name: str, n: int, seconds: float, packs: int, lb: int, total: int, capacity: int, ref: float) -> str:
    over = packs - lb
    return (
        f"| {name} | {n:,} | {seconds:.3f} | {CPU_SECONDS[0]:.3f} | {n / seconds / 1e6:.2f}M | {packs:,} "
        f"| +{over:,} ({over / lb:.3%}) | {total / (packs * capacity):.4%} | {seconds / ref:.2f}x |"
    )


HEADER = (
    "| contender | examples | wall (s) | CPU (s) | lengths/s (wall) | packs | over LB | efficiency | wall vs bfd |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def bench_lognormal(n: int, repeats: int, small: tuple[int, ...]) -> None:
    capacity = 8192
    lengths = lognormal_lengths(n, capacity)
    as_list = lengths.tolist()
    lengths16 = lengths.astype(np.uint16)  # as a build holds them
    lb, total = lower_bound(lengths, capacity), int(lengths.sum())
    print(f"\n### {n:,} lognormal lengths, capacity {capacity} (LB = {lb:,})\n")
    print(HEADER)
    t_bfd, ids = best_time(lambda: plan(lengths, capacity), repeats)
    print(row("packer bfd", n, t_bfd, packs_of(ids), lb, total, capacity, t_bfd))
    contenders: list[tuple[str, Callable[[], int], int]] = [
        ("packer bfd + refine", lambda: packs_of(plan(lengths, capacity, refine=True)), repeats),
        ("packer bfd, budget path (max_examples=10^6, never binds)",
         lambda: packs_of(plan(lengths, capacity, max_examples=10**6)), repeats),
        ("packer bfd, max_examples=64", lambda: packs_of(plan(lengths, capacity, max_examples=64)), repeats),
        ("packer bfd, max_examples=64, in bulk (plan_budgeted: the build's path)",
         lambda: plan_budgeted(lengths16, capacity, max_examples=64).num_packs, repeats),
        ("packer bfd + refine, max_examples=64", lambda: packs_of(plan(lengths, capacity, max_examples=64,
                                                                       refine=True)), repeats),
        ("packer bfd + refine, max_examples=64, in bulk",
         lambda: plan_budgeted(lengths16, capacity, max_examples=64, refine=True).num_packs, repeats),
        ("packer ffd", lambda: packs_of(plan(lengths, capacity, algorithm="ffd")), repeats),
        ("packer ffd, in bulk (plan_first_fit: the build's path)",
         lambda: plan_first_fit(lengths16, capacity).num_packs, repeats),
        ("packer ffd + refine", lambda: packs_of(plan(lengths, capacity, algorithm="ffd", refine=True)), repeats),
        ("packer ffd + refine, in bulk", lambda: plan_first_fit(lengths16, capacity, refine=True).num_packs, repeats),
        ("packer next-fit", lambda: packs_of(plan(lengths, capacity, algorithm="next-fit")), repeats),
        ("packer next-fit + refine",
         lambda: packs_of(plan(lengths, capacity, algorithm="next-fit", refine=True)), repeats),
        ("packer next-fit + refine, in bulk (plan_next_fit)",
         lambda: plan_next_fit(lengths16, capacity, refine=True).num_packs, repeats),
        ("lightbinpack obfd (C++, list in)", lambda: lightbinpack_obfd(as_list, capacity), repeats),
        ("packer bfd per 1000 rows", lambda: chunked(lambda c: packs_of(plan(c, capacity)), lengths, 1000), 1),
        ("TRL-style Python BFD per 1000 rows",
         lambda: chunked(lambda c: python_bfd(c.tolist(), capacity), lengths, 1000), 1),
    ]  # fmt: skip
    for name, fn, reps in contenders:
        seconds, packs = best_time(fn, reps)
        print(row(name, n, seconds, int(packs), lb, total, capacity, t_bfd))
    for m in small:  # the binpacking library is O(n * packs): only small inputs
        part = lengths[:m]
        lb_m, total_m = lower_bound(part, capacity), int(part.sum())
        t_ref, ids = best_time(lambda part=part: plan(part, capacity), repeats)
        print(row("packer bfd", m, t_ref, packs_of(ids), lb_m, total_m, capacity, t_ref))
        seconds, packs = best_time(lambda part=part: binpacking_library(part, capacity), 0)
        print(row("binpacking.to_constant_volume", m, seconds, packs, lb_m, total_m, capacity, t_ref))


_MEMORY_PROBE = """
import sys, time
import numpy as np
from packer.packing import plan

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])  # KiB

lengths = np.load(sys.argv[1])
plan(lengths[:1000], 8192)  # compile / load the numba cache before the baseline
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
base = status("VmRSS")
t0 = time.perf_counter()
ids = plan(lengths, 8192)
seconds = time.perf_counter() - t0
print(seconds, base, status("VmHWM"), int(ids.max()) + 1)
"""


def bench_memory(n: int) -> None:
    """Time and peak memory of one plan() call in a fresh process. Peak RSS, not tracemalloc: numba's
    allocations bypass it. The lengths are loaded from disk so generating them does not set the peak, and
    the peak mark is reset after imports and compilation."""
    lengths = lognormal_lengths(n)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lengths.npy"
        np.save(path, lengths)
        out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(path)], capture_output=True, text=True,
                             check=True)  # fmt: skip
    seconds, base, peak, packs = out.stdout.split()
    base_mib, peak_mib = int(base) / 1024, int(peak) / 1024
    lb = lower_bound(lengths, 8192)
    print(f"\n### {n:,} lognormal lengths, capacity 8192: one plan() call in a fresh process\n")
    print(
        "| examples | time (s) | lengths/s | packs | over LB | RSS before (lengths loaded) | peak RSS | planner peak |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {n:,} | {float(seconds):.3f} | {n / float(seconds) / 1e6:.1f}M | {int(packs):,} | +{int(packs) - lb} "
          f"| {base_mib:.0f} MiB | {peak_mib:.0f} MiB | {peak_mib - base_mib:.0f} MiB |")  # fmt: skip


def bench_histograms(repeats: int, quick: bool) -> None:
    print("\n### Krell et al. 2021 length histograms (one example per histogram count)\n")
    print(
        "| histogram | capacity | contender | examples | time (s) | packs | LB / L2 | over L2 | efficiency |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, capacity in (("wikipedia_bert_512.csv", 512), ("squad_1_1_bert_384.csv", 384)):
        lengths = histogram_lengths(name)
        if quick:
            lengths = lengths[:: max(1, lengths.size // 200_000)]
        lengths = lengths[
            np.random.default_rng(0).permutation(lengths.size)
        ]  # input order as a corpus has it
        lb, l2 = lower_bound(lengths, capacity), lower_bound_l2(lengths, capacity)
        contenders = [("packer bfd", {}), ("packer bfd + refine", {"refine": True})]
        if lengths.size < 1_000_000:
            contenders.append(("packer ffd", {"algorithm": "ffd"}))
        contenders.append(("packer next-fit", {"algorithm": "next-fit"}))
        for label, kwargs in contenders:
            seconds, ids = best_time(lambda kw=kwargs, x=lengths, c=capacity: plan(x, c, **kw), repeats)
            packs = packs_of(ids)
            print(f"| {name} | {capacity} | {label} | {lengths.size:,} | {seconds:.3f} | {packs:,} | {lb:,} / {l2:,} "
                  f"| +{packs - l2:,} | {efficiency(lengths, ids, capacity):.4%} |")  # fmt: skip


def bench_vision(n: int, repeats: int) -> None:
    tokens, vision, images = synthetic_multimodal(n)
    capacity = 8192
    lb = lower_bound(tokens, capacity)
    print(f"\n### Synthetic VLM mix: {tokens.size:,} examples, capacity {capacity} (token LB = {lb:,}; vision LB at "
          f"4096/pack = {lower_bound(vision, 4096):,})\n")  # fmt: skip
    print("| budgets | balance_vision | time (s) | packs | efficiency | vision/pack mean | std | min | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    # cost matrix columns (vision tokens, images) and their limits; an unbounded column is only balanced
    budgets = {"costs": vision[:, None], "limits": [None], "names": ["max_vision_tokens"]}
    dual = {"costs": np.stack([vision, images], axis=1), "limits": [4096, 8], "names": ["max_vision_tokens", "max_images"]}
    for label, kwargs in (("tokens only", budgets), ("vision 4096 + 8 images", dual)):
        for balance in (False, True):
            seconds, ids = best_time(lambda kw=kwargs, b=balance: plan(tokens, capacity, balance=0 if b else None, **kw),
                                     repeats)  # fmt: skip
            load = pack_totals(vision, ids)
            print(f"| {label} | {balance} | {seconds:.3f} | {packs_of(ids):,} | {efficiency(tokens, ids, capacity):.3%} "
                  f"| {load.mean():.0f} | {load.std():.0f} | {load.min()} | {load.max()} |")  # fmt: skip
    # the build's path for budgets (packing.bulk_budgets: plan()'s plan at ~4 B per example), beside plan()
    tokens16, counts16 = tokens.astype(np.uint16), [vision.astype(np.uint16), images.astype(np.uint16)]
    for refine in (False, True):
        for path in ("plan()", "plan_budgeted (bulk)"):
            def run(r=refine, p=path) -> np.ndarray:
                if p == "plan()":
                    return plan(tokens, capacity, refine=r, **dual)
                return plan_budgeted(tokens16, capacity, costs=counts16, limits=[4096, 8], names=dual["names"],
                                     refine=r).pack_ids()
            seconds, ids = best_time(run, repeats)
            load = pack_totals(vision, ids)
            print(f"| vision 4096 + 8 images{' + refine' if refine else ''}, {path} | False | {seconds:.3f} "
                  f"| {packs_of(ids):,} | {efficiency(tokens, ids, capacity):.3%} | {load.mean():.0f} "
                  f"| {load.std():.0f} | {load.min()} | {load.max()} |")  # fmt: skip


def bench_stream(n: int, pools: tuple[int, ...]) -> None:
    capacity = 8192
    lengths = lognormal_lengths(n, capacity)
    as_list = lengths.tolist()
    total, lb = int(lengths.sum()), lower_bound(lengths, capacity)
    offline = packs_of(plan(lengths, capacity))
    print(f"\n### On-the-fly: {n:,} lognormal lengths, capacity {capacity} (LB = {lb:,})\n")
    print("| packing | pool | time (s) | packs | over offline | efficiency |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(f"| offline plan (bfd) | all | | {offline:,} | +0 | {total / (offline * capacity):.4%} |")
    runs = [(p, 0.99) for p in pools] + [(pools[len(pools) // 2], 0.0)]
    for pool, min_fill in runs:
        t0 = time.perf_counter()
        packs = sum(1 for _ in pack_stream(range(n), capacity=capacity, pool_size=pool, length=as_list.__getitem__,
                                           min_fill=min_fill))  # fmt: skip
        seconds = time.perf_counter() - t0
        label = "pack_stream" if min_fill else "pack_stream, no leftovers (min_fill=0)"
        print(f"| {label} | {pool:,} | {seconds:.2f} | {packs:,} | +{packs - offline:,} "
              f"| {total / (packs * capacity):.4%} |")  # fmt: skip


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    import numba

    return (f"{model}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}, numba {numba.__version__}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small inputs, one repeat: a smoke run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per contender (best is reported)")
    parser.add_argument("--only", nargs="*", default=["planner", "memory", "histograms", "vision", "stream"],
                        help="sections to run")  # fmt: skip
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    print(f"Machine: {machine()}")
    print(f"Command: python {' '.join(sys.argv)}")
    if "planner" in args.only:
        bench_lognormal(
            100_000 if args.quick else 1_000_000, repeats, (2_000,) if args.quick else (10_000, 30_000)
        )
    if "memory" in args.only:
        bench_memory(1_000_000 if args.quick else 10_000_000)
    if "histograms" in args.only:
        bench_histograms(repeats, args.quick)
    if "vision" in args.only:
        bench_vision(20_000 if args.quick else 200_000, repeats)
    if "stream" in args.only:
        bench_stream(
            50_000 if args.quick else 1_000_000, (100, 1_000) if args.quick else (100, 1_000, 10_000, 100_000)
        )
    print(f"\nmax RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
