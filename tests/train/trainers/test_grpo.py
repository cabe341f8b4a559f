"""GRPO on group trees inside TRL equals TRL 1.16's own padded GRPOTrainer on the same rollouts (fp32, a real tiny Llama).

Both trainers get their completions from the same ``rollout_func`` (TRL's own hook for custom rollouts): a fixed
function of the prompt and the completion's place in the batch, so the two see identical rollouts whatever the
weights. Prompts have unequal lengths (TRL left-pads them), completions unequal lengths, some end in EOS and
some are cut at ``max_completion_length``. Per-token log-probs (policy, old policy and reference), the logged
losses and every gradient of two optimizer steps with gradient accumulation (learning rate 1e-2, so the second
step runs on weights both trainers updated) are compared; then a sibling's
tokens are changed and its siblings' log-probs must not move (no completion sees another).
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import types
import zlib
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError
from packer.models import get_profile
from packer.models.gemma3 import Gemma3Profile
from packer.models.llava.profile import LlavaProfile
from packer.train.trainers.grpo import _REFUSED_MEDIA, PackedGRPOTrainer, group_trees, pack_trees, row_of
from tests.train.trainer_helpers import VOCAB, StepRecorder, assert_grads_close, logged_losses, tiny_llama

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's "experimental feature" warning

G = 4
PROMPTS = ["What is 2 + 2?", "Name a colour, any colour at all, and say why you like it.", "Count to three.",
           "Summarise: the cat sat on the mat and then it sat on the hat."]


def fixed_rollout(prompts: list, trainer: GRPOTrainer) -> dict:
    """Completions as a fixed function of (prompt, place in the batch): lengths 1..8, every third ends in EOS."""
    tok = trainer.processing_class
    eos = tok.eos_token_id
    prompt_ids, completion_ids = [], []
    for i, prompt in enumerate(prompts):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        g = torch.Generator().manual_seed(zlib.crc32(f"{prompt}|{i % G}".encode()))
        n = int(torch.randint(1, trainer.args.max_completion_length + 1, (1,), generator=g))
        comp = torch.randint(100, 5000, (n,), generator=g).tolist()
        if i % 3 == 0:
            comp[-1] = eos
        prompt_ids.append(ids)
        completion_ids.append(comp)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def length_reward(completions: list, **kwargs) -> list[float]:
    return [float(len(c) % 5) for c in completions]


class Recording:
    """Keeps every (policy / old / reference) per-token log-prob tensor the trainer computes."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *a, **kw)
        self.recorded.append((out[0].detach().clone(), None if out[1] is None else out[1].detach().clone()))
        return out


class RecordingGRPO(Recording, GRPOTrainer):
    recorded: list


class RecordingPackedGRPO(Recording, PackedGRPOTrainer):
    recorded: list


def tiny_qwen35():
    """Qwen3.5's language model (Gated DeltaNet and full-attention layers): a group's completions fork the linear
    layers' recurrent state at the prompt (``packer.train.attention.linear_state``)."""
    torch.manual_seed(0)
    proof = get_profile("qwen3.5").proof()
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0],
            "mrope_interleaved": True}
    return proof.tiny_model(token_ids={}, vocab_size=VOCAB, model_class=proof.text_model_class, rope_parameters=rope)


def saved(tmp_path_factory, name, model) -> str:
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    load_tokenizer("qwen2-vl").save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return saved(tmp_path_factory, "tiny_llama", tiny_llama(seed=0))


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    return saved(tmp_path_factory, "tiny_qwen35", tiny_qwen35().float())


def grpo_config(tmp_path, **kw) -> GRPOConfig:
    base = dict(output_dir=str(tmp_path / "run"), learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True,
                bf16=False, per_device_train_batch_size=2 * G, gradient_accumulation_steps=2, num_generations=G,
                max_completion_length=8, max_steps=2, beta=0.1, seed=0, save_strategy="no", shuffle_dataset=False,
                loss_type="dapo")
    base.update(kw)
    return GRPOConfig(**base)


