"""Attention over packed rows: one call, several backends, explicit boundaries.

A packed row concatenates examples; an example is a tree of nodes laid out depth-first. Token i sees token j
iff j's node is i's node or one of its ancestors (so both are in the same example) and j <= i; models with
bidirectional image attention add "tokens of one image span see each other". Boundaries always come from
``cu_seqlens`` / ``node_offsets`` / ``node_parents``, never from position ids (tree positions go backwards).

    row:   | P P P | a a | b b b | Q Q |     example 0 = node 0 (prefix P) with branches 1 (a) and 2 (b);
    node:    0 0 0   1 1   2 2 2   3 3       example 1 = node 3 (a plain sequence Q)
    parent: -1       0     0      -1         cu_seqlens = [0, 8, 10], node_offsets = [0, 3, 5, 8]

    mask (row i sees column j):           varlen plan (one segment per node, K/V gathered):
          P P P a a b b b Q Q               queries     keys                     causal
        P x . . . . . . . . .               P P P       P P P                    square
        P x x . . . . . . . .               a a         P P P a a                bottom-right
        P x x x . . . . . . .               b b b       P P P b b b              bottom-right
        a x x x x . . . . . .               Q Q         Q Q                      square
        a x x x x x . . . . .
        b x x x . . x . . . .             cu_seqlens_q = [0, 3, 5, 8, 10]   (the node offsets + T)
        b x x x . . x x . . .             cu_seqlens_k = [0, 3, 8, 14, 16]  (ancestor path + node lengths)
        b x x x . . x x x . .
        Q . . . . . . . . x .
        Q . . . . . . . . x x

Backends (``BACKENDS``), all behind ``packed_attention(q, k, v, layout, backend=...)``:

- ``flash``: flash-attn ``flash_attn_varlen_func`` on the varlen plan (CUDA, ``pip install packer[flash]``).
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` on the same plan (CUDA, in PyTorch itself).
- ``flex``: ``flex_attention`` with a BlockMask from the tree metadata; any mask incl. bidirectional image spans.
  torch 2.13 runs it on CPU forward-only (no CPU backward), so CPU training uses ``sdpa``/``sdpa_varlen``.
- ``sdpa``: SDPA with the explicit (T, T) boolean mask of ``build_attention_mask``: the reference.
- ``sdpa_varlen``: the varlen plan run as one SDPA call per segment, on any device. It checks the plan (the
  gather the CUDA kernels use) on CPU, and it is the fastest CPU backend: no (T, T) mask. Forward+backward,
  1 thread, 8/4 heads of 32: 142 ms vs 796 ms for ``sdpa`` on a 2048-token row of 8 Wikipedia-length
  examples, 530 ms vs 1219 ms on 7 caption trees (2520 tokens); ``flex`` forward alone takes 2.3-3.5 s.

For transformers, ``use_packed_attention(model)`` registers the backends in ``AttentionInterface`` and
``model_inputs(batch)`` turns a collated batch into the kwargs of ``model(**kwargs)``.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from packer.errors import ConfigError, ShardError
from packer.models import forward_keys

BACKENDS = ("flash", "varlen", "flex", "sdpa", "sdpa_varlen")
IMPLEMENTATION_PREFIX = "packer"  # transformers attn_implementation names: "packer" (auto), "packer_sdpa", ...
LAYOUT_KWARG = "packer_layout"  # the model kwarg that carries a PackedLayout down to every attention call


# --------------------------------------------------------------------------------------------------------
# Pure mask construction


def _as_long(x: Any, device: torch.device | str | None = None) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.long, device=device).reshape(-1)


def ancestor_matrix(node_parents: torch.Tensor) -> torch.Tensor:
    """``anc[n, m]`` is True iff node m is node n or one of its ancestors.  # (N, N) bool

    Pointer jumping, one vectorized step per tree level (depth is small: a prefix and its branches).
    """
    parents = _as_long(node_parents)
    n = parents.numel()
    anc = torch.eye(n, dtype=torch.bool, device=parents.device)  # (N, N)
    rows = torch.arange(n, device=parents.device)
    up = parents.clone()  # (N,) the current ancestor of each node, -1 once past the root
    while bool((up >= 0).any()):
        has = up >= 0
        anc[rows[has], up[has]] = True
        up = torch.where(has, parents[up.clamp(min=0)], up)
    return anc


def token_nodes(num_tokens: int, node_offsets: torch.Tensor) -> torch.Tensor:
    """The node index of every token.  # (T,) long"""
    offsets = _as_long(node_offsets)
    t = torch.arange(num_tokens, device=offsets.device)
    return torch.searchsorted(offsets, t, right=True) - 1


