"""GRPO with each group as one prefix tree: TRL 1.16's ``GRPOTrainer``, its policy and reference log-probs on packed rows.

TRL pads every (prompt, completion) pair and runs the prompt once per completion: G times per group. Here
TRL generates, scores, computes advantages and its loss as always; only ``_get_per_token_logps_and_entropies``
(every policy, old-policy and reference forward) changes: the completions of one prompt (identical prompt ids
in TRL's batch: TRL repeats each prompt ``num_generations`` times) become one tree, the prompt its root node
and each completion a branch, and the trees are packed across groups into rows of at most ``max_tokens``
tokens with the global planner's best-fit-decreasing kernel::

    TRL (padded, B = 4):                       packed (one row, one group of 4):
    | p p P P P | a a . |                      | P P P | a a | b b b | c | d d |     node 0 = the prompt,
    | p p P P P | b b b |                      cu_seqlens = [0, 11], node_offsets = [0, 3, 5, 8, 9],
    | p p P P P | c . . |                      node_parents = [-1, 0, 0, 0, 0]
    | p p P P P | d d . |

Each completion token's log-prob is read from its predecessor's logit on its own path (a branch's first
token from the prompt's last, ``packer.train.trainers.loss.loss_targets``), divided by TRL's ``temperature``
as TRL's fused LM head does, and handed back in TRL's (B, T_completion) layout (0 on padding, as TRL's), with
the entropies; so every ``loss_type``, the clipping, the KL term, importance sampling and the metrics run
unchanged. A group too long for ``max_tokens`` splits its completions over several trees (the prompt again in
each). Only what packer can make exact is accepted; the rest is refused with a ConfigError naming the option
(docs/training.md, "RL").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from trl import GRPOTrainer

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError
from packer.packing.kernels import bfd_fast
from packer.train.attention.hf import use_packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.keys import LAYOUT_KWARG
from packer.train.options import Backend
from packer.train.trainers.loss import loss_targets

# Inputs of TRL's log-prob call that carry media: the prompt's images would have to be placed once per tree.
_MEDIA = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "num_tiles", "image_sizes",
          "token_type_ids", "mm_token_type_ids", "image_position_ids")


@dataclass(frozen=True)
class GroupTree:
    """One tree of a packed row: a prompt (root) and the completions (branches) that share it."""

    prompt: list[int]
    completions: list[int]  # indices into TRL's batch
    lengths: list[int]  # each completion's unpadded token count

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + sum(self.lengths)


def group_trees(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int,
                max_tokens: int) -> list[GroupTree]:
    """TRL's padded (B, P + C) batch as prefix trees: completions grouped by identical (unpadded) prompt ids,
    split so that no tree has more than ``max_tokens`` tokens; completions with no token are left out."""
    prompt_len = input_ids.shape[1] - completion_length
    ids, mask = input_ids.cpu(), attention_mask.cpu().bool()
    groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for b in range(ids.shape[0]):
        comp = mask[b, prompt_len:]
        n = int(comp.sum())
        if n and not bool(comp[:n].all()):
            raise ConfigError(f"completion {b}'s attention mask has holes; PackedGRPOTrainer packs a completion's "
                              "tokens up to its first padding only")
        prompt = tuple(ids[b, :prompt_len][mask[b, :prompt_len]].tolist())
        groups.setdefault(prompt, []).append((b, n))
    trees = []
    for prompt, members in groups.items():
        members = [m for m in members if m[1] > 0]
        current: list[tuple[int, int]] = []
        for b, n in members:
            if len(prompt) + n > max_tokens:
                raise ConfigError(f"max_tokens={max_tokens} is smaller than a prompt and one completion "
                                  f"({len(prompt)} + {n} tokens): raise max_tokens")
            if current and len(prompt) + sum(m[1] for m in current) + n > max_tokens:
                trees.append(GroupTree(list(prompt), [m[0] for m in current], [m[1] for m in current]))
                current = []
            current.append((b, n))
        if current:
            trees.append(GroupTree(list(prompt), [m[0] for m in current], [m[1] for m in current]))
    return trees


def pack_trees(trees: list[GroupTree], max_tokens: int) -> list[list[GroupTree]]:
    """Rows of trees, each at most ``max_tokens`` tokens: the planner's best-fit decreasing (``bfd_fast``)."""
    if not trees:
        return []
    lens = np.asarray([t.num_tokens for t in trees], dtype=np.int64)
    packs, num_packs = bfd_fast(lens, int(max_tokens), 0)
    rows: list[list[GroupTree]] = [[] for _ in range(int(num_packs))]
    for tree_index, pack in enumerate(np.asarray(packs).tolist()):
        rows[pack].append(trees[tree_index])
    return [r for r in rows if r]