def run(cls, model_dir, tmp_path, **kw):
    tok = load_tokenizer("qwen2-vl")
    data = datasets.Dataset.from_dict({"prompt": PROMPTS * 4})
    packer_kw = {"max_tokens": kw.pop("max_tokens")} if "max_tokens" in kw and issubclass(cls, PackedGRPOTrainer) else {}
    kw.pop("max_tokens", None)
    rollout = kw.pop("rollout_func", fixed_rollout)
    trainer = cls(model_dir, reward_funcs=length_reward, args=grpo_config(tmp_path, **kw), train_dataset=data,
                  processing_class=tok, rollout_func=rollout, **packer_kw)
    trainer.recorded = []
    rec = StepRecorder()
    trainer.add_callback(rec)
    trainer.train()
    return trainer, rec


@pytest.mark.slow
@pytest.mark.parametrize("kw", [
    {},
    {"loss_type": "grpo", "num_iterations": 2},  # num_iterations > 1: the old policy's log-probs are computed too
    {"loss_type": "dr_grpo"},
    {"loss_type": "bnpo", "beta": 0.0},
    {"loss_type": "cispo"},
    {"max_tokens": 30},  # rows of at most 30 tokens: groups split over several trees and rows
])
def test_packed_grpo_equals_trl(model_dir, tmp_path, kw):
    assert_same_training(model_dir, tmp_path, dict(kw))


@pytest.mark.slow
def test_packed_grpo_equals_trl_on_qwen35_linear_attention(qwen35_dir, tmp_path):
    # The delta rule's chunked recurrence (TRL's padded path) against packer's tree recurrence: fp32 round-off
    # of a longer reduction, 2e-5 relative on a log-prob of ~12.
    assert_same_training(qwen35_dir, tmp_path, {}, rtol=5e-5, grad_top=1e-4, grad_rtol=1e-2)


def assert_same_training(model_dir, tmp_path, kw, rtol=1e-5, grad_top=2e-5, grad_rtol=1e-3):
    want, want_rec = run(RecordingGRPO, model_dir, tmp_path / "trl", **kw)
    got, got_rec = run(RecordingPackedGRPO, model_dir, tmp_path / "packer", **kw)
    assert len(got.recorded) == len(want.recorded) > 0
    for (g, ge), (w, we) in zip(got.recorded, want.recorded, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=1e-5)
        if we is not None:
            torch.testing.assert_close(ge, we, rtol=rtol, atol=1e-5)
    assert logged_losses(got) == pytest.approx(logged_losses(want), rel=rtol, abs=1e-6)
    assert len(got_rec.grads) == len(want_rec.grads) == 2
    for step, (g, w) in enumerate(zip(got_rec.grads, want_rec.grads, strict=True)):
        # fp32 round-off of two different reductions (TRL's chunked log-softmax and padded SDPA with the prompt
        # at left-padded positions, against packer's): within 2e-5 of the largest gradient, 1e-3 of each tensor's
        # at the first step (the same weights; ~1e-6 measured). Each optimizer step carries that round-off into
        # the weights (Adam scales a small gradient's difference up), so the second step gets 2.5x: CISPO's third
        # step (the test ran three steps then) measured 2.3e-5 on an AMD EPYC box (its fp32 kernels sum in another
        # order), under 2e-5 before. Two steps prove what three did (the second already runs on updated weights,
        # and num_iterations=2 reuses the first generation there): each step is TRL's vocabulary-wide (151,936)
        # log-softmax over every padded completion position, most of the test's time.
        worst = assert_grads_close(g, w, rtol=grad_rtol)
        print("worst gradient difference / largest gradient:", worst)
        assert worst < (grad_top if step == 0 else 2.5 * grad_top), step


def test_a_completion_never_sees_a_sibling(model_dir, tmp_path):
    trainer = PackedGRPOTrainer(model_dir, reward_funcs=length_reward, args=grpo_config(tmp_path),
                                train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                                processing_class=load_tokenizer("qwen2-vl"))
    prompt = torch.tensor([11, 12, 13, 14, 15])
    comps = torch.tensor([[21, 22, 23, 24], [31, 32, 33, 0], [41, 42, 0, 0]])
    ids = torch.cat([prompt.expand(3, -1), comps], dim=1)
    mask = torch.cat([torch.ones(3, 5, dtype=torch.long), (comps > 0).long()], dim=1)
    model = trainer.model.eval()
    with torch.no_grad():
        before, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 4)
        changed = ids.clone()
        changed[1, 5:8] = torch.tensor([91, 92, 93])
        after, _, _ = trainer._get_per_token_logps_and_entropies(model, changed, mask, 4)
        alone, _, _ = trainer._get_per_token_logps_and_entropies(model, ids[:1], mask[:1], 4)
    assert len(pack_trees(group_trees(ids, mask, 4, ids.numel()), ids.numel())) == 1  # one row, one tree
    torch.testing.assert_close(after[[0, 2]], before[[0, 2]], rtol=0, atol=0)  # siblings untouched
    assert not torch.allclose(after[1, 1:3], before[1, 1:3])  # the changed branch itself moved
    torch.testing.assert_close(before[0], alone[0], rtol=1e-5, atol=1e-6)  # as if it ran alone
    assert float(before[2, 2:].abs().sum()) == 0.0  # padding gets 0, as in TRL