def span_ids(num_tokens: int, spans: torch.Tensor | None) -> torch.Tensor:
    """Index of the bidirectional span holding each token, -1 outside every span.  # (T,) long

    ``spans`` is (S, 2) of [start, end) row offsets, sorted and disjoint.
    """
    out = torch.full((num_tokens,), -1, dtype=torch.long)
    if spans is None or len(spans) == 0:
        return out
    spans = torch.as_tensor(spans, dtype=torch.long).reshape(-1, 2)
    t = torch.arange(num_tokens)
    idx = torch.searchsorted(spans[:, 0].contiguous(), t, right=True) - 1  # (T,) last span starting <= t
    inside = (idx >= 0) & (t < spans[idx.clamp(min=0), 1])
    return torch.where(inside, idx, out)


def build_attention_mask(
    num_tokens: int,
    cu_seqlens: torch.Tensor,
    node_offsets: torch.Tensor | None = None,
    node_parents: torch.Tensor | None = None,
    *,
    bidirectional_spans: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dense boolean attention mask of a packed row: ``mask[i, j]`` is True iff token i sees token j.

    Args:
        num_tokens: T, the row length.
        cu_seqlens: (E+1,) example boundaries, 0 ... T.
        node_offsets: (N,) node starts; None means one node per example (a linear pack).
        node_parents: (N,) parent node index, -1 for an example's root.
        bidirectional_spans: optional (S, 2) [start, end) spans whose tokens all see each other (one image of
            a Molmo-style model), on top of the causal tree mask.

    Returns:
        (T, T) bool. Vectorized: an (N, N) ancestor matrix gathered by each token's node, then causal.
    """
    layout = PackedLayout.from_tensors(
        num_tokens, cu_seqlens, node_offsets, node_parents, bidirectional_spans=bidirectional_spans
    )
    return layout.dense_mask("cpu")


# --------------------------------------------------------------------------------------------------------
# The layout of one batch


def _drop_empty_nodes(offsets: torch.Tensor, parents: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove zero-token nodes (allowed by the shard format and transparent: their children hang off their
    nearest non-empty ancestor), so every node below spans at least one token."""
    lengths = torch.diff(offsets.long(), append=torch.tensor([num_tokens]))  # (N,)
    if bool((lengths < 0).any()):
        raise ShardError(f"'node_offsets' must not decrease and stay <= T={num_tokens}, got {offsets.tolist()[:16]}")
    empty = lengths == 0
    if not bool(empty.any()):
        return offsets, parents
    par = parents.long().clone()
    # Re-parent past empty ancestors, one tree level per step.
    while True:
        hop = (par >= 0) & empty[par.clamp(min=0)]
        if not bool(hop.any()):
            break
        par = torch.where(hop, parents.long()[par.clamp(min=0)], par)
    keep = ~empty
    new_index = torch.cumsum(keep.long(), 0) - 1  # (N,) index among kept nodes
    par = torch.where(par >= 0, new_index[par.clamp(min=0)], par)
    return offsets[keep].contiguous(), par[keep].to(torch.int32).contiguous()



@dataclass(frozen=True)
class VarlenPlan:
    """One attention segment per node: the node's queries against [ancestors ; node] keys, causal bottom-right.

    For a linear pack (no trees) the segments are the examples and ``k_index`` is None (keys are not gathered).
    """

    cu_seqlens_q: torch.Tensor  # (S+1,) int32
    cu_seqlens_k: torch.Tensor  # (S+1,) int32
    max_seqlen_q: int
    max_seqlen_k: int
    k_index: torch.Tensor | None  # (Tk,) long: the row position of each gathered key, None for identity
    bounds_q: list[int]  # cu_seqlens_q as Python ints (the per-segment SDPA loop)
    bounds_k: list[int]


@dataclass(frozen=True, eq=False)
class PackedLayout:
    """The explicit boundaries of one collated batch, plus per-device caches of what the backends derive
    from them (dense mask, BlockMask, varlen plan). One object flows through every layer of a forward pass,
    so each is built once per batch, not once per layer.
    """

    num_tokens: int
    """T, the number of tokens in the (1, T) row."""
    cu_seqlens: torch.Tensor
    """(E+1,) int32 example boundaries, 0 ... T."""
    node_offsets: torch.Tensor
    """(N,) int32 node starts, strictly increasing; every example start is a root node."""
    node_parents: torch.Tensor
    """(N,) int32 parent node index (earlier, same example) or -1 for a root."""
    bidirectional_spans: torch.Tensor | None = None
    """(S, 2) int64 [start, end) spans with full attention inside (Molmo-style images); None for none."""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def from_tensors(
        cls,
        num_tokens: int,
        cu_seqlens: Any,
        node_offsets: Any = None,
        node_parents: Any = None,
        *,
        bidirectional_spans: Any = None,
    ) -> PackedLayout:
        """Build from boundary arrays (tensors, numpy or lists); missing nodes mean one node per example."""
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int32).reshape(-1).cpu()
        if node_offsets is None or len(node_offsets) == 0:
            offsets = cu[:-1].clone()
            parents = torch.full_like(offsets, -1)
        else:
            offsets = torch.as_tensor(node_offsets, dtype=torch.int32).reshape(-1).cpu()
            if node_parents is None:
                raise ShardError("'node_parents' is missing while 'node_offsets' is given")
            parents = torch.as_tensor(node_parents, dtype=torch.int32).reshape(-1).cpu()
        offsets, parents = _drop_empty_nodes(offsets, parents, int(num_tokens))
        spans = None
        if bidirectional_spans is not None and len(bidirectional_spans) > 0:
            spans = torch.as_tensor(bidirectional_spans, dtype=torch.long).reshape(-1, 2).cpu()
        return cls(int(num_tokens), cu, offsets, parents, spans)

    @classmethod
    def from_batch(cls, batch: Mapping[str, Any], *, bidirectional_spans: Any = None) -> PackedLayout:
        """Build from a collated batch (``packer.train.dataset.collate``): input_ids, cu_seqlens, node_offsets/parents."""
        missing = [k for k in ("input_ids", "cu_seqlens") if k not in batch]
        if missing:
            raise ShardError(f"the batch has no {missing}; found keys {sorted(batch)}")
        num_tokens = int(batch["input_ids"].shape[-1])
        return cls.from_tensors(
            num_tokens,
            batch["cu_seqlens"],
            batch.get("node_offsets"),
            batch.get("node_parents"),
            bidirectional_spans=bidirectional_spans if bidirectional_spans is not None else batch.get("image_spans"),
        )

    # ---- checks and basic properties

    def _validate(self) -> None:
        T, cu, off, par = self.num_tokens, self.cu_seqlens.long(), self.node_offsets.long(), self.node_parents.long()
        if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != T or bool((cu[1:] <= cu[:-1]).any()):
            raise ShardError(f"'cu_seqlens' must rise strictly from 0 to T={T}, got {cu.tolist()[:16]}")
        if off.numel() != par.numel():
            raise ShardError(f"'node_offsets' ({off.numel()}) and 'node_parents' ({par.numel()}) differ in length")
        if int(off[0]) != 0 or bool((off[1:] <= off[:-1]).any()) or int(off[-1]) >= T:
            raise ShardError(f"'node_offsets' must rise strictly from 0 and stay < T={T}, got {off.tolist()[:16]}")
        idx = torch.arange(off.numel())
        if bool((par >= idx).any()) or bool((par < -1).any()):
            raise ShardError("'node_parents' must point to an earlier node or be -1")
        node_example = torch.searchsorted(cu, off, right=True) - 1  # (N,)
        is_start = torch.isin(off, cu[:-1])
        if bool((is_start != (par < 0)).any()) or int(is_start.sum()) != cu.numel() - 1:
            raise ShardError("every example must start with a root node (parent -1) and only there")
        if bool((node_example[par.clamp(min=0)] != node_example)[par >= 0].any()):
            raise ShardError("a node's parent must belong to the same example")

    @property
    def num_examples(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_nodes(self) -> int:
        return self.node_offsets.numel()

    @property
    def is_linear(self) -> bool:
        """True when every example is one node (no tree): the plain varlen case."""
        return self.num_nodes == self.num_examples

    @property
    def max_seqlen(self) -> int:
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max())

    def _cached(self, key: tuple, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def to_device(self, name: str, device: torch.device | str) -> torch.Tensor:
        """``self.<name>`` on ``device`` (copied once per device)."""
        device = torch.device(device)
        return self._cached((name, str(device)), lambda: getattr(self, name).to(device))

    # ---- derived structure (CPU, cached)

    def token_nodes(self) -> torch.Tensor:
        """(T,) node index of each token."""
        return self._cached(("token_nodes",), lambda: token_nodes(self.num_tokens, self.node_offsets))

    def ancestors(self) -> torch.Tensor:
        """(N, N) bool ancestor-or-self matrix."""
        return self._cached(("ancestors",), lambda: ancestor_matrix(self.node_parents))

    def span_ids(self) -> torch.Tensor:
        """(T,) bidirectional span of each token, -1 outside."""
        return self._cached(("span_ids",), lambda: span_ids(self.num_tokens, self.bidirectional_spans))

    def dense_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(T, T) bool mask, built once per device."""

        def build() -> torch.Tensor:
            dev = torch.device(device)
            node = self.token_nodes().to(dev)  # (T,)
            anc = self.ancestors().to(dev)  # (N, N)
            t = torch.arange(self.num_tokens, device=dev)
            mask = anc[node[:, None], node[None, :]] & (t[None, :] <= t[:, None])  # (T, T)
            if self.bidirectional_spans is not None:
                span = self.span_ids().to(dev)
                mask |= (span[:, None] == span[None, :]) & (span[:, None] >= 0)
            return mask

        return self._cached(("dense_mask", str(torch.device(device))), build)

    def mask_mod(self, device: torch.device | str):
        """The flex_attention ``mask_mod(b, h, q_idx, kv_idx)`` of this layout, over tensors on ``device``."""
        dev = torch.device(device)
        node = self.token_nodes().to(dev)
        anc = self.ancestors().to(dev)
        if self.bidirectional_spans is None:

            def mask_mod(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx) & anc[node[q_idx], node[kv_idx]]

            return mask_mod
        span = self.span_ids().to(dev)

        def mask_mod_bidirectional(b, h, q_idx, kv_idx):
            tree = (kv_idx <= q_idx) & anc[node[q_idx], node[kv_idx]]
            return tree | ((span[q_idx] == span[kv_idx]) & (span[q_idx] >= 0))

        return mask_mod_bidirectional

    def block_mask(self, device: torch.device | str):
        """The flex_attention BlockMask, built once per device (compiled on CUDA to avoid a T x T tensor)."""
        from torch.nn.attention.flex_attention import create_block_mask

        dev = torch.device(device)
        return self._cached(
            ("block_mask", str(dev)),
            lambda: create_block_mask(
                self.mask_mod(dev),
                B=None,
                H=None,
                Q_LEN=self.num_tokens,
                KV_LEN=self.num_tokens,
                device=dev,
                _compile=dev.type == "cuda",
            ),
        )

    def varlen_plan(self, device: torch.device | str = "cpu") -> VarlenPlan:
        """The per-node segments the varlen kernels run (see the module docstring), once per device."""

        def build() -> VarlenPlan:
            dev = torch.device(device)
            T = self.num_tokens
            ends = torch.cat([self.node_offsets.long()[1:], torch.tensor([T])])
            q_lens = ends - self.node_offsets.long()  # (N,)
            cu_q = torch.cat([self.node_offsets.long(), torch.tensor([T])])  # nodes are contiguous: no q gather
            if self.is_linear:
                k_index, cu_k, k_lens = None, cu_q, q_lens
            else:
                # Row n of `sees` marks the tokens of n's ancestors and of n itself; they all precede n's end,
                # so row-major nonzero() lists each segment's keys in row order, segment after segment.
                sees = self.ancestors()[:, self.token_nodes()]  # (N, T)
                k_index = sees.nonzero()[:, 1]  # (Tk,)
                k_lens = sees.sum(1)  # (N,)
                cu_k = torch.cat([torch.zeros(1, dtype=torch.long), k_lens.cumsum(0)])
            return VarlenPlan(
                cu_seqlens_q=cu_q.to(device=dev, dtype=torch.int32),
                cu_seqlens_k=cu_k.to(device=dev, dtype=torch.int32),
                max_seqlen_q=int(q_lens.max()),
                max_seqlen_k=int(k_lens.max()),
                k_index=None if k_index is None else k_index.to(dev),
                bounds_q=cu_q.tolist(),
                bounds_k=cu_k.tolist(),
            )

        return self._cached(("varlen_plan", str(torch.device(device))), build)


# --------------------------------------------------------------------------------------------------------
# Backends. Inputs are varlen-shaped: q (T, H, D), k and v (T, Hkv, D); the output is (T, H, D).


def flash_available() -> bool:
    """flash-attn is installed and a CUDA device is present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def varlen_available() -> bool:
    """torch's varlen_attn can run: CUDA with PyTorch's flash kernels."""
    if not torch.cuda.is_available() or importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return False
    return bool(torch.backends.cuda.is_flash_attention_available())


def resolve_backend(backend: str, device: torch.device | str, *, bidirectional: bool = False) -> str:
    """Pick a concrete backend: "auto" -> flash, varlen, flex on CUDA; sdpa_varlen (sdpa with spans) on CPU."""
    if backend != "auto":
        if backend not in BACKENDS:
            raise ConfigError(f"unknown attention backend {backend!r}; choose one of auto, {', '.join(BACKENDS)}")
        return backend
    if torch.device(device).type == "cuda":
        if bidirectional:
            return "flex"
        if flash_available():
            return "flash"
        return "varlen" if varlen_available() else "flex"
    # On CPU: flex has no backward in torch 2.13; the per-segment loop beats the dense mask when it applies.
    return "sdpa" if bidirectional else "sdpa_varlen"


def _low_precision(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], torch.dtype]:
    """Flash kernels take fp16/bf16 only: cast fp32 inputs to the autocast dtype (bf16 without autocast)."""
    dtype = tensors[0].dtype
    if dtype in (torch.float16, torch.bfloat16):
        return list(tensors), dtype
    target = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
    return [t.to(target) for t in tensors], dtype


