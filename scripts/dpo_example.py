#!/usr/bin/env python
"""DPO on packer shards: each preference pair is one tree (prompt computed once, chosen and rejected as two
branches), the policy and a frozen reference run once per packed batch, ``sequence_logps`` sums each branch.

    packer build pairs.jsonl -o pref_out/ --profile text            # {"prompt", "chosen", "rejected"} lines
    python scripts/dpo_example.py --data pref_out --steps 20
    python scripts/dpo_example.py --demo --steps 20                  # builds a small demo set first

The model is a small random-weight Llama from a config (real 151936-token vocabulary), the reference a copy
frozen at step 0, as TRL's DPOTrainer does; sigmoid loss, beta 0.1, AdamW. Prints the mean DPO loss, the
reward accuracy (chosen's implicit reward above rejected's) and the mean reward margin per step; the loss
falls from log 2 = 0.693 as the policy moves away from the reference.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_equivalence import tiny_model  # noqa: E402

from packer.config import BuildConfig  # noqa: E402
from packer.pipeline.build import build  # noqa: E402
from packer.train.attention.hf import model_inputs, use_packed_attention  # noqa: E402
from packer.train.data.collate import collate  # noqa: E402
from packer.train.data.dataset import PackedDataset  # noqa: E402
from packer.train.trainers.loss import dpo_loss, sequence_logps  # noqa: E402


def demo_shards(root: Path) -> Path:
    """A few hundred synthetic pairs: the chosen answer gets the arithmetic right."""
    lines = []
    for i in range(300):
        x, y = i % 17, i % 5
        lines.append({"prompt": [{"role": "user", "content": f"What is {x} + {y}?"}],
                      "chosen": [{"role": "assistant", "content": f"{x + y}."}],
                      "rejected": [{"role": "assistant", "content": f"{x + y + 1 + i % 3}, I think."}]})
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    build(BuildConfig.from_inputs([str(data)], str(root / "out"), profile="text", max_length=512), progress=False)
    return root / "out"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="a packer build of preference records")
    ap.add_argument("--demo", action="store_true", help="build a small synthetic preference set first")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=2, help="packed rows per batch")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    data = Path(args.data) if args.data else demo_shards(Path(tempfile.mkdtemp(prefix="packer-dpo-")))
    torch.manual_seed(0)
    policy = tiny_model("text", model_class="LlamaForCausalLM", hidden=64)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)  # frozen at step 0
    for m in (policy, reference):
        use_packed_attention(m)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    loader = torch.utils.data.DataLoader(PackedDataset(data, seed=0), batch_size=args.rows, collate_fn=collate)
    step = 0
    while step < args.steps:
        for batch in loader:
            inputs = model_inputs(batch)
            with torch.no_grad():
                ref = sequence_logps(reference(**inputs).logits, batch)
            losses, margins = dpo_loss(sequence_logps(policy(**inputs).logits, batch), ref, beta=args.beta)
            loss = losses.mean()  # one mean over this batch's pairs
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            print(f"step {step:3d}  pairs {losses.numel():3d}  dpo loss {loss.item():.4f}  "
                  f"reward acc {(margins > 0).float().mean().item():.2f}  margin {margins.mean().item():+.4f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
