"""Shared by the trainer tests (test_trl.py, test_trl_dpo.py, test_trainer.py, test_multiprocess.py): real shards,
tiny real models, and a callback that records what a real trainer's step did (loss and every gradient)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.pipeline.build import build

VOCAB = 151936  # the builtin qwen2-vl tokenizer's model vocabulary
U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731


def chats(n: int, tag: str = "") -> list[dict]:
    """Linear chats of skewed lengths."""
    return [{"messages": [U(f"{tag}question {i}: " + "word " * (2 + (i * 7) % 23)), A("answer " * (1 + (i * 5) % 9))]}
            for i in range(n)]


def trees(n: int) -> list[dict]:
    """Message trees whose shared prompt carries no loss (so each branch's targets are counted once either way)."""
    return [{"messages": [U(f"pick {i} " + "w " * (i % 6))],
             "branches": [[A("one " * (1 + i % 3))], [A("two")], [U("more?"), A("yes " * (1 + i % 2))]][: 2 + i % 2]}
            for i in range(n)]


def build_jsonl(root: Path, name: str, records: list[dict], **config: Any) -> Path:
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    kw = {"profile": "text", "max_length": 160, "rows_per_shard": 4, **config}
    build(BuildConfig.from_inputs([str(data)], str(root / name), **kw), progress=False)
    return root / name


def once_per_run(tmp_path_factory: Any, name: str, make: Callable[[Path], None]) -> Path:
    """``make(root)`` once per pytest run, by whichever xdist worker asks first; every worker gets ``root``.

    A module fixture runs once per xdist worker that collects one of its tests: two workers would each repeat
    a torchrun launch (~25-45 s in CI). pytest-xdist's recipe for a fixture run once: a file lock in the run's
    temp directory, which every worker's ``getbasetemp()`` sits in. A ``make`` that raises leaves no mark: the
    next worker to ask runs it again (and fails the same way)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".made").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            make(root)
            (root / ".made").touch()
    return root


def tiny_llama(vocab_size: int = VOCAB, seed: int = 0) -> LlamaForCausalLM:
    """2 layers, hidden 16, GQA, tied embeddings: the real Llama code over the tokenizer's whole vocabulary."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config).float()


class StepRecorder(TrainerCallback):
    """Every optimizer step's gradients (after the backward of all its micro-batches, DDP's all-reduce included,
    before clipping or the update), and the logged losses."""

    def __init__(self):
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        model = getattr(model, "module", model)
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def trl_args(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    """A TRL config's arguments for one reproducible CPU step: no learning, no clipping, every step logged, rows in
    order; ``kw`` adds to or overrides them."""
    base = dict(output_dir=str(tmp_path / "run"), learning_rate=0.0, logging_steps=1, report_to=[], use_cpu=True,
                save_strategy="no", bf16=False, max_grad_norm=0.0, train_sampling_strategy="sequential",
                disable_tqdm=True)
    return {**base, **kw}


def logged_losses(trainer: Any) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def assert_grads_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], *, rtol: float = 1e-5) -> float:
    """Every parameter's gradient within fp32 round-off: |d| <= rtol (|want| + 1e-2 of the model's largest gradient,
    at least the parameter's largest entry); returns the largest |d| relative to the model's largest gradient."""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    top = max(float(g.abs().max()) for g in want.values())
    worst = 0.0
    for name, w in want.items():
        scale = max(float(w.abs().max()), 1e-2 * top)
        diff = (got[name] - w).abs()
        assert bool((diff <= rtol * (w.abs() + scale)).all()), (name, float(diff.max()), scale)
        worst = max(worst, float(diff.max()) / top)
    return worst


def path_examples(row: dict) -> list[dict]:
    """A packed row's root-to-leaf paths, each as an unpacked example {input_ids, labels} (lists)."""
    import numpy as np

    offsets = list(row["node_offsets"])
    parents = list(row["node_parents"])
    ends = offsets[1:] + [len(row["input_ids"])]
    children = {p for p in parents if p >= 0}
    out = []
    for leaf in (n for n in range(len(offsets)) if n not in children):
        path, n = [], leaf
        while n >= 0:
            path.append(n)
            n = parents[n]
        idx = np.concatenate([np.arange(offsets[k], ends[k]) for k in reversed(path)])
        out.append({"input_ids": [int(row["input_ids"][i]) for i in idx],
                    "labels": [int(row["labels"][i]) for i in idx]})
    return out


def weighted_paths(row: dict) -> list[dict]:
    """A packed row's root-to-leaf paths, unpacked: {example id, its start and length in the row, the path's row
    positions, ids, labels, loss weights (ones on the labels where the row has none), its example's leaves}."""
    cu, offsets, parents = row["cu_seqlens"], list(row["node_offsets"]), list(row["node_parents"])
    T = len(row["input_ids"])
    ends = offsets[1:] + [T]
    weights = row.get("loss_weights")
    if weights is None:
        weights = (row["labels"] != IGNORE_INDEX).astype(np.float32)
    children = {p for p in parents if p >= 0}
    out = []
    for leaf in (n for n in range(len(offsets)) if n not in children):
        chain, n = [], leaf
        while n >= 0:
            chain.append(n)
            n = parents[n]
        pos = np.concatenate([np.arange(offsets[k], ends[k]) for k in reversed(chain)])
        example = int(np.searchsorted(cu, pos[0], side="right")) - 1
        out.append({"example": row["example_ids"][example], "start": int(cu[example]),
                    "length": int(cu[example + 1] - cu[example]), "pos": pos, "ids": row["input_ids"][pos],
                    "labels": row["labels"][pos], "weights": weights[pos]})
    for p in out:
        p["branches"] = sum(q["example"] == p["example"] for q in out)
    return out
