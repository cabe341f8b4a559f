#!/usr/bin/env python
"""The GPU proof in one unattended command, on an air-gapped CUDA node as it is: kernels, exactness, speed.

    make gpu-wheels                      # here, once: .gpu/wheels (fla-core + what the node lacks) and .gpu/data
    python3 scripts/gpu_check.py --wheels .gpu/wheels --data .gpu/data --out OUT    # on the node (PYTHONPATH=.)
    python scripts/gpu_check.py --dry-run                                          # here: the same paths on CPU

Runs under the node's own python3 (torch, transformers, triton, numpy, pyarrow, numba, einops already there):
no venv, no network. ``--wheels DIR`` installs the prepared wheels with ``pip install --no-index --no-deps
--target`` into a temporary folder put first on ``sys.path`` (nothing of the node's changes). Then, in this process:

1. ``kernels``: every packer attention backend the device has (torch ``varlen``, ``flex``, ``sdpa``,
   ``sdpa_varlen``; ``flash`` only if flash-attn happens to be installed) in bf16 on random packed tree rows,
   against fp32 SDPA with the dense mask: max abs error of the output, cosine of the q/k/v gradients;
   bidirectional image spans on the backends that take them.
2. ``gated_delta``: fla's varlen ``chunk_gated_delta_rule`` (``fla_tree_gated_delta_rule``: one varlen call per
   tree depth, forked initial states) in bf16 against packer's fp32 torch path, on independent sequences and
   on a branched row.
3. ``train_step``: ``scripts/bench_train_step.py``'s padded-vs-packed training step (real tokens/s) on a
   small real-shaped Llama (and Qwen2-VL for COCO caption trees when ``--data`` holds COCO).
4. ``gpu_tests``: ``pytest -m gpu`` with what is left of ``--budget`` (``--skip-tests``: not).

Prints ONE JSON summary line last (also ``OUT/gpu_check.json``). ``--dry-run`` (implied on a machine without
CUDA only when asked) runs the same code on CPU where it exists and lists what it skipped and why. Without
CUDA and without ``--dry-run`` it says so and exits 0. Exit 1 when a check failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.metadata as md
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BF16_ATOL = 2e-2  # bf16 has 8 mantissa bits: outputs of unit-variance attention land within ~1e-2 of fp32
GRAD_COS = 0.999
DELTA_ATOL = 5e-2  # the gated delta rule accumulates a state over the sequence: bf16 drifts more than attention


def install_wheels(wheels: Path) -> dict:
    """``pip install --no-index --no-deps --target`` the prepared wheels; their folder goes first on sys.path."""
    target = Path(tempfile.mkdtemp(prefix="gpu-check-site-"))
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--find-links", str(wheels), "--target", str(target), *files]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-2000:], "command": " ".join(cmd[:12])}
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])
    importlib.invalidate_caches()
    return {"ok": True, "target": str(target), "wheels": [Path(f).name for f in files]}


class NodeImage(importlib.abc.MetaPathFinder):
    """``--simulate-node``: refuse every import whose distribution the node's package list lacks (dry-run proof)."""

    def __init__(self, allowed: set[str]):
        norm = lambda s: s.lower().replace("_", "-")  # noqa: E731
        # What the node's own packages need (here, at this machine's versions of them) is on the node too in its
        # own version: only what packer and its scripts import beyond that closure is refused.
        self.allowed, todo = set(), [norm(a) for a in allowed]
        while todo:
            name = todo.pop()
            if name in self.allowed:
                continue
            self.allowed.add(name)
            try:
                reqs = md.requires(name) or []
            except md.PackageNotFoundError:
                continue
            todo += [norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in reqs if "extra ==" not in r]
        self.owners = {mod: {norm(d) for d in dists} for mod, dists in md.packages_distributions().items()}
        self.refused: set[str] = set()

    def refuses(self, name: str) -> bool:
        owners = self.owners.get(name.partition(".")[0])
        return bool(owners) and not owners & self.allowed

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        top = name.partition(".")[0]
        if path is None and self.refuses(top):
            self.refused.add(f"{top} ({', '.join(sorted(self.owners[top]))})")
            raise ModuleNotFoundError(f"No module named {top!r} (not on the simulated node)", name=top)
        return None

    def install(self) -> None:
        """First on sys.meta_path; availability probes (``importlib.util.find_spec``) answer None, as there."""
        probe = importlib.util.find_spec

        def find_spec(name, package=None):  # noqa: ANN001, ANN202
            return None if self.refuses(name) else probe(name, package)

        importlib.util.find_spec = find_spec
        sys.meta_path.insert(0, self)


def _cos(a, b) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))


