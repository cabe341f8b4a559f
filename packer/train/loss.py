"""Exact cross-entropy on packed rows, linear or tree.

Labels are stored unshifted: ``labels[t]`` is the target of token t, predicted by the logit of t's
predecessor on its path (``packer.core.tree.predecessor_index``): t-1 inside a node, the parent's last token
at a node start, nothing at an example start. A parent with k children therefore feeds k predictions from
one logit:

    row:     | P0 P1 P2 | a0 a1 | b0 b1 |      node 0 = prefix, nodes 1 and 2 = branches of node 0
    pred:     -1  0  1     2  3    2  5        a0 and b0 are both predicted from P2's logit

For a linear pack this is the usual shift with no loss across example boundaries (every example's first
label is -100). The tree loss counts each (node token) target once: a shared prefix's loss tokens are counted
once, not once per path, which is what running every root-to-leaf path alone and summing each distinct
target's loss once gives.

Normalization: the default is the token mean over the whole optimizer step. ``packed_cross_entropy`` returns
the sum and the count, so a trainer divides the summed losses of all micro-batches (and ranks) by their
summed count (see docs/training.md). ``weighting="example"`` averages each example's mean over examples,
with examples found from ``cu_seqlens`` (segment ids), never from the packed row's mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError, ShardError
from packer.train.layout import PackedLayout

REDUCTIONS = ("sum", "mean", "none")
WEIGHTINGS = ("token", "example")


def _layout(meta: Mapping[str, Any] | PackedLayout, num_tokens: int) -> PackedLayout:
    if isinstance(meta, PackedLayout):
        return meta
    if "packer_layout" in meta:
        return meta["packer_layout"]
    if "cu_seqlens" not in meta:
        raise ShardError(f"the batch metadata has no 'cu_seqlens'; found keys {sorted(meta)}")
    return PackedLayout.from_tensors(num_tokens, meta["cu_seqlens"], meta.get("node_offsets"), meta.get("node_parents"))


@dataclass(frozen=True)
class LossTargets:
    """The loss tokens of a row: where they are, which logit predicts them, what they should be."""

    positions: torch.Tensor  # (L,) row position of each loss token
    predecessors: torch.Tensor  # (L,) row position of the logit that predicts it
    targets: torch.Tensor  # (L,) target token ids
    examples: torch.Tensor  # (L,) example index (segment id) of each loss token
    num_examples: int


def loss_targets(labels: torch.Tensor, meta: Mapping[str, Any] | PackedLayout) -> LossTargets:
    """Select the loss tokens of a row (labels != -100) and their predecessors."""
    labels = labels.reshape(-1)
    layout = _layout(meta, labels.numel())
    if layout.num_tokens != labels.numel():
        raise ShardError(f"labels have {labels.numel()} tokens but the layout describes {layout.num_tokens}")
    positions = (labels != IGNORE_INDEX).nonzero().reshape(-1).cpu()  # (L,)
    pred = layout.predecessors()[positions]  # (L,)
    if bool((pred < 0).any()):
        bad = positions[pred < 0][:5].tolist()
        raise ShardError(
            f"loss tokens at example starts {bad} have no predecessor to predict them; "
            "an example's first label must be -100"
        )
    examples = torch.searchsorted(layout.cu_seqlens.long(), positions, right=True) - 1  # (L,)
    dev = labels.device
    return LossTargets(
        positions=positions.to(dev),
        predecessors=pred.to(dev),
        targets=labels[positions.to(dev)].long(),
        examples=examples.to(dev),
        num_examples=layout.num_examples,
    )


def logits_to_keep(labels: torch.Tensor, meta: Mapping[str, Any] | PackedLayout) -> torch.Tensor:
    """The sorted distinct positions whose logits the loss reads.  # (K,) long

    Pass it as ``model(..., logits_to_keep=idx)`` so the LM head projects K rows, not T (a (T, V) fp32 logit
    tensor is 2.5 GB at T=4096, V=152k), then give it to ``packed_cross_entropy(..., logits_index=idx)``.
    """
    return torch.unique(loss_targets(labels, meta).predecessors)  # unique() sorts


@dataclass(frozen=True)
class PackedLoss:
    """What ``packed_cross_entropy`` returns.

    ``loss`` is the sum (``reduction="sum"``), ``loss / count`` (``"mean"``) or a (T,) per-token tensor
    (``"none"``, 0 where no loss). ``count`` is what a trainer divides the step's summed loss by: loss tokens
    for token weighting, examples with at least one loss token for example weighting.
    """

    loss: torch.Tensor
    count: torch.Tensor  # () int64
    num_loss_tokens: torch.Tensor  # () int64
    num_correct: torch.Tensor  # () int64, argmax hits (token accuracy = num_correct / num_loss_tokens)

    @property
    def accuracy(self) -> torch.Tensor:
        """Token accuracy of this row (argmax of the predecessor's logit equals the target)."""
        return self.num_correct.double() / self.num_loss_tokens.clamp(min=1).double()


def _predecessor_logits(logits: torch.Tensor, sel: LossTargets, logits_index: torch.Tensor | None) -> torch.Tensor:
    """(L, V) fp32 logits of each loss target's predecessor; ``logits`` may hold only the rows of
    ``logits_index`` (sorted positions, see ``logits_to_keep``)."""
    flat = logits.reshape(-1, logits.shape[-1])  # (T or K, V)
    rows = sel.predecessors
    if logits_index is not None:
        index = logits_index.to(rows.device).reshape(-1)
        rows = torch.searchsorted(index, rows).clamp(max=index.numel() - 1)
        if not bool((index[rows] == sel.predecessors).all()):
            raise ConfigError("'logits_index' misses positions the loss needs: build it with logits_to_keep()")
    return flat.index_select(0, rows).float()  # (L, V)


def packed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    meta: Mapping[str, Any] | PackedLayout,
    *,
    reduction: str = "sum",
    weighting: str = "token",
    logits_index: torch.Tensor | None = None,
) -> PackedLoss:
    """Exact packed cross-entropy, linear or tree.

    Args:
        logits: (1, T, V) or (T, V) model logits; or (1, K, V) / (K, V) rows at ``logits_index``.
        labels: (1, T) or (T,) unshifted labels (-100 where no loss).
        meta: the collated batch (cu_seqlens, node_offsets, node_parents) or a ``PackedLayout``.
        reduction: "sum" (default: divide by the global ``count`` in the trainer), "mean", or "none".
        weighting: "token" (each loss token weighs 1) or "example" (each example's mean, over examples).
        logits_index: (K,) sorted row positions of the logits given (see ``logits_to_keep``), None for all.

    Only the L loss positions' logits are gathered and upcast to fp32: (L, V), never (T, V).
    """
    if reduction not in REDUCTIONS:
        raise ConfigError(f"'reduction' must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"'weighting' must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    sel = loss_targets(labels, meta)
    picked = _predecessor_logits(logits, sel, logits_index)  # (L, V)
    token_loss = F.cross_entropy(picked, sel.targets, reduction="none")  # (L,)
    with torch.no_grad():
        num_correct = (picked.argmax(-1) == sel.targets).sum()
    num_tokens = torch.tensor(sel.targets.numel(), device=token_loss.device)

    if weighting == "token":
        weights = torch.ones_like(token_loss)
        count = num_tokens
    else:
        per_example = torch.bincount(sel.examples, minlength=sel.num_examples)  # (E,) loss tokens per example
        weights = 1.0 / per_example[sel.examples].to(token_loss.dtype)  # (L,) each example sums to 1
        count = (per_example > 0).sum()
    weighted = token_loss * weights  # (L,)

    if reduction == "none":
        total = labels.numel()
        loss = weighted.new_zeros(total).index_put((sel.positions,), weighted)  # (T,)
    else:
        loss = weighted.sum()
        if reduction == "mean":
            loss = loss / count.clamp(min=1)
    return PackedLoss(loss=loss, count=count, num_loss_tokens=num_tokens, num_correct=num_correct)


@dataclass(frozen=True)
class SequenceLogps:
    """What ``sequence_logps`` returns: one entry per leaf branch (root-to-leaf path), leaves in row order.

    For a preference build every example is a prompt with two leaves, chosen then rejected, so entries
    ``0::2`` are the chosen answers and ``1::2`` the rejected ones (``preference_pairs`` checks that).
    """

    logps: torch.Tensor  # (B,) fp32 summed log-prob of the path's loss tokens, differentiable
    num_tokens: torch.Tensor  # (B,) int64 loss tokens on the path
    examples: torch.Tensor  # (B,) int64 example index (segment id) of each leaf
    leaves: torch.Tensor  # (B,) int64 node index of each leaf


def sequence_logps(
    logits: torch.Tensor, batch: Mapping[str, Any], *, logits_index: torch.Tensor | None = None
) -> SequenceLogps:
    """Per leaf branch: the summed log-prob of the loss tokens on its root-to-leaf path (and their count).

    The predecessor rule is ``packed_cross_entropy``'s: a branch's first token is predicted by its parent's
    last token, so each path sums exactly what running it alone would (a shared prefix's loss tokens count
    in every path through it). A preference pair's prompt carries no loss, so chosen and rejected sum only
    their answers, as TRL's DPO does::

        row:   | P0 P1 P2 | c0 c1 | r0 r1 r2 |      node 0 = prompt, 1 = chosen, 2 = rejected
        logps: [log p(c0|P) + log p(c1|P c0),  log p(r0|P) + log p(r1|..) + log p(r2|..)]

    Args:
        logits: (1, T, V) or (T, V); or (1, K, V) / (K, V) rows at ``logits_index`` (see ``logits_to_keep``).
        batch: the collated batch: ``labels`` and cu_seqlens / node_offsets / node_parents (or ``packer_layout``).
        logits_index: (K,) sorted row positions of the logits given, None for all.
    """
    labels = batch["labels"].reshape(-1)
    layout = _layout(batch, labels.numel())
    sel = loss_targets(labels, layout)
    picked = _predecessor_logits(logits, sel, logits_index)  # (L, V)
    token_logp = -F.cross_entropy(picked, sel.targets, reduction="none")  # (L,) log p(target)
    starts = layout.node_offsets.long().to(sel.positions.device)  # (N,)
    node_of = torch.searchsorted(starts, sel.positions, right=True) - 1  # (L,) node of each loss token
    N = layout.num_nodes
    node_sum = token_logp.new_zeros(N).index_add(0, node_of, token_logp)  # (N,)
    node_count = torch.bincount(node_of, minlength=N)  # (N,)
    parents = layout.node_parents.long()
    is_leaf = torch.ones(N, dtype=torch.bool)
    is_leaf[parents[parents >= 0]] = False
    leaves = is_leaf.nonzero().reshape(-1)  # (B,)
    on_path = layout.ancestors()[leaves].to(node_sum.device)  # (B, N) ancestor-or-self of each leaf
    logps = (on_path.to(node_sum.dtype) * node_sum[None, :]).sum(-1)  # (B,)
    counts = (on_path.long() * node_count[None, :]).sum(-1)  # (B,)
    examples = torch.searchsorted(layout.cu_seqlens.long(), starts.cpu()[leaves], right=True) - 1  # (B,)
    return SequenceLogps(logps=logps, num_tokens=counts, examples=examples.to(logps.device), leaves=leaves.to(logps.device))


def preference_pairs(seq: SequenceLogps) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) indices into ``seq`` for a preference build: each example's two leaves, in node
    order (node 1 chosen, node 2 rejected, docs/format.md). ShardError if an example has not exactly two."""
    per_example = torch.bincount(seq.examples.cpu())
    if seq.examples.numel() == 0 or bool((per_example[per_example > 0] != 2).any()):
        raise ShardError(
            "a preference batch needs exactly two leaves (chosen, rejected) per example; got "
            f"{per_example.tolist()[:8]}: build it from {{'prompt', 'chosen', 'rejected'}} records, with --overlong drop"
        )
    i = torch.arange(0, seq.examples.numel(), 2, device=seq.logps.device)
    return i, i + 1


def dpo_loss(
    policy: SequenceLogps, reference: SequenceLogps, *, beta: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sigmoid DPO loss of a preference batch (Rafailov et al. 2023; TRL's ``loss_type="sigmoid"``):
    ``-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` per pair. Returns (per-pair losses (P,),
    rewards margin (P,)); a trainer averages the losses over the step's pairs."""
    c, r = preference_pairs(policy)
    ref = reference.logps.detach().to(policy.logps.device)
    logits = (policy.logps[c] - ref[c]) - (policy.logps[r] - ref[r])  # (P,)
    return -F.logsigmoid(beta * logits), beta * logits.detach()
