"""Labels and what the loss reads: -100 at every example start, the token's own id elsewhere (unshifted),
``num_loss_tokens``, per-token ``loss_weights`` (v4) and TRL's ``seq_lengths`` (v3)."""

from __future__ import annotations

import numpy as np

from packer.core.types import IGNORE_INDEX
from packer.report.verify.decode import Rows, rows_with
from packer.report.verify.report import RowCheck


def check_first_label_ignored(d: Rows, check: RowCheck) -> None:
    """Nothing predicts an example's first token: its label is -100."""
    starts, _, rows = d.examples
    check(rows_with(d.labels.values[starts] != IGNORE_INDEX, rows, d.num_rows), "label at start",
          lambda i: "an example's first label is not -100 (nothing predicts an example's first token)")


def check_labels_unshifted(d: Rows, check: RowCheck) -> None:
    """Each label is -100 or the token's own id (the trainer shifts, not the shards)."""
    labels, ids = d.labels.values, d.input_ids.values
    wrong = (labels != IGNORE_INDEX) & (labels != ids)
    check(rows_with(wrong, d.input_ids.row_of, d.num_rows), "labels",
          lambda i: "a label is neither -100 nor the token's own id (labels are unshifted)")


def check_loss_token_count(d: Rows, check: RowCheck) -> None:
    """``num_loss_tokens`` counts the labels that are not -100."""
    loss = np.bincount(d.input_ids.row_of, weights=d.labels.values != IGNORE_INDEX, minlength=d.num_rows).astype(np.int64)
    stored = d.totals["num_loss_tokens"]
    check(loss != stored, "num_loss_tokens", lambda i: f"num_loss_tokens is {stored[i]}, labels have {loss[i]}")


def check_loss_weights(d: Rows, check: RowCheck) -> None:
    """v4's ``loss_weights``: one per token where set, finite, >= 0, and 0 exactly where the label is -100."""
    if d.loss_weights is None:
        return
    null, weights = d.loss_weights_null, d.loss_weights.values
    have = d.loss_weights.lengths
    want = np.where(null, 0, d.num_tokens)
    check(have != want, "loss_weights", lambda i: f"loss_weights has {have[i]} entries for {want[i]} tokens")
    if not (have == want).all():
        return
    weighted = np.repeat(~null, d.num_tokens)  # (L,) tokens of rows with weights
    lab = d.labels.values[weighted]
    bad = (~np.isfinite(weights) | (weights < 0) | ((lab == IGNORE_INDEX) & (weights != 0))
           | ((lab != IGNORE_INDEX) & (weights == 0)))
    check(rows_with(bad, d.input_ids.row_of[weighted], d.num_rows), "loss_weights",
          lambda i: "a loss weight is not finite, negative, set on a token without loss, or 0 on a loss token")


def check_seq_lengths(d: Rows, check: RowCheck) -> None:
    """v3's ``seq_lengths``: the examples' lengths exactly where TRL's padding-free collator is exact (every example
    one node, no media, no mRoPE, no loss weights), null elsewhere (assemble._seq_lengths)."""
    if d.seq_lengths is None:
        return
    E, lengths, null = d.num_examples, d.seq_lengths, d.seq_lengths_null
    plain = d.mrope_null & (d.num_nodes == E)
    for items in d.media.values():
        plain &= items.per_row == 0
    if d.loss_weights is not None:
        plain &= d.loss_weights_null  # v4: a row with loss weights, which TRL's own loss would ignore
    check(plain & null, "seq_lengths missing",
          lambda i: "seq_lengths is null but every example of the row is linear, without media or mRoPE")
    check(~plain & ~null, "seq_lengths set",
          lambda i: "seq_lengths is set but the row has a tree, an image, a video, audio, mRoPE positions (TRL would "
          "rebuild its positions and attention wrongly) or loss weights (TRL's loss would ignore them)")
    both = plain & ~null
    counts = lengths.lengths
    lengths_ok = np.ones(d.num_rows, dtype=bool)
    lengths_ok[both] = counts[both] == E[both]
    check(~lengths_ok, "seq_lengths length", lambda i: f"seq_lengths has {counts[i]} values for {E[i]} examples")
    rows = np.flatnonzero(both & lengths_ok)
    if len(rows):
        got = np.concatenate([lengths.of_row(r) for r in rows])
        want = np.concatenate([np.diff(d.cu_seqlens.of_row(r)) for r in rows])
        check(rows_with(got != want, np.repeat(rows, E[rows]), d.num_rows), "seq_lengths",
              lambda i: f"seq_lengths {lengths.of_row(i)[:8].tolist()} differ from np.diff(cu_seqlens)")
