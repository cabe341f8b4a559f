"""Fast paths against their general paths: what each one is worth to scripts/bench_build.py.

Every fast path beside a general one must move bench_build (or its own stage's benchmark) by >= 5% to stay
(docs/benchmarks.md, "Fast paths", where the measured gains and the paths removed are listed). Each mode runs
bench_build's corpus (``bench_build.make_corpus``: qwen2-vl, packs of 8,192 tokens) once with every fast path
("all-on") and once with EACH fast path switched to its general path:

    python scripts/bench_fast_paths.py --stage                  # one process's encode stage, 50k records, 3 rounds
    python scripts/bench_fast_paths.py --stage --subset images --records 15000 --only mrope-scalars
    python scripts/bench_fast_paths.py --rounds 3               # whole builds (bench_build's child), --num-proc 2
    python scripts/bench_fast_paths.py --planner                # the planner's own benchmark (1M lengths)
    python scripts/bench_fast_paths.py --rounds 3 --profile qwen3-vl --only python-template   # another template

``--stage`` is the instrument to trust on a shared machine: every chunk of the corpus is encoded
(``stages.encode_chunk``, its cache commit included, as a pool worker runs it: the encoder pickled and loaded,
``gc.freeze`` after) once per variant, the variants in a new random order for each chunk, so that other jobs'
load falls on all of them alike; CPU (``time.process_time``) summed per variant, and its gain as the median over
rounds of (variant / all-on - 1). "all-on again", a second all-on encoder, is the control: its gain is the noise.
``--subset images|trees`` keeps only bench_build's records with an image, or only its caption trees, for a path
whose work is confined to that kind.

Whole builds run bench_build's build in a fresh process (``--child``) per variant, all-on twice per round, the
variants shuffled per round, and report the CPU of the process tree (``resource.getrusage(RUSAGE_CHILDREN)``
around each build: the build process and its spawn workers, reaped when it closes its pool), wall and the load
average; every variant's shards must equal all-on's, byte for byte. On the shared 2-core dev box one build's CPU
moved by up to 15% with other jobs' load, more than most of the effects measured, hence ``--stage``.

**Switching a fast path off.** The encoder's (``packer.encode.encoder.FAST_PATHS``) through the public
``Encoder(fast=...)``: every one but the one named, the encoder pickled to the workers as it is. Every other one
by a monkeypatch that puts its general path in its place (the ``GENERAL`` functions below; the library has no
switch for them), scoped to its variant in ``--stage``; in a whole build applied in the build process and,
because a spawn worker imports this script as ``__mp_main__`` before its first task, in every worker too. Each
patch leaves a mark file the first time a process takes it, and a variant whose general path left none fails.
``--planner``: the planner's fast paths on ``plan()`` of 1M lognormal lengths (bench_packing's workload).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import bench_build  # noqa: E402

ENCODER_PATHS = ("python-template", "byte-lengths", "batch-finish", "plain-columns")  # packer.encode.encoder.FAST_PATHS
_ENV, _MARKS_ENV = "PACKER_BENCH_GENERAL", "PACKER_BENCH_MARKS"
_marked: set[str] = set()


def _mark(name: str) -> None:
    """Leave ``MARKS/name.PID`` the first time this process takes ``name``'s general path."""
    if name not in _marked and os.environ.get(_MARKS_ENV):
        _marked.add(name)
        Path(os.environ[_MARKS_ENV], f"{name}.{os.getpid()}").touch()


# ------------------------------------------------------------------------------------- the general paths
# Each returns the (module, attribute, replacement) patches that put a fast path's general path in its place.