def _gather_kv(k: torch.Tensor, v: torch.Tensor, plan: VarlenPlan) -> tuple[torch.Tensor, torch.Tensor]:
    if plan.k_index is None:
        return k, v
    return k.index_select(0, plan.k_index), v.index_select(0, plan.k_index)  # (Tk, Hkv, D)


def _flash(q, k, v, layout: PackedLayout, scale: float, dropout: float) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    _no_spans(layout, "flash")
    plan = layout.varlen_plan(q.device)
    kg, vg = _gather_kv(k, v, plan)
    (q16, k16, v16), dtype = _low_precision(q, kg, vg)
    # causal=True is bottom-right aligned when seqlen_q != seqlen_k (flash-attn >= 2.1): a node's queries are
    # the last rows of its [ancestors ; node] key range. GQA: kv may have fewer heads than q.
    out = flash_attn_varlen_func(
        q16,
        k16,
        v16,
        plan.cu_seqlens_q,
        plan.cu_seqlens_k,
        plan.max_seqlen_q,
        plan.max_seqlen_k,
        dropout_p=dropout,
        softmax_scale=scale,
        causal=True,
    )  # (T, H, D)
    return out.to(dtype)


def _varlen(q, k, v, layout: PackedLayout, scale: float, dropout: float) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    _no_spans(layout, "varlen")
    if dropout:
        raise ConfigError("backend 'varlen' has no attention dropout (torch hardcodes 0); use 'flash' or 'sdpa'")
    plan = layout.varlen_plan(q.device)
    kg, vg = _gather_kv(k, v, plan)
    (q16, k16, v16), dtype = _low_precision(q, kg, vg)
    # window_size=(-1, 0) is how varlen_attn spells causal; PyTorch's flash kernel aligns it bottom-right.
    out = varlen_attn(
        q16,
        k16,
        v16,
        plan.cu_seqlens_q,
        plan.cu_seqlens_k,
        plan.max_seqlen_q,
        plan.max_seqlen_k,
        scale=scale,
        window_size=(-1, 0),
        enable_gqa=q.shape[1] != k.shape[1],
    )  # (T, H, D)
    return out.to(dtype)