def test_groups_are_trees_packed_to_the_budget():
    ids = torch.tensor([[0, 7, 8, 1, 2, 0], [0, 7, 8, 3, 0, 0], [9, 9, 9, 4, 5, 6], [0, 7, 8, 1, 1, 1]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    trees = group_trees(ids, mask, 3, 100)
    assert [(t.prompt, t.completions, t.lengths) for t in trees] == [([7, 8], [0, 1, 3], [2, 1, 3]),
                                                                     ([9, 9, 9], [2], [3])]
    row = row_of(trees, ids, 3)
    # completions 0 ([1, 2]) and 3 ([1, 1, 1]) share their first token: one inner node [1], computed once
    assert row.input_ids.tolist() == [[7, 8, 1, 2, 1, 1, 3, 9, 9, 9, 4, 5, 6]]
    assert row.layout.node_parents.tolist() == [-1, 0, 1, 1, 0, -1, 5]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 3, 4, 2, 0, 1, 2, 3, 4, 5]]
    assert sorted(zip(row.targets.tolist(), row.sources.tolist(), strict=True)) == [
        (0, 2), (1, 3), (3, 6), (6, 10), (7, 11), (8, 12), (9, 2), (10, 4), (11, 5)]
    split = group_trees(ids, mask, 3, 6)  # a group over the budget splits its completions, prompt in each
    assert [(t.prompt, t.completions) for t in split] == [([7, 8], [0, 1]), ([7, 8], [3]), ([9, 9, 9], [2])]
    assert all(sum(t.num_tokens for t in r) <= 6 for r in pack_trees(split, 6))
    with pytest.raises(ConfigError, match="max_tokens=4"):
        group_trees(ids, mask, 3, 4)


def test_what_packer_cannot_make_exact_is_refused(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="cast_lm_head_to_fp32"):
        PackedGRPOTrainer(model_dir, reward_funcs=length_reward, args=grpo_config(tmp_path, cast_lm_head_to_fp32=True),
                          train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                          processing_class=load_tokenizer("qwen2-vl"))
    trainer = PackedGRPOTrainer(model_dir, reward_funcs=length_reward, args=grpo_config(tmp_path),
                                train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                                processing_class=load_tokenizer("qwen2-vl"))
    ids, mask = torch.ones(2, 6, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)
    with pytest.raises(ConfigError, match="pixel_values.*'llama'"):  # images on a family not proven: by model type
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 3, pixel_values=torch.zeros(4, 3))
    # other families' media inputs (LLaVA-NeXT, InternVL, SmolVLM, LFM2-VL, Gemma 4; token_type_ids on any model
    # but Gemma 3) and any input TRL may add later (a video's pixels): by name
    for name in (*_REFUSED_MEDIA, "token_type_ids", "pixel_values_videos"):
        with pytest.raises(ConfigError, match=name):
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 3, **{name: torch.zeros(2, 6)})


def test_images_inside_completions_are_refused(tmp_path):
    """A tool's image in a completion: its pixels are not among TRL's prompt images, so it is refused by name."""
    trainer = PackedGRPOTrainer(vl_model_dir(tmp_path, "qwen2-vl"), reward_funcs=length_reward,
                                args=grpo_config(tmp_path, beta=0.0), processing_class=vl_processor("qwen2-vl"),
                                train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}))
    image = trainer.model.config.image_token_id
    ids = torch.tensor([[11, image, 12, 21, image, 22]] * 2)  # prompt [11 <img> 12], completion [21 <img> 22]
    with pytest.raises(ConfigError, match="completion holds image tokens"):
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), 3,
                                                   pixel_values=torch.zeros(8, 3 * 2 * 14 * 14),
                                                   image_grid_thw=torch.tensor([[1, 2, 2]] * 2), num_images=[1, 1])


