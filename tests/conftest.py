"""Shared fixtures. ``../shared`` (beside the repo root) holds the COCO sample and length histograms;
``PACKER_SHARED`` overrides where it is (CI clones main with shared/ beside it)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download at test time
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray 2.60 turns token auth on for a local ray.init() and keeps the token in ~/.ray/auth_token, one file for every
# process of the machine: two xdist workers starting Rays raced on it and a driver joining the multi-node test
# cluster was refused (InvalidAuthToken). One token in the environment, inherited by every Ray node and driver
# the tests start, leaves that file alone.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")).resolve()
COCO = SHARED / "data" / "coco-mini"
HISTOGRAMS = SHARED / "data" / "length-histograms"


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to start without the shared data: hundreds of tests read the COCO sample (many at import, through
    ``COCO``), and each would fail on its own way to an empty folder ("need at least one array to concatenate")."""
    if not any((COCO / "train2017").glob("*.jpg")) or not HISTOGRAMS.is_dir():
        raise pytest.UsageError(
            f"the shared test data is missing: {COCO}/train2017/*.jpg and {HISTOGRAMS}/ are needed. Put the shared/ "
            f"folder beside the repository (shared/data/coco-mini, shared/data/length-histograms) or set "
            f"PACKER_SHARED to it (now {SHARED})")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return SHARED  # there: ``pytest_configure`` refuses to start without it


@pytest.fixture(scope="session")
def coco_dir(shared_dir: Path) -> Path:
    return COCO


@pytest.fixture(scope="session")
def coco_images(coco_dir: Path) -> list[Path]:
    return sorted(p for d in ("train2017", "val2017", "unlabelled") for p in (coco_dir / d).glob("*.jpg"))


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from packer.encode.tokenizers import load_tokenizer

    return load_tokenizer("qwen2-vl")


@pytest.fixture(scope="session", autouse=True)
def _one_intra_op_thread():
    """Every test runs torch with one intra-op thread (tiny models: faster, immune to oversubscription). CI runs
    two xdist workers on two cores: a worker's torch left at its default (a thread per core) oversubscribes them, and
    a tiny Llama's backward over 10 paths took 8.2 s against 0.5 s with one thread on a busy 2-core box (the
    one-process checks of test_normalizations / test_multiprocess spent most of their time there). The
    multi-rank workers and doc recipes the tests launch run one thread already (OMP_NUM_THREADS=1)."""
    import torch

    torch.set_num_threads(1)
    yield
