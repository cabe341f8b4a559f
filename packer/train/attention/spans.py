"""Bidirectional spans on the varlen kernels: the causal call as before, a second call over the spans, merged by
their log-sum-exps. Exact in value and gradient on flash-attn, torch varlen and the plain-torch reference.

The mask. Query i sees C(i), its causal tree keys (own or ancestor node, j <= i); inside a span [a, b) (one
image) it also sees the whole span. A span lies inside one node, so [a, i] is already in C(i) and

    visible(i) = C(i) ⊔ B(i),    B(i) = {j : i < j < b}    (disjoint; B(i) = ∅ outside spans)

Call 1 runs C: the layout's ``varlen_plan``, unchanged (trees included: a node's keys are its ancestors' tokens
and its own). Call 2 runs B: ``span_plan``, per span the queries a .. b-2 against the keys a+1 .. b-1 with window
(0, -1), "key at or after the query" on that shifted square, i.e. j > i. A span's last token has B = ∅.

    span [1, 5) of | t i i i i t |:   call 1 (causal)        call 2 (queries 1..3, keys 2..4)
                                        k: 0 1 2 3 4 5         k: 2 3 4
                                      q1   x x . . . .       q1   x x x
                                      q2   x x x . . .       q2   . x x
                                      q3   x x x x . .       q3   . . x
                                      q4   x x x x x .       (q4: nothing beyond call 1)

The merge. With s_ij = scale * q_i.k_j, call c returns o_c(i) = sum_{j in set_c} exp(s_ij - L_c(i)) v_j and
L_c(i) = log sum_{j in set_c} exp(s_ij). Over the disjoint union

    L = logaddexp(L1, L2),    o = exp(L1 - L) o1 + exp(L2 - L) o2

is the softmax over visible(i) exactly: no key is counted twice because C and B do not meet (the formulation
needs no subtraction). Rows outside call 2 keep (o1, L1).

The gradient. Both CUDA kernels' autograd drops dL, so ``_TwoCalls`` runs each kernel's backward itself, handing
both calls the merged o and L (ring attention's identity). A varlen backward recomputes P_ij = exp(s_ij - L(i))
and D_i = dO_i . o_i from the L and o it is given, then dS_ij = P_ij (dO_i . v_j - D_i), dq_i = scale sum_j
dS_ij k_j, dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dO_i. Given the merged L and o, P is the full
softmax restricted to the call's keys and D the full one, so each call returns exactly its keys' terms of the
full gradient, and the two add up to it (call 2's query and key gradients flow back through the gathers).

Cost: call 2 has n-1 queries and keys per n-token span (image tokens only); the merge touches those rows and one
(H, T) fp32 LSE; no (T, T) mask. Both plans are built once per batch (``PackedLayout`` caches them).
"""

from __future__ import annotations

import torch

from packer.errors import ConfigError
from packer.train.attention.layout import PackedLayout, VarlenPlan
from packer.train.attention.varlen_kernels import VarlenKernel

CAUSAL = (-1, 0)  # call 1: bottom-right causal, as the single-call path runs it
AFTER = (0, -1)  # call 2: key at or after the query's diagonal of a square segment


class _TwoCalls(torch.autograd.Function):
    """o = merge(call 1 over (q, k1, v1), call 2 over (q2, k2, v2)); the backward described in the module docstring."""

    @staticmethod
    def forward(ctx, q, k1, v1, q2, k2, v2, kernel: VarlenKernel, plan1: VarlenPlan, plan2: VarlenPlan,
                scale: float, window1: tuple[int, int]):
        o1, l1, st1 = kernel.forward(q, k1, v1, plan1, scale=scale, window=window1)  # (T, H, D), (H, T)
        o2, l2, st2 = kernel.forward(q2, k2, v2, plan2, scale=scale, window=AFTER)  # (T2, H, D), (H, T2)
        idx = plan2.q_index  # (T2,) row of each call-2 query
        l1s = l1[:, idx]  # (H, T2)
        lse = torch.logaddexp(l1s, l2)  # (H, T2)
        w1 = torch.exp(l1s - lse).T.unsqueeze(-1)  # (T2, H, 1)
        w2 = torch.exp(l2 - lse).T.unsqueeze(-1)  # (T2, H, 1)
        out = o1.clone()
        out[idx] = (w1 * o1[idx].to(w1.dtype) + w2 * o2.to(w1.dtype)).to(o1.dtype)  # (T2, H, D)
        lse_all = l1.clone()
        lse_all[:, idx] = lse  # (H, T)
        ctx.save_for_backward(q, k1, v1, q2, k2, v2, out, lse_all)
        ctx.kernel, ctx.plans, ctx.states, ctx.scale, ctx.window1 = kernel, (plan1, plan2), (st1, st2), scale, window1
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k1, v1, q2, k2, v2, out, lse_all = ctx.saved_tensors
        (plan1, plan2), (st1, st2), kernel = ctx.plans, ctx.states, ctx.kernel
        idx = plan2.q_index
        dq, dk1, dv1 = kernel.backward(dout, q, k1, v1, out, lse_all, plan1, scale=ctx.scale, window=ctx.window1,
                                       state=st1)
        dq2, dk2, dv2 = kernel.backward(dout[idx], q2, k2, v2, out[idx], lse_all[:, idx], plan2, scale=ctx.scale,
                                        window=AFTER, state=st2)
        return dq, dk1, dv1, dq2, dk2, dv2, None, None, None, None, None


def span_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PackedLayout, kernel: VarlenKernel,
                   *, scale: float, window: int | None = None) -> torch.Tensor:
    """Packed attention with ``layout``'s bidirectional spans on a varlen ``kernel``: (T, H, D) in q's dtype.

    q (T, H, D), k and v (T, Hkv, D) in a dtype the kernel takes; the layout has a ``span_plan`` (a span of two
    or more tokens). Differentiable in q, k, v. ``window`` (a sliding-window layer's, Gemma 3): call 1 keeps
    keys less than ``window`` path positions back (its segments are paths, so a bottom-right band); call 2's
    keys lie after their query, which a window never cuts (transformers' sliding_window_overlay bounds the past).
    """
    plan1, plan2 = layout.varlen_plan(q.device), layout.span_plan(q.device)
    if plan2 is None:
        raise ConfigError("span_attention needs a layout with a bidirectional span of two or more tokens")
    k1, v1 = (k, v) if plan1.k_index is None else (k.index_select(0, plan1.k_index), v.index_select(0, plan1.k_index))
    q2 = q.index_select(0, plan2.q_index)  # (T2, H, D)
    k2, v2 = k.index_select(0, plan2.k_index), v.index_select(0, plan2.k_index)  # (T2, Hkv, D)
    window1 = CAUSAL if window is None else (window - 1, 0)
    return _TwoCalls.apply(q, k1, v1, q2, k2, v2, kernel, plan1, plan2, scale, window1)