def test_gemma3_pan_and_scan_crops_are_refused(tmp_path):
    """Gemma 3 with pan-and-scan: more pixel_values entries (the crops) than images, which packer does not place."""
    trainer = PackedGRPOTrainer(vl_model_dir(tmp_path, "gemma3"), reward_funcs=length_reward,
                                args=grpo_config(tmp_path, beta=0.0), processing_class=gemma3_processor(),
                                train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}))
    image = trainer.model.config.image_token_id
    ids = torch.tensor([[11, image, 12, 21, 22, 23]] * 2)
    with pytest.raises(ConfigError, match="pan-and-scan"):  # 2 images, 3 entries each: the whole and 2 crops
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), 3,
                                                   pixel_values=torch.zeros(6, 3, 56, 56), num_images=[1, 1])


@pytest.mark.slow
def test_packed_grpo_equals_trl_on_two_ranks(model_dir, tmp_path):
    """torchrun, 2 ranks over gloo: TRL gathers the rewards of both ranks for the group advantages and DDP
    averages the gradients; packing each rank's micro-batch changes neither."""
    repo = Path(__file__).resolve().parents[3]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(Path(__file__).with_name("grpo_multirank_worker.py")), "--model", model_dir, "--out", str(tmp_path)]
    result = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    record = json.loads((tmp_path / "record.json").read_text())
    grads = torch.load(tmp_path / "grads.pt")
    assert record["trl"]["world"] == record["packer"]["world"] == 2
    assert record["packer"]["losses"] == pytest.approx(record["trl"]["losses"], rel=1e-5, abs=1e-6)
    assert len(grads["packer"]) == len(grads["trl"]) == 2
    for g, w in zip(grads["packer"], grads["trl"], strict=True):
        assert assert_grads_close(g, w, rtol=1e-3) < 2e-5


# ---------------------------------------------------------------- deeper trees: completions sharing more than the prompt

def shared_turn_rollout(prompts: list, trainer: GRPOTrainer) -> dict:
    """Multi-turn-shaped rollouts: completions 0-2 of a group share a first turn and a "tool result" (6 tokens),
    completion 1 is a prefix of completion 2, completion 3 shares nothing but the prompt."""
    out = fixed_rollout(prompts, trainer)
    for i, prompt in enumerate(prompts):
        g = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
        turn = torch.randint(100, 5000, (6,), generator=g).tolist()
        own = out["completion_ids"][i][:2]
        out["completion_ids"][i] = {0: turn + own, 1: turn[:4], 2: turn}.get(i % G, own)
    return out


@pytest.mark.slow
def test_packed_grpo_equals_trl_with_shared_turns(model_dir, tmp_path):
    assert_same_training(model_dir, tmp_path, {"rollout_func": shared_turn_rollout, "max_completion_length": 8})


@pytest.mark.slow
def test_packed_grpo_equals_trl_with_shared_turns_on_qwen35(qwen35_dir, tmp_path):
    # The recurrent state forks at every inner node of the trie, not only at the prompt. Log-probs within 1e-4
    # relative (the delta rule's fp32 round-off over longer paths: 5.6e-5 on one log-prob of ~12, 1 of 64).
    # Optimizer SGD: gradients within 1.1e-6, 1.1e-6, 1.6e-6 of the largest over 3 steps (2 now). Under AdamW the same
    # run drifts to 1.9e-4 and 4.3e-4 at steps 2 and 3 (step 1: 1.1e-6, as here): Adam's first update is about
    # lr * sign(gradient) for every entry, so fp32 round-off on a near-zero gradient entry becomes an lr-sized
    # weight difference, and the next steps run on different weights. That it is round-off and not a fork at a
    # deeper node: test_deep_trees_on_qwen35_are_exact_in_float64.
    assert_same_training(qwen35_dir, tmp_path, {"rollout_func": shared_turn_rollout, "optim": "sgd"}, rtol=1e-4,
                         grad_top=1e-5, grad_rtol=1e-2)


