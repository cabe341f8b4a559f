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
unchanged. Completions that share more than the prompt (a first turn, a tool result) form a radix trie under it:
each shared prefix one node, computed once, a shared token's log-prob handed to every completion through it.
Prompt images (the Qwen-VL families, GLM-4.6V, LLaVA-1.5, Gemma 3) go through the model once per tree
(``_PromptImages``: mRoPE positions along each path, or 1-D ones and Gemma 3's bidirectional image spans).
A group too long for ``max_tokens`` splits its completions over several trees (the prompt again in each). Only
what packer can make exact is accepted; the rest is refused with a ConfigError naming the option
(docs/training.md, "RL").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from trl import GRPOTrainer

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError
from packer.models.shared.mrope import mrope_position_ids
from packer.packing.kernels import bfd_fast
from packer.train.attention.hf import use_packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.keys import LAYOUT_KWARG
from packer.train.options import Backend
from packer.train.trainers.loss import loss_targets

# Media inputs TRL 1.16 may hand its log-prob call (it passes no video or audio). Proven packed: images in the
# prompt of the Qwen-VL families (``pixel_values`` + ``image_grid_thw`` + ``num_images``; ``mm_token_type_ids`` is
# not needed: packer places the mRoPE positions from the ids along each path, Qwen2-VL's ``get_rope_index`` rule,
# which Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-4.6V share for images), of LLaVA-1.5 and of Gemma 3 (``pixel_values``
# one entry per image + ``num_images``, 1-D positions; Gemma 3's ``token_type_ids`` not needed: each run of image
# tokens is a bidirectional span of the layout).
# Any other family's media inputs are refused by name.
_REFUSED_MEDIA = ("pixel_attention_mask", "spatial_shapes", "num_tiles", "image_sizes", "image_position_ids")
# model types whose prompt images are proven equal to TRL's padded path (tests/train/trainers/test_grpo.py)
_MROPE_IMAGE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "glm46v")
_FLAT_IMAGE_MODEL_TYPES = ("llava", "gemma3")  # 1-D positions, one pixel_values entry per image
_SPAN_IMAGE_MODEL_TYPES = ("gemma3",)  # each image's run of tokens one bidirectional span
_IMAGE_MODEL_TYPES = (*_MROPE_IMAGE_MODEL_TYPES, *_FLAT_IMAGE_MODEL_TYPES)


@dataclass(frozen=True)
class GroupTree:
    """One tree of a packed row: a prompt (node 0) and the completions that share it as a radix trie of their
    tokens, so a prefix several completions share (a first turn, a tool result) is one node, computed once."""

    prompt: list[int]
    completions: list[int]  # indices into TRL's batch
    lengths: list[int]  # each completion's unpadded token count
    nodes: tuple[tuple[int, int, int, int], ...]  # (parent node, completion holding the tokens, start, end)
    leaves: tuple[int, ...]  # per completion: the node of its last token (inner when it prefixes another)
    sample: int = -1  # the batch index whose images the prompt carries (-1: none)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + sum(end - start for _, _, start, end in self.nodes)


