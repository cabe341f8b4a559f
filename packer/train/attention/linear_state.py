"""Linear-state layers (linear attention, SSM mixers) on packed rows and message trees, by state forking.

A full-attention layer is made exact on a packed row by its mask (``packer.train.attention.backends``). A layer with a
*state* — a causal conv's window of the last K-1 inputs and a recurrent state carried token to token (Qwen3.5's
Gated DeltaNet, Mamba-2) — has no mask: run over a packed row as one sequence, the state flows straight across
every example boundary (measured on a tiny ``Qwen3_5ForCausalLM``: the second example's logits off by 0.31).
Here every such layer runs over the row's *tree* instead:

    row:    | P P P | a a | b b b | Q Q |       example 0: node 0 (P) with branches 1 (a) and 2 (b)
    parent:   -1      0     0      -1           example 1: node 3 (Q)

    conv:   each token's window is the K-1 tokens before it on its root-to-leaf path:
            a's first token sees P P P (not b), b's first token sees P P P (not a a), Q's first sees zeros
    state:  node 0 starts from zero, nodes 1 and 2 both start from node 0's END state (forked, not chained:
            b never sees a), node 3 starts from zero

Both come from the row's ``PackedLayout`` (``cu_seqlens`` / ``node_offsets`` / ``node_parents``), never from
positions. The conv is a gather: lag j of token t is the predecessor along its path applied j times
(``PackedLayout.predecessors``, the same index the tree loss uses), so the window of a branch's first tokens
reaches into its parent and never into a sibling. The recurrence is a chunked scan over a *tree of chunks*:
each node is cut into chunks of C tokens (padded at its end: a padded token has zero key, zero value and zero
log-decay, so it leaves the state as it was), a node's first chunk follows its parent's LAST chunk, the others
follow the chunk before them. Chunks at the same depth of that tree run as one batch (``ChunkSchedule``), so
the sequential steps are the longest path's chunk count, as for one example alone, whatever the number of
examples and branches in the row.

A layer kind plugs in as a ``LinearStateAdapter`` (the module classes it handles, and its packed forward built
from ``tree_causal_conv`` and ``tree_chunk_scan``): ``GatedDeltaNetAdapter`` (Qwen3.5, dense and MoE) and
``Mamba2Adapter`` (the Mamba-2 mixers of Granite-4.0-H, Nemotron-H and Bamba) today. ``install(model)`` (called by
``packer.train.attention.hf.use_packed_attention``) wraps the forward of every module an adapter knows; the wrapped
forward takes the packed path when a ``packer_layout`` reaches it and is the module's own forward otherwise. A
stateful model with a mixer packer does not know is refused there, by name: never silently wrong.

Kernels: plain torch on every device (the reference, and what CPU tests and small runs use); on CUDA with
``flash-linear-attention`` installed, the gated delta rule runs fla's varlen chunk kernel once per tree depth
(nodes of one depth as varlen sequences, each with its parent's end state as ``initial_state``).
"""

from __future__ import annotations

import importlib.util
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packer.core import tree
from packer.errors import ConfigError
from packer.train.attention.layout import PackedLayout
from packer.train.keys import LAYOUT_KWARG

CHUNK = 64  # the chunk of transformers' torch_chunk_gated_delta_rule (and fla's): changes rounding, not maths


# --------------------------------------------------------------------------------------------------------
# Tree primitives, shared by every adapter