def check_kernels(device: str, seeds: int, skipped: list[str]) -> dict:
    """Each backend in bf16 against fp32 SDPA on the dense mask: forward max abs error, gradient cosines."""
    import torch
    from helpers import random_layout, random_spans

    from packer.train.attention.backends import flash_available, packed_attention, varlen_available
    from packer.train.attention.layout import PackedLayout

    cuda = device == "cuda"
    backends = ["sdpa", "sdpa_varlen", "flex", "varlen", "flash"]
    if not cuda:
        skipped.append("kernels.varlen: torch varlen_attn is a CUDA kernel")
        skipped.append("kernels.flash: flash-attn is CUDA only (and has no installable wheel for torch 2.11+cu130)")
        skipped.append("kernels.flex backward: torch's flex_attention has no CPU backward (forward checked)")
        backends = ["sdpa", "sdpa_varlen", "flex"]
    elif not varlen_available():
        skipped.append("kernels.varlen: this torch has no flash kernels for varlen_attn")
        backends.remove("varlen")
    if cuda and not flash_available():
        skipped.append("kernels.flash: flash-attn is not installed (no wheel fits; torch varlen is the same kernel)")
        backends.remove("flash")
    out: dict = {}
    for spans in (False, True):
        for backend in backends:
            if spans and backend == "varlen" and not cuda:
                continue
            worst, cos, t = 0.0, 1.0, time.perf_counter()
            for seed in range(seeds):
                rng = random.Random(seed)
                lay = random_layout(rng, examples=6, max_len=300 if cuda else 60, max_nodes=6)
                extra = {"bidirectional_spans": random_spans(rng, lay)} if spans else {}
                layout = PackedLayout.from_tensors(**lay, **extra)
                g = torch.Generator().manual_seed(seed)
                q, k, v = (torch.randn(layout.num_tokens, h, 64, generator=g) for h in (8, 4, 4))
                grad = not (backend == "flex" and not cuda)
                q16, k16, v16 = (x.to(device, torch.bfloat16).requires_grad_(grad) for x in (q, k, v))
                ref_in = [x.detach().float().requires_grad_(grad) for x in (q16, k16, v16)]
                ref = packed_attention(*ref_in, layout, backend="sdpa")
                with torch.set_grad_enabled(grad):
                    got = packed_attention(q16, k16, v16, layout, backend=backend)
                worst = max(worst, float((got.detach().float() - ref.detach()).abs().max()))
                if grad:
                    w = torch.randn(ref.shape, generator=g).to(device)
                    g_ref = torch.autograd.grad((ref * w).sum(), ref_in)
                    g_got = torch.autograd.grad((got.float() * w).sum(), (q16, k16, v16))
                    cos = min(cos, *(_cos(a, b) for a, b in zip(g_got, g_ref, strict=True)))
            name = backend + ("+spans" if spans else "")
            ok = worst < BF16_ATOL and cos > GRAD_COS
            out[name] = {"ok": ok, "max_abs_err_bf16_vs_fp32": worst, "min_grad_cos": cos if grad else None,
                         "seconds": round(time.perf_counter() - t, 2)}
    return out


def check_gated_delta(device: str, skipped: list[str]) -> dict:
    """fla's varlen gated delta kernel in bf16 against packer's fp32 torch path (CPU: the torch path in bf16)."""
    import torch
    import torch.nn.functional as F

    from packer.train.attention import linear_state
    from packer.train.attention.layout import PackedLayout

    cuda = device == "cuda"
    rows = {
        "independent": PackedLayout.from_tensors(900, [0, 300, 700, 900], [0, 300, 700], [-1, -1, -1]),
        "branched": PackedLayout.from_tensors(180, [0, 159, 171, 180], [0, 70, 75, 155, 158, 159, 171],
                                              [-1, 0, 0, 2, 2, -1, -1]),
    }
    out: dict = {}
    use_fla = cuda and linear_state.fla_available()
    if not use_fla:
        why = "fla's triton kernels need CUDA" if not cuda else "fla is not importable (pass --wheels)"
        skipped.append(f"gated_delta.fla: {why}; the torch tree path ran in bf16 instead")
    if use_fla:
        out["fla_version"] = md.version("fla-core")
    for name, layout in rows.items():
        T = layout.num_tokens
        g0 = torch.Generator().manual_seed(4)
        q, k = torch.randn(T, 2, 64, generator=g0), torch.randn(T, 2, 64, generator=g0)
        v = torch.randn(T, 4, 64, generator=g0)
        g, beta = -F.softplus(torch.randn(T, 4, generator=g0)), torch.rand(T, 4, generator=g0)
        full = [x.to(device) for x in (q, k, v, g, beta)]
        t = time.perf_counter()
        ref = linear_state.tree_gated_delta_rule(*full, layout)  # fp32 reference
        low = [x.to(torch.bfloat16) for x in full]
        if use_fla:
            got = linear_state.fla_tree_gated_delta_rule(*low, layout)
        else:
            got = linear_state.tree_gated_delta_rule(*low, layout)
        err = float((got.float() - ref.float()).abs().max())
        out[name] = {"ok": err < DELTA_ATOL, "kernel": "fla" if use_fla else "torch", "tokens": T,
                     "max_abs_err_bf16_vs_fp32": err, "seconds": round(time.perf_counter() - t, 2)}
    return out


