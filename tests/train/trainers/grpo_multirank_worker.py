"""One rank of tests/train/trainers/test_grpo.py's 2-rank proof (``torchrun --nproc_per_node 2``, gloo on CPU): TRL's
GRPOTrainer and PackedGRPOTrainer on the same rollouts, each over both ranks; rank 0 saves both runs' per-step
gradients (after DDP's all-reduce) and logged losses."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from tests.train.trainer_helpers import logged_losses
from tests.train.trainers.test_grpo import RecordingGRPO, RecordingPackedGRPO, run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    result = {}
    for name, cls in (("trl", RecordingGRPO), ("packer", RecordingPackedGRPO)):
        trainer, rec = run(cls, args.model, out / name)
        result[name] = {"grads": rec.grads, "losses": logged_losses(trainer),
                        "world": trainer.accelerator.num_processes}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save({k: v["grads"] for k, v in result.items()}, out / "grads.pt")
        (out / "record.json").write_text(json.dumps({k: {"losses": v["losses"], "world": v["world"]}
                                                     for k, v in result.items()}))


if __name__ == "__main__":
    main()
