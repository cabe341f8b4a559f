"""Time per example of the budgeted bulk planner (``plan_budgeted``) as n grows, this tree against others.

The mix of ``bench_build_memory.py --driver-only --budgets``: lengths of 3-42 text tokens, 30% of the
examples with one image of 64-1280 vision tokens added, capacity 4096 (qwen2-vl's max length),
``max_vision_tokens`` 2048, ``max_images`` 4, ``max_examples_per_pack`` 32, ``refine`` on. Each (tree, size)
runs in a fresh child process that draws the columns (seed 0), compiles the kernels on a slice, then times
one ``plan_budgeted`` call (CPU: ``process_time``). Trees alternate per size, so a before/after pair runs
back to back; the plans' sha256 (order and bounds) must match across trees.

    nice -n 10 python scripts/bench_budgets_scale.py --sizes 5e6 1e7 2e7 --before /tmp/base
    python scripts/bench_budgets_scale.py --sizes 1e6                       # this tree alone (~20 s)

``--before DIR``: a checkout (e.g. ``git archive a2e2c77 packer | tar -x -C DIR``) run with PYTHONPATH=DIR.

``--walk``: where the time goes, this tree only. Best fit over the same examples (plan()'s order) with a
copy of ``kernels.ix_find`` that counts, per example with an image and per text example: tree nodes
visited, buckets searched, treap nodes looked at in a bucket before the pack that fits when its newest
pack does not (until 5387c68 a bucket was a list, and this counted the packs walked past), buckets found
empty of fits, and the packs read to tighten their bounds.

    nice -n 10 python scripts/bench_budgets_scale.py --walk --sizes 1e6 5e6 1e7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import hashlib, json, sys, time
import numpy as np
from packer.packing.bulk_budgets import plan_budgeted

def columns(n):
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 43, size=n).astype(np.uint16)
    images = (rng.random(n) < 0.3).astype(np.uint16)
    vision = (images * rng.integers(64, 1281, size=n)).astype(np.uint16)
    return tokens + vision, vision, images

def run(lens, vision, images):
    return plan_budgeted(lens, 4096, costs=[vision, images], limits=[2048, 4],
                         names=["max_vision_tokens", "max_images"], max_examples=32, refine=True)

run(*columns(20_000))  # compile
n = int(sys.argv[1])
cols = columns(n)
t0 = time.process_time()
packs = run(*cols)
cpu = time.process_time() - t0
digest = hashlib.sha256(packs.order.tobytes() + packs.bounds.tobytes()).hexdigest()[:16]
print(json.dumps({"n": n, "packs": int(packs.bounds.shape[0] - 1), "cpu_s": cpu, "sha": digest}))
"""