def train_step(device: str, data: Path, backend: str, big: bool, skipped: list[str],
               profile: Path | None = None) -> dict:
    """bench_train_step's padded-vs-packed figures: real tokens/s per side and their ratio."""
    import bench_train_step as bts
    import torch

    data = data.resolve()  # the bench writes image paths into JSONL read from a temp dir
    coco, hist = data / "coco-mini", data / "length-histograms" / "wikipedia_bert_512.csv"
    size = dict(hidden=1024, layers=4, heads=16, text_examples=256, images=24, repeats=3, capacity=4096) if big \
        else dict(hidden=64, layers=1, heads=2, text_examples=12, images=2, repeats=1, capacity=1024)
    args = argparse.Namespace(coco=coco, histogram=hist, max_pixels=200704, vision_depth=2, vision_dim=64,
                              backend=backend, threads=torch.get_num_threads(), seed=0, device=device,
                              dtype=torch.bfloat16 if device == "cuda" else torch.float32, profile=profile, **size)
    out = {"backend": backend, "model": {k: size[k] for k in ("hidden", "layers", "heads", "capacity")}}
    with tempfile.TemporaryDirectory() as tmp:
        text = bts.run_text(args, Path(tmp))
        out["text"] = {**text, "ratio_packed_over_padded": text["b_tok_s"] / text["a_tok_s"]}
        if (coco / "val2017").is_dir():
            caps = bts.run_captions(args, Path(tmp))
            out["captions"] = {**caps, "ratio_trees_over_padded": caps["d_tok_s"] / caps["c_tok_s"]}
        else:
            skipped.append(f"train_step.captions: no COCO images under {coco}")
    if big:  # GPU-bound shapes: a Llama-3.2-1B-like stack (its MLP 2x hidden, not 4x), text rows of 8,192
        args1b = argparse.Namespace(**{**vars(args), "hidden": 2048, "layers": 16, "heads": 32, "capacity": 8192,
                                       "text_examples": 512, "profile": None})
        with tempfile.TemporaryDirectory() as tmp:
            text = bts.run_text(args1b, Path(tmp), kv_heads=8)
        out["llama_1b_shaped"] = {"model": {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8,
                                            "capacity": 8192},
                                  "text": {**text, "ratio_packed_over_padded": text["b_tok_s"] / text["a_tok_s"]}}
    out["ok"] = True
    return out


def gpu_test_files() -> list[str]:
    """The test files that hold ``@pytest.mark.gpu`` tests: only these are collected on the node, so a test module
    that imports what the node lacks (moto, ray, trl...) cannot stop the GPU tests from running."""
    marker = re.compile(r"^\s*@pytest\.mark\.gpu\b", re.M)
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if marker.search(p.read_text()))


def gpu_tests(timeout: float, data: Path | None) -> dict:
    """``pytest -m gpu`` on the files that hold GPU tests: counts, skip reasons, and each problem's first line."""
    env = dict(os.environ)
    if data is not None and (data / "coco-mini").is_dir():
        env["PACKER_SHARED"] = str(data.resolve().parent)  # tests read PACKER_SHARED/data/coco-mini
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "gpu.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs",
               "--continue-on-collection-errors", f"--junitxml={xml}", *gpu_test_files()]
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout, 30))
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"pytest -m gpu ran past the {timeout:.0f} s left of the budget"}
        suite = ET.parse(xml).getroot() if xml.exists() else None
    if suite is None:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-2000:]}
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    problems = []
    for case in suite.iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            first = (bad.get("message") or bad.text or "").strip().splitlines()[:1]
            problems.append(f"{case.get('classname')}::{case.get('name')}: {first[0][:300] if first else '?'}")
    skips = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.+)", proc.stdout)))
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "skip_reasons": skips, "problems": problems[:20], "ok": proc.returncode == 0 and not problems,
            "tail": proc.stdout.strip().splitlines()[-1:]}


def collect_gpu_tests() -> dict:
    """Dry run: collect the GPU test files in this process (under ``--simulate-node``'s import guard, the node's
    packages only), so a module the node cannot import is found here, not there."""
    import pytest

    files = gpu_test_files()
    code = pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files])
    return {"ok": int(code) == 0, "files": files, "exit_code": int(code)}