_COMPILED_FLEX = None


def _flex(q, k, v, layout: PackedLayout, scale: float, dropout: float) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED_FLEX
    if dropout:
        raise ConfigError("backend 'flex' has no attention dropout; set attention_dropout=0 or use 'sdpa'")
    if q.device.type == "cpu":
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ConfigError(
                "backend 'flex' cannot train on CPU: torch 2.13's flex_attention has no CPU backward. "
                "Use backend='sdpa' or 'sdpa_varlen' on CPU (flex works on CPU under torch.no_grad)"
            )
        q, k, v = q.detach(), k.detach(), v.detach()  # torch refuses requires_grad leaves even under no_grad
    fn = flex_attention
    if q.device.type == "cuda":  # the fused kernel; eager flex materializes the full score matrix
        if _COMPILED_FLEX is None:
            _COMPILED_FLEX = torch.compile(flex_attention, dynamic=True)
        fn = _COMPILED_FLEX
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, H, T, D)
    with warnings.catch_warnings():
        # On CPU the unfused path is deliberate (inductor's CPU flex kernel has no backward either).
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = fn(qh, kh, vh, block_mask=layout.block_mask(q.device), scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)  # (T, H, D)


def _sdpa(q, k, v, layout: PackedLayout, scale: float, dropout: float) -> torch.Tensor:
    mask = layout.dense_mask(q.device)  # (T, T)
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, H, T, D)
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )  # (1, H, T, D)
    return out[0].transpose(0, 1)  # (T, H, D)


