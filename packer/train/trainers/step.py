"""What every packer trainer's ``compute_loss`` does alike, once: take a ``PackedCollator`` batch apart, run the
model on the logits the loss needs, and turn the step's loss sum into the value the Trainer back-propagates.

Why the last step multiplies by W: with ``average_tokens_across_devices`` (transformers' default) the
denominator ``num_items_in_batch`` is the whole step's count over every micro-batch and every rank, and DDP then
averages the gradients over the W ranks; multiplying each rank's loss by W undoes that average, so the gradient
is the step's sum over the global count, as transformers does for a model's own loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from packer.train.keys import EXAMPLES_KWARG, FILLER_KWARG, LAYOUT_KWARG, SOURCES_KWARG, WEIGHTS_KWARG
from packer.train.trainers.loss import logits_to_keep


@dataclass(frozen=True)
class Batch:
    """A trainer batch taken apart: what the model takes, the labels, and packer's bookkeeping (None when the
    collator wrote none)."""

    model_inputs: dict[str, Any]  # tokens, positions, pixels, packer_layout: model(**model_inputs)
    labels: torch.Tensor  # (1, T), unshifted
    weights: torch.Tensor | None  # (1, T) loss weights of a weighted build
    sources: list[str] | None  # (E,) each example's source of a mixed build
    filler: torch.Tensor | None  # (E,) bool: the example is an equal-shares filler (labels all -100)
    examples: list[str] | None  # (E,) example ids

    @property
    def layout(self) -> Any:
        return self.model_inputs[LAYOUT_KWARG]


def split_batch(inputs: dict[str, Any]) -> Batch:
    """``inputs`` without ``labels``, ``shift_labels`` (a model's own loss reads them; packer's loss does not) and
    packer's bookkeeping keys, which no model signature takes."""
    inputs = dict(inputs)
    labels = inputs.pop("labels")
    inputs.pop("shift_labels", None)
    return Batch(model_inputs=inputs, labels=labels, weights=inputs.pop(WEIGHTS_KWARG, None),
                 sources=inputs.pop(SOURCES_KWARG, None), filler=inputs.pop(FILLER_KWARG, None),
                 examples=inputs.pop(EXAMPLES_KWARG, None))


def kept_rows(batch: Batch) -> torch.Tensor:
    """(K,) the row positions whose logits the loss reads (``logits_to_keep``), on the labels' device: pass it as
    ``model(**batch.model_inputs, logits_to_keep=keep)`` and the logits are (1, K, V), not (1, T, V)."""
    return logits_to_keep(batch.labels, batch.layout).to(batch.labels.device)


def step_loss(trainer: Any, total: torch.Tensor, num_items_in_batch: torch.Tensor | None,
              local_count: torch.Tensor) -> torch.Tensor:
    """The loss a Trainer back-propagates from this micro-batch's loss ``total``: divided by the step's global
    ``num_items_in_batch`` and multiplied by the ranks DDP averages over (the module docstring); in evaluation
    (no ``num_items_in_batch``) this batch's own mean, ``total / local_count``."""
    if num_items_in_batch is None:
        return total / local_count.to(total.dtype)
    loss = total / num_items_in_batch.to(total.dtype)
    if trainer.args.average_tokens_across_devices and trainer.accelerator.num_processes > 1:
        loss = loss * trainer.accelerator.num_processes
    return loss


def global_count(trainer: Any, count: torch.Tensor) -> torch.Tensor:
    """A micro-batch count summed over the ranks (``average_tokens_across_devices``), as transformers sums its
    token count for ``num_items_in_batch``."""
    if trainer.args.average_tokens_across_devices and trainer.args.world_size > 1:
        count = trainer.accelerator.gather(count.reshape(1)).sum()
    return count