def conv_lags(layout: PackedLayout, kernel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(K, T) long: row position of the token j steps back on each token's root-to-leaf path (j = 0 .. K-1;
    lag 0 is the token itself), T where the path has fewer than j tokens before it (a zero input).

    Cached on the layout per kernel size and device: every conv layer of a forward pass shares it.
    """

    def build() -> torch.Tensor:
        pred = layout.predecessors()  # (T,) -1 at an example start
        T = layout.num_tokens
        pred_ext = torch.cat([pred, torch.tensor([-1])])  # (T+1,) the missing token's predecessor is missing
        pred_ext = torch.where(pred_ext < 0, T, pred_ext)
        lags = [torch.arange(T)]
        for _ in range(kernel - 1):
            lags.append(pred_ext[lags[-1]])  # (T,) one more step back along the path
        return torch.stack(lags).to(device)  # (K, T)

    return layout._cached(("conv_lags", kernel, str(torch.device(device))), build)


def conv_plan(layout: PackedLayout, kernel: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """How ``tree_causal_conv`` runs one plain conv over the row: (gather (T + N*(K-1),), keep (T,)) long.

    Each node is preceded by its own K-1 path predecessors (``conv_lags`` of its first token, oldest first; the
    zero row T where the path is shorter), so an unpadded conv over the gathered sequence gives every node
    token the window of its path; ``keep`` picks those outputs back in row order.

        | P P P | a a | b b b |  K = 3  ->  0 0 P P P | P P a a | P P b b b     (0: the zero row)
    """

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        offsets = layout.node_offsets.long()
        lengths = torch.from_numpy(tree.node_lengths(layout.num_tokens, offsets.numpy()))  # (N,)
        context = conv_lags(layout, kernel)[1:, offsets].flip(0).t()  # (N, K-1) oldest first
        seg = lengths + kernel - 1  # (N,) each node's gathered segment
        start = torch.cumsum(seg, 0) - seg  # (N,)
        gather = torch.empty(int(seg.sum()), dtype=torch.long)
        ctx_pos = start[:, None] + torch.arange(kernel - 1)  # (N, K-1)
        gather[ctx_pos.reshape(-1)] = context.reshape(-1)
        node = torch.repeat_interleave(torch.arange(len(offsets)), lengths)  # (T,)
        within = torch.arange(layout.num_tokens) - offsets[node]  # (T,)
        pos = start[node] + kernel - 1 + within  # (T,) each token's place in the gathered sequence
        gather[pos] = torch.arange(layout.num_tokens)
        return gather.to(device), (pos - (kernel - 1)).to(device)  # an unpadded conv's output o ends at o+K-1

    return layout._cached(("conv_plan", kernel, str(torch.device(device))), build)


def tree_causal_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: PackedLayout, activation=None
) -> torch.Tensor:
    """A depthwise causal conv along every root-to-leaf path of the row, then ``activation`` (None: none).

    Args:
        x: (T, C) the conv's inputs in row order.
        weight: (C, K) depthwise kernel, as ``nn.Conv1d(C, C, K, groups=C).weight[:, 0]``: ``weight[:, K-1]``
            multiplies the token itself, ``weight[:, K-1-j]`` the token j steps back on its path.
        bias: (C,) or None.
    Returns:
        (T, C): what ``F.conv1d(..., padding=K-1)[..., :L]`` gives each path alone, at each token. One
        ``F.conv1d`` over the nodes, each behind its K-1 path predecessors (``conv_plan``): about the cost of
        the convs of each example alone (1.2x forward + backward on 8 examples, 2048 tokens, 2048 channels,
        one CPU thread), where summing K gathered shifted copies cost 5x.
    """
    K = weight.shape[-1]
    gather, keep = conv_plan(layout, K, x.device)
    x_ext = torch.cat([x, x.new_zeros(1, x.shape[1])])  # (T+1, C) row T is the zero before a path
    xs = x_ext.t().index_select(1, gather)[None]  # (1, C, T + N*(K-1)) channels-first, contiguous: conv1d's fast layout
    out = F.conv1d(xs, weight.to(x.dtype)[:, None, :], None if bias is None else bias.to(x.dtype),
                   groups=x.shape[1])[0]  # (C, T + N*(K-1) - K + 1)
    out = out.index_select(1, keep)  # (C, T)
    return (out if activation is None else activation(out)).t()  # (T, C); the activation on conv1d's layout


@dataclass(frozen=True)
class ChunkSchedule:
    """How a row's tokens become chunks of a chunked scan over its trees, and the order the chunks run in.

    Node n of L tokens owns ceil(L / C) chunks; token i of node n sits in slot ``(first_chunk[n] + i // C) * C
    + i % C`` of the padded (M * C) layout. A chunk's predecessor is the chunk before it in its node, or its
    parent node's last chunk (a node's first chunk), or none (an example's first chunk). Chunks are sorted by
    depth in that chunk tree (``perm``): the chunks of level l are ``perm[bounds[l]:bounds[l+1]]``, and each
    reads its initial state from row ``pred_rows[l][i]`` of level l-1's end states (level 0 starts from zero).

        row: | P P P P P | a a | b |  C = 2        chunks: P0 P1 P2 | a0 | b0     levels: 0: P0, 1: P1,
        parents: -1        0     0                 preds:  - P0 P1  | P2 | P2             2: P2, 3: a0 b0
    """

    chunk: int
    num_chunks: int
    """M, the number of chunks."""
    slot: torch.Tensor
    """(T,) long: each token's slot in the padded (M * C) layout, chunks in LEVEL order (``perm``)."""
    perm: torch.Tensor
    """(M,) long: chunk ids in level order."""
    inverse: torch.Tensor
    """(M,) long: the position of each chunk in ``perm``."""
    bounds: list[int]
    """Level l is ``perm[bounds[l]:bounds[l+1]]``."""
    pred_rows: list[torch.Tensor]
    """Level l >= 1: (n_l,) long row of each chunk's predecessor among level l-1's chunks (index 0 is empty)."""


def chunk_schedule(layout: PackedLayout, chunk: int = CHUNK, device: torch.device | str = "cpu") -> ChunkSchedule:
    """The ``ChunkSchedule`` of ``layout`` in chunks of ``chunk`` tokens, cached on the layout per device."""

    def build() -> ChunkSchedule:
        dev = torch.device(device)
        offsets = layout.node_offsets.numpy().astype(np.int64)
        parents = layout.node_parents.numpy().astype(np.int64)
        lengths = tree.node_lengths(layout.num_tokens, offsets)  # (N,) >= 1: the layout drops empty nodes
        n_chunks = -(-lengths // chunk)  # (N,)
        first = np.concatenate([[0], np.cumsum(n_chunks)[:-1]])  # (N,) each node's first chunk
        M = int(n_chunks.sum())
        within = np.arange(layout.num_tokens) - np.repeat(offsets, lengths)  # (T,) index inside its node
        token_chunk = np.repeat(first, lengths) + within // chunk  # (T,) first + i // C
        # Level of a node's first chunk: its parent's first level + the parent's chunk count (parents come first).
        start = np.zeros(len(offsets), dtype=np.int64)
        for n, p in enumerate(parents.tolist()):
            if p >= 0:
                start[n] = start[p] + n_chunks[p]
        node_of = np.repeat(np.arange(len(offsets)), n_chunks)  # (M,)
        k = np.arange(M) - first[node_of]  # (M,) chunk index inside its node
        level = start[node_of] + k  # (M,)
        pred = np.where(k > 0, np.arange(M) - 1,
                        np.where(parents[node_of] >= 0, first[np.maximum(parents[node_of], 0)]
                                 + n_chunks[np.maximum(parents[node_of], 0)] - 1, -1))  # (M,)
        perm = np.argsort(level, kind="stable")  # (M,) level order, row order inside a level
        counts = np.bincount(level)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        inverse = np.empty(M, dtype=np.int64)
        inverse[perm] = np.arange(M)
        row_in_level = inverse - bounds[level]  # (M,) each chunk's row among its level's chunks
        slot = inverse[token_chunk] * chunk + within % chunk  # (T,) in the level-ordered padded layout
        pred_rows = [torch.zeros(0, dtype=torch.long, device=dev)]
        for lv in range(1, len(counts)):
            ids = perm[bounds[lv]:bounds[lv + 1]]
            assert (pred[ids] >= 0).all(), "only an example's first chunk has no predecessor, at level 0"
            pred_rows.append(torch.from_numpy(row_in_level[pred[ids]]).to(dev))
        return ChunkSchedule(
            chunk=chunk, num_chunks=M, slot=torch.from_numpy(slot).to(dev), perm=torch.from_numpy(perm).to(dev),
            inverse=torch.from_numpy(inverse).to(dev), bounds=bounds.tolist(), pred_rows=pred_rows,
        )

    return layout._cached(("chunk_schedule", chunk, str(torch.device(device))), build)


def to_chunks(x: torch.Tensor, schedule: ChunkSchedule) -> torch.Tensor:
    """(T, H, ...) in row order -> (M, H, C, ...) padded chunks in level order (zeros after each node's end)."""
    M, C = schedule.num_chunks, schedule.chunk
    padded = x.new_zeros((M * C, *x.shape[1:])).index_copy(0, schedule.slot, x)  # (M*C, H, ...)
    return padded.reshape(M, C, *x.shape[1:]).movedim(1, 2)  # (M, H, C, ...)


def from_chunks(x: torch.Tensor, schedule: ChunkSchedule) -> torch.Tensor:
    """(M, H, C, ...) chunks in level order -> (T, H, ...) in row order (the padding dropped)."""
    flat = x.movedim(2, 1).reshape(-1, *x.shape[1:2], *x.shape[3:])  # (M*C, H, ...)
    return flat.index_select(0, schedule.slot)


def tree_chunk_scan(schedule: ChunkSchedule, step, zero_state: torch.Tensor) -> list[torch.Tensor]:
    """Run ``step`` over the chunk tree level by level; returns the outputs of every level, in level order.

    ``step(lv, state_in) -> (out, state_out)`` processes level ``lv``'s chunks (``perm[bounds[lv]:bounds[lv+1]]``;
    its per-chunk tensors pre-permuted to level order and split by ``level_sizes``, so that autograd sees one
    split, not a full-size zero gradient per level slice) from their initial states ``state_in`` (n, ...).
    Level 0 starts from ``zero_state`` (expanded); level l reads its predecessors' end states from level l-1.
    """
    outs = []
    state = None
    for lv, n in enumerate(level_sizes(schedule)):
        if lv == 0:
            state_in = zero_state.expand(n, *zero_state.shape)
        else:
            state_in = state.index_select(0, schedule.pred_rows[lv])  # forked: children share a parent's state
        out, state = step(lv, state_in)
        outs.append(out)
    return outs


def level_sizes(schedule: ChunkSchedule) -> list[int]:
    """Chunks per level (``torch.split`` sizes of a level-ordered per-chunk tensor)."""
    return [b - a for a, b in zip(schedule.bounds[:-1], schedule.bounds[1:], strict=True)]


# --------------------------------------------------------------------------------------------------------
# The gated delta rule (Qwen3.5, Qwen3-Next): transformers' torch_chunk_gated_delta_rule over the chunk tree


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """transformers' (and fla's) l2norm: x / sqrt(sum(x^2) + eps)."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def tree_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    layout: PackedLayout,
    *,
    use_qk_l2norm: bool = True,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """The gated delta rule over every root-to-leaf path of the row, in plain torch (any device).

    The maths of transformers' ``torch_chunk_gated_delta_rule`` (same ops, same fp32), with the chunks of
    ``chunk_schedule``: each example starts from a zero state, each branch from its parent's end state.

    Args:
        q, k: (T, Hk, Dk). v: (T, Hv, Dv), Hv a multiple of Hk (each q/k head serves Hv/Hk value heads).
        g: (T, Hv) log-decay (<= 0). beta: (T, Hv) write strength.
    Returns:
        (T, Hv, Dv) in q's dtype.
    """
    dtype = q.dtype
    Hk, Hv = k.shape[1], v.shape[1]
    if Hk != Hv:
        q, k = q.repeat_interleave(Hv // Hk, dim=1), k.repeat_interleave(Hv // Hk, dim=1)  # (T, Hv, Dk)
    work = torch.promote_types(dtype, torch.float32)  # fp32 as transformers (fp64 stays fp64: the tests' exact check)
    q, k, v, g, beta = (x.to(work) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * q.shape[-1] ** -0.5
    sched = chunk_schedule(layout, chunk, q.device)
    # Per-chunk tensors in LEVEL order (a level is then a slice): (M, H, C, D), (M, H, C).
    q, k, v, g, beta = (to_chunks(x, sched) for x in (q, k, v, g, beta))  # level order: a level is a split
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]  # (M, H, C, D)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    cum = g.cumsum(-1)  # (M, H, C) log of the decay from the chunk start to each position
    pairwise = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (M, H, C, C)
    ut = (k_beta @ k.transpose(-1, -2)) * pairwise  # (M, H, C, C)
    intra = (q @ k.transpose(-1, -2)) * pairwise  # (M, H, C, C)
    u = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)  # (M, H, C, Dv)
    w = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)  # Dk
    q_dec = q * cum.exp()[..., None]  # (M, H, C, Dk) reads the chunk's initial state
    k_dec = k * (cum[..., -1:] - cum).exp()[..., None]  # (M, H, C, Dk) writes, decayed to the chunk end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # (M, H, 1, 1)

    sizes = level_sizes(sched)
    u, w, q_dec, intra, k_dec, chunk_decay = (x.split(sizes) for x in (u, w, q_dec, intra, k_dec, chunk_decay))

    def step(lv: int, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v_new = u[lv] - w[lv] @ state  # (n, H, C, Dv) what the state does not predict yet
        out = q_dec[lv] @ state + intra[lv] @ v_new  # (n, H, C, Dv)
        return out, state * chunk_decay[lv] + k_dec[lv].transpose(-1, -2) @ v_new  # (n, H, Dk, Dv)

    zero = q.new_zeros(q.shape[1], q.shape[-1], v.shape[-1])  # (H, Dk, Dv)
    out = torch.cat(tree_chunk_scan(sched, step, zero))  # (M, H, C, Dv) level order
    return from_chunks(out, sched).to(dtype)  # (T, Hv, Dv)


def fla_available() -> bool:
    """flash-linear-attention is installed and a CUDA device is present."""
    return torch.cuda.is_available() and importlib.util.find_spec("fla") is not None


def fla_tree_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, layout: PackedLayout
) -> torch.Tensor:
    """``tree_gated_delta_rule`` on fla's varlen chunk kernel (CUDA): one call per tree depth, the nodes of that
    depth as varlen sequences, each starting from its parent's end state (fla's ``initial_state``, one per
    sequence), zero for the roots. Written against fla's ``chunk_gated_delta_rule(q, k, v, g, beta,
    initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)`` as transformers calls it; not
    run in packer's CI (no GPU): ``tests/train/attention/test_linear_state.py`` checks it against the torch path on CUDA.
    """
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    offsets = layout.node_offsets.numpy().astype(np.int64)
    parents = layout.node_parents.numpy().astype(np.int64)
    lengths = tree.node_lengths(layout.num_tokens, offsets)
    depth = np.zeros(len(offsets), dtype=np.int64)
    for n, p in enumerate(parents.tolist()):
        depth[n] = depth[p] + 1 if p >= 0 else 0
    out = v.new_zeros(v.shape)  # (T, Hv, Dv)
    final: dict[int, torch.Tensor] = {}  # node -> its end state (H, Dk, Dv)
    for d in range(int(depth.max()) + 1):
        nodes = np.flatnonzero(depth == d)
        index = torch.from_numpy(np.concatenate([np.arange(offsets[n], offsets[n] + lengths[n]) for n in nodes]))
        index = index.to(q.device)  # (T_d,)
        cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths[nodes])])).to(q.device, torch.int32)
        h0 = None
        if d > 0:
            h0 = torch.stack([final[int(parents[n])] for n in nodes])  # (N_d, H, Dk, Dv) forked parent states
        o, ht = chunk_gated_delta_rule(
            q[index][None], k[index][None], v[index][None], g=g[index][None], beta=beta[index][None],
            initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
        )  # (1, T_d, Hv, Dv), (N_d, Hv, Dk, Dv)
        out = out.index_copy(0, index, o[0].to(out.dtype))
        for i, n in enumerate(nodes.tolist()):
            final[n] = ht[i]
    return out


# --------------------------------------------------------------------------------------------------------
# Mamba-2's SSD (Granite-4.0-H, Nemotron-H, Bamba): transformers' torch mamba2_chunk_scan over the chunk tree


def tree_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    layout: PackedLayout,
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk: int = CHUNK,
) -> torch.Tensor:
    """Mamba-2's selective state space (SSD) over every root-to-leaf path of the row, in plain torch.

    Per head: dt = clamp(softplus(dt + dt_bias)); state S (P, N) <- exp(A dt) S + (dt x) B^T; y = S C + D x.
    The maths of transformers' ``mamba2_chunk_scan`` (fp32, dt softplus), with ``chunk_schedule``'s chunks:
    each example from a zero state, each branch from its parent's end state.

    Args:
        x: (T, H, P). dt: (T, H) before bias and softplus. A: (H,) negative. B, C: (T, G, N), H a multiple of G.
        D: (H,) skip, dt_bias: (H,). dt_limit: dt's clamp.
    Returns:
        (T, H, P) fp32 (as transformers' torch path).
    """
    H, G = x.shape[1], B.shape[1]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    dt = F.softplus(dt).clamp(min=dt_limit[0], max=dt_limit[1])  # (T, H)
    work = torch.promote_types(x.dtype, torch.float32)
    x = x.to(work)
    B, C = (t.to(work).repeat_interleave(H // G, dim=1) for t in (B, C))  # (T, H, N)
    skip = None if D is None else D[:, None].to(work) * x  # (T, H, P)
    xd, a = x * dt[..., None].to(work), A.to(work) * dt.to(work)  # (T, H, P), (T, H) log-decay per token
    sched = chunk_schedule(layout, chunk, x.device)
    xd, a, B, C = (to_chunks(t, sched) for t in (xd, a, B, C))  # (M, H, C, P), (M, H, C), (M, H, C, N) x 2
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).triu(1)
    cum = a.cumsum(-1)  # (M, H, C)
    L = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (M, H, C, C)
    y_diag = ((C @ B.transpose(-1, -2)) * L) @ xd  # (M, H, C, P) within the chunk
    writes = xd.transpose(-1, -2) @ (B * (cum[..., -1:] - cum).exp()[..., None])  # (M, H, P, N) to the chunk end
    c_dec = C * cum.exp()[..., None]  # (M, H, C, N) reads the chunk's initial state
    chunk_decay = cum[..., -1].exp()[..., None, None]  # (M, H, 1, 1)
    sizes = level_sizes(sched)
    y_diag, writes, c_dec, chunk_decay = (t.split(sizes) for t in (y_diag, writes, c_dec, chunk_decay))

    def step(lv: int, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = y_diag[lv] + c_dec[lv] @ state.transpose(-1, -2)  # (n, H, C, P)
        return out, state * chunk_decay[lv] + writes[lv]  # (n, H, P, N)

    zero = x.new_zeros(H, x.shape[-1], B.shape[-1])  # (H, P, N)
    y = from_chunks(torch.cat(tree_chunk_scan(sched, step, zero)), sched)  # (T, H, P)
    return y if skip is None else y + skip


# --------------------------------------------------------------------------------------------------------
# Adapters: one per layer kind


class LinearStateAdapter:
    """How packer runs one kind of linear-state layer over a packed row's trees.

    ``classes``: the transformers module class names it handles. ``forward(module, hidden_states, layout,
    **kwargs)`` returns what the module's own forward returns for each root-to-leaf path alone, packed: built
    from ``tree_causal_conv`` (a conv window along each path) and ``tree_chunk_scan`` / the fla kernels (a
    recurrent state forked at each branch), as ``GatedDeltaNetAdapter`` and ``Mamba2Adapter`` are.
    """

    classes: tuple[str, ...] = ()

    def forward(self, module: torch.nn.Module, hidden_states: torch.Tensor, layout: PackedLayout,
                **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError


class GatedDeltaNetAdapter(LinearStateAdapter):
    """Qwen3.5's (and Qwen3.5-MoE's) ``Qwen3_5GatedDeltaNet``: in_proj_qkv -> causal conv (kernel 4) + SiLU ->
    q, k, v; in_proj_b -> beta = sigmoid; in_proj_a -> g = -exp(A_log) * softplus(a + dt_bias); gated delta
    rule with q/k l2-normalized; gated RMSNorm with in_proj_z; out_proj. transformers 5.23.0's forward
    (modeling_qwen3_5.py:545-656) without a cache, on the tree."""

    classes = ("Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")

    def forward(self, module, hidden_states, layout, **kwargs):
        from transformers.activations import ACT2FN

        T = hidden_states.shape[1]
        mixed = module.in_proj_qkv(hidden_states)[0]  # (T, 2*Dk*Hk + Dv*Hv)
        z = module.in_proj_z(hidden_states)  # (1, T, Hv*Dv)
        b = module.in_proj_b(hidden_states)[0]  # (T, Hv)
        a = module.in_proj_a(hidden_states)[0]  # (T, Hv)
        weight = module.conv1d.weight[:, 0]  # (C, K)
        mixed = tree_causal_conv(mixed, weight, module.conv1d.bias, layout, ACT2FN[module.activation])  # (T, C)
        q, k, v = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
        q = q.reshape(T, -1, module.head_k_dim)  # (T, Hk, Dk)
        k = k.reshape(T, -1, module.head_k_dim)  # (T, Hk, Dk)
        v = v.reshape(T, -1, module.head_v_dim)  # (T, Hv, Dv)
        beta = b.sigmoid()  # (T, Hv)
        g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)  # (T, Hv)
        if hidden_states.device.type == "cuda" and fla_available():
            core = fla_tree_gated_delta_rule(q, k, v, g, beta, layout)
        else:
            core = tree_gated_delta_rule(q, k, v, g, beta, layout, use_qk_l2norm=True)  # (T, Hv, Dv)
        core = module.norm(core.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))  # (T*Hv, Dv)
        return module.out_proj(core.reshape(1, T, -1))  # (1, T, hidden)


class Mamba2Adapter(LinearStateAdapter):
    """Mamba-2 mixers as transformers 5.23.0 writes them for Granite-4.0-H (``GraniteMoeHybridMambaLayer``),
    Nemotron-H (``NemotronHMamba2Mixer``) and Bamba (``BambaMixer``), whose forwards are the same code:
    in_proj -> gate | xBC | dt; causal conv (kernel 4) + SiLU over xBC -> x, B, C; SSD with A = -exp(A_log), D,
    dt_bias, softplus, dt clamped to ``time_step_limit``; grouped gated RMSNorm with the gate; out_proj."""

    classes = ("GraniteMoeHybridMambaLayer", "NemotronHMamba2Mixer", "BambaMixer")

    def forward(self, module, hidden_states, layout, **kwargs):
        from transformers.activations import ACT2FN

        T, dtype = hidden_states.shape[1], hidden_states.dtype
        gate, xbc, dt = module.in_proj(hidden_states)[0].split(
            [module.intermediate_size, module.conv_dim, module.num_heads], dim=-1)  # (T, I), (T, conv), (T, H)
        xbc = tree_causal_conv(xbc, module.conv1d.weight[:, 0], module.conv1d.bias, layout,
                               ACT2FN[module.activation])  # (T, conv)
        gn = module.n_groups * module.ssm_state_size
        x, B, C = torch.split(xbc, [module.intermediate_size, gn, gn], dim=-1)
        y = tree_ssd(
            x.reshape(T, module.num_heads, module.head_dim), dt, -torch.exp(module.A_log.float()),
            B.reshape(T, module.n_groups, -1), C.reshape(T, module.n_groups, -1), layout,
            D=module.D, dt_bias=module.dt_bias, dt_limit=tuple(module.time_step_limit),
        )  # (T, H, P)
        y = module.norm(y.reshape(1, T, -1), gate[None])  # (1, T, I)
        return module.out_proj(y.to(dtype))  # (1, T, hidden)


ADAPTERS: dict[str, LinearStateAdapter] = {}


def register_adapter(adapter: LinearStateAdapter) -> LinearStateAdapter:
    """Make packer run every module whose class name is in ``adapter.classes`` through ``adapter``."""
    for name in adapter.classes:
        ADAPTERS[name] = adapter
    return adapter


register_adapter(GatedDeltaNetAdapter())
register_adapter(Mamba2Adapter())

# Class-name fragments of token mixers that carry state across tokens (transformers 5.23's hybrids: Mamba,
# Mamba-2, Gated DeltaNet, Kimi Delta Attention, LFM2's short conv, RWKV, xLSTM, RecurrentGemma, Lightning
# attention, ...). A module matching one that no adapter handles is refused by ``install``.
STATEFUL_HINTS = ("Mamba", "Mixer", "DeltaNet", "DeltaAttention", "LinearAttention", "ShortConv", "Rwkv",
                  "RecurrentBlock", "Rglru", "Lightning", "mLSTM", "sLSTM", "Ssm", "SSM")


def _packed_forward(self: torch.nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """The forward ``install`` puts on a linear-state module: packer's tree path when a layout rides in the
    kwargs, the module's own forward otherwise (generation, unpacked batches)."""
    layout = kwargs.get(LAYOUT_KWARG)
    if layout is None:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    cache = kwargs.get("cache_params", args[0] if args else None)
    if cache is not None:
        raise ConfigError(f"{type(self).__name__}: a packed row trains without a cache; pass use_cache=False "
                          "(packer.train.attention.hf.model_inputs does)")
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if isinstance(mask, torch.Tensor):
        raise ConfigError(f"{type(self).__name__}: pass packer boundaries or an attention_mask, not both")
    if hidden_states.shape[0] != 1 or hidden_states.shape[1] != layout.num_tokens:
        raise ConfigError(f"{type(self).__name__}: a packed row is one (1, {layout.num_tokens}) sequence, got "
                          f"hidden states {tuple(hidden_states.shape)}")
    return ADAPTERS[type(self).__name__].forward(self, hidden_states, layout, **kwargs)


