"""``make gpu-check`` runs unattended anywhere: without CUDA it says so in its JSON summary and exits 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def test_gpu_check_is_in_the_makefile():
    makefile = (REPO / "Makefile").read_text()
    assert "gpu-check:" in makefile and "scripts/gpu_check.py" in makefile