def _general_mrope() -> list[tuple[Any, str, Any]]:
    """mrope_position_ids on numpy arrays: runs from their edges, the layout always checked (before 4983dc0)."""
    from packer.core.tree import check_layout, node_lengths
    from packer.errors import RecordError
    from packer.models.qwen_vl import profile
    from packer.models.shared.mrope import _grid_positions, _runs

    def mrope_position_ids(input_ids, node_offsets, node_parents, image_grids, *, image_token_id,
                           spatial_merge_size=2, video_token_id=None, video_grids=(), video_intervals=()):
        _mark("mrope-scalars")
        ids = np.asarray(input_ids)
        length = ids.shape[0]
        check_layout(length, node_offsets, node_parents, empty_nodes=True)
        offsets, lengths = np.asarray(node_offsets, dtype=np.int64), node_lengths(length, node_offsets)
        parents = np.asarray(node_parents, dtype=np.int64)
        ends = offsets + lengths
        spans = []
        for token_id, grids_in, intervals, what in ((image_token_id, image_grids, None, "image"),
                                                    (video_token_id, video_grids, video_intervals, "video")):
            starts_k, ends_k = _runs(ids, token_id)
            if starts_k.shape[0] == 0 and len(grids_in) == 0:
                continue
            grids = np.asarray(grids_in, dtype=np.int64).reshape(-1, 3)
            counts = grids[:, 0] * (grids[:, 1] // spatial_merge_size) * (grids[:, 2] // spatial_merge_size)
            if starts_k.shape[0] != grids.shape[0] or (ends_k - starts_k != counts).any():
                raise RecordError("image_count_mismatch", f"{starts_k.shape[0]} runs of {what} tokens do not match")
            for k, (rs, re_) in enumerate(zip(starts_k.tolist(), ends_k.tolist(), strict=True)):
                spans.append((rs, re_, tuple(grids[k].tolist()), 1.0 if intervals is None else float(intervals[k])))
        spans.sort()
        run_starts = np.array([sp[0] for sp in spans], dtype=np.int64)
        run_ends = np.array([sp[1] for sp in spans], dtype=np.int64)
        run_node = np.searchsorted(offsets, run_starts, side="right") - 1
        if (run_ends > ends[run_node]).any():
            raise RecordError("image_count_mismatch", "an image's or video's tokens are split across two tree nodes")
        out = np.empty((3, length), dtype=np.int32)
        next_pos = [0] * offsets.shape[0]
        k, m, run_node_l = 0, spatial_merge_size, run_node.tolist()
        for n, (s, e, parent) in enumerate(zip(offsets.tolist(), ends.tolist(), parents.tolist(), strict=True)):
            cur = 0 if parent < 0 else next_pos[parent]
            while k < len(spans) and run_node_l[k] == n:
                rs, re_, (t, h, w), interval = spans[k]
                out[:, s:rs] = np.arange(cur, cur + rs - s)
                cur += rs - s
                out[:, rs:re_] = _grid_positions(t, h // m, w // m, interval)
                out[:, rs:re_] += cur
                cur += max(h, w) // m
                s = re_
                k += 1
            out[:, s:e] = np.arange(cur, cur + e - s)
            next_pos[n] = cur + e - s
        return out

    return [(profile, "mrope_position_ids", mrope_position_ids)]


def _general_layout_check() -> list[tuple[Any, str, Any]]:
    """core.tree.check_layout of one example: ``layout_faults`` (the row-group check) instead of scalar rules."""
    from packer.core import tree

    def example_fault(num_tokens, off, par, *, empty_nodes):
        _mark("scalar-layout")
        faults = tree.layout_faults(num_tokens, off, par, empty_nodes=empty_nodes)
        return next((name for name, bad in faults.items() if bad[0]), None)

    return [(tree, "_example_fault", example_fault)]


GENERAL: dict[str, tuple[str, Callable[[], list[tuple[Any, str, Any]]] | None]] = {
    "python-template": ("encode/templates.py: the builtins' ChatML (Qwen2-VL, Qwen2.5, Qwen3-VL) in pure Python, not Jinja", None),
    "byte-lengths": ("encode/labels.py + draft.py: the loss rule for the batch from token byte lengths, not "
                     "per text from character offsets", None),
    "batch-finish": ("encode/finish.py: the batch's chats and trees finished as columns, not one record at a time by "
                     "Encoder._finish", None),
    "plain-columns": ("encode/encoder.py encode_chats / encode_texts: a chunk's chats of one-text messages and text "
                      "records from their lines' columns, not an Example per record through encode_batch", None),
    "mrope-scalars": ("models/shared/mrope.py mrope_position_ids on Python scalars", _general_mrope),
    "scalar-layout": ("core/tree.py check_layout of one example: scalar rules, not layout_faults",
                      _general_layout_check),
}


def _patch(name: str) -> list[tuple[Any, str, Any]]:
    """Put ``name``'s general path in place of its fast path (the encoder's own: nothing to patch); returns
    what it replaced, for ``_restore``."""
    make = GENERAL[name][1]
    patches = make() if make else []
    saved = [(obj, attr, obj[attr] if isinstance(obj, dict) else getattr(obj, attr)) for obj, attr, _ in patches]
    _restore(patches)
    return saved


def _restore(patches: list[tuple[Any, str, Any]]) -> None:
    for obj, attr, value in reversed(patches):
        if isinstance(obj, dict):
            obj[attr] = value
        else:
            setattr(obj, attr, value)


@contextlib.contextmanager
def general_path(name: str) -> Iterator[None]:
    """``name``'s general path while inside."""
    saved = _patch(name)
    try:
        yield
    finally:
        _restore(saved)


def encoder_fast(name: str) -> set[str]:
    """The encoder fast paths a variant keeps: all but ``name`` (``fastokens`` too, which only ``byte-lengths``
    off takes with it: its boundaries need byte lengths)."""
    from packer.encode.encoder import FAST_PATHS

    return set(FAST_PATHS) - {name}


def _apply_in_build() -> None:
    """In a ``--child`` build process and its spawn workers (this script imported as ``__mp_main__``): the
    general path of the variant in the environment, for the whole process."""
    name = os.environ.get(_ENV, "all-on")
    if name == "all-on":
        return
    _patch(name)
    if name in ENCODER_PATHS:
        from packer.encode import encoder

        init = encoder.Encoder.__init__

        def without(self, *args, fast=True, **kwargs):  # the variant's paths, whatever make_encoder asks
            _mark(name)
            init(self, *args, fast=encoder_fast(name), **kwargs)

        encoder.Encoder.__init__ = without


if os.environ.get(_ENV):
    _apply_in_build()


# ------------------------------------------------------------------------------------------ whole builds


def _build(corpus: Path, out: Path, variant: str, num_proc: int, marks: Path,
           profile: str = "qwen2-vl") -> dict[str, Any]:
    """One bench_build build in a fresh process into an empty ``out`` (a finished build's encode cache would
    let the next one skip its encode): wall, CPU of the process tree, shard hashes, load."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", _ENV: variant, _MARKS_ENV: str(marks)}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(corpus), str(out),
                           str(num_proc), profile], env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"the {variant} build failed with exit code {proc.returncode}")
    manifest = json.loads((out / "manifest.json").read_text())
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"wall": wall, "cpu": cpu, "load": (load, os.getloadavg()[0]),
            "shards": [s["sha256"] for s in manifest["shards"]]}


def whole_builds(args: argparse.Namespace, variants: list[str]) -> None:
    rng = random.Random(0)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in ["all-on", *variants]}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        bench_build.make_corpus(corpus, args.coco, args.records)
        print(f"{args.records:,} records ({corpus.stat().st_size / 2**20:.0f} MiB), --profile {args.profile}, "
              f"--num-proc {args.num_proc}, "
              f"{args.rounds} rounds; uptime: {_uptime()}", flush=True)
        for r in range(args.rounds):
            order = variants[:]
            rng.shuffle(order)
            half = len(order) // 2
            for variant in ["all-on", *order[:half], "all-on", *order[half:]]:
                marks = Path(tmp) / f"marks-{variant}-{r}-{len(runs[variant])}"
                marks.mkdir()
                b = _build(corpus, Path(tmp) / "out", variant, args.num_proc, marks, args.profile)
                taken = sorted(p.name for p in marks.iterdir())
                if variant != "all-on" and not taken:
                    raise SystemExit(f"{variant}: no process took its general path")
                if runs["all-on"] and b["shards"] != runs["all-on"][0]["shards"]:
                    raise SystemExit(f"{variant}: the shards differ from all-on's")
                b["marks"], b["round"] = len(taken), r
                runs[variant].append(b)
                print(f"  round {r + 1} {variant:>15}: {b['cpu']:6.1f} CPU-s {b['wall']:6.1f} s wall, load "
                      f"{b['load'][0]:.1f}-{b['load'][1]:.1f}, general path in {b['marks']} processes", flush=True)
        print(f"uptime: {_uptime()}")
    _report(runs, "build CPU-s", wall=True)


def _report(runs: dict[str, list[dict[str, Any]]], what: str, *, wall: bool) -> None:
    """Per variant: the median and range of its runs, and its CPU against all-on's: the median over rounds of
    (variant / all-on of the same round - 1), all-on's runs of a round averaged."""
    def by_round(bs: list[dict[str, Any]], key: str) -> dict[int, float]:
        out: dict[int, list[float]] = {}
        for b in bs:
            out.setdefault(b["round"], []).append(b[key])
        return {r: statistics.fmean(v) for r, v in out.items()}

    base = by_round(runs["all-on"], "cpu")
    base_wall = by_round(runs["all-on"], "wall") if wall else {}
    loads = [x for bs in runs.values() for b in bs for x in b.get("load", ())]
    median_base = statistics.median(b["cpu"] for b in runs["all-on"])
    print(f"\n| variant | {what} (median; min-max) | vs all-on (median of rounds) | {'wall s, vs all-on | ' if wall else ''}runs |")
    print(f"| --- | --- | --- | {'--- | ' if wall else ''}--- |")
    for variant, bs in sorted(runs.items(), key=lambda kv: -statistics.median(b["cpu"] for b in kv[1])):
        cpu = [b["cpu"] for b in bs]
        med = statistics.median(cpu)
        ratio = statistics.median(b["cpu"] / base[b["round"]] - 1 for b in bs)
        gain = "" if variant == "all-on" else f"{med - median_base:+.2f} CPU-s ({ratio:+.1%})"
        wall_col = ""
        if wall:
            w = statistics.median(b["wall"] for b in bs)
            w_ratio = statistics.median(b["wall"] / base_wall[b["round"]] - 1 for b in bs)
            wall_col = f"{w:.1f} ({w_ratio:+.1%}) | " if variant != "all-on" else f"{w:.1f} | "
        print(f"| {variant} | {med:.2f} ({min(cpu):.2f}-{max(cpu):.2f}) | {gain} | {wall_col}{len(bs)} |")
    if loads:
        print(f"\nload average (1 min) over the runs: {min(loads):.1f}-{max(loads):.1f}")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------- the encode stage


def make_corpus(path: Path, coco: Path, records: int, subset: str | None = None) -> None:
    """bench_build's corpus of ``records`` records; ``subset`` "images" / "trees": only its records with an
    image / its caption trees (drawn from a corpus that many times larger), for a path that only they take."""
    if subset is None:
        bench_build.make_corpus(path, coco, records)
        return
    share = {"images": 0.3, "trees": 0.1}[subset]
    bench_build.make_corpus(path, coco, int(records / share * 1.2) + 100)
    key = '"type": "image"' if subset == "images" else '"branches"'
    kept = [line for line in path.read_text().splitlines(keepends=True) if key in line][:records]
    path.write_text("".join(kept))


def encode_stage(args: argparse.Namespace, variants: list[str]) -> None:
    """The encode stage in this process, interleaved chunk by chunk: every chunk of the corpus is encoded
    (``stages.encode_chunk``, its cache commit included) once per variant, the variants in a new random order
    for each chunk, so that the load of the moment falls on all of them alike; CPU summed per variant over the
    chunks."""
    import pickle
    import shutil

    from packer.config import BuildConfig
    from packer.pipeline import stages
    from packer.pipeline.cache import EncodeCache
    from packer.pipeline.faults import Hooks

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[_MARKS_ENV] = tmp
        corpus = Path(tmp) / "corpus.jsonl"
        make_corpus(corpus, args.coco, args.records, args.subset)
        config = BuildConfig.from_inputs([str(corpus)], str(Path(tmp) / "out"), profile=args.profile,
                                         max_length=8192, max_pixels=256 * 28 * 28)
        made = stages.make_encoder(config)
        # what a worker holds: one per variant, its counts its own; "all-on again", a second all-on, is the control
        encoders = {v: pickle.loads(pickle.dumps(made.replace(fast=encoder_fast(v)) if v in ENCODER_PATHS else made))
                    for v in ["all-on", "all-on again", *variants]}
        chunks = stages.scan_chunks(config)
        gc.freeze()  # as a worker does once it holds the encoder: collections do not walk what is set up
        rng = random.Random(0)
        cpu: dict[str, list[float]] = {v: [] for v in encoders}
        print(f"{args.records:,} records{f' ({args.subset} only)' if args.subset else ''} in {len(chunks)} chunks, "
              f"{args.rounds} rounds; uptime: {_uptime()}", flush=True)
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):
            caches = {v: EncodeCache(Path(tmp) / f"cache-{v}-{r}", len(chunks)) for v in encoders}
            for cache in caches.values():
                cache.root.mkdir()
            total = dict.fromkeys(encoders, 0.0)
            for k, chunk in enumerate([chunks[0], *chunks]):  # chunk 0 twice: its first pass (k = 0) is a warm-up
                order = list(encoders)
                rng.shuffle(order)
                for variant in order:
                    cache = caches[variant]
                    with general_path(variant) if GENERAL.get(variant, ("", None))[1] else contextlib.nullcontext():
                        gc.collect()  # no collection of the last variant's garbage inside this one's time
                        t0 = time.process_time()
                        stages.encode_chunk(chunk, encoder=encoders[variant], cache=cache, config=config, hooks=Hooks())
                        dt = time.process_time() - t0
                    cache.arrow(chunk.index).unlink()  # the next round encodes it again
                    cache.rejects_file(chunk.index).unlink()
                    total[variant] += dt if k else 0.0
                loads.append(os.getloadavg()[0])
            for v in encoders:
                cpu[v].append(total[v])
            print(f"  round {r + 1}: " + ", ".join(f"{v} {total[v]:.2f}" for v in encoders), flush=True)
            for v in encoders:
                shutil.rmtree(caches[v].root)
        print(f"uptime: {_uptime()}")
        taken = {p.name.split(".")[0] for p in Path(tmp).iterdir() if "." in p.name and not p.name.endswith(".jsonl")}
    missing = [v for v in variants if v not in ENCODER_PATHS and v not in taken]
    key = dict(zip(ENCODER_PATHS, ("render:python", "labels:byte-lengths", "finish:batch", "plain-columns"), strict=True))
    missing += [v for v in variants if v in ENCODER_PATHS and encoders[v].path_counts()[key[v]]]
    if missing:
        raise SystemExit(f"these variants did not take their general path: {missing}")
    runs = {v: [{"cpu": c, "round": r} for r, c in enumerate(cs)] for v, cs in cpu.items()}
    _report(runs, f"encode-stage CPU-s, {args.records:,} records", wall=False)
    print(f"load average (1 min) over the chunks: {min(loads):.1f}-{max(loads):.1f}")


# ------------------------------------------------------------------------------------------------ planner


def planner(args: argparse.Namespace) -> None:
    """``plan()``'s fast paths on bench_packing's 1M lognormal lengths, capacity 8192, best of 9 (CPU):
    plain BFD through the length-class planner (``plan_bulk``) against the one-at-a-time kernel it replaces
    there, and the tokens-only kernel (``bfd_fast``, refine's two passes) against the general one
    (``bfd_general`` with no budget column)."""
    from packer.packing import kernels, plan
    from packer.packing.planner import _constraints

    lengths = np.clip(np.rint(np.random.default_rng(0).lognormal(np.log(300), 1.0, 1_000_000)), 1, 8192).astype(np.int64)
    capacity = 8192

    def kernel_plan():
        assign, num_packs = kernels.bfd_fast(lengths, capacity, 0)
        return np.random.default_rng(0).permutation(num_packs).astype(np.int64)[assign]

    def general_kernel():
        needs, budgets = _constraints(lengths.shape[0], None, None, None, None, None)  # examples, unbounded
        order = kernels.order_decreasing(lengths, capacity)
        cls, classes = kernels.class_column(budgets, needs.shape[1])
        return kernels.bfd_general(order, lengths, needs, capacity, budgets, cls, classes, *kernels.no_packs(1))

    contenders = {
        "plan(): plan_bulk (fast)": lambda: plan(lengths, capacity),
        "plan(): bfd_fast + permutation (general)": kernel_plan,
        "kernel: bfd_fast (fast)": lambda: kernels.bfd_fast(lengths, capacity, 0),
        "kernel: bfd_general, no budgets (general)": general_kernel,
    }
    for fn in contenders.values():
        fn()  # numba compiles / loads its cache
    best = {name: min(_cpu(fn) for _ in range(args.repeats)) for name, fn in contenders.items()}
    assert np.array_equal(plan(lengths, capacity), kernel_plan())
    print(f"uptime: {_uptime()}")
    for name, cpu in best.items():
        print(f"{name}: {cpu * 1e3:.1f} ms CPU (best of {args.repeats})")


def _cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=list(GENERAL), metavar="NAME", help="these fast paths only")
    ap.add_argument("--stage", action="store_true", help="one process's encode stage, in-process")
    ap.add_argument("--subset", choices=["images", "trees"], help="--stage: only bench_build's records with an "
                    "image, or only its caption trees")
    ap.add_argument("--planner", action="store_true", help="the planner's fast paths (1M lengths)")
    ap.add_argument("--repeats", type=int, default=9, help="--planner: best of")
    ap.add_argument("--list", action="store_true", help="print the fast paths and exit")
    ap.add_argument("--coco", type=Path, default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    ap.add_argument("--profile", default="qwen2-vl", help="the builds' profile (its tokenizer and template)")
    ap.add_argument("--child", nargs=4, metavar=("CORPUS", "OUT", "NUM_PROC", "PROFILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # the general path (if any) was applied when this script was imported
        bench_build._child(args.child[0], args.child[1], int(args.child[2]), "local", args.child[3])
        return
    if args.list:
        for name, (what, _) in GENERAL.items():
            print(f"{name:>15}  {what}")
        return
    variants = args.only or list(GENERAL)
    if args.planner:
        planner(args)
    elif args.stage:
        encode_stage(args, variants)
    else:
        whole_builds(args, variants)


if __name__ == "__main__":
    main()
