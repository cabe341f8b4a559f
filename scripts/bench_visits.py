"""What a writer pays per file it visits (issue 32): ``take_rows`` over many encode-cache files, a few rows of each.

A shard's writer gathers its rows from every map output of the exchange (or every chunk file); at 1B examples a
writer visits ~39k map outputs per slice and takes ~1 row from each (docs/scale.md, "The 1B estimate"), so the
cost of one visit, not of the rows, is what the write stage pays. This bench re-splits a kept build's encode cache
(the multimodal bench corpus's, bench_repack.py's ``--keep DIR``: ``DIR/full-N``) into ``--files`` files of equal
rows (Arrow IPC, one record batch each, as the map outputs are), then times, in fresh processes, takes of
``--rows`` random rows from every file, best of ``--reps`` (CPU time): remembered (each file's layout kept from a
first take, as a writer's later shards and slices see them) and not. ``--base REV``: the same takes with the
packer of git revision REV in the same run (``git archive``), and the ratios.

    python scripts/bench_visits.py --keep /tmp/rpab --records 200000 --files 4096 --rows 1 --base 8b62769
    python scripts/bench_visits.py --keep /tmp/rpab --records 200000 --files 391 --rows 1 64 --base 8b62769
    python scripts/bench_visits.py --keep /tmp/rpab --records 200000 --files 39000 --rows 1 --reps 1 --profile
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import REPO, make_corpus  # noqa: E402
from bench_repack import BUILD, checkout  # noqa: E402

CHILD = r"""
import glob, json, sys, time
from pathlib import Path
import numpy as np
from packer.shards import assemble
files = sorted(glob.glob(sys.argv[1] + "/part-*.arrow"))
rows_per, reps = [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
counts = json.load(open(sys.argv[1] + "/counts.json"))
starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
remembered = len(files) <= assemble.LAYOUTS_MAX
take = assemble.take_rows
out = {"layouts_max": assemble.LAYOUTS_MAX, "remembered": remembered}
if remembered:  # what the layouts hold: Python's allocations while they are learnt, per layout (after a
    import gc, tracemalloc  # first few, which pay one-time imports and caches)
    assemble.learn_layouts(files[:8])
    gc.collect()
    tracemalloc.start()
    assemble.learn_layouts(files)
    gc.collect()
    out["layout_bytes"] = tracemalloc.get_traced_memory()[0] / max(1, len(assemble._LAYOUTS) - 8)
    tracemalloc.stop()
take(files, starts, starts[:-1].copy(), remember=True)  # first visits: layouts learnt where this packer keeps them
rng = np.random.default_rng(0)
for k in rows_per:
    sel = np.concatenate([starts[c] + rng.choice(counts[c], k, replace=False) for c in range(len(files))])
    rng.shuffle(sel)
    for remember in (True, False):
        best = 1e9
        for _ in range(reps):
            t = time.process_time()
            take(files, starts, sel, remember=remember)
            best = min(best, time.process_time() - t)
        out[f"{k}-{remember}"] = best / len(files) * 1e6
if sys.argv[4] == "profile":  # where a remembered take's time goes: CPU us per visit by function, own time
    import cProfile, pstats
    sel = np.concatenate([starts[c] + rng.choice(counts[c], rows_per[0], replace=False) for c in range(len(files))])
    prof = cProfile.Profile(time.process_time)
    prof.runcall(take, files, starts, sel, remember=True)
    stats = pstats.Stats(prof).stats
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    out["profile"] = [[f"{fn[2]} ({Path(fn[0]).name}:{fn[1]})", v[1], v[2] / len(files) * 1e6] for fn, v in top]
print(json.dumps(out))
"""


def split(cache: Path, into: Path, files: int) -> None:
    """The cache's rows (chunk files in order) re-split into ``files`` files of equal rows, one record batch each."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    parts = []
    for path in sorted(cache.glob("chunk-*.arrow")):
        with pa.memory_map(str(path)) as src:
            parts.append(ipc.open_file(src).read_all())
    table = pa.concat_tables(parts).combine_chunks()
    bounds = [table.num_rows * i // files for i in range(files + 1)]
    into.mkdir(parents=True)
    for i in range(files):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i]).combine_chunks()
        with ipc.new_file(str(into / f"part-{i:06d}.arrow"), part.schema) as writer:
            writer.write_table(part)
    (into / "counts.json").write_text(json.dumps([bounds[i + 1] - bounds[i] for i in range(files)]))


def run(code: Path, parts: Path, rows: list[int], reps: int, profile: bool = False) -> dict:
    env = {"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(parts), ",".join(map(str, rows)), str(reps),
                           "profile" if profile else "-"], capture_output=True, text=True, env=env, check=True,
                          cwd=parts)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, required=True,
                    help="bench_repack.py's --keep DIR (DIR/full-N is made if missing)")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--coco", type=Path, default=REPO.parent / "shared" / "data" / "coco-mini")
    ap.add_argument("--files", type=int, default=4096)
    ap.add_argument("--rows", type=int, nargs="+", default=[1], help="rows taken from each file per take")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--base", default=None, help="also time git revision REV's take_rows, in the same run")
    ap.add_argument("--profile", action="store_true",
                    help="then, in this tree, one remembered take of the first --rows under cProfile: CPU us per "
                         "visit by function (own time; cProfile's overhead included)")
    args = ap.parse_args()
    full = args.keep / f"full-{args.records}"
    if not (full / "manifest.json").exists():
        corpus = args.keep / f"corpus-{args.records}.jsonl"
        if not corpus.exists():
            make_corpus(corpus, args.coco, args.records)
        subprocess.run([sys.executable, "-m", "packer.cli", "build", str(corpus), "-o", str(full), "--max-length",
                        "8192", "--num-proc", "2", *BUILD], check=True, cwd=REPO)
    with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
        parts = Path(tmp) / "parts"
        split(full / ".packer" / "encode", parts, args.files)
        trees = [("this tree", REPO)]
        if args.base:
            trees.insert(0, (args.base, checkout(args.base, Path(tmp) / "base")))
        results = {name: run(code, parts, args.rows, args.reps, args.profile and code == REPO)
                   for name, code in trees}
    print(f"{args.files} files of ~{args.records // args.files} rows; CPU us per visit, best of {args.reps}")
    for name, r in results.items():
        kept = f"layouts kept, {r['layout_bytes']:.0f} B each" if r["remembered"] else "no layout kept"
        print(f"{name}: LAYOUTS_MAX {r['layouts_max']} ({kept})")
        for k in args.rows:
            print(f"  {k} row(s) a visit: remembered {r[f'{k}-True']:.0f}, not {r[f'{k}-False']:.0f}")
    if args.profile:
        print(f"this tree, one remembered take of {args.rows[0]} row(s) a file under cProfile: "
              "CPU us per visit, own time (calls)")
        for name, calls, us in results["this tree"]["profile"]:
            print(f"  {us:7.1f}  {name} ({calls})")
    if args.base:
        old, new = results[args.base], results["this tree"]
        for k in args.rows:
            print(f"ratio (this tree / {args.base}), {k} row(s): remembered "
                  f"{new[f'{k}-True'] / old[f'{k}-True']:.3f}, not {new[f'{k}-False'] / old[f'{k}-False']:.3f}")


if __name__ == "__main__":
    main()