def install(model: torch.nn.Module) -> list[str]:
    """Route every linear-state module of ``model`` that an adapter knows through packer's tree path; refuse a
    model with a stateful mixer no adapter knows (``ConfigError`` naming its class). Idempotent. Returns the
    names of the modules routed.

    Detection: a module whose class is in ``ADAPTERS`` is routed; a module whose class name holds one of
    ``STATEFUL_HINTS`` and is not, or a model that says it is stateful (transformers' ``_is_stateful``) with
    no routed module, is refused.
    """
    routed, unknown = [], []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls in ADAPTERS:
            if not isinstance(module.__dict__.get("forward"), types.MethodType):
                module.forward = types.MethodType(_packed_forward, module)  # deepcopy rebinds a bound method
            routed.append(name)
        elif any(h in cls for h in STATEFUL_HINTS):
            unknown.append(f"{name} ({cls})")
    if unknown:
        raise ConfigError(
            f"packer cannot keep the recurrent state of {sorted(set(u.split(' (')[1][:-1] for u in unknown))} apart "
            f"on packed rows (modules {unknown[:4]}{' ...' if len(unknown) > 4 else ''}): running it over a packed "
            f"row would carry one example's state into the next. Packer forks the state of "
            f"{sorted(ADAPTERS)} (packer.train.attention.linear_state); train this model unpacked"
        )
    stateful = [type(m).__name__ for m in model.modules() if getattr(type(m), "_is_stateful", False)]
    if stateful and not routed:
        raise ConfigError(
            f"{stateful[0]} is a stateful model (a recurrent or linear-attention layer) but packer knows none of "
            f"its layers: packed rows would leak state across examples. Packer forks the state of "
            f"{sorted(ADAPTERS)} (packer.train.attention.linear_state)"
        )
    return routed
