"""GRPO's policy log-prob pass: TRL 1.16's padded path against PackedGRPOTrainer's group trees (docs/benchmarks.md).

For each group size G and prompt:completion shape it builds one optimizer micro-batch as TRL lays it out (each
prompt repeated G times, left-padded prompts, right-padded completions whose lengths vary), then reports

- tokens computed per step: TRL's padded B x (P + C), and the packed rows' tokens (each prompt once per group);
- CPU time of one forward + backward of the per-token log-probs (``_get_per_token_logps_and_entropies``, the
  call TRL's loss makes), TRL's own method on a model with TRL's fused LM head, and PackedGRPOTrainer's on a
  model with packer's attention (the same weights), min over ``--repeats``, interleaved per row, 1 torch thread.

The VLM shape's prompt is 1500 image-like + 100 text tokens; the language model computes image tokens like text
tokens, so the CPU figure runs them as text (the vision tower, once per image in both paths' inputs, is left out).

    nice -n 10 .venv/bin/python scripts/bench_grpo.py            # the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import copy
import time
from types import SimpleNamespace

import numpy as np
import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from packer.train.attention.hf import use_packed_attention
from packer.train.trainers.grpo import PackedGRPOTrainer, group_trees, pack_trees

SHAPES = {"math 300:600": (300, 600), "VLM 1500+100:300": (1600, 300)}


def batch(prompts: int, G: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0):
    """TRL's (B, P + C) ids and mask: prompt lengths within 80-100% of ``prompt_len`` (left-padded), completion
    lengths uniform in [20%, 100%] of ``completion_len`` (right-padded, as EOS ends them)."""
    rng = np.random.default_rng(seed)
    p_lens = rng.integers(int(0.8 * prompt_len), prompt_len + 1, prompts)
    c_lens = rng.integers(int(0.2 * completion_len), completion_len + 1, prompts * G)
    P, C = int(p_lens.max()), int(c_lens.max())
    ids = torch.zeros(prompts * G, P + C, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(prompts):
        prompt = torch.from_numpy(rng.integers(1, vocab, p_lens[i]))
        for g in range(G):
            b = i * G + g
            ids[b, P - p_lens[i]:P] = prompt
            mask[b, P - p_lens[i]:P] = 1
            ids[b, P:P + c_lens[b]] = torch.from_numpy(rng.integers(1, vocab, c_lens[b]))
            mask[b, P:P + c_lens[b]] = 1
    return ids, mask, C


def step_time(fn, model, ids, mask, C, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logps, _, _ = fn(model, ids, mask, C, compute_entropy=True)
        (logps.sum()).backward()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16], help="G, completions per prompt")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (groups) per micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's load moves it least)")
    ap.add_argument("--no-time", action="store_true", help="token counts only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    padded_model = LlamaForCausalLM(config).float()
    packed_model = copy.deepcopy(padded_model)
    add_fused_lm_head(padded_model, outputs=("log_probs", "entropy"))
    use_packed_attention(packed_model, "auto")
    trl = SimpleNamespace(accelerator=Accelerator(cpu=True))
    packed = SimpleNamespace(accelerator=trl.accelerator, temperature=1.0, packer_max_tokens=None)

    def trl_fn(*a, **k):
        return GRPOTrainer._get_per_token_logps_and_entropies(trl, *a, **k)

    def packed_fn(*a, **k):
        return PackedGRPOTrainer._get_per_token_logps_and_entropies(packed, *a, **k)

    print(f"{'shape':18} {'G':>3} {'B':>4} {'padded tok':>10} {'packed tok':>10} {'ratio':>6} "
          f"{'TRL s':>7} {'packed s':>8} {'speedup':>7}")
    for name, (p_len, c_len) in SHAPES.items():
        for G in args.groups:
            ids, mask, C = batch(args.prompts, G, p_len, c_len, config.vocab_size)
            padded_tokens = ids.numel()
            packed_tokens = sum(t.num_tokens for r in pack_trees(group_trees(ids, mask, C, ids.numel()), ids.numel())
                                for t in r)
            t_trl = t_packed = float("nan")
            if not args.no_time:
                t_trl = step_time(trl_fn, padded_model, ids, mask, C, args.repeats)
                t_packed = step_time(packed_fn, packed_model, ids, mask, C, args.repeats)
            print(f"{name:18} {G:>3} {ids.shape[0]:>4} {padded_tokens:>10} {packed_tokens:>10} "
                  f"{padded_tokens / packed_tokens:>6.2f} {t_trl:>7.2f} {t_packed:>8.2f} {t_trl / t_packed:>7.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
