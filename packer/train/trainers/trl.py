"""TRL on packer's rows: the rows TRL cannot train exactly on its own, trained exactly inside TRL's trainers.

TRL 1.16's ``SFTTrainer(model, train_dataset=load_dataset(OUT)["train"], args=SFTConfig(padding_free=True,
max_length=None))`` is exact on its own for a build whose rows are linear text (the card's view has no media
columns, and the shards' ``seq_lengths`` column is what TRL's padding-free collator rebuilds positions and
``cu_seq_lens`` from). Everything else goes through one of these, documented in docs/training.md ("Trainers"):

- ``PackedSFTTrainer``: ``SFTTrainer`` with ``PackedCollator`` (packer's positions, mRoPE rows, images through
  the family's reader, bidirectional spans in ``packer_layout``), ``use_packed_attention`` and packer's tree
  loss (``loss="packer"``, the default) or TRL's own fused loss on ``shift_labels`` (``loss="model"``: linear rows).
- ``PackedDPOTrainer``: ``DPOTrainer`` on preference trees (the prompt once, chosen and rejected as its two
  branches): one policy and one reference forward per packed batch, ``sequence_logps`` per branch, TRL's sigmoid
  DPO loss, averaged over the step's pairs on every micro-batch and rank.

Both take ``train_dataset`` as ``load_dataset(OUT)["train"]`` (TRL's own map-style data path), or as a packer
output path / ``PackedDataset``: then every rank reads ``PackedDataset(OUT, rank, world_size)`` (equal steps,
filler rows without loss) and TRL's constructor, which accepts only ``datasets`` types, is shown a one-row probe
of the build's columns.

TRL's ``SFTConfig``/``DPOConfig`` default to ``bf16=True``: pass ``bf16=False`` for fp32 training (the proofs in
tests/train/trainers/test_trl.py do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from trl import DPOTrainer, SFTTrainer

from packer.errors import ConfigError
from packer.train.attention.hf import use_packed_attention
from packer.train.data.dataset import PackedDataset
from packer.train.keys import FILLER_KWARG, LAYOUT_KWARG
from packer.train.options import Backend, Loss, Prefix, Weighting
from packer.train.trainers.grpo import PackedGRPOTrainer  # noqa: F401  (reached as packer.train.trl.PackedGRPOTrainer)
from packer.train.trainers.loss import preference_pairs, sequence_logps
from packer.train.trainers.step import global_count, kept_rows, split_batch, step_loss
from packer.train.trainers.trainer import PackedCollator, PackedTrainerMixin, prepare_args


def _data(train_dataset: Any, seed: int) -> tuple[Any, PackedDataset | None, str | Path | None]:
    """(what TRL's constructor sees, the PackedDataset to train from or None, the build's path or None)."""
    if isinstance(train_dataset, (str, Path)):
        train_dataset = PackedDataset(train_dataset, seed=seed)
    if isinstance(train_dataset, PackedDataset):
        return _probe(train_dataset), train_dataset, train_dataset.shards.root
    return _without_empty_media(train_dataset), None, None


def _without_empty_media(data: Any) -> Any:
    """A ``datasets`` view of a build with no image or video (its media columns all empty) without those columns:
    TRL takes any ``images`` column for a vision dataset, which needs a processor."""
    media = [c for c in ("images", "videos") if c in getattr(data, "column_names", ())]
    if media and "num_vision_tokens" in data.column_names and not any(data["num_vision_tokens"]):
        return data.remove_columns(media)
    return data


def _probe(data: PackedDataset) -> Any:
    """A one-row ``datasets.Dataset`` with the build's columns, for TRL's constructor (it reads one sample to tell a
    vision dataset by its ``images`` column, and accepts only ``datasets`` types); training reads ``data``."""
    import datasets

    row = {"input_ids": [[0]], "labels": [[-100]]}
    totals = data.shards.manifest.totals
    if totals is None or totals.vision_tokens:
        row["images"] = [[]]
    return datasets.Dataset.from_dict(row)


def _config(args: Any) -> None:
    """TRL settings packer rows need: no TRL preprocessing (they are tokenized, and truncating would cut a row's
    tokens off its cu_seqlens), no padding-free collator (packer's collator lays the rows out)."""
    args.padding_free = False
    if hasattr(args, "packing"):
        args.packing = False
    args.max_length = None
    args.dataset_kwargs = {**(getattr(args, "dataset_kwargs", None) or {}), "skip_prepare_dataset": True}
    prepare_args(args)


class PackedSFTTrainer(PackedTrainerMixin, SFTTrainer):
    """``trl.SFTTrainer`` on any packer build: trees, images (any family packer reads), mRoPE, bidirectional spans.

        trainer = PackedSFTTrainer(model, args=SFTConfig(output_dir="out", bf16=False),
                                   train_dataset=load_dataset(OUT)["train"], processing_class=processor,
                                   data_collator=PackedCollator(OUT))     # or train_dataset=OUT: exact on W ranks
        trainer.train()

    ``loss``: "packer" (default; ``packed_cross_entropy`` over the step's loss tokens: every row kind) or "model"
    (TRL's own fused loss on ``shift_labels``: linear rows only; a tree is refused). ``backend``: the packer
    attention backend (``use_packed_attention``). ``weighting`` ("token", "example", "sqrt", "branches") and
    ``prefix`` ("once", "path"): the normalization, exact over the step (docs/training.md, "Normalizations").
    ``source_metrics``: log each source's loss, tokens and examples (default: when the build mixes sources).
    """

    def __init__(self, model: Any, args: Any = None, train_dataset: Any = None, *, data_collator: Any = None,
                 loss: Loss = "packer", backend: Backend = "auto", weighting: Weighting = "token",
                 prefix: Prefix = "once",
                 source_metrics: bool | None = None, **kwargs: Any):
        if args is None:
            raise ConfigError("PackedSFTTrainer needs an SFTConfig (args=SFTConfig(output_dir=..., bf16=False))")
        seen, packed, path = _data(train_dataset, args.seed)
        _config(args)
        use_packed_attention(model, backend)
        super().__init__(model, args=args, train_dataset=seen, data_collator=data_collator or PackedCollator(path),
                         **kwargs)
        if packed is not None:
            self.train_dataset = packed
        self._packer_setup(loss, weighting, prefix)
        self._packer_sources_setup(source_metrics, packed if packed is not None else path)

    def _packer_log(self, out: Any) -> None:
        mode = "train" if self.model.training else "eval"
        correct = self.accelerator.gather_for_metrics(out.num_correct.reshape(1)).sum()
        total = self.accelerator.gather_for_metrics(out.num_loss_tokens.reshape(1)).sum()
        self._metrics[mode]["mean_token_accuracy"].append((correct / total.clamp(min=1)).item())


class PackedDPOTrainer(PackedTrainerMixin, DPOTrainer):
    """``trl.DPOTrainer`` on packer's preference trees (docs/format.md: prompt, then chosen, then rejected).

        trainer = PackedDPOTrainer(policy, ref_model=reference, args=DPOConfig(output_dir="out", bf16=False),
                                   train_dataset=load_dataset(OUT)["train"], processing_class=tokenizer)

    The loss is TRL's ``loss_type="sigmoid"`` (``-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))``), with
    ``pi``/``ref`` the summed log-probs of each answer's loss tokens (``sequence_logps``), averaged over the
    pairs of the whole optimizer step (every micro-batch and rank; TRL averages each micro-batch's pairs, which
    is the same when micro-batches hold equally many pairs). Refused with a ConfigError: other loss types,
    ``precompute_ref_log_probs``, ``ld_alpha``, ``use_weighting``, another ``f_divergence_type``.
    """

    def __init__(self, model: Any, ref_model: Any = None, args: Any = None, train_dataset: Any = None, *,
                 data_collator: Any = None, backend: Backend = "auto", **kwargs: Any):
        if args is None:
            raise ConfigError("PackedDPOTrainer needs a DPOConfig (args=DPOConfig(output_dir=..., bf16=False))")
        unsupported = {
            "loss_type": list(args.loss_type) != ["sigmoid"],
            "precompute_ref_log_probs": bool(args.precompute_ref_log_probs),
            "ld_alpha": args.ld_alpha is not None,
            "use_weighting": bool(args.use_weighting),
            "f_divergence_type": str(getattr(args.f_divergence_type, "value", args.f_divergence_type)) != "reverse_kl",
        }
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise ConfigError(f"PackedDPOTrainer computes TRL's sigmoid DPO loss only; unset {', '.join(bad)} "
                              "(or train these variants from sequence_logps yourself)")
        seen, packed, path = _data(train_dataset, args.seed)
        _config(args)
        for m in (model, ref_model):
            if m is not None:
                use_packed_attention(m, backend)
        super().__init__(model, ref_model=ref_model, args=args, train_dataset=seen,
                         data_collator=data_collator or PackedCollator(path), **kwargs)
        if self.ref_model is not None:
            use_packed_attention(self.accelerator.unwrap_model(self.ref_model), backend)
        if packed is not None:
            self.train_dataset = packed
        self._packer_setup("packer")

    def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        return dataset  # packer rows are tokenized preference trees already

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor:
        """The step's preference pairs (every micro-batch; every rank with ``average_tokens_across_devices``):
        the loss is averaged over them."""
        pairs = sum(b[LAYOUT_KWARG].num_examples - int(b[FILLER_KWARG].sum()) if FILLER_KWARG in b
                    else b[LAYOUT_KWARG].num_examples for b in batch_samples)
        return global_count(self, torch.tensor(pairs, device=device))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: D102
        batch = split_batch(inputs)
        keep = kept_rows(batch)
        meta = {"labels": batch.labels, LAYOUT_KWARG: batch.layout}
        if batch.weights is not None:  # a weighted build: each answer token's log-prob times its weight
            meta["loss_weights"] = batch.weights
        outputs = model(**batch.model_inputs, logits_to_keep=keep)
        policy = sequence_logps(outputs.logits, meta, logits_index=keep)
        with torch.no_grad():
            reference = sequence_logps(self.ref_model(**batch.model_inputs, logits_to_keep=keep).logits, meta,
                                       logits_index=keep)
        c, r = preference_pairs(policy)
        chosen = policy.logps[c] - reference.logps[c].to(policy.logps.device)
        rejected = policy.logps[r] - reference.logps[r].to(policy.logps.device)
        losses = -F.logsigmoid(self.beta * (chosen - rejected))  # TRL's "sigmoid", per pair
        real = torch.ones_like(losses, dtype=torch.bool)
        if batch.filler is not None:
            real = ~batch.filler.to(losses.device)[policy.examples[c]]
        losses = losses[real]
        loss = step_loss(self, losses.sum(), num_items_in_batch, real.sum().clamp(min=1))
        self._log_pairs(chosen[real].detach(), rejected[real].detach(), policy, c[real], r[real])
        return (loss, outputs) if return_outputs else loss

    def _log_pairs(self, chosen, rejected, policy, c, r) -> None:
        mode = "train" if self.model.training else "eval"
        m = self._metrics[mode]
        cr, rr = self.accelerator.gather(self.beta * chosen), self.accelerator.gather(self.beta * rejected)
        if cr.numel():
            m["rewards/chosen"].append(cr.mean().item())
            m["rewards/rejected"].append(rr.mean().item())
            m["rewards/accuracies"].append((cr > rr).float().mean().item())
            m["rewards/margins"].append((cr - rr).mean().item())
            m["logps/chosen"].append(self.accelerator.gather(policy.logps[c].detach()).mean().item())
            m["logps/rejected"].append(self.accelerator.gather(policy.logps[r].detach()).mean().item())
