#!/usr/bin/env python
"""Train a tiny HF model on packer shards with transformers' Trainer.

    python scripts/train_hf_trainer.py --data demo_out/caption_trees --steps 10            # packer loss (trees)
    python scripts/train_hf_trainer.py --data text_shards --steps 10 --loss model          # linear packs only

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
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_equivalence import tiny_model  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from packer.train.collate import collate  # noqa: E402
from packer.train.dataset import PackedDataset  # noqa: E402
from packer.train.hf import LAYOUT_KWARG, model_inputs, use_packed_attention  # noqa: E402
from packer.train.loss import logits_to_keep, packed_cross_entropy  # noqa: E402


class PackedCollator:
    """Shard rows -> model kwargs (+ labels). ``with_model_loss`` keeps shift_labels for the model's own loss."""

    def __init__(self, *, with_model_loss: bool = False):
        self.with_model_loss = with_model_loss

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(rows)
        if self.with_model_loss:
            return model_inputs(batch, with_labels=True)
        return {**model_inputs(batch), "labels": batch["labels"]}


class PackedTrainer(Trainer):
    """Trainer whose loss is packer's exact packed (tree) cross-entropy, normalized over the whole step."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Make the Trainer count the step's loss tokens (all micro-batches, all ranks) and pass them to
        # compute_loss; the loss returned is then already normalized for gradient accumulation.
        self.model_accepts_loss_kwargs = True
        self.loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        layout = inputs[LAYOUT_KWARG]
        keep = logits_to_keep(labels, layout).to(labels.device)
        outputs = model(**inputs, logits_to_keep=keep)
        out = packed_cross_entropy(outputs.logits, labels, layout, logits_index=keep)
        if num_items_in_batch is None:  # evaluation: this batch's own token mean
            return (out.loss / out.count, outputs) if return_outputs else out.loss / out.count
        loss = out.loss / num_items_in_batch
        if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
            loss = loss * self.accelerator.num_processes  # the count is global; DDP averages gradients over ranks
        return (loss, outputs) if return_outputs else loss


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
    use_packed_attention(model, args.backend)
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
            remove_unused_columns=False,  # rows carry cu_seqlens/node_* that the model signature does not name
            use_cpu=not torch.cuda.is_available(),
            dataloader_num_workers=0,
            # accelerate would otherwise fetch the batch once and slice every tensor's dim 0 to the per-device
            # batch size: a (4, 1, T) mRoPE position tensor and the (patches, C) pixel_values do not split so.
            accelerator_config={"dispatch_batches": False},
        )
        trainer_cls = PackedTrainer if args.loss == "packer" else Trainer
        trainer = trainer_cls(
            model=model,
            args=training_args,
            train_dataset=dataset,
            data_collator=PackedCollator(with_model_loss=args.loss == "model"),
        )
        result = trainer.train()
    print(f"{args.loss} loss: final train_loss {result.training_loss:.4f} over {result.global_step} steps, "
          f"{result.metrics.get('train_samples_per_second', 0):.2f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