def _sdpa_varlen(q, k, v, layout: PackedLayout, scale: float, dropout: float) -> torch.Tensor:
    _no_spans(layout, "sdpa_varlen")
    plan = layout.varlen_plan(q.device)
    kg, vg = _gather_kv(k, v, plan)
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, kg, vg))  # (1, H, T, D), (1, Hkv, Tk, D)
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for s in range(len(plan.bounds_q) - 1):
        q0, q1, k0, k1 = plan.bounds_q[s], plan.bounds_q[s + 1], plan.bounds_k[s], plan.bounds_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        # SDPA's is_causal is top-left aligned, so a node's segment (lq < lk) gets an explicit bottom-right mask.
        mask = None if lq == lk else torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        outs.append(
            F.scaled_dot_product_attention(
                qh[:, :, q0:q1],
                kh[:, :, k0:k1],
                vh[:, :, k0:k1],
                attn_mask=mask,
                dropout_p=dropout,
                is_causal=mask is None,
                scale=scale,
                enable_gqa=gqa,
            )
        )  # (1, H, lq, D)
    return torch.cat(outs, dim=2)[0].transpose(0, 1)  # (T, H, D)


def _no_spans(layout: PackedLayout, backend: str) -> None:
    if layout.bidirectional_spans is not None:
        raise ConfigError(
            f"backend {backend!r} runs causal segments only; bidirectional image spans need backend 'flex' or 'sdpa'"
        )


