"""Real multi-process training on CPU over gloo (tests/train/trainers/multirank_worker.py): ``torchrun --nproc_per_node 2`` and
``accelerate launch`` around transformers' Trainer (``PackedTrainer``, DDP), and a plain loop with DDP or FSDP2.

Every run crosses an epoch end with an odd number of packed rows (so one rank reads a filler row), accumulates 2
micro-batches per step (the last step of an epoch has one), and is checked against one process computing each step
from the unpacked examples: for every optimizer step, the loss logged and every gradient (after DDP's all-reduce, or
FSDP2's reduce-scatter, gathered) equal the token mean over all the step's examples, each example (each tree path)
run alone with the model's default attention, followed by the same SGD update. Also: every rank took the same
number of steps (no hang: a run that hangs fails the timeout), every real example was trained once per epoch, and a
run resumed from a mid-epoch checkpoint logs the uninterrupted run's losses for every later step.

The torchrun runs on the mixed build share one launch (``_make``, the worker's ``--then``), made once per pytest run
whichever xdist worker comes first (``once_per_run``): two ranks' imports cost more than these tiny runs. The resume
and ``accelerate launch`` make their own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.train.data.dataset import PackedDataset
from tests.train.trainer_helpers import (
    assert_grads_close,
    build_jsonl,
    chats,
    once_per_run,
    path_examples,
    tiny_llama,
    trees,
)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
WORKER = REPO / "tests" / "train" / "trainers" / "multirank_worker.py"
LR = 0.5  # multirank_worker.LR
TIMEOUT = 420  # a rank left waiting at an all-reduce would hang: the run fails here instead


JOBS = {"full": ("--save-steps", "2"), "trl": ("--mode", "trl"), "ddp": ("--mode", "loop", "--wrap", "ddp"),
        "fsdp2": ("--mode", "loop", "--wrap", "fsdp2")}


def _make(root: Path) -> None:
    """The two builds, then the torchrun runs on the mixed one in one launch (each run's own --out; a test that
    needs one more launch, the resume, makes it itself): PackedTrainer saving a checkpoint every 2 steps, TRL's
    SFTTrainer, and the plain loop with DDP and with FSDP2."""
    mixed = build_jsonl(root, "mixed", chats(17) + trees(5), max_length=128)  # 9 rows: a filler on W=2
    linear = build_jsonl(root, "linear", chats(17), max_length=128)  # 7 rows
    for path in (mixed, linear):
        assert len(PackedDataset(path)) % 2 == 1, path.name
    run_jobs("torchrun", [(root / "torchrun" / name, ("--data", str(mixed), *args)) for name, args in JOBS.items()])


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """``_make``'s directory, made once per pytest run whichever xdist worker comes first (``once_per_run``)."""
    return once_per_run(tmp_path_factory, "multiprocess", _make)


@pytest.fixture(scope="module")
def builds(shared):
    return {"mixed": shared / "mixed", "linear": shared / "linear"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher: str, out: Path, *args: str) -> tuple[dict, list]:
    (result,) = launch_jobs(launcher, [(out, args)])
    return result


def launch_jobs(launcher: str, jobs: list[tuple[Path, tuple[str, ...]]]) -> list[tuple[dict, list]]:
    """One launch of 2 ranks running each job (its --out, its worker arguments) in turn (the worker's ``--then``):
    each job's (record, grads)."""
    run_jobs(launcher, jobs)
    return [load_job(out) for out, _ in jobs]


