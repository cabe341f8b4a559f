"""GRPO's policy log-prob pass: TRL 1.16's padded path against PackedGRPOTrainer's group trees (docs/benchmarks.md).

For each group size G and prompt:completion shape it builds one optimizer micro-batch as TRL lays it out (each
prompt repeated G times, left-padded prompts, right-padded completions whose lengths vary), then reports

- tokens computed per step: TRL's padded B x (P + C), and the packed rows' tokens (each prompt once per group);
- CPU time of one forward + backward of the per-token log-probs (``_get_per_token_logps_and_entropies``, the
  call TRL's loss makes), TRL's own method on a model with TRL's fused LM head, and PackedGRPOTrainer's on a
  model with packer's attention (the same weights), min over ``--repeats``, interleaved per row, 1 torch thread.

The "VLM 1500+100:300" shape runs its 1500 image-like prompt tokens as text through the Llama (no vision tower);
``--vlm`` adds "Qwen2-VL real" rows on the real path: a random-weight Qwen2-VL (the same text sizes, a 1-block vision
tower of width 32) with a real 1500-token image (grid 1 x 60 x 100, 6,000 patches) in each prompt, TRL's inputs as
its ``_generate_and_score_completions`` hands them over (``pixel_values`` once per completion, ``image_grid_thw``,
``num_images``, ``mm_token_type_ids``), so TRL's vision tower runs G times per group and packer's once.
``--vlm qwen2.5-vl qwen3-vl qwen3.5 glm-4.6v`` picks the families (each its packer proof's tiny model: Qwen2.5-VL
at the Llama's text sizes, Qwen3-VL and Qwen3.5 at hidden 32, GLM-4.6V at 64; the same image grid). The
"multi-turn" shape: completions of a group share a first turn and tool result (200 tokens) before their own 20-100%
of 400, which the radix trie computes once.

    nice -n 10 .venv/bin/python scripts/bench_grpo.py            # the table in docs/benchmarks.md
    nice -n 10 .venv/bin/python scripts/bench_grpo.py --vlm --only multi Qwen2-VL --groups 4 8 --repeats 2
    nice -n 10 .venv/bin/python scripts/bench_grpo.py --vlm qwen2.5-vl qwen3-vl qwen3.5 --only Qwen --groups 4
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

SHAPES = {"math 300:600": (300, 600), "VLM 1500+100:300": (1600, 300), "multi-turn 300:200+400": (300, 600)}
SHARED = {"multi-turn 300:200+400": 200}  # tokens a group's completions share after the prompt
IMAGE_GRID = (1, 60, 100)  # 6,000 patches, 1,500 tokens after Qwen2-VL's 2 x 2 merge
VLM_NAMES = {"qwen2-vl": "Qwen2-VL", "qwen2.5-vl": "Qwen2.5-VL", "qwen3-vl": "Qwen3-VL", "qwen3.5": "Qwen3.5",
             "glm-4.6v": "GLM-4.6V"}
IMAGE_TOKEN, VISION_START, VISION_END, VIDEO_TOKEN = 8000, 8001, 8002, 8003


def batch(prompts: int, G: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0, shared: int = 0,
          image: bool = False):
    """TRL's (B, P + C) ids and mask: prompt lengths within 80-100% of ``prompt_len`` (left-padded), completion
    lengths uniform in [20%, 100%] of ``completion_len`` (right-padded, as EOS ends them); the first ``shared``
    completion tokens the same within a group; ``image``: the prompt opens with one Qwen2-VL image (1,500 tokens)."""
    rng = np.random.default_rng(seed)
    p_lens = rng.integers(int(0.8 * prompt_len), prompt_len + 1, prompts)
    if image:  # the image (1,502 tokens with its start and end) before 80-100% of prompt_len text tokens
        p_lens = p_lens + IMAGE_GRID[0] * IMAGE_GRID[1] * IMAGE_GRID[2] // 4 + 2
    c_lens = shared + rng.integers(int(0.2 * (completion_len - shared)), completion_len - shared + 1, prompts * G)
    P, C = int(p_lens.max()), int(c_lens.max())
    ids = torch.zeros(prompts * G, P + C, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(prompts):
        prompt = torch.from_numpy(rng.integers(1, IMAGE_TOKEN, p_lens[i]))
        if image:
            n = IMAGE_GRID[0] * IMAGE_GRID[1] * IMAGE_GRID[2] // 4
            prompt[:n + 2] = torch.tensor([VISION_START] + [IMAGE_TOKEN] * n + [VISION_END])
        turn = torch.from_numpy(rng.integers(1, IMAGE_TOKEN, shared))
        for g in range(G):
            b = i * G + g
            ids[b, P - p_lens[i]:P] = prompt
            mask[b, P - p_lens[i]:P] = 1
            ids[b, P:P + c_lens[b]] = torch.from_numpy(rng.integers(1, IMAGE_TOKEN, c_lens[b]))
            ids[b, P:P + shared] = turn
            mask[b, P:P + c_lens[b]] = 1
    return ids, mask, C


def image_inputs(ids: torch.Tensor, P: int, patch: int = 14) -> dict:
    """TRL's media inputs of a batch whose every prompt holds one image: pixels once per completion."""
    patches = IMAGE_GRID[0] * IMAGE_GRID[1] * IMAGE_GRID[2]
    pixels = torch.randn(patches, 3 * 2 * patch * patch, generator=torch.Generator().manual_seed(0))
    B = ids.shape[0]
    mm = torch.zeros_like(ids)
    mm[:, :P] = (ids[:, :P] == IMAGE_TOKEN).long()
    return {"pixel_values": pixels.repeat(B, 1), "image_grid_thw": torch.tensor([IMAGE_GRID] * B),
            "num_images": [1] * B, "mm_token_type_ids": mm}