_KERNELS = {"flash": _flash, "varlen": _varlen, "flex": _flex, "sdpa": _sdpa, "sdpa_varlen": _sdpa_varlen}


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: PackedLayout,
    *,
    backend: str = "auto",
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention over one packed row with the tree mask of ``layout``.

    Args:
        q: (T, H, D) queries. k, v: (T, Hkv, D) keys and values; H a multiple of Hkv (GQA).
        layout: the row's boundaries.
        backend: one of ``BACKENDS`` or "auto" (see ``resolve_backend``).
        scale: softmax scale, default 1/sqrt(D).
        dropout: attention dropout probability (sdpa, sdpa_varlen and flash only).

    Returns:
        (T, H, D), in q's dtype.
    """
    if q.shape[0] != layout.num_tokens:
        raise ShardError(f"q has {q.shape[0]} tokens but the layout describes {layout.num_tokens}")
    name = resolve_backend(backend, q.device, bidirectional=layout.bidirectional_spans is not None)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _KERNELS[name](q, k, v, layout, scale, dropout)


# --------------------------------------------------------------------------------------------------------
# transformers integration


_RAW_LAYOUT: tuple | None = None  # (cu_seqlens, node_offsets, node_parents, T, layout) of the last raw batch


def _layout_from_kwargs(kwargs: dict, num_tokens: int) -> PackedLayout | None:
    """The layout riding in the attention kwargs: ``packer_layout`` (from ``model_inputs``), or the raw
    collated keys ``cu_seqlens`` / ``node_offsets`` / ``node_parents`` of ``model(**batch)``."""
    global _RAW_LAYOUT
    layout = kwargs.get(LAYOUT_KWARG)
    if layout is not None:
        return layout
    cu = kwargs.get("cu_seqlens")
    if not isinstance(cu, torch.Tensor):
        return None
    offsets, parents = kwargs.get("node_offsets"), kwargs.get("node_parents")
    # Every layer receives the same tensor objects: identity keeps one layout (and its caches) per forward.
    last = _RAW_LAYOUT
    if last is not None and last[0] is cu and last[1] is offsets and last[2] is parents and last[3] == num_tokens:
        return last[4]
    layout = PackedLayout.from_tensors(num_tokens, cu, offsets, parents)
    _RAW_LAYOUT = (cu, offsets, parents, num_tokens, layout)
    return layout


def _check_not_packed(position_ids: Any) -> None:
    """A causal call without packer metadata is one plain sequence; refuse a row whose positions restart,
    which would otherwise attend across examples silently."""
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() >= 1 and position_ids.shape[-1] > 1:
        pos = position_ids.reshape(-1, position_ids.shape[-1])[0]
        if bool((pos[1:] != pos[:-1] + 1).any()):
            raise ConfigError(
                "a packed row reached a packer attention backend without its boundaries: call "
                "model(**packer.train.attention.model_inputs(batch)) (or pass cu_seqlens/node_offsets/node_parents)"
            )


def make_attention_function(backend: str):
    """An ``AttentionInterface`` function running ``backend`` ("auto" or one of ``BACKENDS``)."""

    def packer_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """transformers calls this with query (B, H, T, D), key/value (B, Hkv, T, D); returns (B, T, H, D)."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        layout = _layout_from_kwargs(kwargs, query.shape[2]) if causal else None
        if layout is None or query.shape[2] != layout.num_tokens:
            # Not a packed text call: a vision tower's per-image attention (non-causal), or one plain sequence.
            if causal and attention_mask is None:
                _check_not_packed(kwargs.get("position_ids"))
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
            )
        if query.shape[0] != 1:
            raise ConfigError(f"packed attention takes one concatenated row (batch size 1), got {query.shape[0]}")
        if attention_mask is not None:
            raise ConfigError("pass packer boundaries or an attention_mask, not both: drop 'attention_mask'")
        q = query[0].transpose(0, 1)  # (T, H, D)
        k = key[0].transpose(0, 1)  # (T, Hkv, D)
        v = value[0].transpose(0, 1)  # (T, Hkv, D)
        out = packed_attention(q, k, v, layout, backend=backend, scale=scaling, dropout=dropout)  # (T, H, D)
        return out.unsqueeze(0), None  # (1, T, H, D)

    packer_attention_forward.__name__ = f"packer_{backend}_attention_forward"
    return packer_attention_forward


