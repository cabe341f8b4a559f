"""DPO on packed preference trees equals DPO on the unpacked pairs: real shards, a tiny real Llama (fp32).

Preference records (explicit and implicit prompts, multi-turn prompts, long and short answers) are built into
shards with ``packer.pipeline.build``; each example is a prompt node with two leaves, chosen then rejected.
The packed side runs the policy and a frozen reference (same architecture, another seed) once per packed
row through packer's attention, takes ``sequence_logps`` and the sigmoid DPO loss (beta 0.1). The unpacked
side runs prompt+chosen and prompt+rejected one at a time with the model's default attention, as TRL does.
The losses and every parameter gradient must agree within fp32 tolerance.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.encode.tokenizers import load_tokenizer
from packer.pipeline.build import build
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from packer.train.trainers.loss import dpo_loss, preference_pairs, sequence_logps

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)
BETA = 0.1


def u(text: str) -> dict:
    return {"role": "user", "content": text}


def a(text: str) -> dict:
    return {"role": "assistant", "content": text}


RECORDS = [
    {"prompt": [u("What colour is the sky?")], "chosen": [a("Blue.")], "rejected": [a("Green, always, everywhere.")]},
    {"prompt": [{"role": "system", "content": "Be kind."}, u("Hi"), a("Hello!"), u("Tell me a joke.")],
     "chosen": [a("Why did the chicken cross the road? " * 3)], "rejected": [a("No.")]},
    {"chosen": [u("Count to three."), a("1 2 3")], "rejected": [u("Count to three."), a("one, two, many")]},  # implicit
    {"prompt": [u("Summarise: " + "the cat sat on the mat. " * 8)],
     "chosen": [a("A cat sat."), u("Shorter?"), a("Cat.")], "rejected": [a("Dogs bark.")]},
]




@pytest.fixture(scope="module")
def pref_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo")
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="text", max_length=160)
    build(config, progress=False)
    return list(PackedDataset(root / "out", shuffle=False))


def _ranges(layout: PackedLayout) -> list[tuple[int, int]]:
    offsets = layout.node_offsets.tolist()
    return list(zip(offsets, offsets[1:] + [layout.num_tokens], strict=True))


def _pairs(batch: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(chosen, rejected) row positions of every example: its root followed by each leaf."""
    layout = PackedLayout.from_batch(batch)
    ranges = _ranges(layout)
    paths = [torch.cat([torch.arange(*ranges[n]) for n in p]) for p in ce.leaf_paths(layout)]
    return list(zip(paths[0::2], paths[1::2], strict=True))


def _path_logp(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p of a path's loss tokens, the path run alone (TRL's concatenated_forward, batch of one)."""
    logits = model(input_ids=ids[None], use_cache=False).logits[0]  # (L, V)
    k = (labels != IGNORE_INDEX).nonzero().reshape(-1)
    return -F.cross_entropy(logits[k - 1].float(), labels[k], reduction="sum")


def test_shards_hold_prompt_chosen_rejected_trees(pref_build):
    tok = load_tokenizer("qwen2-vl")
    want = {tuple(tok.apply_chat_template(r.get("prompt", []) + r[k], tokenize=True)["input_ids"]): k
            for r in RECORDS for k in ("chosen", "rejected")}
    batch = collate(pref_build)
    seen = []
    for chosen, rejected in _pairs(batch):
        ids = batch["input_ids"][0]
        seen += [want.get(tuple(ids[chosen].tolist())), want.get(tuple(ids[rejected].tolist()))]
    assert seen == ["chosen", "rejected"] * len(RECORDS)  # every path is its pair's own rendering, in order
    parents = batch["node_parents"].tolist()
    assert all(parents.count(p) == 2 for p in set(parents) if p >= 0)  # the prompt computed once


def test_dpo_loss_and_grads_equal_unpacked_pairs(pref_build):
    (batch,), ids, vocab = ce.compact_vocab([collate(pref_build)], {})
    policy = ce.tiny_model("text", token_ids=ids, vocab_size=vocab, seed=0, model_class="LlamaForCausalLM")
    ref = ce.tiny_model("text", token_ids=ids, vocab_size=vocab, seed=1, model_class="LlamaForCausalLM")

    # packed: one forward per model over the whole row
    for m in (policy, ref):
        use_packed_attention(m, "sdpa")
    inputs = model_inputs(batch)
    with torch.no_grad():
        ref_seq = sequence_logps(ref(**inputs).logits, batch)
    seq = sequence_logps(policy(**inputs).logits, batch)
    losses, _ = dpo_loss(seq, ref_seq, beta=BETA)
    losses.mean().backward()
    packed_grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters()}
    assert losses.numel() == len(RECORDS)

    # unpacked: prompt+chosen and prompt+rejected, each alone, default attention
    for m in (policy, ref):
        m.set_attn_implementation("sdpa")
    policy.zero_grad(set_to_none=True)
    ids_row, labels_row = batch["input_ids"][0], batch["labels"][0]
    per_pair = []
    counts = []
    for chosen, rejected in _pairs(batch):
        lp = [_path_logp(policy, ids_row[p], labels_row[p]) for p in (chosen, rejected)]
        with torch.no_grad():
            lr = [_path_logp(ref, ids_row[p], labels_row[p]) for p in (chosen, rejected)]
        per_pair.append(-F.logsigmoid(BETA * ((lp[0] - lr[0]) - (lp[1] - lr[1]))))
        counts += [int((labels_row[p] != IGNORE_INDEX).sum()) for p in (chosen, rejected)]
    unpacked = torch.stack(per_pair)
    unpacked.mean().backward()

    assert seq.num_tokens.tolist() == counts
    torch.testing.assert_close(losses.detach(), unpacked.detach(), rtol=1e-5, atol=1e-6)
    worst = 0.0
    for n, p in policy.named_parameters():
        torch.testing.assert_close(packed_grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
        worst = max(worst, float((packed_grads[n] - p.grad).abs().max()))
    print(f"dpo packed vs unpacked: loss max diff {float((losses - unpacked).detach().abs().max()):.2e}, grad max diff {worst:.2e}")


def test_preference_pairs_refuses_a_non_preference_batch(pref_build):
    batch = collate(pref_build)
    seq = sequence_logps(torch.zeros(1, batch["input_ids"].shape[1], 8), {**batch, "labels": batch["labels"].clamp(max=7)})
    c, r = preference_pairs(seq)
    assert (r - c == 1).all()
    from packer.errors import ShardError
    from packer.train.trainers.loss import SequenceLogps
    odd = SequenceLogps(seq.logps[:3], seq.num_tokens[:3], torch.tensor([0, 0, 1]), seq.leaves[:3])
    with pytest.raises(ShardError, match="exactly two leaves"):
        preference_pairs(odd)