class _Float64Torch(types.ModuleType):
    """``torch`` for modeling_qwen3_5 with ``torch.float32`` read as float64: its delta rule and gated norm cast
    to fp32 even in a float64 model (``.to(torch.float32)``)."""

    float32 = torch.float64

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@pytest.mark.slow
def test_deep_trees_on_qwen35_are_exact_in_float64(tmp_path, monkeypatch):
    """Float64 settles whether a state fork at an inner node of the trie is exact: a deep tree's per-token
    log-probs and gradients through ``PackedGRPOTrainer`` against each completion run alone (unpadded) through
    transformers' own Qwen3.5 forward (chunked delta rule and causal conv of transformers, no packer code).

    TRL's padded trainer cannot run in float64 (its fused LM head computes in fp32), so the reference is what
    its padded rows compute, one completion each. The model's own fp32 casts are lifted for the comparison
    (``torch.float32`` in modeling_qwen3_5, RMSNorm's ``x.float()``): with them in place the gradients agree
    to 6.5e-8 of the largest (fp32 sums over different token sets), without them to 7.5e-11, what is left
    being ``A_log.float()`` / ``a.float()`` in the decay, the same code on both sides. Nodes of 15-70 tokens
    cross the 64-token chunks; measured: log-probs within 1.8e-15."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen35

    monkeypatch.setattr(qwen35, "torch", _Float64Torch("torch"))
    monkeypatch.setattr(qwen35.Qwen3_5RMSNorm, "forward", lambda self, x: self._norm(x) * (1.0 + self.weight))
    model = tiny_qwen35().double()
    reference = copy.deepcopy(model)
    trainer = PackedGRPOTrainer(model, reward_funcs=length_reward, args=grpo_config(tmp_path, beta=0.0),
                                train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                                processing_class=load_tokenizer("qwen2-vl"))  # beta 0: no reference model
    g = torch.Generator().manual_seed(0)
    r = lambda n: torch.randint(100, 5000, (n,), generator=g).tolist()  # noqa: E731
    p1, p2, turn, own1, own2, own3 = r(37), r(9), r(50), r(20), r(70), r(15)
    seqs = [(p1, turn + own1), (p1, turn[:30]), (p1, turn), (p1, own2), (p1, turn + own3), (p2, turn[:20] + own1),
            (p2, own3)]
    P, C = max(len(p) for p, _ in seqs), max(len(c) for _, c in seqs)
    ids, mask = torch.zeros(len(seqs), P + C, dtype=torch.long), torch.zeros(len(seqs), P + C, dtype=torch.long)
    for b, (p, c) in enumerate(seqs):  # TRL's layout: prompts left-padded, completions right-padded
        ids[b, P - len(p):P + len(c)] = torch.tensor(p + c)
        mask[b, P - len(p):P + len(c)] = 1
    trees = group_trees(ids, mask, C, ids.numel())
    assert [len(t.nodes) for t in trees] == [5, 2]  # [turn[:30]] -> [turn[30:]] -> {own1, own3}, own2 | 2 branches
    weights = torch.randn(len(seqs), C, generator=g, dtype=torch.float64) * mask[:, P:]
    got, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C)
    (got * weights).sum().backward()
    want = torch.zeros_like(got)
    for b, (p, c) in enumerate(seqs):
        logits = reference(input_ids=torch.tensor([p + c]), use_cache=False).logits[0, len(p) - 1:-1]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
        (logp * weights[b, :len(c)]).sum().backward()
        want[b, :len(c)] = logp.detach()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-12)
    grads = {n: p.grad for n, p in model.named_parameters()}
    worst = assert_grads_close(grads, {n: p.grad for n, p in reference.named_parameters()}, rtol=1e-8)
    print("float64: worst gradient difference / largest gradient:", worst)
    assert worst < 1e-9


def test_shared_turns_are_computed_once_and_never_see_a_sibling(model_dir, tmp_path):
    trainer = PackedGRPOTrainer(model_dir, reward_funcs=length_reward, args=grpo_config(tmp_path),
                                train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                                processing_class=load_tokenizer("qwen2-vl"))
    prompt = torch.tensor([11, 12, 13, 14, 15])
    comps = torch.tensor([[21, 22, 23, 24, 25], [21, 22, 23, 31, 0], [21, 22, 0, 0, 0], [41, 42, 43, 0, 0]])
    ids = torch.cat([prompt.expand(4, -1), comps], dim=1)
    mask = torch.cat([torch.ones(4, 5, dtype=torch.long), (comps > 0).long()], dim=1)
    (tree,) = group_trees(ids, mask, 5, ids.numel())
    assert tree.num_tokens == 5 + 2 + 1 + 2 + 1 + 3  # [21 22] [23] [24 25] [31] [41 42 43]
    model = trainer.model.eval()
    with torch.no_grad():
        before, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 5)
        changed = ids.clone()
        changed[1, 8] = 91  # completion 1's own token after the shared [21 22 23]
        after, _, _ = trainer._get_per_token_logps_and_entropies(model, changed, mask, 5)
        alone = torch.cat([trainer._get_per_token_logps_and_entropies(model, ids[b:b + 1], mask[b:b + 1], 5)[0]
                           for b in range(4)])
    torch.testing.assert_close(after[[0, 2, 3]], before[[0, 2, 3]], rtol=0, atol=0)  # siblings untouched
    torch.testing.assert_close(after[1, :3], before[1, :3], rtol=0, atol=0)  # its shared prefix too
    assert not torch.allclose(after[1, 3], before[1, 3])
    torch.testing.assert_close(before, alone, rtol=1e-5, atol=1e-6)  # each as if it ran alone


# ---------------------------------------------------------------- the Qwen-VL families: an image in the prompt

IMAGE_SIZES = [(2, 2), (3, 2), (2, 4), (4, 3)]  # in units of the resize factor (28 / 32 px): 4, 6, 8, 12 tokens
VL_PROCESSORS = {"qwen2-vl": "Qwen2VLProcessor", "qwen2.5-vl": "Qwen2_5_VLProcessor", "qwen3-vl": "Qwen3VLProcessor",
                 "qwen3.5": "Qwen3VLProcessor", "qwen3.5-moe": "Qwen3VLProcessor",
                 "glm-4.6v": "Glm46VProcessor"}  # processing_auto's mapping
GEMMA3_TINY = Gemma3Profile(name="gemma3-tiny", image_px=56, tokens_per_image=4)  # 4x4 patches pooled 2x2: 4 tokens
LLAVA_TINY = LlavaProfile(name="llava-tiny", image_px=56)  # 4x4 patches of 14 px: 16 tokens


def vl_profile(name: str):
    return {"gemma3": GEMMA3_TINY, "llava": LLAVA_TINY}.get(name) or get_profile(name)


def llava_processor():
    """transformers' ``LlavaProcessor`` at the tiny model's 56 px (CLIP's PIL processor: shortest edge, centre
    crop), LLaVA-1.5's "default" features (CLS dropped: 16 tokens), over the builtin qwen2-vl tokenizer
    left-padded (LLaVA-1.5's Vicuna tokenizer ships nowhere offline; its ``<|image_pad|>`` is the image token)."""
    import transformers

    tok = load_tokenizer("qwen2-vl")
    tok.padding_side = "left"
    images = transformers.CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    return transformers.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14,
                                       vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                       image_token="<|image_pad|>",
                                       chat_template=tok.chat_template)