def _mask_for_fallback(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any):
    """``AttentionMaskInterface`` entry: packed batches carry no attention_mask, so no (T, T) mask is built
    from position ids (which would be wrong for trees, and wasted); a padded unpacked batch gets sdpa's mask."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def implementation_name(backend: str = "auto") -> str:
    """The transformers ``attn_implementation`` name of a packer backend ("packer" for auto)."""
    if backend == "auto":
        return IMPLEMENTATION_PREFIX
    if backend not in BACKENDS:
        raise ConfigError(f"unknown attention backend {backend!r}; choose one of auto, {', '.join(BACKENDS)}")
    return f"{IMPLEMENTATION_PREFIX}_{backend}"


def register() -> list[str]:
    """Register every packer backend in transformers' AttentionInterface and AttentionMaskInterface.

    Names: "packer" (auto per device) and "packer_<backend>". Idempotent. Returns the names.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    names = []
    for backend in ("auto", *BACKENDS):
        name = implementation_name(backend)
        AttentionInterface.register(name, make_attention_function(backend))
        AttentionMaskInterface.register(name, _mask_for_fallback)
        names.append(name)
    return names


def use_packed_attention(model: Any, backend: str = "auto") -> str:
    """Switch a stock transformers model (and its sub-models) to a packer backend; returns the name set.

    No model code changes: the model reads ``config._attn_implementation`` at every call. Vision towers
    (non-causal, per-image) fall through to SDPA inside the same function. A forward pre-hook lets the
    model take a collated batch as it is: ``model(**collate(rows))`` (see ``_packed_batch_hook``).
    """
    register()
    name = implementation_name(backend)
    model.set_attn_implementation(name)
    if not getattr(model, "_packer_hook", False):
        model.register_forward_pre_hook(_packed_batch_hook, with_kwargs=True)
        model._packer_hook = True
    return name


