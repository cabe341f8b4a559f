"""Every normalization of ``packed_cross_entropy`` equals its unpacked definition over a whole optimizer step
(issue 24): G micro-batches of packed rows, trees with loss on their shared prefix and per-token weights, on a
real tiny ``LlamaForCausalLM`` (fp32), against each root-to-leaf path run alone through the same model and the
definition written per example (or per path): loss and every gradient equal. Many ranks: test_multiprocess.py.

Definitions (units are examples with prefix="once", root-to-leaf paths with prefix="path"; W a unit's summed
loss weight, S its summed weighted token loss, B its example's leaves):

    token     sum S / sum W            example   mean over units of S / W
    sqrt      sum S/sqrt(W) / sum sqrt(W)      branches  sum S/sqrt(B) / sum W/sqrt(B)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from packer.train.trainers.loss import PREFIXES, WEIGHTINGS, loss_count, packed_cross_entropy, step_count
from tests.train.trainer_helpers import (
    A,
    U,
    assert_grads_close,
    build_jsonl,
    tiny_llama,
    weighted_paths,
)

W = lambda c, w: {"role": "assistant", "content": c, "loss": w}  # noqa: E731


def records() -> list[dict]:
    """Chats (some weighted), trees whose shared prefix carries loss (so prefix="path" counts it per path), and
    trees of two and three branches."""
    out = []
    for i in range(10):
        out.append({"messages": [U(f"question {i} " + "w " * (i % 5)), W("answer " * (1 + i % 4), [1, 0.5, 2.0][i % 3])]})
    for i in range(6):
        root = [U(f"tree {i} " + "x " * (i % 3)), W("shared " * (1 + i % 2), 1.5 if i % 2 else 1), U("and?")]
        branches = [[A("one " * (1 + i % 3))], [W("two", 3.0)], [U("more"), A("yes " * (1 + i % 2))]][: 2 + i % 2]
        out.append({"messages": root, "branches": branches})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return build_jsonl(tmp_path_factory.mktemp("norm"), "norm", records(), max_length=120, rows_per_shard=3)


def path_losses(model, rows: list[dict], prefix: str) -> dict:
    """Every path run alone: unit key -> ({row position: (weight, token loss)}, branches); a token shared by a
    unit's paths once (prefix="once": a unit is an example; "path": each path is one)."""
    units: dict = {}
    for r, row in enumerate(rows):
        for k, p in enumerate(weighted_paths(row)):
            logits = model(input_ids=torch.as_tensor(p["ids"], dtype=torch.long)[None]).logits[0]
            at = np.flatnonzero(p["labels"] != IGNORE_INDEX)
            losses = F.cross_entropy(logits[at - 1].float(), torch.as_tensor(p["labels"][at], dtype=torch.long),
                                     reduction="none")
            key = (r, p["example"]) if prefix == "once" else (r, p["example"], k)
            unit = units.setdefault(key, ({}, p["branches"]))[0]
            for t, loss in zip(at.tolist(), losses, strict=True):
                unit.setdefault(int(p["pos"][t]), (float(p["weights"][t]), loss))
    return units


def reference(units: dict, weighting: str) -> torch.Tensor:
    """The step's loss by the definition (module docstring)."""
    num, den = torch.zeros(()), 0.0
    for tokens, branches in units.values():
        Wu = sum(w for w, _ in tokens.values())
        if Wu == 0:
            continue
        S = sum(w * loss for w, loss in tokens.values())
        if weighting == "token":
            num, den = num + S, den + Wu
        elif weighting == "example":
            num, den = num + S / Wu, den + 1
        elif weighting == "sqrt":
            num, den = num + S / math.sqrt(Wu), den + math.sqrt(Wu)
        else:
            num, den = num + S / math.sqrt(branches), den + Wu / math.sqrt(branches)
    return num / den


def _steps(data, G: int, rows_per_micro: int) -> list[list[list[dict]]]:
    rows = list(PackedDataset(data, shuffle=False))
    micro = [rows[i : i + rows_per_micro] for i in range(0, len(rows), rows_per_micro)]
    return [micro[i : i + G] for i in range(0, len(micro), G)]


