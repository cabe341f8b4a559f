"""``make gpu-check`` runs unattended anywhere: without CUDA it says so and exits 0; ``--dry-run`` runs its checks
on CPU, importing nothing beyond the CUDA node's image and the wheels ``make gpu-wheels`` prepares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]



@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine gpu-check really runs (make gpu-check)")
def test_gpu_check_without_cuda_says_so_and_exits_0():
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["cuda"] is False and summary["ok"] is True
    assert "needs a CUDA GPU" in summary["message"]


@pytest.mark.slow
def test_dry_run_checks_the_kernels_on_cpu_as_the_node_would_import_them():
    """bf16 against fp32 on every CPU backend and the gated delta torch path, under the simulated node's imports."""
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run", "--seeds", "1", "--skip-bench",
                           "--simulate-node", "scripts/gpu_node_packages.txt"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and summary["ok"], summary
    # numba's entry points load awkward's extension where awkward is installed (here); the node has none
    assert summary["dry_run"] and set(summary["simulated_node_refused"]) <= {"awkward (awkward)"}
    assert set(summary["kernels"]) == {"sdpa", "sdpa_varlen", "flex", "sdpa+spans", "sdpa_varlen+spans", "flex+spans"}
    assert all(0 < k["max_abs_err_bf16_vs_fp32"] < 2e-2 for k in summary["kernels"].values())
    assert summary["kernels"]["sdpa_varlen"]["min_grad_cos"] > 0.999
    assert {g["kernel"] for g in (summary["gated_delta"]["independent"], summary["gated_delta"]["branched"])} == {"torch"}
    assert any(s.startswith("kernels.varlen") for s in summary["skipped"])
    assert any(s.startswith("gated_delta.fla") for s in summary["skipped"])
    # the GPU test files import with the node's packages only (on the node a module that did not stopped them all)
    assert summary["gpu_tests"]["ok"] and "tests/train/attention/test_backends.py" in summary["gpu_tests"]["files"]


def test_the_gpu_tests_are_collected_from_their_files_only():
    """Each file that holds a ``pytest.mark.gpu`` test, and no other: the node lacks what other test modules import."""
    files = load_script("gpu_check").gpu_test_files()
    marked = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
              if any(line.strip().startswith("@pytest.mark.gpu") for line in p.read_text().splitlines())}
    assert set(files) == marked and "tests/train/test_equivalence.py" in files
    assert "tests/test_gpu_check.py" not in files  # its skipif mentions CUDA, not the marker


def test_the_node_guard_refuses_what_the_image_lacks():
    """--simulate-node: a package outside the image (and outside its packages' own needs) cannot be imported."""
    guard = load_script("gpu_check").NodeImage({"numpy"})
    assert guard.find_spec("numpy", None) is None  # allowed: the normal finders take it
    with pytest.raises(ModuleNotFoundError, match="not on the simulated node"):
        guard.find_spec("zstandard", None)
    assert guard.refused == {"zstandard (zstandard)"}


def test_the_wheels_are_pinned_and_none_is_on_the_node_already():
    wheels = load_script("gpu_wheels").WHEELS
    node = {ln.strip().lower() for ln in (REPO / "scripts" / "gpu_node_packages.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")}
    assert "fla-core==0.6.0" in wheels and all("==" in w for w in wheels)
    assert not {w.split("==")[0] for w in wheels} & node
    assert {"torch", "transformers", "triton", "numpy", "pyarrow", "numba", "einops"} <= node


def test_gpu_check_is_in_the_makefile():
    makefile = (REPO / "Makefile").read_text()
    assert "gpu-check:" in makefile and "scripts/gpu_check.py --wheels .gpu/wheels" in makefile
    assert "gpu-wheels:" in makefile and "scripts/gpu_wheels.py" in makefile


def test_a_stage_the_budget_left_out_fails_the_check():
    """A stage not started before the deadline proved nothing: the summary says so and is not ok."""
    gpu_check = load_script("gpu_check")
    summary: dict = {}
    skipped: list[str] = []
    gpu_check._stage(summary, "train_step", lambda: {"ok": True}, deadline=0.0, skipped=skipped)
    assert skipped == ["train_step: the time budget ran out before it"]
    assert summary["train_step"]["ok"] is False and not gpu_check._all_ok(summary)
    gpu_check._stage(summary, "kernels", lambda: {"ok": True}, deadline=float("inf"), skipped=skipped)
    assert summary["kernels"] == {"ok": True}