@dataclass(frozen=True)
class PackedRow:
    """A packed row of group trees and where each completion token's log-prob goes in TRL's (B, C) output."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T): positions along each root-to-leaf path
    layout: PackedLayout
    labels: torch.Tensor  # (T,) the completion tokens, -100 elsewhere
    targets: torch.Tensor  # (L,) flat index b * C + j of each completion token, in row order


def row_of(trees: list[GroupTree], input_ids: torch.Tensor, completion_length: int) -> PackedRow:
    """Lay out ``trees`` as one packed row (depth-first: prompt, then each completion)."""
    prompt_len = input_ids.shape[1] - completion_length
    ids = input_ids.cpu()
    tokens: list[int] = []
    labels: list[int] = []
    targets: list[int] = []
    cu, offsets, parents = [0], [], []
    for tree in trees:
        root = len(offsets)
        offsets.append(len(tokens))
        parents.append(-1)
        tokens += tree.prompt
        labels += [IGNORE_INDEX] * len(tree.prompt)
        for b, n in zip(tree.completions, tree.lengths, strict=True):
            offsets.append(len(tokens))
            parents.append(root)
            completion = ids[b, prompt_len:prompt_len + n].tolist()
            tokens += completion
            labels += completion
            targets += [b * completion_length + j for j in range(n)]
        cu.append(len(tokens))
    layout = PackedLayout.from_tensors(len(tokens), cu, offsets, parents)
    device = input_ids.device
    return PackedRow(
        input_ids=torch.tensor([tokens], dtype=input_ids.dtype, device=device),
        position_ids=layout.path_positions().to(device).unsqueeze(0),
        layout=layout,
        labels=torch.tensor(labels, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
    )


class PackedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with each group's prompt computed once: the policy and reference forwards on packed
    prefix trees (module docstring), everything else TRL's.

        trainer = PackedGRPOTrainer(model, reward_funcs=reward, args=GRPOConfig(output_dir="out", bf16=False),
                                    train_dataset=prompts)
        trainer.train()

    ``max_tokens``: the most tokens in one packed row (default: the padded batch's own B x (P + C), so a row
    never holds more than TRL's padded forward would). ``backend``: packer's attention backend
    (``use_packed_attention``). Refused with a ConfigError: prompts with images or other media, a MoE
    load-balancing loss (``router_aux_loss_coef`` on a model that outputs router logits), ``cast_lm_head_to_fp32``.
    """

    def __init__(self, model: Any, reward_funcs: Any, args: Any = None, *, max_tokens: int | None = None,
                 backend: Backend = "auto", **kwargs: Any):
        if args is None:
            raise ConfigError("PackedGRPOTrainer needs a GRPOConfig (args=GRPOConfig(output_dir=..., bf16=False))")
        if getattr(args, "cast_lm_head_to_fp32", False):
            raise ConfigError("PackedGRPOTrainer: cast_lm_head_to_fp32 is not supported (packer computes the "
                              "log-probs from the model's own logits); unset cast_lm_head_to_fp32")
        if max_tokens is not None and max_tokens < 1:
            raise ConfigError(f"max_tokens must be a positive token count, got {max_tokens}")
        super().__init__(model, reward_funcs, args=args, **kwargs)
        if self.aux_loss_enabled:
            raise ConfigError("PackedGRPOTrainer: the MoE load-balancing loss counts the prompt's tokens once per "
                              "completion in TRL's padded layout, which packed trees cannot reproduce; set "
                              "router_aux_loss_coef=0 or turn off output_router_logits in the model config")
        self.packer_max_tokens = max_tokens
        use_packed_attention(self.accelerator.unwrap_model(self.model), backend)
        if self.ref_model is not None:
            use_packed_attention(self.accelerator.unwrap_model(self.ref_model), backend)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **media: Any):
        """TRL's (B, C) per-token log-probs (and entropies) of the completions, computed on packed group trees."""
        given = [k for k in _MEDIA if media.get(k) is not None] + (["num_images"] if media.get("num_images") else [])
        if given:
            raise ConfigError(f"PackedGRPOTrainer packs text prompts only; this batch carries {given} (prompts "
                              "with images are not supported yet: use trl.GRPOTrainer)")
        if compute_aux_loss:
            raise ConfigError("PackedGRPOTrainer: set router_aux_loss_coef=0 (the MoE aux loss is not packed)")
        B, C = input_ids.shape[0], int(logits_to_keep)
        budget = self.packer_max_tokens or input_ids.numel()
        trees = group_trees(input_ids, attention_mask, C, budget)
        logps_flat, entropy_flat, index = [], [], []
        for trees_of_row in pack_trees(trees, budget):
            row = row_of(trees_of_row, input_ids, C)
            sel = loss_targets(row.labels, row.layout)
            keep = torch.unique(sel.predecessors)  # sorted
            with self.accelerator.autocast():
                out = model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False,
                            logits_to_keep=keep, **{LAYOUT_KWARG: row.layout})
            logits = out.logits[0].index_select(0, torch.searchsorted(keep, sel.predecessors)).float()
            logp = F.log_softmax(logits / self.temperature, dim=-1)  # TRL's fused head divides by temperature too
            logps_flat.append(logp.gather(-1, sel.targets.unsqueeze(-1)).squeeze(-1))
            if compute_entropy:
                entropy_flat.append(-(logp.exp() * logp).sum(-1))  # differentiable: TRL's entropy bonus uses it
            index.append(row.targets)  # sel's tokens are the row's labelled ones, in row order
        logps = torch.zeros(B * C, dtype=torch.float32, device=input_ids.device)
        entropies = torch.zeros(B * C, dtype=torch.float32, device=input_ids.device) if compute_entropy else None
        if index:
            idx = torch.cat(index)
            logps = logps.index_put((idx,), torch.cat(logps_flat))
            if compute_entropy:
                entropies = entropies.index_put((idx,), torch.cat(entropy_flat))
        return logps.view(B, C), (entropies.view(B, C) if compute_entropy else None), None