@pytest.mark.slow
@pytest.mark.parametrize("prefix", PREFIXES)
def test_packed_step_equals_the_unpacked_definition(data, prefix):
    """G = 3 micro-batches of 2 packed rows: for every weighting, the sum of the rows' losses / step_count == the
    definition on the paths run alone, and every parameter's gradient too (one forward each side, a backward per
    weighting)."""
    packed_model, ref_model = tiny_llama(seed=1), tiny_llama(seed=1)
    use_packed_attention(packed_model, "sdpa_varlen")
    step = _steps(data, G=3, rows_per_micro=2)[0]
    rows = [r for m in step for r in m]
    assert any(r.get("loss_weights") is not None for r in rows) and any((r["node_parents"] >= 0).any() for r in rows)
    batches = [collate(m) for m in step]
    logits = [packed_model(**model_inputs(b)).logits for b in batches]
    units = path_losses(ref_model, rows, prefix)
    params = [p for _, p in packed_model.named_parameters()]
    names = [n for n, _ in packed_model.named_parameters()]
    for weighting in WEIGHTINGS:
        count = step_count(batches, weighting=weighting, prefix=prefix)
        total = torch.zeros(())
        for b, lg in zip(batches, logits, strict=True):
            out = packed_cross_entropy(lg, b["labels"], b, weighting=weighting, prefix=prefix)
            assert float(out.count) == pytest.approx(float(loss_count(b["labels"], b, weighting=weighting,
                                                                       prefix=prefix)))
            total = total + out.loss / count.float()
        want = reference(units, weighting)
        assert float(total.detach()) == pytest.approx(float(want.detach()), rel=1e-5), weighting
        got = torch.autograd.grad(total, params, retain_graph=True, allow_unused=True)
        ref = torch.autograd.grad(want, list(ref_model.parameters()), retain_graph=True, allow_unused=True)
        assert_grads_close({n: g for n, g in zip(names, got, strict=True) if g is not None},
                           {n: g for n, g in zip(names, ref, strict=True) if g is not None})


def test_the_prefix_choice_counts_a_shared_prefix_once_or_per_path():
    """One tree row by hand: P (2 loss tokens) with branches a (1) and b (2); token mean "once" divides by 5,
    "path" by (2+1) + (2+2) = 7; sqrt's denominator sqrt(5) vs sqrt(3) + sqrt(4); branches: 5 / sqrt(2)."""
    labels = torch.tensor([-100, 5, 6, 7, 8, 9])
    meta = {"cu_seqlens": torch.tensor([0, 6]), "node_offsets": torch.tensor([0, 3, 4]),
            "node_parents": torch.tensor([-1, 0, 0])}
    assert float(loss_count(labels, meta)) == 5
    assert float(loss_count(labels, meta, prefix="path")) == 7
    assert float(loss_count(labels, meta, weighting="sqrt")) == pytest.approx(math.sqrt(5))
    assert float(loss_count(labels, meta, weighting="sqrt", prefix="path")) == pytest.approx(math.sqrt(3) + 2)
    assert float(loss_count(labels, meta, weighting="branches")) == pytest.approx(5 / math.sqrt(2))
    assert float(loss_count(labels, meta, weighting="example", prefix="path")) == pytest.approx(2)
    weights = torch.tensor([0, 0.5, 0.5, 2, 1, 1])
    assert float(loss_count(labels, meta, loss_weights=weights)) == 5  # 0.5 + 0.5 + 2 + 1 + 1
    assert float(loss_count(labels, meta, prefix="path", loss_weights=weights)) == 6  # (1 + 2) + (1 + 2)
    logits = torch.randn(6, 11)
    out = packed_cross_entropy(logits, labels, meta)
    assert out.count.dtype == torch.int64 and int(out.count) == 5  # an integer count where it is one
    with pytest.raises(ConfigError, match="prefix"):
        packed_cross_entropy(logits, labels, meta, prefix="twice")
    with pytest.raises(ConfigError, match="weighting"):
        packed_cross_entropy(logits, labels, meta, weighting="cube")


def test_sequence_logps_weighs_each_token():
    """DPO's per-path log-probs of a weighted build: each loss token's log-prob times its weight, summed along the
    path (the prompt P carries none; chosen a0 a1, rejected b0)."""
    from packer.train.trainers.loss import sequence_logps

    labels = torch.tensor([-100, -100, -100, 7, 8, 9])
    weights = torch.tensor([0, 0, 0, 0.5, 2.0, 3.0])
    batch = {"labels": labels, "cu_seqlens": torch.tensor([0, 6]), "node_offsets": torch.tensor([0, 3, 5]),
             "node_parents": torch.tensor([-1, 0, 0]), "loss_weights": weights}
    logits = torch.randn(6, 11)
    logp = torch.log_softmax(logits, -1)
    got = sequence_logps(logits, batch)
    want_a = 0.5 * logp[2, 7] + 2.0 * logp[3, 8]  # a0 from P's last token, a1 from a0
    want_b = 3.0 * logp[2, 9]  # b0 from P's last token
    assert torch.allclose(got.logps, torch.stack([want_a, want_b]), atol=1e-6)
    assert got.num_tokens.tolist() == [2, 1]