# Keys of a collated batch that are packer's bookkeeping, never model inputs.
_BATCH_ONLY = ("cu_seqlens", "max_seqlen", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
               "node_offsets", "node_parents", "num_loss_tokens", "example_ids", "image_offsets", "packer_state")


def _packed_batch_hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook: ``model(**collate(rows))`` becomes ``model(**model_inputs(batch))``.

    A raw collated batch carries `cu_seqlens` / `max_seqlen`, which a transformers vision tower would pop as
    its *own* precomputed boundaries (silently wrong), and tree rows' `labels`, which the model's shifted
    loss would get wrong. So the hook moves the boundaries into ``packer_layout``, keeps labels only for
    linear rows (where ``shift_labels`` makes HF's loss exact), and leaves every other kwarg as given.
    """
    if LAYOUT_KWARG in kwargs or "cu_seqlens" not in kwargs or "node_parents" not in kwargs:
        return args, kwargs  # not a packer batch, or already converted
    layout = PackedLayout.from_batch(kwargs)
    out = {k: v for k, v in kwargs.items() if k not in _BATCH_ONLY}
    if not layout.is_linear or "shift_labels" not in kwargs:
        out.pop("labels", None)
        out.pop("shift_labels", None)
    out.setdefault("use_cache", False)
    out[LAYOUT_KWARG] = layout
    return args, out



def model_inputs(
    batch: Mapping[str, Any],
    *,
    with_labels: bool = False,
    bidirectional_spans: Any = None,
) -> dict[str, Any]:
    """The kwargs of ``model(**kwargs)`` for a collated packed batch.

    Keeps the model's inputs (input_ids, position_ids, images), sets ``use_cache=False``, and adds the row's
    ``PackedLayout`` under ``packer_layout``; transformers forwards it untouched to every attention call.
    With ``with_labels=True`` (linear packs only) ``labels`` and ``shift_labels`` are kept so the model's own
    loss is exact. Other keys (boundaries, counts, provenance) are dropped: a vision tower would read
    ``cu_seqlens`` / ``max_seqlen`` as its own.
    """
    layout = PackedLayout.from_batch(batch, bidirectional_spans=bidirectional_spans)
    # What the model takes (the model families' forward keys). Everything else stays out: targets and
    # bookkeeping (the loss is computed outside), and the boundary keys, which a vision tower would pop as its
    # own precomputed `cu_seqlens` / `max_seqlen` (transformers' vision_utils); they travel as packer_layout.
    out: dict[str, Any] = {k: batch[k] for k in forward_keys() if batch.get(k) is not None}
    out["use_cache"] = False
    out[LAYOUT_KWARG] = layout
    if with_labels:
        if "shift_labels" not in batch or not layout.is_linear:
            raise ConfigError(
                "with_labels=True needs a linear pack with 'shift_labels'; a tree row needs "
                "packer.train.loss.packed_cross_entropy (a parent's last logit feeds several targets)"
            )
        out["labels"] = batch["labels"]
        out["shift_labels"] = batch["shift_labels"]
    return out


def image_spans(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(S, 2) [start, end) of every run of ``image_token_id`` (one image each, as Qwen2-VL lays them out):
    the bidirectional spans of a Molmo-style model."""
    ids = input_ids.reshape(-1)
    is_img = (ids == image_token_id).to(torch.int8)
    edges = torch.diff(is_img, prepend=is_img.new_zeros(1), append=is_img.new_zeros(1))  # (T+1,)
    starts = (edges == 1).nonzero().reshape(-1)
    ends = (edges == -1).nonzero().reshape(-1)
    return torch.stack([starts, ends], dim=1)