def gemma3_processor():
    """transformers' ``Gemma3Processor`` (PIL image processor at the tiny model's 56 px, 4 tokens an image) over
    packer's ``gemma3`` stand-in tokenizer, left-padded, and Gemma 3's chat template as released (an image part is
    ``<start_of_image>``, which the processor expands; the builtin template writes that expansion itself)."""
    import transformers

    from packer.models.gemma3.tokenizers import GEMMA3_CHAT_TEMPLATE

    tok = load_tokenizer("gemma3")
    tok.padding_side = "left"
    template = GEMMA3_CHAT_TEMPLATE.replace("'\n\n<start_of_image><image_soft_token><end_of_image>\n\n'",
                                            "'<start_of_image>'")
    assert template != GEMMA3_CHAT_TEMPLATE
    images = transformers.Gemma3ImageProcessorPil(size={"height": 56, "width": 56})
    return transformers.Gemma3Processor(image_processor=images, tokenizer=tok, image_seq_length=4,
                                        chat_template=template)


def vl_processor(name: str):
    """The family's real transformers processor offline: packer's builtin tokenizer of the profile, left-padded
    (TRL left-pads its prompt ids; a right-padding processor would put TRL's ``mm_token_type_ids`` beside the wrong
    tokens), and the PIL image processor with the profile's patch size, mean and std (no video processor: its
    class needs torchvision; TRL 1.16's GRPO passes no video)."""
    import transformers

    from tests.helpers import without_video_processor

    if name in ("gemma3", "llava"):
        return gemma3_processor() if name == "gemma3" else llava_processor()
    profile = get_profile(name)
    tok = load_tokenizer(profile.default_tokenizer)
    tok.padding_side = "left"
    factor = profile.patch_size * profile.merge_size
    if name == "glm-4.6v":  # GLM's smart_resize counts an image as 2 frames: its bounds are on 2 x the area
        images = transformers.Glm46VImageProcessorPil(size={"shortest_edge": 8 * factor * factor,
                                                             "longest_edge": 32 * factor * factor})
    else:
        images = transformers.Qwen2VLImageProcessorPil(
            min_pixels=4 * factor * factor, max_pixels=16 * factor * factor, patch_size=profile.patch_size,
            merge_size=profile.merge_size, image_mean=list(profile.image_mean), image_std=list(profile.image_std))
    cls = without_video_processor(getattr(transformers, VL_PROCESSORS[name]))
    return cls(image_processor=images, tokenizer=tok, video_processor=None, chat_template=tok.chat_template)