def run_jobs(launcher: str, jobs: list[tuple[Path, tuple[str, ...]]]) -> None:
    """``launch_jobs`` without reading what the jobs wrote (``load_job``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port())]
    else:  # accelerate's CPU multi-process launch: its torchrun launcher; use_cpu=True makes the group gloo
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_port())]
    worker_args: list[str] = []
    for out, args in jobs:
        worker_args += [*(["--then"] if worker_args else []), "--out", str(out), *args]
    run = subprocess.run([*cmd, str(WORKER), *worker_args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]


def load_job(out: Path) -> tuple[dict, list]:
    """What one job wrote: its record and its gradients."""
    return json.loads((out / "record.json").read_text()), torch.load(out / "grads.pt")


def _examples(data: Path) -> dict[str, list[dict]]:
    """Every example of the build by id: its root-to-leaf paths as unpacked {input_ids, labels}."""
    found = {}
    for row in PackedDataset(data, shuffle=False):
        cu = row["cu_seqlens"]
        for e, ex_id in enumerate(row["example_ids"]):
            a, b = int(cu[e]), int(cu[e + 1])
            nodes = (row["node_offsets"] >= a) & (row["node_offsets"] < b)
            first = int(np.flatnonzero(nodes)[0])
            sub = {"input_ids": row["input_ids"][a:b], "labels": row["labels"][a:b],
                   "node_offsets": row["node_offsets"][nodes] - a,
                   "node_parents": np.where(row["node_parents"][nodes] < 0, -1, row["node_parents"][nodes] - first)}
            found[ex_id] = path_examples(sub)
    return found


def check_run(record: dict, grads: list, data: Path, *, epochs: int = 2) -> dict:
    """Equal steps, every real example once per epoch, and every step == the one-process unpacked token mean."""
    ranks = record["ranks"]
    assert record["world"] == 2 and len(ranks) == 2
    assert len({r["global_step"] for r in ranks}) == 1  # equal steps
    assert len({len(r["batches"]) for r in ranks}) == 1  # equal micro-batches, fillers included
    steps: dict[int, list[str]] = {}
    fillers = 0
    for r in ranks:
        for b in r["batches"]:
            flags = b["filler"] or [False] * len(b["examples"])
            fillers += sum(flags)
            steps.setdefault(b["step"], []).extend(e for e, f in zip(b["examples"], flags, strict=True) if not f)
    examples = _examples(data)
    per_epoch = len(steps) // epochs
    for k in range(epochs):
        seen = [e for s in range(k * per_epoch, (k + 1) * per_epoch) for e in steps[s]]
        assert sorted(seen) == sorted(examples)  # every real example once per epoch, none twice
    assert fillers > 0  # the odd row count made a filler row
    # one process: each step's examples unpacked, token mean, the same SGD update
    model = tiny_llama(seed=0)
    model.set_attn_implementation("sdpa")
    losses = {h["step"]: h["loss"] for h in record["losses"]}
    by_step = {g["step"]: g["grads"] for g in grads}
    worst = 0.0
    for s in sorted(steps):
        model.zero_grad(set_to_none=True)
        total, count = torch.zeros(()), 0
        for ex in steps[s]:
            for path in examples[ex]:
                ids, labels = torch.tensor(path["input_ids"])[None], torch.tensor(path["labels"])
                logits = model(input_ids=ids).logits[0]
                k = (labels != IGNORE_INDEX).nonzero().reshape(-1)
                total = total + F.cross_entropy(logits[k - 1].float(), labels[k], reduction="sum")
                count += k.numel()
        loss = total / count
        loss.backward()
        assert losses[s + 1] == pytest.approx(float(loss.detach()), rel=1e-5), s
        worst = max(worst, assert_grads_close(by_step[s], {n: p.grad for n, p in model.named_parameters()}))
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return {"steps": len(steps), "grad_max_rel": worst, "losses": [losses[s + 1] for s in sorted(steps)]}


@pytest.fixture(scope="module")
def torchrun_runs(shared) -> dict[str, tuple[dict, list, Path]]:
    """Each torchrun run of ``_make``: its record, gradients and directory."""
    return {name: (*load_job(shared / "torchrun" / name), shared / "torchrun" / name) for name in JOBS}


def test_torchrun_trainer_ddp_packer_loss_and_resume(builds, torchrun_runs, tmp_path):
    """torchrun, 2 ranks, PackedTrainer with packer's loss on trees and linear rows, G = 2, two epochs; then the run
    resumed from its step-2 checkpoint (mid-epoch) logs the same losses for steps 3.. and ends at the same step."""
    record, grads, full = torchrun_runs["full"]
    summary = check_run(record, grads, builds["mixed"])
    assert summary["steps"] == 6 and record["wrapped"] == "DistributedDataParallel"
    checkpoint = full / "checkpoints" / "checkpoint-2"
    resumed, _ = launch("torchrun", tmp_path / "resumed", "--data", str(builds["mixed"]), "--resume", str(checkpoint))
    assert {r["global_step"] for r in resumed["ranks"]} == {6}
    after = {h["step"]: h["loss"] for h in resumed["losses"]}  # steps 1-2 come from the checkpoint's history
    assert sorted(after) == [1, 2, 3, 4, 5, 6]
    for step, loss in after.items():
        assert loss == pytest.approx(summary["losses"][step - 1], rel=1e-6), step
    resumed_examples = sorted(e for r in resumed["ranks"] for b in r["batches"] for e, f in
                              zip(b["examples"], b["filler"] or [False] * len(b["examples"]), strict=True) if not f)
    full_examples = sorted(e for r in record["ranks"] for b in r["batches"] if b["step"] >= 2 for e, f in
                           zip(b["examples"], b["filler"] or [False] * len(b["examples"]), strict=True) if not f)
    assert resumed_examples == full_examples  # the rest of the epoch, nothing twice, nothing skipped
    print(f"torchrun DDP packer loss: {summary}")


def test_torchrun_trl_sft_trainer(builds, torchrun_runs):
    """TRL's SFTTrainer (PackedSFTTrainer given the build's path) under torchrun, 2 ranks, G = 2, trees: each rank
    reads its PackedDataset share; the same per-step equality."""
    record, grads, _ = torchrun_runs["trl"]
    summary = check_run(record, grads, builds["mixed"])
    print(f"torchrun TRL PackedSFTTrainer: {summary}")


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_torchrun_plain_loop(builds, torchrun_runs, wrap):
    """A plain PyTorch loop over PackedDataset under torchrun: DDP, and FSDP2 (torch's fully_shard runs on CPU over
    gloo; accelerate has no FSDP on CPU, so the Trainer cannot shard there)."""
    record, grads, _ = torchrun_runs[wrap]
    summary = check_run(record, grads, builds["mixed"])
    assert record["sharded_grads"] == (wrap == "fsdp2")
    print(f"torchrun loop {wrap}: {summary}")


def test_accelerate_launch_trainer_ddp_model_loss(builds, tmp_path):
    """accelerate launch, 2 ranks, the stock Trainer loss (the model's own, on shift_labels) on linear rows, G = 2:
    transformers' num_items_in_batch makes it the same step-wide token mean."""
    record, grads = launch("accelerate", tmp_path / "run", "--data", str(builds["linear"]), "--loss", "model")
    summary = check_run(record, grads, builds["linear"])
    assert record["wrapped"] == "DistributedDataParallel"
    print(f"accelerate launch DDP model loss: {summary}")
