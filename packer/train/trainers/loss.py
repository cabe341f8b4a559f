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

Normalization (docs/training.md, "Normalizations"): every one is a coefficient ``c_t`` per loss token t, so
that the step's loss is ``sum_t c_t w_t l_t / sum_t c_t w_t`` over every loss token of the optimizer step
(``w_t``: the token's loss weight, 1 unless the build has weights; ``l_t``: its cross-entropy). The
numerator of a row needs only the row; the denominator is the step's: ``packed_cross_entropy`` returns a
row's sum and its ``count`` (its share of the denominator), and a trainer divides the summed losses of all
micro-batches and ranks by their summed counts (``step_count``), exactly what the unpacked definition is:

    weighting   c_t (prefix="once": units are examples)      the step's loss, unpacked
    token       1                                             sum w l / sum w       (the weighted token mean)
    example     1 / W_e                                       mean over examples of each one's weighted mean
    sqrt        1 / sqrt(W_e)                                 sum_e S_e / sqrt(W_e) / sum_e sqrt(W_e)  (Molmo2)
    branches    1 / sqrt(B_e)                                 each of an example's B_e branches' tokens scaled
                                                              by 1/sqrt(B_e), normalized by their weights (Molmo2's
                                                              root_subsegments)

``W_e``: an example's summed loss weight (its loss tokens when unweighted), ``S_e`` its summed weighted loss,
``B_e`` its leaves (root-to-leaf paths). ``prefix="path"`` makes each root-to-leaf path a unit of its own, as
running every path alone would: a token counts once per path through it (a shared prefix's loss tokens k
times under k leaves), and ``W_e``, ``S_e`` are the path's. Examples (and paths) come from ``cu_seqlens`` and
the tree, never from the packed row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError, ShardError
from packer.train.attention.layout import PackedLayout, copy_to
from packer.train.keys import WEIGHTS_KWARG
from packer.train.options import Prefix, Reduction, Weighting, check, choices

REDUCTIONS, WEIGHTINGS, PREFIXES = choices(Reduction), choices(Weighting), choices(Prefix)


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
    weights: torch.Tensor | None = None  # (L,) fp32 loss weight of each loss token; None: all 1


def loss_targets(labels: torch.Tensor, meta: Mapping[str, Any] | PackedLayout,
                 loss_weights: torch.Tensor | None = None, *, device: torch.device | str | None = None) -> LossTargets:
    """Select the loss tokens of a row (labels != -100), their predecessors and weights (``loss_weights``, else
    the batch's ``loss_weights`` when ``meta`` is a batch), on ``device`` (default: the labels').

    Labels on the CPU (the collator's copy) keep the selection off the GPU's stream: it is computed on the host
    and copied without a stream sync, where labels on the GPU cost one sync (``nonzero``) per row."""
    labels = labels.reshape(-1)
    if loss_weights is None and isinstance(meta, Mapping):
        loss_weights = meta.get("loss_weights")
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
    dev = labels.device if device is None else torch.device(device)
    here = positions.to(labels.device)  # a no-op for CPU labels
    weights = None
    if loss_weights is not None:
        loss_weights = loss_weights.reshape(-1)
        if loss_weights.numel() != labels.numel():
            raise ShardError(f"loss_weights have {loss_weights.numel()} entries for {labels.numel()} labels")
        weights = loss_weights.to(labels.device)[here].float()
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ShardError("loss_weights must be finite and >= 0 on every loss token")
        weights = copy_to(weights, dev)
    return LossTargets(
        positions=copy_to(positions, dev),
        predecessors=copy_to(pred, dev),
        targets=copy_to(labels[here].long(), dev),
        examples=copy_to(examples, dev),
        num_examples=layout.num_examples,
        weights=weights,
    )


def _check(weighting: Weighting, prefix: Prefix) -> None:
    check("weighting", weighting, Weighting)
    check("prefix", prefix, Prefix)


def token_coefficients(sel: LossTargets, layout: PackedLayout, *, weighting: Weighting = "token",
                       prefix: Prefix = "once") -> tuple[torch.Tensor, torch.Tensor]:
    """(each loss token's ``c_t * w_t`` (L,) float64, the row's share of the step's denominator () float64):
    the normalizations of this module's docstring. The row's loss is ``sum(coef * l)``; the step's is the sum of
    its rows' losses over the sum of their counts."""
    _check(weighting, prefix)
    dev = sel.targets.device
    w = torch.ones(sel.targets.numel(), dtype=torch.float64, device=dev) if sel.weights is None \
        else sel.weights.double()  # (L,)
    if weighting == "token" and prefix == "once":
        return w, w.sum()
    E = sel.num_examples
    parents = layout.node_parents.long()
    N = layout.num_nodes
    is_leaf = torch.ones(N, dtype=torch.bool)
    is_leaf[parents[parents >= 0]] = False
    leaves = is_leaf.nonzero().reshape(-1)  # (B,)
    starts = layout.node_offsets.long()
    leaf_example = copy_to(torch.searchsorted(layout.cu_seqlens.long(), starts[leaves], right=True) - 1, dev)  # (B,)
    branches = torch.bincount(leaf_example, minlength=E).double()  # (E,) B_e
    if prefix == "once":
        unit_w = torch.zeros(E, dtype=torch.float64, device=dev).index_add(0, sel.examples, w)  # (E,) W_e
        unit_c = {"token": torch.ones_like(unit_w), "example": 1 / unit_w, "sqrt": unit_w.rsqrt(),
                  "branches": branches.rsqrt()}[weighting]
        unit_c = torch.where(unit_w > 0, unit_c, torch.zeros_like(unit_c))  # (E,) an example without loss is none
        coef = w * unit_c[sel.examples]
    else:  # every root-to-leaf path a unit: a token counts in each path through its node
        node_of = torch.searchsorted(copy_to(starts, dev), sel.positions, right=True) - 1  # (L,)
        node_w = torch.zeros(N, dtype=torch.float64, device=dev).index_add(0, node_of, w)  # (N,)
        on_path = copy_to(layout.ancestors()[leaves], dev).double()  # (B, N) ancestor-or-self of each leaf
        path_w = on_path @ node_w  # (B,) W_p
        path_c = {"token": torch.ones_like(path_w), "example": 1 / path_w, "sqrt": path_w.rsqrt(),
                  "branches": branches[leaf_example].rsqrt()}[weighting]
        path_c = torch.where(path_w > 0, path_c, torch.zeros_like(path_c))  # (B,)
        coef = w * (on_path.T @ path_c)[node_of]  # (L,) sum over the paths through each token's node
    return coef, coef.sum()


def loss_count(labels: torch.Tensor, meta: Mapping[str, Any] | PackedLayout, *, weighting: Weighting = "token",
               prefix: Prefix = "once", loss_weights: torch.Tensor | None = None) -> torch.Tensor:
    """A row's (or collated batch's) share of the step's denominator, without a forward: what
    ``packed_cross_entropy(...).count`` will be. () float64."""
    labels = labels.reshape(-1)
    sel = loss_targets(labels, meta, loss_weights)
    return token_coefficients(sel, _layout(meta, labels.numel()), weighting=weighting, prefix=prefix)[1]


def step_count(batches: Any, *, weighting: Weighting = "token", prefix: Prefix = "once", group: Any = None) -> torch.Tensor:
    """The denominator of a whole optimizer step (``num_items_in_batch``-style): the summed ``loss_count`` of the
    step's micro-batches (collated batches, or a trainer's inputs with ``packer_layout``), summed over the ranks of
    ``group`` when torch.distributed is initialized (every rank must call it). () float64.

        count = step_count(micro_batches, weighting="sqrt")            # before the step's forwards
        for b in micro_batches:                                         # collated batches
            logits = model(**model_inputs(b)).logits
            (packed_cross_entropy(logits, b["labels"], b, weighting="sqrt").loss / count.float()).backward()

    Under DDP (gradients averaged over W ranks) multiply each loss by W."""
    total = torch.zeros((), dtype=torch.float64)
    for b in batches:
        weights = b.get("loss_weights", b.get(WEIGHTS_KWARG))
        meta = b.get("packer_layout", b)
        total = total + loss_count(b["labels"], meta, weighting=weighting, prefix=prefix, loss_weights=weights).cpu()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else total.device
        total = total.to(dev)
        dist.all_reduce(total, group=group)
    return total


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
    (``"none"``, 0 where no loss). ``count`` is this row's share of what a trainer divides the step's summed loss
    by (``step_count``): loss tokens for token weighting (their summed weight when weighted), examples with a
    loss token for example weighting, ``sum_t c_t w_t`` in general (the module docstring).
    """

    loss: torch.Tensor
    count: torch.Tensor  # () int64 for unweighted token and example counts, float64 otherwise
    num_loss_tokens: torch.Tensor  # () int64
    num_correct: torch.Tensor  # () int64, argmax hits (token accuracy = num_correct / num_loss_tokens)
    token_losses: torch.Tensor | None = None  # (L,) detached cross-entropy of each loss token (per-source metrics)
    token_weights: torch.Tensor | None = None  # (L,) its loss weight
    token_examples: torch.Tensor | None = None  # (L,) its example (segment id)

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
    reduction: Reduction = "sum",
    weighting: Weighting = "token",
    prefix: Prefix = "once",
    loss_weights: torch.Tensor | None = None,
    logits_index: torch.Tensor | None = None,
) -> PackedLoss:
    """Exact packed cross-entropy, linear or tree.

    Args:
        logits: (1, T, V) or (T, V) model logits; or (1, K, V) / (K, V) rows at ``logits_index``.
        labels: (1, T) or (T,) unshifted labels (-100 where no loss).
        meta: the collated batch (cu_seqlens, node_offsets, node_parents) or a ``PackedLayout``.
        reduction: "sum" (default: divide by the global ``count`` in the trainer), "mean", or "none".
        weighting: "token", "example", "sqrt" or "branches" (the module docstring's table).
        prefix: "once" (a tree's shared loss tokens count once) or "path" (once per root-to-leaf path through them).
        loss_weights: (1, T) or (T,) each label's weight (the shards' ``loss_weights``); None: the batch's
            ``loss_weights`` when ``meta`` is a collated batch, else every weight 1.
        logits_index: (K,) sorted row positions of the logits given (see ``logits_to_keep``), None for all.

    Only the L loss positions' logits are gathered and upcast to fp32: (L, V), never (T, V).
    """
    check("reduction", reduction, Reduction)
    _check(weighting, prefix)
    if loss_weights is None and isinstance(meta, Mapping):
        loss_weights = meta.get("loss_weights")
    layout = _layout(meta, labels.numel())  # once: a batch's boundaries are checked and turned into a layout here
    sel = loss_targets(labels, layout, loss_weights, device=logits.device)
    picked = _predecessor_logits(logits, sel, logits_index)  # (L, V)
    token_loss = F.cross_entropy(picked, sel.targets, reduction="none")  # (L,)
    with torch.no_grad():
        num_correct = (picked.argmax(-1) == sel.targets).sum()
    num_tokens = torch.full((), sel.targets.numel(), device=token_loss.device)  # a fill, not a host copy
    coef, count = token_coefficients(sel, layout, weighting=weighting, prefix=prefix)
    if sel.weights is None and (weighting, prefix) in (("token", "once"), ("example", "once")):
        count = count.round().long()  # a count of tokens or examples: an integer, as transformers' own
    weighted = token_loss * coef.to(token_loss.dtype)  # (L,)

    if reduction == "none":
        total = labels.numel()
        loss = weighted.new_zeros(total).index_put((sel.positions,), weighted)  # (T,)
    else:
        loss = weighted.sum()
        if reduction == "mean":
            loss = loss / torch.where(count > 0, count, torch.ones_like(count)).to(loss.dtype)
    return PackedLoss(loss=loss, count=count, num_loss_tokens=num_tokens, num_correct=num_correct,
                      token_losses=token_loss.detach(),
                      token_weights=torch.ones_like(token_loss.detach()) if sel.weights is None else sel.weights,
                      token_examples=sel.examples)


@dataclass(frozen=True)
class SequenceLogps:
    """What ``sequence_logps`` returns: one entry per leaf branch (root-to-leaf path), leaves in row order.

    For a preference build every example is a prompt with two leaves, chosen then rejected, so entries
    ``0::2`` are the chosen answers and ``1::2`` the rejected ones (``preference_pairs`` checks that).
    """

    logps: torch.Tensor  # (B,) fp32 summed log-prob of the path's loss tokens (each times its loss weight)
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
        batch: the collated batch: ``labels`` and cu_seqlens / node_offsets / node_parents (or ``packer_layout``),
            and ``loss_weights`` where the build has them.
        logits_index: (K,) sorted row positions of the logits given, None for all.
    """
    labels = batch["labels"].reshape(-1)
    layout = _layout(batch, labels.numel())
    sel = loss_targets(labels, layout, batch.get("loss_weights", batch.get(WEIGHTS_KWARG)))
    picked = _predecessor_logits(logits, sel, logits_index)  # (L, V)
    token_logp = -F.cross_entropy(picked, sel.targets, reduction="none")  # (L,) log p(target)
    if sel.weights is not None:  # a weighted build: each token's log-prob times its weight (ms-swift's loss_scale)
        token_logp = token_logp * sel.weights.to(token_logp.dtype)
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
