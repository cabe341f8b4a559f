"""The normalizations of issue 24 inside transformers' Trainer and TRL's SFTTrainer on 2 real ranks (torchrun, gloo,
tests/train/trainers/multirank_worker.py), G = 2 micro-batches per step, a weighted two-source build of chats and trees with
loss on their shared prefix: every step's logged loss and every gradient equal the definition
(tests/train/trainers/test_normalizations.py) over all the step's examples, each path run alone in one process, followed by
the same SGD update; and every step's per-source metrics (``SourceMetricsCallback``) equal each source's weighted
token mean, tokens, loss tokens and examples over both ranks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.pipeline.build import build
from packer.train.data.dataset import PackedDataset
from tests.train.trainer_helpers import assert_grads_close, once_per_run, tiny_llama, weighted_paths
from tests.train.trainers.test_multiprocess import LR, load_job, run_jobs
from tests.train.trainers.test_normalizations import records

pytestmark = pytest.mark.slow


def _build(root: Path) -> None:
    """Two sources: weighted chats and trees (records() of test_normalizations), odd rows (a filler on 2 ranks);
    then every run of RUNS on it in one torchrun launch (two ranks' imports cost more than these tiny runs)."""
    import json

    recs = records()
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:10]))
    (root / "trees.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[10:]))
    config = BuildConfig.from_dict({"sources": [{"name": "chat", "paths": [str(root / "chat.jsonl")]},
                                                {"name": "trees", "paths": [str(root / "trees.jsonl")]}],
                                    "output": str(root / "out"), "profile": "text", "max_length": 96,
                                    "rows_per_shard": 4})
    build(config, progress=False)
    assert len(PackedDataset(root / "out")) % 2 == 1
    run_jobs("torchrun", [(root / "runs" / "-".join(run), ("--mode", run[0], "--data", str(root / "out"),
                                                            "--weighting", run[1], "--prefix", run[2], "--epochs", "1"))
                          for run in RUNS])


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """``_build``'s directory, made once per pytest run whichever xdist worker comes first (``once_per_run``)."""
    return once_per_run(tmp_path_factory, "norm-multi", _build)


@pytest.fixture(scope="module")
def mixed(shared) -> Path:
    return shared / "out"


def _examples(data: Path) -> dict[str, dict]:
    """Every example by id: its paths (row positions made example-relative), length and source."""
    found: dict[str, dict] = {}
    for row in PackedDataset(data, shuffle=False):
        for p in weighted_paths(row):
            ex = found.setdefault(p["example"], {"paths": [], "length": p["length"],
                                                 "source": row["example_sources"][row["example_ids"].index(p["example"])]})
            ex["paths"].append({**p, "pos": p["pos"] - p["start"]})
    return found


def _definition(units: list[tuple[dict, int]], weighting: str) -> torch.Tensor:
    num, den = torch.zeros(()), 0.0
    for tokens, branches in units:
        Wu = sum(w for w, _ in tokens.values())
        if Wu == 0:
            continue
        S = sum(w * loss for w, loss in tokens.values())
        c = {"token": 1.0, "example": 1 / Wu, "sqrt": 1 / math.sqrt(Wu), "branches": 1 / math.sqrt(branches)}[weighting]
        num, den = num + c * S, den + c * Wu
    return num / den


def check(record: dict, grads: list, data: Path, weighting: str, prefix: str) -> dict:
    steps: dict[int, list[str]] = {}
    for r in record["ranks"]:
        for b in r["batches"]:
            flags = b["filler"] or [False] * len(b["examples"])
            steps.setdefault(b["step"], []).extend(e for e, f in zip(b["examples"], flags, strict=True) if not f)
    examples = _examples(data)
    model = tiny_llama(seed=0)
    logs = {h["step"]: h for h in record["losses"]}
    by_step = {g["step"]: g["grads"] for g in grads}
    worst = 0.0
    for s in sorted(steps):
        model.zero_grad(set_to_none=True)
        units: list[tuple[dict, int]] = []
        per_source: dict[str, dict] = {}
        for ex_id in steps[s]:
            ex = examples[ex_id]
            seen: dict[int, tuple[float, torch.Tensor]] = {}
            for p in ex["paths"]:
                logits = model(input_ids=torch.as_tensor(p["ids"], dtype=torch.long)[None]).logits[0]
                at = np.flatnonzero(p["labels"] != IGNORE_INDEX)
                losses = F.cross_entropy(logits[at - 1].float(), torch.as_tensor(p["labels"][at], dtype=torch.long),
                                         reduction="none")
                tokens = {int(p["pos"][t]): (float(p["weights"][t]), loss) for t, loss in zip(at.tolist(), losses,
                                                                                              strict=True)}
                if prefix == "path":
                    units.append((tokens, len(ex["paths"])))
                for k, v in tokens.items():
                    seen.setdefault(k, v)
            if prefix == "once":
                units.append((seen, len(ex["paths"])))
            src = per_source.setdefault(ex["source"], {"S": 0.0, "W": 0.0, "tokens": 0, "loss_tokens": 0, "examples": 0})
            src["S"] += sum(w * float(loss.detach()) for w, loss in seen.values())
            src["W"] += sum(w for w, _ in seen.values())
            src["tokens"] += ex["length"]
            src["loss_tokens"] += len(seen)
            src["examples"] += 1
        loss = _definition(units, weighting)
        loss.backward()
        assert logs[s + 1]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5), s
        worst = max(worst, assert_grads_close(by_step[s], {n: p.grad for n, p in model.named_parameters()}))
        logged = logs[s + 1]["sources"]
        for name in ("chat", "trees"):
            want = per_source.get(name, {"S": 0.0, "W": 0.0, "tokens": 0, "loss_tokens": 0, "examples": 0})
            assert logged[f"tokens/{name}"] == want["tokens"] and logged[f"examples/{name}"] == want["examples"]
            assert logged[f"loss_tokens/{name}"] == want["loss_tokens"], (s, name)
            if want["W"]:
                assert logged[f"loss/{name}"] == pytest.approx(want["S"] / want["W"], rel=1e-5), (s, name)
            else:
                assert f"loss/{name}" not in logged
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return {"steps": len(steps), "grad_max_rel": worst}


RUNS = [("trainer", "sqrt", "path"), ("trl", "example", "once"), ("trainer", "branches", "once")]


@pytest.fixture(scope="module")
def runs(shared) -> dict[tuple[str, str, str], tuple[dict, list]]:
    return {run: load_job(shared / "runs" / "-".join(run)) for run in RUNS}


@pytest.mark.parametrize("mode, weighting, prefix", RUNS)
def test_two_ranks_step_equals_the_definition(mixed, runs, mode, weighting, prefix):
    record, grads = runs[mode, weighting, prefix]
    assert record["world"] == 2 and len({r["global_step"] for r in record["ranks"]}) == 1
    summary = check(record, grads, mixed, weighting, prefix)
    assert summary["steps"] >= 2
    print(f"2 ranks {mode} {weighting}/{prefix}: {summary}")