def radix_trie(seqs: dict[int, list[int]]) -> tuple[list[tuple[int, int, int, int]], dict[int, int]]:
    """``seqs`` (batch index -> completion tokens) as a radix trie under node 0 (the prompt): nodes
    (parent, completion, start, end) depth-first (a parent before its children), children in order of first
    appearance, and each completion's leaf node."""
    nodes: list[tuple[int, int, int, int]] = []
    leaves: dict[int, int] = {}

    def grow(members: list[int], depth: int, parent: int) -> None:  # recursion depth <= len(members)
        groups: dict[int, list[int]] = {}
        for m in members:
            if len(seqs[m]) > depth:
                groups.setdefault(seqs[m][depth], []).append(m)
        for group in groups.values():
            first, end = seqs[group[0]], min(len(seqs[m]) for m in group)
            stop = depth + 1
            while stop < end and all(seqs[m][stop] == first[stop] for m in group):
                stop += 1
            nodes.append((parent, group[0], depth, stop))
            node = len(nodes)
            leaves.update((m, node) for m in group if len(seqs[m]) == stop)
            grow(group, stop, node)

    grow(list(seqs), 0, 0)
    return nodes, leaves


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def group_trees(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int,
                max_tokens: int, image_keys: list[bytes] | None = None) -> list[GroupTree]:
    """TRL's padded (B, P + C) batch as prefix trees: completions grouped by identical (unpadded) prompt ids (and
    images: ``image_keys``, one digest per sample), each group a radix trie of its completions, split so that no
    tree has more than ``max_tokens`` tokens; completions with no token are left out."""
    prompt_len = input_ids.shape[1] - completion_length
    ids, mask = input_ids.cpu(), attention_mask.cpu().bool()
    groups: dict[tuple, list[tuple[int, list[int]]]] = {}
    for b in range(ids.shape[0]):
        comp = mask[b, prompt_len:]
        n = int(comp.sum())
        if n and not bool(comp[:n].all()):
            raise ConfigError(f"completion {b}'s attention mask has holes; PackedGRPOTrainer packs a completion's "
                              "tokens up to its first padding only")
        prompt = tuple(ids[b, :prompt_len][mask[b, :prompt_len]].tolist())
        key = (prompt, image_keys[b] if image_keys is not None else b"")
        groups.setdefault(key, []).append((b, ids[b, prompt_len:prompt_len + n].tolist()))
    trees = []

    def close(prompt: tuple[int, ...], current: list[tuple[int, list[int]]]) -> None:
        seqs = dict(current)
        nodes, leaves = radix_trie(seqs)
        trees.append(GroupTree(list(prompt), list(seqs), [len(c) for c in seqs.values()], tuple(nodes),
                               tuple(leaves[b] for b in seqs), current[0][0] if image_keys is not None else -1))

    for (prompt, _), members in groups.items():
        current: list[tuple[int, list[int]]] = []
        size = len(prompt)  # the trie's tokens so far: each completion adds what no earlier one shares
        for b, comp in members:
            if not comp:
                continue
            if len(prompt) + len(comp) > max_tokens:
                raise ConfigError(f"max_tokens={max_tokens} is smaller than a prompt and one completion "
                                  f"({len(prompt)} + {len(comp)} tokens): raise max_tokens")
            new = len(comp) - max((_common(comp, c) for _, c in current), default=0)
            if current and size + new > max_tokens:
                close(prompt, current)
                current, size, new = [], len(prompt), len(comp)
            current.append((b, comp))
            size += new
        if current:
            close(prompt, current)
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
    targets: torch.Tensor  # (L,) flat index b * C + j of each completion token (a shared token serves several)
    sources: torch.Tensor  # (L,) the row position of that token