def step_time(fn, model, ids, mask, C, repeats: int, **media) -> float:
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.process_time()  # CPU seconds of this process (1 torch thread): what load moves least
        logps, _, _ = fn(model, ids, mask, C, compute_entropy=True, **media)
        (logps.sum()).backward()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16], help="G, completions per prompt")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (groups) per micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's load moves it least)")
    ap.add_argument("--no-time", action="store_true", help="token counts only")
    ap.add_argument("--vlm", nargs="*", default=None, choices=sorted(VLM_NAMES), metavar="FAMILY",
                    help=f"also real VLM rows, vision tower included (no FAMILY: qwen2-vl; any of {sorted(VLM_NAMES)})")
    ap.add_argument("--only", nargs="+", default=None, help="shapes whose name starts with one of these")
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

    print(f"{'shape':28} {'G':>3} {'B':>4} {'padded tok':>10} {'packed tok':>10} {'ratio':>6} "
          f"{'TRL s':>7} {'packed s':>8} {'speedup':>7}")
    shapes = [(name, p, c, padded_model, packed_model) for name, (p, c) in SHAPES.items()]
    patch = {}
    for family in ([] if args.vlm is None else args.vlm or ["qwen2-vl"]):
        from packer.models import get_profile

        torch.manual_seed(0)
        proof = get_profile(family).proof()
        tokens = {t: IMAGE_TOKEN + i for i, t in enumerate(proof.model_tokens())}  # image, start, end, video ...
        sizes = {"hidden": 128} if family in ("qwen2-vl", "qwen2.5-vl") else {}  # the others: their proofs' sizes
        vlm = proof.tiny_model(token_ids=tokens, vocab_size=config.vocab_size, **sizes)
        vlm_packed = copy.deepcopy(vlm)
        add_fused_lm_head(vlm, outputs=("log_probs", "entropy"))
        use_packed_attention(vlm_packed, "auto")
        name = f"{VLM_NAMES[family]} real 1500+100:300"
        patch[name] = get_profile(family).patch_size
        shapes.append((name, 100, 300, vlm, vlm_packed))
    for name, p_len, c_len, padded_m, packed_m in shapes:
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        for G in args.groups:
            image = name in patch
            ids, mask, C = batch(args.prompts, G, p_len, c_len, config.vocab_size, shared=SHARED.get(name, 0),
                                 image=image)
            media = image_inputs(ids, ids.shape[1] - C, patch[name]) if image else {}
            padded_tokens = ids.numel()
            packed_tokens = sum(t.num_tokens for r in pack_trees(group_trees(ids, mask, C, ids.numel()), ids.numel())
                                for t in r)
            t_trl = t_packed = float("nan")
            if not args.no_time:
                t_trl = step_time(trl_fn, padded_m, ids, mask, C, args.repeats, **media)
                t_packed = step_time(packed_fn, packed_m, ids, mask, C, args.repeats, **media)
            print(f"{name:28} {G:>3} {ids.shape[0]:>4} {padded_tokens:>10} {packed_tokens:>10} "
                  f"{padded_tokens / packed_tokens:>6.2f} {t_trl:>7.2f} {t_packed:>8.2f} {t_trl / t_packed:>7.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
