#!/usr/bin/env python
"""The GPU proof in one unattended command (``make gpu-check``): kernels, exactness and speed on CUDA.

    make gpu-check        # or: python scripts/gpu_check.py [--skip-install] [--skip-bench]

1. Installs flash-attn when a prebuilt wheel fits this torch/CUDA/Python (``pip --only-binary``: never a
   source build of an hour); without one, the flash tests skip and the summary says why.
2. Runs the ``gpu``-marked tests: every attention backend (flash varlen, torch varlen, flex; with bidirectional
   image spans too: the two merged varlen calls, tests/train/attention/test_spans.py) in bf16 and fp32
   against fp32 SDPA with the dense packed mask, losses and gradients of packed rows on real model code.
3. Runs ``scripts/bench_train_step.py`` on CUDA with the real varlen kernels.

Prints ONE JSON summary line last. Exit 0 when everything ran and passed (or when there is no CUDA: it says
so and does nothing), 1 when a test failed or a step broke.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], *, timeout: int) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _flash_attn(install: bool) -> dict:
    try:
        import flash_attn

        return {"installed": True, "version": flash_attn.__version__, "installed_now": False}
    except ImportError:
        pass
    if not install:
        return {"installed": False, "why": "--skip-install"}
    proc = _run([sys.executable, "-m", "pip", "install", "-q", "--only-binary=:all:", "flash-attn"], timeout=900)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        return {"installed": False, "why": f"no prebuilt wheel fits this torch/CUDA/Python ({last[:200]})"}
    return {"installed": True, "installed_now": True}


def _gpu_tests() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "gpu.xml"
        proc = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs",
                     f"--junitxml={xml}", "tests"], timeout=1800)
        suite = ET.parse(xml).getroot() if xml.exists() else None
    if suite is None:
        return {"ok": False, "error": proc.stdout[-2000:] + proc.stderr[-2000:]}
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    skips = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.+)", proc.stdout)))
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "skip_reasons": skips, "ok": proc.returncode == 0, "tail": proc.stdout.strip().splitlines()[-1:]}


def _bench(backend: str) -> dict:
    proc = _run([sys.executable, "scripts/bench_train_step.py", "--device", "cuda", "--dtype", "bfloat16",
                 "--backend", backend], timeout=1800)
    if proc.returncode != 0:
        return {"ok": False, "backend": backend, "error": proc.stderr[-2000:]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"ok": True, "backend": backend, "ratio_b_over_a": result["ratio_b_over_a"],
            "ratio_d_over_c": result["ratio_d_over_c"], "text": result["text"], "captions": result["captions"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-install", action="store_true", help="do not try to install flash-attn")
    parser.add_argument("--skip-bench", action="store_true", help="tests only")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "ok": True,
                          "message": "make gpu-check needs a CUDA GPU; none here, so nothing was run"}))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    summary: dict = {"cuda": True, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                     "cuda_version": torch.version.cuda}
    summary["flash_attn"] = _flash_attn(install=not args.skip_install)
    summary["tests"] = _gpu_tests()
    if not args.skip_bench:
        backend = "flash" if summary["flash_attn"]["installed"] else "varlen"
        summary["bench_train_step"] = _bench(backend)
    summary["ok"] = summary["tests"]["ok"] and summary.get("bench_train_step", {"ok": True})["ok"]
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