def row_of(trees: list[GroupTree], input_ids: torch.Tensor, completion_length: int) -> PackedRow:
    """Lay out ``trees`` as one packed row (depth-first: each prompt, then its trie's nodes)."""
    prompt_len = input_ids.shape[1] - completion_length
    ids = input_ids.cpu()
    tokens: list[int] = []
    labels: list[int] = []
    targets: list[int] = []
    sources: list[int] = []
    cu, offsets, parents = [0], [], []
    for tree in trees:
        root = len(offsets)
        offsets.append(len(tokens))
        parents.append(-1)
        tokens += tree.prompt
        labels += [IGNORE_INDEX] * len(tree.prompt)
        for parent, b, start, end in tree.nodes:
            offsets.append(len(tokens))
            parents.append(root + parent)
            part = ids[b, prompt_len + start:prompt_len + end].tolist()
            tokens += part
            labels += part
        for b, leaf in zip(tree.completions, tree.leaves, strict=True):
            node = leaf  # walk the path up: each node's tokens are this completion's [start, end)
            while node:
                parent, _, start, end = tree.nodes[node - 1]
                first = offsets[root + node]
                targets += [b * completion_length + j for j in range(start, end)]
                sources += range(first, first + end - start)
                node = parent
        cu.append(len(tokens))
    layout = PackedLayout.from_tensors(len(tokens), cu, offsets, parents)
    device = input_ids.device
    return PackedRow(
        input_ids=torch.tensor([tokens], dtype=input_ids.dtype, device=device),
        position_ids=layout.path_positions().to(device).unsqueeze(0),
        layout=layout,
        labels=torch.tensor(labels, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        sources=torch.tensor(sources, dtype=torch.long, device=device),
    )


class PackedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with each group's prompt computed once: the policy and reference forwards on packed
    prefix trees (module docstring), everything else TRL's.

        trainer = PackedGRPOTrainer(model, reward_funcs=reward, args=GRPOConfig(output_dir="out", bf16=False),
                                    train_dataset=prompts)
        trainer.train()

    ``max_tokens``: the most tokens in one packed row (default: the padded batch's own B x (P + C), so a row
    never holds more than TRL's padded forward would). ``backend``: packer's attention backend
    (``use_packed_attention``). Refused with a ConfigError: media other than the prompt images of
    ``_IMAGE_MODEL_TYPES``, a MoE load-balancing loss (``router_aux_loss_coef`` on a model that outputs router
    logits), ``cast_lm_head_to_fp32``.
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
                                           compute_entropy=False, compute_aux_loss=False, pixel_values=None,
                                           image_grid_thw=None, num_images=None, mm_token_type_ids=None,
                                           token_type_ids=None, **media: Any):
        """TRL's (B, C) per-token log-probs (and entropies) of the completions, computed on packed group trees."""
        refused = [k for k in _REFUSED_MEDIA if media.get(k) is not None]
        model_type = getattr(self.accelerator.unwrap_model(model).config, "model_type", None)
        if token_type_ids is not None and model_type not in _SPAN_IMAGE_MODEL_TYPES:
            refused.append("token_type_ids")
        if refused or set(media) - set(_REFUSED_MEDIA):
            raise ConfigError(f"PackedGRPOTrainer packs text prompts and the prompt images of {list(_IMAGE_MODEL_TYPES)} "
                              f"only; this batch carries {refused or sorted(media)} (use trl.GRPOTrainer)")
        if compute_aux_loss:
            raise ConfigError("PackedGRPOTrainer: set router_aux_loss_coef=0 (the MoE aux loss is not packed)")
        B, C = input_ids.shape[0], int(logits_to_keep)
        images = None
        if pixel_values is not None:
            images = _PromptImages(self.accelerator.unwrap_model(model), pixel_values, image_grid_thw, num_images, B)
            if bool((input_ids[:, -C:] == images.image_token_id).any()):
                raise ConfigError("PackedGRPOTrainer packs images in the prompt only; a completion holds image tokens "
                                  "(a tool's image): use trl.GRPOTrainer")
        budget = self.packer_max_tokens or input_ids.numel()
        trees = group_trees(input_ids, attention_mask, C, budget, None if images is None else images.keys)
        logps_flat, entropy_flat, index = [], [], []
        for trees_of_row in pack_trees(trees, budget):
            row = row_of(trees_of_row, input_ids, C)
            sel = loss_targets(row.labels, row.layout)
            keep = torch.unique(sel.predecessors)  # sorted
            inputs: dict[str, Any] = {"position_ids": row.position_ids, LAYOUT_KWARG: row.layout}
            if images is not None:
                inputs = images.inputs(row, [t.sample for t in trees_of_row])
            with self.accelerator.autocast():
                out = model(input_ids=row.input_ids, use_cache=False, logits_to_keep=keep, **inputs)
            logits = out.logits[0].index_select(0, torch.searchsorted(keep, sel.predecessors))
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 as TRL's head; fp64 stays
            logp = F.log_softmax(logits / self.temperature, dim=-1)  # TRL's fused head divides by temperature too
            # sel's tokens are the row's labelled ones in row order: a row position's rank among them
            rank = torch.cumsum(row.labels != IGNORE_INDEX, 0) - 1
            pick = rank[row.sources]
            logps_flat.append(logp.gather(-1, sel.targets.unsqueeze(-1)).squeeze(-1)[pick])
            if compute_entropy:  # differentiable: TRL's entropy bonus uses it
                entropy_flat.append(-(logp.exp() * logp).sum(-1)[pick])
            index.append(row.targets)
        dtype = logps_flat[0].dtype if logps_flat else torch.float32
        logps = torch.zeros(B * C, dtype=dtype, device=input_ids.device)
        entropies = torch.zeros(B * C, dtype=dtype, device=input_ids.device) if compute_entropy else None
        if index:
            idx = torch.cat(index)
            logps = logps.index_put((idx,), torch.cat(logps_flat))
            if compute_entropy:
                entropies = entropies.index_put((idx,), torch.cat(entropy_flat))
        return logps.view(B, C), (entropies.view(B, C) if compute_entropy else None), None


class _PromptImages:
    """The prompt images of TRL's batch (each prompt's images repeated once per completion there): one digest per
    sample to group by, and per packed row each tree's images once.

    Qwen-VL families: the mRoPE positions of every path (``packer.models.shared.mrope.mrope_position_ids``,
    Qwen2-VL's ``get_rope_index`` per path: the image rule of Qwen2.5-VL, Qwen3-VL, Qwen3.5 and GLM-4.6V too;
    Qwen3-VL interleaves the same three rows in its rotary). LLaVA-1.5 and Gemma 3: 1-D positions; Gemma 3's each run of
    image tokens a bidirectional span of the layout (the blocks ``Gemma3Model`` builds from ``token_type_ids``)."""

    def __init__(self, model: Any, pixel_values: torch.Tensor, grid: torch.Tensor | None, num_images: Any, batch: int):
        model_type = getattr(model.config, "model_type", None)
        self.mrope = model_type in _MROPE_IMAGE_MODEL_TYPES
        self.spans = model_type in _SPAN_IMAGE_MODEL_TYPES
        if model_type not in _IMAGE_MODEL_TYPES or (self.mrope and grid is None) or num_images is None:
            raise ConfigError(f"PackedGRPOTrainer packs prompt images for {list(_IMAGE_MODEL_TYPES)} only (pixel_values "
                              f"with num_images, and image_grid_thw for Qwen); this is {model_type!r}: use "
                              "trl.GRPOTrainer")
        counts = [int(n) for n in num_images]
        if len(counts) != batch:
            raise ConfigError(f"num_images has {len(counts)} entries for a batch of {batch}")
        if self.mrope:
            rows = grid.prod(-1).tolist()
        elif pixel_values.shape[0] == sum(counts):
            rows = [1] * sum(counts)  # one pixel_values entry per image
        else:
            raise ConfigError(f"PackedGRPOTrainer: {model_type} pixel_values has {pixel_values.shape[0]} entries for "
                              f"{sum(counts)} images (pan-and-scan crops are not packed); set do_pan_and_scan=False")
        image_start = np.cumsum([0, *counts]).tolist()
        row_start = np.cumsum([0, *rows]).tolist()
        self.pixel_values, self.grid = pixel_values, grid
        self.images = [range(image_start[b], image_start[b + 1]) for b in range(batch)]
        self.rows = [(row_start[image_start[b]], row_start[image_start[b + 1]]) for b in range(batch)]
        pixels = pixel_values.detach().cpu().contiguous()
        grids = grid.cpu() if grid is not None else torch.zeros(sum(counts), 0, dtype=torch.long)
        self.keys = [hashlib.sha1(pixels[a:e].numpy().tobytes() + grids[i.start:i.stop].numpy().tobytes()).digest()
                     for (a, e), i in zip(self.rows, self.images, strict=True)]
        self.image_token_id = int(model.config.image_token_id)
        self.merge = int(model.config.vision_config.spatial_merge_size) if self.mrope else 1

    def inputs(self, row: PackedRow, samples: list[int]) -> dict[str, Any]:
        """The model's kwargs for ``row`` whose trees' prompts carry the images of ``samples`` (in row order)."""
        pixels = torch.cat([self.pixel_values[self.rows[b][0]:self.rows[b][1]] for b in samples])
        layout = row.layout
        if not self.mrope and not self.spans:
            return {"position_ids": row.position_ids, "pixel_values": pixels, LAYOUT_KWARG: layout}
        if not self.mrope:
            ids = row.input_ids[0].cpu()
            hits = torch.cat([torch.zeros(1, dtype=torch.int8), (ids == self.image_token_id).to(torch.int8),
                              torch.zeros(1, dtype=torch.int8)])
            edges = hits.diff()
            spans = torch.stack([(edges == 1).nonzero()[:, 0], (edges == -1).nonzero()[:, 0]], dim=1)  # (S, 2)
            layout = PackedLayout.from_tensors(layout.num_tokens, layout.cu_seqlens, layout.node_offsets,
                                               layout.node_parents, bidirectional_spans=spans)
            return {"position_ids": row.position_ids, "pixel_values": pixels, LAYOUT_KWARG: layout}
        grid = torch.cat([self.grid[self.images[b].start:self.images[b].stop] for b in samples])
        mrope = mrope_position_ids(row.input_ids[0].cpu().numpy(), layout.node_offsets.cpu().numpy(),
                                   layout.node_parents.cpu().numpy(), [tuple(g) for g in grid.tolist()],
                                   image_token_id=self.image_token_id, spatial_merge_size=self.merge)
        positions = torch.cat([row.position_ids.cpu(), torch.from_numpy(mrope.astype(np.int64))])  # text row, t/h/w
        return {"position_ids": positions.unsqueeze(1).to(row.input_ids.device), "pixel_values": pixels,
                "image_grid_thw": grid, LAYOUT_KWARG: layout}
