"""A ``packer`` command's start-up, before/after: ``packer ARGS`` with git revision REV's packer (``git archive``)
and with this checkout's, alternated in fresh processes, ``--pairs`` pairs: the wall and the CPU of each process
(``wait4``), the means, and how many pairs the second tree was lower in. Commands that do little work (``--help``,
``stats``, ``verify --help``) show what their imports cost.

    python scripts/bench_startup.py --base fe4a55a --pairs 10 -- --help
    python scripts/bench_startup.py --base fe4a55a --pairs 10 -- stats OUT
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(tree: Path, args: list[str]) -> tuple[float, float]:
    """``packer ARGS`` with the packer package under ``tree``, in a fresh process: (wall, CPU) seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "packer.cli", *args], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"packer {' '.join(args)} failed under {tree}")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision to compare this checkout with")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("args", nargs="+", help="packer's arguments (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base, "packer"], check=True,
                                 capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        trees = {args.base: base, "this tree": REPO}
        for tree in trees.values():  # untimed: the page cache warm for both
            run(tree, args.args)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for k in range(args.pairs):
            for name in (list(trees) if k % 2 == 0 else list(trees)[::-1]):
                runs[name].append(run(trees[name], args.args))
    print(f"packer {' '.join(args.args)}: {args.pairs} alternated pairs, load {os.getloadavg()[0]:.1f}")
    (a, b) = runs.values()
    for i, what in ((0, "wall"), (1, "CPU")):
        x, y = [r[i] for r in a], [r[i] for r in b]
        lower = sum(q < p for p, q in zip(x, y, strict=True))
        print(f"  {what:4} {args.base} {statistics.mean(x):.3f} s -> this tree {statistics.mean(y):.3f} s "
              f"({statistics.mean(y) / statistics.mean(x) - 1:+.1%}; {lower} of {args.pairs} pairs lower)")


if __name__ == "__main__":
    main()