_WALK = r"""
import json, sys
import numpy as np
from numba import njit
from packer.packing.kernels import (WIDE, _ix_class, _ix_pull, _tp_exact, _tp_fits, class_column, ix_insert, ix_new,
                                    ix_remove)

@njit
def newest(root, links, rem2, smax, need, cnt):  # kernels._tp_newest, counting
    if root < 0 or not _tp_fits(smax, root, need):
        return -1
    x = root
    while True:
        cnt[2] += 1
        c = links[x, 1]
        if c >= 0 and _tp_fits(smax, c, need):
            x = c
            continue
        if _tp_fits(rem2, x, need):
            return x
        c = links[x, 0]
        if c >= 0 and _tp_fits(smax, c, need):
            x = c
            continue
        while True:
            cnt[2] += 1
            if x == root:
                return -1
            p = links[x, 2]
            if links[p, 1] == x:
                if _tp_fits(rem2, p, need):
                    return p
                c = links[p, 0]
                if c >= 0 and _tp_fits(smax, c, need):
                    x = c
                    break
            x = p

@njit
def size(root, links):  # packs in the treap at root
    if root < 0:
        return 0
    stack = [root]
    k = 0
    while len(stack):
        x = stack.pop()
        k += 1
        for c in (links[x, 0], links[x, 1]):
            if c >= 0:
                stack.append(c)
    return k

@njit
def find(ix, lo, need, cnt):  # kernels.ix_find, counting
    tree, head, links, smax, _, rem2, exact, meta = ix
    half = meta[0]
    dims = rem2.shape[1]
    k = _ix_class(meta, need)
    node = half + lo
    while True:
        cnt[0] += 1
        fits = True
        for d in range(dims):
            if tree[node, k, d] < need[d]:
                fits = False
                break
        if fits:
            if node < half:
                node = 2 * node
                continue
            cnt[1] += 1
            root = head[node - half, 0]
            b = head[node - half, 1]
            if b < 0 or not _tp_fits(rem2, b, need):
                b = newest(root, links, rem2, smax, need, cnt)
            if b >= 0:
                return b
            cnt[3] += 1
            cnt[4] += size(root, links)
            if root >= 0:
                _tp_exact(exact, root, links, rem2, meta)
            else:
                exact[:] = -1
            tree[node] = exact
            _ix_pull(tree, node)
        while node & 1:
            node >>= 1
        if node == 0:
            return -1
        node += 1

@njit
def bfd(order, lens, vision, images, capacity, budgets, cls, classes, cnt):
    dims = budgets.shape[0]
    ix = ix_new(capacity + 1, lens.shape[0], dims, cls, classes, WIDE)
    rem, rem2 = ix[4], ix[5]
    need = np.ones(dims, np.int64)
    packs = 0
    for i in order:
        need[1] = vision[i]
        need[2] = images[i]
        b = find(ix, np.int64(lens[i]), need, cnt[images[i]])
        if b < 0:
            b = packs
            packs += 1
            rem[b] = capacity
            rem2[b] = budgets
        else:
            ix_remove(ix, b)
        rem[b] -= lens[i]
        for d in range(dims):
            rem2[b, d] -= need[d]
        if rem[b] > 0 and rem2[b, 0] > 0:
            ix_insert(ix, b)
    return packs

n = int(sys.argv[1])
rng = np.random.default_rng(0)
tokens = rng.integers(3, 43, size=n).astype(np.int64)
images = (rng.random(n) < 0.3).astype(np.int64)
vision = images * rng.integers(64, 1281, size=n)
lens = tokens + vision
order = np.lexsort((np.arange(n), -lens))
budgets = np.array([32, 2048, 4], np.int64)
cls, classes = class_column(budgets, 3)
cnt = np.zeros((2, 5), np.int64)
packs = bfd(order, lens, vision, images, 4096, budgets, cls, classes, cnt)
with_image = int(images.sum())
print(json.dumps({"n": n, "packs": packs, "image": (cnt[1] / with_image).tolist(),
                  "text": (cnt[0] / (n - with_image)).tolist()}))
"""


def walk(n: int) -> None:
    out = subprocess.run([sys.executable, "-c", _WALK, str(n)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, check=True, cwd=REPO)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for kind in ("image", "text"):
        nodes, buckets, walked, empty, scanned = r[kind]
        print(f"| {r['n']:,} | {kind} | {nodes:.1f} | {buckets:.2f} | {walked:.1f} | {empty:.3f} | {scanned:.1f} |",
              flush=True)


def probe(tree: Path, n: int) -> dict:
    """One fresh process on ``tree``'s packer: the plan's CPU seconds (the columns are drawn before)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _PROBE, str(n)], env=env, capture_output=True, text=True,
                         check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=float, default=[5e6, 1e7, 2e7])
    parser.add_argument("--before", type=Path, action="append", default=[], help="another tree (repeatable)")
    parser.add_argument("--walk", action="store_true", help="count the search's steps instead (this tree)")
    args = parser.parse_args()
    if args.walk:
        print("| examples | per example with | tree nodes | buckets searched | treap nodes looked at | buckets with no fit "
              "| packs read to tighten |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for size in args.sizes:
            walk(int(size))
        return
    trees = [*args.before, REPO]
    print("| tree | examples | packs | plan CPU-s | us per example | plan sha256 |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for size in args.sizes:
        shas = set()
        for tree in trees:
            r = probe(tree, int(size))
            shas.add(r["sha"])
            print(f"| {tree} | {r['n']:,} | {r['packs']:,} | {r['cpu_s']:.2f} | {1e6 * r['cpu_s'] / r['n']:.2f} "
                  f"| {r['sha']} |", flush=True)
        if len(shas) > 1:
            print(f"PLANS DIFFER at {int(size):,}", flush=True)


if __name__ == "__main__":
    main()
