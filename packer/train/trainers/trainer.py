"""transformers' ``Trainer`` on packer's rows, exact across micro-batches and ranks.

Two pieces, used by ``PackedTrainer`` here and by the TRL trainers of ``packer.train.trainers.trl``:

- ``PackedCollator``: rows, either ``PackedDataset``'s (numpy) or ``datasets.load_dataset(OUT)["train"]``'s
  (lists), to a batch the model takes as it is (``model_inputs``: tokens, positions, images, ``packer_layout``)
  plus ``labels`` (and ``shift_labels`` for linear rows, which make a model's own shifted loss exact). It checks
  what a trainer may have done to the rows on the way (a column removed by ``remove_unused_columns``, a row
  truncated by TRL's ``max_length``) and says what to set instead.
- ``PackedTrainerMixin``: a ``PackedDataset`` train set is read as ``PackedDataset(path, rank, world_size)`` on
  every rank (equal steps, filler rows without loss, cost-balanced steps), not re-sharded by accelerate: its
  ``IterableDatasetShard`` would split each rank's share again, and complete an epoch's last batch with copies of
  real rows, which would then count twice (transformers does the same for its own rank-aware
  ``BatchRebalanceSampler``). The loss is the step's token mean over every micro-batch and rank: packer's
  ``packed_cross_entropy`` (trees too) divided by the Trainer's ``num_items_in_batch``, or with ``loss="model"``
  the model's own loss (linear rows), which the Trainer divides the same way.

Why the Trainer's count is packer's count: transformers counts ``shift_labels != -100`` (or ``labels[..., 1:]``)
over the step's micro-batches and, with ``average_tokens_across_devices`` (the default), sums it over ranks. Every
example's first label is -100, so that is exactly the number of loss tokens, trees included. The Trainer then
skips its own division by the accumulation steps (``model_accepts_loss_kwargs``), and DDP's gradient average over
W ranks is undone by multiplying the loss by W, as transformers does for a model's own loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from transformers import Trainer

from packer.errors import ConfigError, ShardError
from packer.shards.mrope import dense_row
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.data.collate import collate, steps_per_epoch
from packer.train.data.dataset import PackedDataset
from packer.train.keys import EXAMPLES_KWARG, FILLER_KWARG, LAYOUT_KWARG, SOURCES_KWARG, WEIGHTS_KWARG
from packer.train.options import Backend, Loss, Prefix, Weighting, check
from packer.train.trainers.loss import loss_count, packed_cross_entropy
from packer.train.trainers.metrics import SourceMetrics, SourceMetricsCallback, build_sources
from packer.train.trainers.step import global_count, kept_rows, split_batch, step_loss

_INT_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "node_offsets", "node_parents")
_NEEDED = (*_INT_COLUMNS, "example_ids")


class PackedCollator:
    """A trainer's ``data_collator`` for packer rows: ``collate`` + ``model_inputs`` + the labels.

        collator = PackedCollator("my_shards/")       # the build's profile reads its images (any family)
        collator = PackedCollator()                    # text builds: nothing to read from the manifest

    Args:
        path: the build (directory or URL) whose manifest names the profile that turns its images and videos into
            pixels; only needed for rows with media. ``PackedDataset`` rows carry it already.
        load_images: decode images (False: metadata only, as ``PackedDataset(load_images=False)``).
        storage_options: fsspec options for an object-store ``path``.
    """

    def __init__(self, path: str | Path | None = None, *, load_images: bool = True,
                 storage_options: dict[str, Any] | None = None):
        self.context: dict[str, Any] | None = None
        self.path = path
        if path is not None:
            from packer.shards.io import open_shards

            manifest = open_shards(path, storage_options=storage_options).manifest
            self.context = {"profile": manifest.profile, "profile_options": manifest.config.profile_overrides(),
                            "load_images": load_images}

    def __call__(self, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
        batch = collate([self.row(r) for r in rows])
        out = model_inputs(batch)
        out["labels"] = batch["labels"]
        if "shift_labels" in batch:
            out["shift_labels"] = batch["shift_labels"]
        if batch["num_filler_rows"]:  # PackedDataset's equal shares: their labels are -100 already
            out[FILLER_KWARG] = batch["filler_examples"]
        out[EXAMPLES_KWARG] = batch["example_ids"]
        if "loss_weights" in batch:
            out[WEIGHTS_KWARG] = batch["loss_weights"]
        if "example_sources" in batch:
            out[SOURCES_KWARG] = batch["example_sources"]
        return out

    def row(self, r: Mapping[str, Any]) -> dict[str, Any]:
        """One row as ``collate`` takes it: ``PackedDataset``'s rows as they are; a ``datasets`` row (lists, flat
        mRoPE) as numpy arrays, with this collator's profile; ConfigError / ShardError when a trainer removed a
        column or truncated the row."""
        missing = [k for k in _NEEDED if k not in r]
        if missing:
            raise ConfigError(
                f"a packer row reached the collator without {missing}: the trainer removed the columns its model "
                "signature does not name; set remove_unused_columns=False in the training arguments"
            )
        if isinstance(r["input_ids"], np.ndarray):
            return dict(r)  # PackedDataset's row
        row: dict[str, Any] = {k: np.asarray(r[k], dtype=np.int32) for k in _INT_COLUMNS}
        mrope = r.get("mrope_position_ids")
        if mrope is None and r.get("mrope_runs") is not None:  # a v6 row as ``datasets`` reads it: stored sparse
            mrope = dense_row(r["mrope_runs"], r["mrope_bases"], r["mrope_rest"])
        if mrope is not None:
            # as stored (float32 since schema v5, int32 before): never cast to int here (collate checks and casts)
            row["mrope_position_ids"] = np.asarray(mrope).reshape(-1, 3).T  # (3, T)
        row["images"], row["videos"] = list(r.get("images") or []), list(r.get("videos") or [])
        row["audios"] = list(r.get("audios") or [])
        row["example_ids"] = list(r["example_ids"])
        if r.get("example_sources") is not None:
            row["example_sources"] = list(r["example_sources"])
        if r.get("loss_weights") is not None:
            row["loss_weights"] = np.asarray(r["loss_weights"], dtype=np.float32)
        T = len(row["input_ids"])
        cu = row["cu_seqlens"]
        if len(row["labels"]) != T or len(cu) < 2 or cu[-1] != T or len(row["position_ids"]) != T:
            raise ShardError(
                f"a packer row holds {T} tokens but its cu_seqlens end at {cu[-1] if len(cu) else None}: it was cut "
                "after the build (TRL truncates input_ids and labels to max_length); pass max_length=None and "
                "dataset_kwargs={'skip_prepare_dataset': True} (packer.train.trainers.trl does), packs are already "
                "within the build's --max-length"
            )
        if self.context is not None:
            row.update(self.context)
        elif row["images"] or row["videos"] or row["audios"]:
            raise ConfigError("rows with images, videos or audio need the build's profile: PackedCollator(OUT)")
        return row


def _no_reshard(dataloader: Any) -> None:
    """Make accelerate's ``IterableDatasetShard`` around a rank's own ``PackedDataset`` pass it through: one
    process, batches of one (so it never completes a last batch with copies of real rows)."""
    shard = getattr(dataloader, "dataset", None)
    if shard is not None and type(shard).__name__ == "IterableDatasetShard":
        shard.num_processes, shard.process_index, shard.batch_size, shard.split_batches = 1, 0, 1, False


class PackedTrainerMixin:
    """Give a transformers ``Trainer`` (or a TRL trainer) packer's data path and exact step-wide loss.

    ``packer_loss``: "packer" (``packed_cross_entropy``: any rows, trees too) or "model" (the model's own loss
    on ``shift_labels``: linear rows only; a tree row is refused by ``use_packed_attention``'s hook).
    ``packer_weighting`` / ``packer_prefix``: the normalization (``packer.train.trainers.loss``: "token", "example", "sqrt",
    "branches"; a tree's shared prefix "once" or per "path"), exact over the step: ``num_items_in_batch`` is the
    step's ``loss_count`` summed over its micro-batches and ranks.
    """

    packer_loss: Loss = "packer"
    packer_weighting: Weighting = "token"
    packer_prefix: Prefix = "once"
    packer_sources: SourceMetrics | None = None

    def _packer_sources_setup(self, enabled: bool | None, data: Any) -> None:
        """Install ``SourceMetricsCallback`` (first, so reporting integrations see its keys) for a build with more
        than one source, or wherever ``enabled``; the build is ``data``'s (a PackedDataset or path) or the
        collator's."""
        path = data.shards.root if isinstance(data, PackedDataset) else data if isinstance(data, (str, Path)) \
            else getattr(self.data_collator, "path", None)
        names = build_sources(path) if path is not None else None
        if enabled is None:
            enabled = names is not None and len(names) > 1
        if not enabled:
            return
        if names is None:
            raise ConfigError("source_metrics=True needs the build: train_dataset=PackedDataset(OUT) or OUT, or "
                              "data_collator=PackedCollator(OUT)")
        if self.packer_loss == "model":
            raise ConfigError("source_metrics need packer's loss (loss='packer')")
        self.packer_sources = SourceMetrics(names)
        self.callback_handler.callbacks.insert(0, SourceMetricsCallback(self.packer_sources))

    def _packer_setup(self, loss: Loss, weighting: Weighting = "token", prefix: Prefix = "once") -> None:
        check("loss", loss, Loss)
        check("weighting", weighting, Weighting)
        check("prefix", prefix, Prefix)
        if loss == "model" and (weighting, prefix) != ("token", "once"):
            raise ConfigError(f"weighting={weighting!r}, prefix={prefix!r} need packer's loss (loss='packer'); the "
                              "model's own loss is the plain token mean")
        self.packer_loss, self.packer_weighting, self.packer_prefix = loss, weighting, prefix
        # The Trainer counts the step's loss tokens (every micro-batch, every rank) only for a model that takes
        # loss kwargs, and then leaves the gradient-accumulation division to the loss: packer's loss does both.
        self.model_accepts_loss_kwargs = True
        self.loss_is_scaled_for_ga = True  # (transformers >= 5.19) TRL's DPOTrainer sets False: it would divide by G

    def get_train_dataloader(self):  # noqa: D102 - transformers' hook
        data = self.train_dataset
        if not isinstance(data, PackedDataset):
            return super().get_train_dataloader()
        from torch.utils.data import DataLoader

        data = data.with_rank(self.args.process_index, self.args.world_size)
        batch = self._train_batch_size
        workers = self.args.dataloader_num_workers
        if steps_per_epoch(data, batch, num_workers=workers) != math.ceil(len(data) / batch):
            raise ConfigError(
                f"{workers} DataLoader workers split this rank's {len(data)} rows into batches of {batch} that the "
                "Trainer would miscount (it takes len(rows) / batch size): use batch size 1 (one packed row per "
                "micro-batch) or a worker count whose slices are multiples of the batch size"
            )
        loader = DataLoader(data, batch_size=batch, collate_fn=self.data_collator, num_workers=workers,
                            pin_memory=self.args.dataloader_pin_memory,
                            persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
                            prefetch_factor=self.args.dataloader_prefetch_factor if workers > 0 else None)
        loader = self.accelerator.prepare(loader)
        _no_reshard(loader)
        return loader

    def _get_num_items_in_batch(self, batch_samples: list, device: Any) -> Any:
        """The step's denominator for packer's loss: every micro-batch's ``loss_count`` (the chosen normalization),
        summed over ranks with ``average_tokens_across_devices`` (the default), as transformers sums its token
        count. The model's own loss keeps transformers' count."""
        if self.packer_loss == "model" or not all(LAYOUT_KWARG in b for b in batch_samples):
            return super()._get_num_items_in_batch(batch_samples, device)  # not PackedCollator's batches
        import torch

        count = sum((loss_count(b["labels"], b[LAYOUT_KWARG], weighting=self.packer_weighting,
                                prefix=self.packer_prefix, loss_weights=b.get(WEIGHTS_KWARG)).cpu()
                     for b in batch_samples), torch.zeros((), dtype=torch.float64))
        return global_count(self, count.to(device))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: D102
        if self.packer_loss == "model":
            if WEIGHTS_KWARG in inputs:
                raise ConfigError("this build has loss weights, which the model's own loss ignores: use loss='packer'")
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        batch = split_batch(inputs)  # fillers' labels are all -100: the token loss skips them by itself
        keep = kept_rows(batch)
        outputs = model(**batch.model_inputs, logits_to_keep=keep)
        out = packed_cross_entropy(outputs.logits, batch.labels, batch.layout, weighting=self.packer_weighting,
                                   prefix=self.packer_prefix, loss_weights=batch.weights, logits_index=keep)
        self._packer_log(out)
        if self.model.training and self.packer_sources is not None and batch.sources is not None:
            self.packer_sources.add(out, batch.labels, batch.layout, batch.sources, batch.filler)
        loss = step_loss(self, out.loss, num_items_in_batch, torch_where_positive(out.count))
        return (loss, outputs) if return_outputs else loss

    def _packer_log(self, out: Any) -> None:
        """Hook for a trainer's metrics (the TRL trainers log token accuracy)."""


def torch_where_positive(count: Any) -> Any:
    """``count`` where it is > 0, else 1 (a batch with no loss divides its zero sum by 1)."""
    import torch

    return torch.where(count > 0, count, torch.ones_like(count))


def prepare_args(args: Any) -> None:
    """The two training arguments packer rows need: keep every column (rows carry cu_seqlens / node_* that no model
    signature names) and let each rank fetch its own batches (accelerate's dispatching reads on rank 0 and slices
    every tensor's first dimension: a (4, 1, T) mRoPE position tensor and (patches, C) pixels do not split so)."""
    if args is None:
        return
    args.remove_unused_columns = False
    args.accelerator_config.dispatch_batches = False


class PackedTrainer(PackedTrainerMixin, Trainer):
    """``transformers.Trainer`` on packer shards, exact for any G (gradient accumulation) and W (ranks).

        trainer = PackedTrainer(model=model, args=TrainingArguments(..., remove_unused_columns=False),
                                train_dataset=PackedDataset("my_shards/"))
        trainer.train()

    ``train_dataset``: a ``PackedDataset`` (read per rank: equal steps, fillers, balance; recommended) or a packer
    output path, or ``datasets.load_dataset(OUT)["train"]`` (read as any map-style dataset: on W > 1 ranks
    accelerate completes the epoch's last step with repeated rows unless the rows divide evenly).
    ``data_collator`` defaults to ``PackedCollator`` of the build; ``use_packed_attention(model, backend)`` is
    applied; ``loss``: "packer" (default) or "model" (see ``PackedTrainerMixin``); ``weighting``: "token" (default),
    "example", "sqrt" or "branches" and ``prefix``: "once" (default) or "path", the normalization
    (docs/training.md, "Normalizations"); ``source_metrics``: log each source's loss, tokens and examples per
    step (``packer.train.trainers.metrics.SourceMetricsCallback``; default: when the build mixes sources).
    """

    def __init__(self, model=None, args=None, *, train_dataset=None, data_collator=None, loss: Loss = "packer",
                 backend: Backend = "auto", weighting: Weighting = "token", prefix: Prefix = "once",
                 source_metrics: bool | None = None, **kwargs: Any):
        if isinstance(train_dataset, (str, Path)):
            train_dataset = PackedDataset(train_dataset, seed=getattr(args, "seed", 0))
        if data_collator is None:
            data_collator = PackedCollator(train_dataset.shards.root if isinstance(train_dataset, PackedDataset)
                                           else None)
        prepare_args(args)
        if model is not None:
            use_packed_attention(model, backend)
        super().__init__(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator, **kwargs)
        self._packer_setup(loss, weighting, prefix)
        self._packer_sources_setup(source_metrics, train_dataset)

