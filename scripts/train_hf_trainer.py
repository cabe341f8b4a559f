#!/usr/bin/env python
"""Train a tiny HF model on packer shards with transformers' Trainer.

    python scripts/train_hf_trainer.py --data demo_out/caption_trees --steps 10            # packer loss (trees)
    python scripts/train_hf_trainer.py --data text_shards --steps 10 --loss model          # linear packs only

``PackedTrainer`` is ``packer.train.trainers.trainer.PackedTrainer`` (docs/training.md, "Trainers"): each rank reads its own
``PackedDataset`` share (equal steps, fillers), exact for any gradient accumulation and number of ranks
(tests/train/trainers/test_multiprocess.py runs it under torchrun and accelerate launch).

``--loss packer`` (default, any shards): ``PackedTrainer.compute_loss`` runs the model with
``logits_to_keep`` (only the rows the loss reads) and ``packed_cross_entropy``, divided by the Trainer's
``num_items_in_batch``: the loss tokens of the whole optimizer step, gathered over ranks when
``average_tokens_across_devices`` is on. That count is labels[..., 1:] != -100, which is exactly the packed
loss-token count (every example's first label is -100), trees included.

``--loss model`` (linear packs only): the stock Trainer and the model's own loss; the collate's
``shift_labels`` make it exact (no prediction across example boundaries). The token mean spans the whole
step when the Trainer sees the model accept loss kwargs (a ``**kwargs`` forward: Llama, Qwen2 and
Qwen2VLForConditionalGeneration do); otherwise it is the mean of micro-batch means.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_equivalence import tiny_model  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from packer.train.data.dataset import PackedDataset  # noqa: E402
from packer.train.trainers.trainer import PackedTrainer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a finished `packer build` output directory")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1, help="packed rows per micro-batch")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--loss", choices=("packer", "model"), default="packer")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--output", help="Trainer output_dir (default: a temporary directory)")
    args = parser.parse_args(argv)

    dataset = PackedDataset(args.data, shuffle=True, seed=0)
    model = tiny_model(dataset.profile, tokenizer=dataset.shards.manifest.config.tokenizer, hidden=args.hidden)
    with tempfile.TemporaryDirectory() as tmp:
        training_args = TrainingArguments(
            output_dir=args.output or tmp,
            max_steps=args.steps,
            per_device_train_batch_size=args.rows,
            gradient_accumulation_steps=args.grad_accum,
            learning_rate=args.lr,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            dataloader_num_workers=0,
            # PackedTrainer sets remove_unused_columns=False (rows carry cu_seqlens / node_*) and
            # accelerator_config.dispatch_batches=False (each rank fetches its own batches: accelerate would otherwise
            # slice every tensor's first dimension, cutting (4, 1, T) mRoPE positions and the (patches, C) pixels).
        )
        # PackedDataset is read per rank (rank, world_size from the Trainer), not re-sharded by accelerate.
        trainer = PackedTrainer(model=model, args=training_args, train_dataset=dataset, loss=args.loss,
                                backend=args.backend)
        result = trainer.train()
    print(f"{args.loss} loss: final train_loss {result.training_loss:.4f} over {result.global_step} steps, "
          f"{result.metrics.get('train_samples_per_second', 0):.2f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