def _stage(summary: dict, name: str, fn, deadline: float, skipped: list[str]) -> None:
    if time.monotonic() > deadline:
        # a stage the budget left out proved nothing: the check is not ok (rerun with a larger --budget)
        skipped.append(f"{name}: the time budget ran out before it")
        summary[name] = {"ok": False, "error": "not run: the time budget ran out before it"}
        return
    try:
        summary[name] = fn()
    except Exception as exc:  # noqa: BLE001 - one failing stage must not hide the others' figures
        summary[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()[-3000:]}


def _all_ok(value) -> bool:
    if isinstance(value, dict):
        return value.get("ok", True) is not False and all(_all_ok(v) for v in value.values())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run on CPU what exists there, list what it skips")
    parser.add_argument("--wheels", type=Path, help="install these wheels first (--no-index --target a temp dir)")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared"))
                        / "data", help="length-histograms/ and coco-mini/ (make gpu-wheels copies them to .gpu/data)")
    parser.add_argument("--out", type=Path, help="also write the summary to OUT/gpu_check.json")
    parser.add_argument("--budget", type=float, default=480, help="seconds; a stage not started by then is not run, and the check is not ok")
    parser.add_argument("--seeds", type=int, default=3, help="random packed rows per kernel check")
    parser.add_argument("--skip-bench", action="store_true", help="no training-step figure")
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu after the checks")
    parser.add_argument("--only", default=None,
                        help="comma-separated stages to run (kernels, gated_delta, train_step, gpu_tests); default all")
    parser.add_argument("--profile", action="store_true",
                        help="profile a few text training steps of each side into OUT/profile (traces, op tables)")
    parser.add_argument("--simulate-node", type=Path,
                        help="a package list (one name a line): refuse imports of anything else (dry-run proof)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "tests")]
    summary: dict = {"python": sys.version.split()[0]}
    skipped: list[str] = []
    if args.wheels:
        summary["wheels"] = install_wheels(args.wheels)
    guard = None
    if args.simulate_node:
        names = {ln.split("==")[0].strip() for ln in args.simulate_node.read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")}
        extra = {p.name.split("-")[0] for p in args.wheels.glob("*.whl")} if args.wheels else set()
        guard = NodeImage(names | extra | {"packer"})
        os.environ["PACKER_CACHE"] = tempfile.mkdtemp(prefix="gpu-check-cache-")  # builtins built as on the node
        guard.install()
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print(json.dumps({"cuda": False, "ok": True,
                          "message": "gpu-check needs a CUDA GPU; none here, so nothing was run "
                                     "(--dry-run runs the same checks on CPU)"}))
        return 0
    device = "cuda" if cuda else "cpu"
    summary.update(cuda=cuda, dry_run=not cuda, torch=torch.__version__, cuda_version=torch.version.cuda,
                   device=torch.cuda.get_device_name(0) if cuda else "cpu")
    for name in ("transformers", "triton", "fla-core", "flash-attn"):
        try:
            summary[name] = md.version(name)
        except md.PackageNotFoundError:
            summary[name] = None
    only = set(args.only.split(",")) if args.only else None
    wanted = lambda stage: only is None or stage in only  # noqa: E731
    if wanted("kernels"):
        _stage(summary, "kernels", lambda: check_kernels(device, args.seeds, skipped), deadline, skipped)
    if wanted("gated_delta"):
        _stage(summary, "gated_delta", lambda: check_gated_delta(device, skipped), deadline, skipped)
    profile = (args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))) / "profile" if args.profile else None
    if not args.skip_bench and wanted("train_step"):
        from packer.train.attention.backends import flash_available, varlen_available

        backend = ("flash" if flash_available() else "varlen" if varlen_available() else "flex") if cuda \
            else "sdpa_varlen"
        _stage(summary, "train_step", lambda: train_step(device, args.data, backend, cuda, skipped, profile),
               deadline, skipped)
    if wanted("gpu_tests") and cuda and not args.skip_tests:  # last: the kernels and figure come first in the budget
        _stage(summary, "gpu_tests", lambda: gpu_tests(deadline - time.monotonic(), args.data), deadline, skipped)
    elif wanted("gpu_tests") and not cuda:
        skipped.append("gpu_tests: pytest -m gpu needs CUDA (their CPU twins run in the normal suite); "
                       "the files were collected instead")
        _stage(summary, "gpu_tests", collect_gpu_tests, deadline, skipped)
    if guard is not None:
        summary["simulated_node_refused"] = sorted(guard.refused)
    summary["skipped"] = skipped
    summary["seconds"] = round(time.monotonic() - start, 1)
    summary["ok"] = all(_all_ok(summary.get(k, {})) for k in ("wheels", "kernels", "gated_delta", "train_step",
                                                              "gpu_tests"))
    if only is not None:
        summary["only"] = sorted(only)
    line = json.dumps(summary, default=str)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(line + "\n")
    print(line)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
