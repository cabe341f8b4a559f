"""The keys a trainer batch carries besides the model's own inputs: one place for the collator that writes them
(``trainers.trainer.PackedCollator``), the hook that reads the layout (``attention.hf``, ``attention.linear_state``)
and the losses that read the rest (``trainers.loss``, ``trainers.step``)."""

from __future__ import annotations

LAYOUT_KWARG = "packer_layout"  # carries a PackedLayout down to every attention call
FILLER_KWARG = "packer_filler_examples"  # (E,) bool of a trainer batch with filler rows: the loss skips them
EXAMPLES_KWARG = "packer_example_ids"  # a trainer batch's example ids (provenance; what a run trained on)
SOURCES_KWARG = "packer_example_sources"  # (E,) source name of each example (a mixed build's per-source metrics)
WEIGHTS_KWARG = "packer_loss_weights"  # a trainer batch's (1, T) loss weights
BOOKKEEPING_KWARGS = (FILLER_KWARG, EXAMPLES_KWARG, WEIGHTS_KWARG, SOURCES_KWARG)  # PackedCollator's, never model inputs