def vl_model_dir(tmp_path: Path, name: str) -> str:
    """The profile's tiny model (packer's proof: random weights, fp32) saved with its tokenizer."""
    profile = vl_profile(name)
    tok = load_tokenizer(profile.default_tokenizer or "qwen2-vl")
    proof = profile.proof()
    torch.manual_seed(0)
    model = proof.tiny_model(token_ids={t: tok.convert_tokens_to_ids(t) for t in proof.model_tokens()},
                             vocab_size=VOCAB)
    model.save_pretrained(tmp_path / name)
    tok.save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def image_rollout(prompts: list, trainer: GRPOTrainer) -> dict:
    """``fixed_rollout`` for conversational prompts with an image: the prompt ids as the processor gives them."""
    proc = trainer.processing_class
    prompt_ids, completion_ids = [], []
    for i, prompt in enumerate(prompts):
        images = [c["image"] for m in prompt for c in m["content"] if c.get("type") == "image"]
        text = proc.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        prompt_ids.append(list(proc(images=images, text=[text])["input_ids"][0]))
        g = torch.Generator().manual_seed(zlib.crc32(f"{text}|{i % G}".encode()))
        n = int(torch.randint(1, trainer.args.max_completion_length + 1, (1,), generator=g))
        completion_ids.append(torch.randint(100, 5000, (n,), generator=g).tolist())
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def completion_length_reward(completion_ids: list, **kwargs) -> list[float]:
    return [float(len(c) % 5) for c in completion_ids]


def image_prompts(factor: int = 28) -> datasets.Dataset:
    from PIL import Image

    files = sorted((Path(os.environ.get("PACKER_SHARED", "/work/shared")) / "data/coco-mini/train2017").glob("*.jpg"))
    images = [Image.open(f).convert("RGB").resize((w * factor, h * factor))
              for f, (w, h) in zip(files, IMAGE_SIZES, strict=False)]
    texts = ["What is this?", "Describe the picture in a few words, please.", "Colour?", "Count the objects."]
    prompts = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}] for t in texts]
    return datasets.Dataset.from_dict({"prompt": prompts * 2, "image": images * 2})


