"""What a cold numba cache costs: a command run under an empty ``NUMBA_CACHE_DIR``, every kernel signature numba
compiles on the way timed by its ``numba:compile`` event.

    python scripts/bench_compile.py demo                                   # the demo's caption-tree build
    python scripts/bench_compile.py pytest tests/packing/test_bulk_budgets.py
    python scripts/bench_compile.py demo --base DIR --rounds 3             # alternated with another tree
    python scripts/bench_compile.py demo --warm                            # the same command again, cache kept
    python scripts/bench_compile.py plans 1000000 --base DIR --rounds 3    # the planners warm, alternated

``demo``: ``packer build JSONL --output OUT --config configs/coco-caption-trees.yaml --overwrite`` on the demo's
caption trees (``--jsonl``, default ``demo_out/jsonl/coco_caption_trees.jsonl``; ``make demo`` or
``scripts/coco_to_jsonl.py`` writes it), ``--num-proc 1`` for the per-kernel table (events of a pool's workers
would stay in the workers). ``pytest ARGS...``: ``pytest -q -n 0 -p no:cacheprovider ARGS`` in one process.
``plans [N]``: the planners these kernels serve, warm (each tree's cache filled by a first run not counted), the
best of 3 CPU-seconds each on N lognormal lengths (``warm_plans``): a cut must not slow a warm plan.

Each run is a fresh process (this script with ``--child``) of the tree under test (``sys.path[0]`` is that tree)
with a fresh empty cache folder. It prints the run's wall and CPU seconds (the child's and its children's), the
count of signatures compiled and, per kernel, its signatures and compile seconds: ``self`` excludes the compiles
of the kernels it called (numba compiles a callee as its own dispatcher first), ``incl`` includes them. With
``--base DIR`` (``git archive REV | tar -x -C DIR``) the two trees alternate for ``--rounds`` pairs and the pairs'
ratios are printed; the per-kernel tables are the last pair's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(out: str, argv: list[str]) -> int:
    """Run ``argv`` (``demo ...`` / ``pytest ...``) in this process with a ``numba:compile`` listener; the events go
    to ``out`` as JSON."""
    from numba.core import event

    events: list[dict] = []
    stack: list[list] = []

    class Listener(event.Listener):
        def on_start(self, ev):
            stack.append([time.perf_counter(), 0.0, _name(ev)])

        def on_end(self, ev):
            t0, inner, name = stack.pop()
            dt = time.perf_counter() - t0
            if stack:
                stack[-1][1] += dt
            callers = [s[2] for s in stack if not s[2].startswith("numba.")]
            events.append({"kernel": name, "sig": str(ev.data["args"]), "incl": dt, "self": dt - inner,
                           "caller": callers[-1] if callers else ""})

    def _name(ev) -> str:
        d = ev.data["dispatcher"]
        f = getattr(d, "py_func", None)
        return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(d))}"

    listener = Listener()
    event.register("numba:compile", listener)
    rc = 0
    timings: dict[str, float] = {}
    try:
        if argv[0] == "demo":
            from packer.cli import cli

            try:
                rc = cli(["build", *argv[1:]], prog_name="packer", standalone_mode=False) or 0
            except SystemExit as e:
                rc = e.code or 0
        elif argv[0] == "plans":
            timings = warm_plans(int(argv[1]) if len(argv) > 1 else 1_000_000)
        elif argv[0] == "pytest":
            import pytest

            rc = int(pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", *argv[1:]]))
        else:
            raise SystemExit(f"unknown target {argv[0]!r}")
    finally:
        event.unregister("numba:compile", listener)
        try:
            setslices = _array_setslices()
        except Exception as e:  # a numba whose internals moved: the timings still count
            setslices = [f"(not found: {e!r})"]
        Path(out).write_text(json.dumps({"rc": rc, "events": events, "setslices": setslices, "timings": timings}))
    return rc


def warm_plans(n: int, repeats: int = 3) -> dict[str, float]:
    """Each planner whose kernels this script's cuts touch, on n lognormal lengths (capacity 8,192) with 30%
    image examples (vision tokens, images), after a first call (compiles or loads its kernels): the best of
    ``repeats`` CPU-seconds each (``plan()``'s budgeted general path on n // 4)."""
    import numpy as np

    from packer.packing import plan
    from packer.packing.bulk import plan_bulk
    from packer.packing.bulk_budgets import plan_budgeted, plan_first_fit, plan_next_fit

    rng = np.random.default_rng(0)
    cap = 8192
    lens = np.clip(np.rint(rng.lognormal(np.log(300), 1.0, n)), 1, cap).astype(np.uint16)
    images = (rng.random(n) < 0.3).astype(np.uint8)
    vision = (images * rng.integers(0, np.minimum(lens, 1024).astype(np.int64) + 1)).astype(np.uint16)
    budget = {"costs": [vision, images], "limits": [2048, 4], "names": ["max_vision_tokens", "max_images"]}
    m = n // 4
    wide = np.stack([vision[:m], images[:m]], 1).astype(np.int64)
    cases = {
        "plan_bulk refine": lambda: plan_bulk(lens, cap, refine=True),
        "plan_bulk": lambda: plan_bulk(lens, cap),
        "plan_budgeted refine": lambda: plan_budgeted(lens, cap, refine=True, **budget),
        "plan_first_fit refine": lambda: plan_first_fit(lens, cap, refine=True, **budget),
        "plan_next_fit refine": lambda: plan_next_fit(lens, cap, refine=True, **budget),
        "plan() budgets refine (n/4)": lambda: plan(lens[:m].astype(np.int64), cap, costs=wide,
                                                    limits=[2048, 4], refine=True),
    }
    out = {}
    for name, fn in cases.items():
        fn()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
        out[name] = best
    return out


def _array_setslices() -> list[str]:
    """Where packer's compiled kernels assign an array into an array's slice or row (``a[i:j] = b``,
    ``rows[k] = other[r]``): numba compiles its shape-mismatch raise for those, string formatting included (one
    per dimension count, ~3-5 s each cold)."""
    from numba.core import ir, types
    from numba.core.dispatcher import Dispatcher

    found = set()
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("packer."):
            continue
        for obj in list(vars(mod).values()):
            if not isinstance(obj, Dispatcher):
                continue
            for cres in obj.overloads.values():
                ann = getattr(cres, "type_annotation", None)
                if not hasattr(ann, "blocks"):  # loaded from the cache: no IR kept
                    continue
                for block in ann.blocks.values():
                    for st in block.body:
                        if isinstance(st, (ir.SetItem, ir.StaticSetItem)) and isinstance(
                                ann.typemap.get(st.value.name), types.Buffer):
                            found.add(f"{st.loc.filename}:{st.loc.line} ({obj.py_func.__qualname__})")
    return sorted(found)


def run(tree: Path, target: list[str], cache: Path | None, tmp: Path) -> dict:
    """One run of ``target`` by ``tree``'s packer in a fresh process; its seconds and events."""
    out = tmp / f"events-{time.monotonic_ns()}.json"
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    if cache is None:
        cache = Path(tempfile.mkdtemp(dir=tmp, prefix="numba-"))
    env["NUMBA_CACHE_DIR"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(out), *target], cwd=tree,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    data = json.loads(out.read_text()) if out.exists() else {"rc": proc.returncode, "events": []}
    if proc.returncode:
        print(proc.stdout[-3000:], file=sys.stderr)
    tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] if target[0] == "pytest" else []
    return {"wall": wall, "cpu": cpu, "rc": proc.returncode, "events": data["events"], "cache": cache,
            "tail": tail, "setslices": data.get("setslices", []), "timings": data.get("timings", {})}


def table(r: dict, top: int) -> None:
    ev = r["events"]
    by = defaultdict(lambda: [0, 0.0, 0.0])
    for e in ev:
        k = by[e["kernel"]]
        k[0] += 1
        k[1] += e["self"]
        k[2] += e["incl"]
    total = sum(e["self"] for e in ev)
    print(f"  {len(ev)} signatures of {len(by)} kernels, {total:.1f} s compiling (self, summed)")
    print(f"  {'kernel':60s} {'sigs':>5s} {'self s':>8s} {'incl s':>8s}")
    for name, (n, s, i) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {name[-60:]:60s} {n:5d} {s:8.2f} {i:8.2f}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("demo", "pytest", "plans"),
                    help="demo [build options] | pytest ARGS... | plans [N]")
    ap.add_argument("--base", type=Path, help="another tree, alternated with this one")
    ap.add_argument("--rounds", type=int, default=1, help="runs (with --base: pairs)")
    ap.add_argument("--jsonl", type=Path, default=REPO / "demo_out/jsonl/coco_caption_trees.jsonl")
    ap.add_argument("--num-proc", type=int, default=1, help="demo: the build's --num-proc")
    ap.add_argument("--warm", action="store_true", help="also run each tree once more on its filled cache")
    ap.add_argument("--top", type=int, default=25, help="kernels listed")
    ap.add_argument("--signatures", action="store_true", help="list every signature (the last run's)")
    args, rest = ap.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp_s:
        tmp = Path(tmp_s)
        target = [args.kind, *rest]
        if target[0] == "demo":
            target = ["demo", str(args.jsonl.resolve()), "--output", str(tmp / "out"), "--config",
                      str(REPO / "configs/coco-caption-trees.yaml"), "--overwrite", "--num-proc",
                      str(args.num_proc), *target[1:]]
        trees = {"this": REPO} if args.base is None else {"base": args.base.resolve(), "this": REPO}
        runs: dict[str, list[dict]] = {k: [] for k in trees}
        caches: dict[str, Path | None] = {k: None for k in trees}
        if args.kind == "plans":  # warm: each tree's cache filled once by a first run, not counted
            for name, tree in trees.items():
                caches[name] = run(tree, target, None, tmp)["cache"]
        for i in range(args.rounds):
            for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
                r = run(tree, target, caches[name], tmp)
                runs[name].append(r)
                sigs = len(r["events"])
                print(f"round {i + 1} {name}: wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s, {sigs} signatures, "
                      f"rc {r['rc']} {' '.join(r['tail'])}", flush=True)
                for plan, t in r["timings"].items():
                    print(f"  {plan:30s} {t:7.3f} CPU-s", flush=True)
                if args.warm and i == args.rounds - 1:
                    w = run(tree, target, r["cache"], tmp)
                    print(f"  warm {name}: wall {w['wall']:.1f} s, CPU {w['cpu']:.1f} s, {len(w['events'])} "
                          "signatures", flush=True)
        for name, rs in runs.items():
            print(f"\n{name} ({trees[name]}), last run:")
            table(rs[-1], args.top)
            for where in rs[-1]["setslices"]:
                print(f"  an array assigned into a slice (numba's shape-error raise): {where}")
            if args.signatures:
                for e in sorted(rs[-1]["events"], key=lambda e: -e["self"]):
                    print(f"    {e['self']:7.2f} {e['incl']:7.2f} {e['kernel']} {e['sig']}"
                          f"{'  <- ' + e['caller'] if e['caller'] else ''}")
        if args.base is not None and args.kind == "plans":
            for plan in runs["this"][0]["timings"]:
                ratios = [t["timings"][plan] / b["timings"][plan] - 1
                          for b, t in zip(runs["base"], runs["this"], strict=True)]
                print(f"{plan}: " + ", ".join(f"{b['timings'][plan]:.3f} -> {t['timings'][plan]:.3f}" for b, t in
                                              zip(runs["base"], runs["this"], strict=True)) +
                      f"; mean {sum(ratios) / len(ratios):+.1%}, {sum(r < 0 for r in ratios)} of {len(ratios)} "
                      "lower")
        if args.base is not None:
            cpu = [(b["cpu"], t["cpu"]) for b, t in zip(runs["base"], runs["this"], strict=True)]
            wall = [(b["wall"], t["wall"]) for b, t in zip(runs["base"], runs["this"], strict=True)]
            for label, pairs in (("CPU", cpu), ("wall", wall)):
                ratios = [t / b - 1 for b, t in pairs]
                print(f"{label}: " + ", ".join(f"{b:.1f} -> {t:.1f}" for b, t in pairs) +
                      f"; mean {sum(ratios) / len(ratios):+.1%}, {sum(r < 0 for r in ratios)} of {len(ratios)} "
                      "lower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