@pytest.mark.slow
@pytest.mark.parametrize(("name", "rtol", "grad_top", "whole_groups"), [
    ("qwen2-vl", 1e-5, 2e-5, True),  # steps_per_generation=1: every micro-batch holds whole groups
    ("qwen2.5-vl", 1e-5, 2e-5, False),  # windowed vision attention
    ("qwen3-vl", 1e-5, 2e-5, False),  # interleaved mRoPE, DeepStack into the first decoder layers
    ("qwen3.5", 5e-5, 2e-5, False),  # Gated DeltaNet layers: the state forks after the image (fp32, as the text test)
    ("qwen3.5-moe", 5e-5, 2e-5, False),  # its sparse MoE blocks (no router aux loss: refused, see the docstring)
    ("gemma3", 1e-5, 2e-5, False),  # 1-D positions, each image's tokens bidirectional, a sliding-window layer
    ("glm-4.6v", 1e-5, 2e-5, False),  # Qwen2-VL's image mRoPE rule over <|image|> runs
    ("llava", 1e-5, 2e-5, False),  # LLaVA-1.5: CLIP at a fixed size, 1-D positions, causal image tokens
])
def test_packed_grpo_equals_trl_with_an_image(tmp_path, name, rtol, grad_top, whole_groups):
    """Each group's image goes through the vision tower and the language model once (TRL: G times), its mRoPE
    positions placed along every path; log-probs, losses and gradients (vision tower included) equal TRL's.

    SGD, so that step 2 compares gradients and not AdamW's amplified round-off: with AdamW, step 1 is within
    1.1e-6 of the largest gradient on every family, step 2 within 7.8e-6 (Qwen2-VL), 2.0e-6 (Qwen2.5-VL),
    8.5e-5 (Qwen3-VL), 2.1e-5 (Qwen3.5) (see test_packed_grpo_equals_trl_with_shared_turns_on_qwen35).

    Completions of 1..4 tokens (8 before: the same trees and code paths; each padded completion position costs
    TRL a 151,936-wide log-softmax, most of the test's time)."""
    model_dir = vl_model_dir(tmp_path, name)
    profile = vl_profile(name)
    moe = {"router_aux_loss_coef": 0.0} if name.endswith("moe") else {}  # the aux loss is refused (docstring)
    results = []
    for cls in (RecordingGRPO, RecordingPackedGRPO):
        trainer = cls(model_dir, reward_funcs=completion_length_reward,
                      train_dataset=image_prompts(profile.patch_size * getattr(profile, "merge_size", 2)),
                      args=grpo_config(tmp_path / cls.__name__, max_steps=2, optim="sgd", max_completion_length=4,
                                       steps_per_generation=1 if whole_groups else None, **moe),
                      processing_class=vl_processor(name),
                      rollout_func=image_rollout)
        trainer.recorded = []
        rec = StepRecorder()
        trainer.add_callback(rec)
        rows: dict[str, list[int]] = {"policy": [], "reference": []}  # patch rows of each vision-tower call
        for key, model in (("policy", trainer.model), ("reference", trainer.ref_model)):
            tower = getattr(model.model, "visual", None) or model.model.vision_tower
            tower.register_forward_hook(lambda m, args, kw, out, r=rows[key]: r.append(
                (args[0] if args else kw["pixel_values"]).shape[0]), with_kwargs=True)
        trainer.train()
        results.append((trainer, rec, rows))
    (want, want_rec, want_rows), (got, got_rec, got_rows) = results
    # The reference forward runs over the whole generation batch (TRL: in chunks of a micro-batch): each group
    # whole, its image once (TRL: G times). The policy forwards run per micro-batch, which TRL fills from the
    # generation batch shuffled, so a group's completions spread over the micro-batches and a tree holds those
    # that meet in one. Measured: reference 960 -> 240 patch rows, policy 960 -> 464. With steps_per_generation=1
    # each micro-batch is a generation batch of its own, not split: policy 960 -> 240 too.
    assert sum(got_rows["reference"]) * G == sum(want_rows["reference"])
    assert len(got_rows["policy"]) == len(want_rows["policy"]) == 4
    if whole_groups:
        assert sum(got_rows["policy"]) * G == sum(want_rows["policy"])
    assert all(g < w for g, w in zip(got_rows["policy"], want_rows["policy"], strict=True))
    print(name, "patch rows through the vision tower, TRL -> packed:", want_rows, got_rows)
    assert len(got.recorded) == len(want.recorded) > 0
    for (g, _), (w, _) in zip(got.recorded, want.recorded, strict=True):
        torch.testing.assert_close(g, w, rtol=rtol, atol=1e-5)
    assert logged_losses(got) == pytest.approx(logged_losses(want), rel=rtol, abs=1e-6)
    assert len(got_rec.grads) == len(want_rec.grads) == 2
    for g, w in zip(got_rec.grads, want_rec.grads, strict=True):
        assert any(n.startswith(("model.visual", "model.vision_tower")) for n in g)  # the vision tower trains too
        worst = assert_grads_close(g, w, rtol=1e-3)
        print(name, "worst gradient difference / largest gradient:", worst)
        assert worst < grad_top
