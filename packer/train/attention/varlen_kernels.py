"""Varlen attention as a raw forward/backward pair that exposes the log-sum-exp, over three kernels: flash-attn's,
PyTorch's (``torch.nn.attention.varlen``) and a plain-torch reference that runs on any device in any dtype.

``packer.train.attention.spans`` merges two varlen calls by their LSEs. The public autograd of both CUDA kernels
drops the LSE's gradient, so the merge runs each kernel's backward itself, handing it the *merged* output and
LSE (the ring-attention identity, derived there). Hence the raw pair, one interface for all three:

    out, lse, state = kernel.forward(q, k, v, plan, scale=s, window=(-1, 0))    # (Tq, H, D), (H, Tq) fp32
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, plan, scale=s, window=(-1, 0), state=state)

q (Tq, H, D) and k, v (Tk, Hkv, D) are the plan's gathered rows (``VarlenPlan``: segment s runs queries
``bounds_q[s]:bounds_q[s+1]`` against keys ``bounds_k[s]:bounds_k[s+1]``); H a multiple of Hkv (GQA: query
head h reads kv head h // (H / Hkv)). ``window = (left, right)`` as flash-attn spells it, aligned bottom-right:
query a of a segment sees key b iff ``a + lk - lq - left <= b <= a + lk - lq + right`` (-1: unbounded), so
(-1, 0) is causal and (0, -1) is "key at or after the query" on a square segment. ``backward`` returns this
call's share of the gradient of whatever softmax ``out`` and ``lse`` are the result of: with this call alone
that is the call's own gradient. Every row of a plan packer builds sees at least one key.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from packer.errors import ConfigError
from packer.train.attention.layout import VarlenPlan

Window = tuple[int, int]


class VarlenKernel(Protocol):
    name: str

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: VarlenPlan, *, scale: float,
                window: Window) -> tuple[torch.Tensor, torch.Tensor, Any]: ...

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, plan: VarlenPlan, *, scale: float, window: Window,
                 state: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def window_mask(lq: int, lk: int, window: Window, device: torch.device | str = "cpu") -> torch.Tensor:
    """(lq, lk) bool: query a sees key b under ``window`` (bottom-right aligned, see the module docstring).

        window_mask(2, 3, (-1, 0))  ->  [[1, 1, 0],      window_mask(3, 3, (0, -1))  ->  [[1, 1, 1],
                                         [1, 1, 1]]                                      [0, 1, 1],
                                                                                         [0, 0, 1]]
    """
    a = torch.arange(lq, device=device)[:, None] + (lk - lq)  # (lq, 1) each query's diagonal key
    b = torch.arange(lk, device=device)[None, :]  # (1, lk)
    left, right = window
    mask = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= b >= a - left
    if right >= 0:
        mask &= b <= a + right
    return mask


class ReferenceKernel:
    """Plain torch, one segment at a time, explicit (H, lq, lk) scores: the CPU stand-in for the CUDA kernels and
    the check of the merge math (fp64 on CPU gives ~1e-15 against the dense mask). Accumulates in fp32 at least."""

    name = "reference"

    @staticmethod
    def _segment(q, k, v, plan: VarlenPlan, s: int, scale: float, window: Window):
        q0, q1, k0, k1 = plan.bounds_q[s], plan.bounds_q[s + 1], plan.bounds_k[s], plan.bounds_k[s + 1]
        acc = torch.promote_types(q.dtype, torch.float32)
        group = q.shape[1] // k.shape[1]
        qs = q[q0:q1].transpose(0, 1).to(acc)  # (H, lq, D)
        ks = k[k0:k1].repeat_interleave(group, dim=1).transpose(0, 1).to(acc)  # (H, lk, D)
        vs = v[k0:k1].repeat_interleave(group, dim=1).transpose(0, 1).to(acc)  # (H, lk, D)
        mask = window_mask(q1 - q0, k1 - k0, window, q.device)  # (lq, lk)
        scores = (qs @ ks.transpose(1, 2) * scale).masked_fill(~mask, float("-inf"))  # (H, lq, lk)
        return (q0, q1, k0, k1), qs, ks, vs, scores

    def forward(self, q, k, v, plan, *, scale, window):
        out = torch.empty_like(q)  # (Tq, H, D)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.promote_types(q.dtype, torch.float32),
                          device=q.device)  # (H, Tq)
        for s in range(len(plan.bounds_q) - 1):
            (q0, q1, _, _), _, _, vs, scores = self._segment(q, k, v, plan, s, scale, window)
            seg_lse = torch.logsumexp(scores, dim=-1)  # (H, lq)
            out[q0:q1] = (torch.exp(scores - seg_lse[..., None]) @ vs).transpose(0, 1).to(q.dtype)  # (lq, H, D)
            lse[:, q0:q1] = seg_lse
        return out, lse, None

    def backward(self, dout, q, k, v, out, lse, plan, *, scale, window, state):
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        hkv, group = k.shape[1], q.shape[1] // k.shape[1]
        for s in range(len(plan.bounds_q) - 1):
            (q0, q1, k0, k1), qs, ks, vs, scores = self._segment(q, k, v, plan, s, scale, window)
            acc = qs.dtype
            p = torch.exp(scores - lse[:, q0:q1, None].to(acc))  # (H, lq, lk) the probabilities of the full softmax
            do = dout[q0:q1].transpose(0, 1).to(acc)  # (H, lq, D)
            o = out[q0:q1].transpose(0, 1).to(acc)  # (H, lq, D)
            ds = p * (do @ vs.transpose(1, 2) - (do * o).sum(-1, keepdim=True))  # (H, lq, lk)
            dq[q0:q1] += (ds @ ks * scale).transpose(0, 1).to(dq.dtype)
            lk = k1 - k0
            dk_h = (ds.transpose(1, 2) @ qs * scale).reshape(hkv, group, lk, -1).sum(1)  # (Hkv, lk, D)
            dv_h = (p.transpose(1, 2) @ do).reshape(hkv, group, lk, -1).sum(1)  # (Hkv, lk, D)
            dk[k0:k1] += dk_h.transpose(0, 1).to(dk.dtype)
            dv[k0:k1] += dv_h.transpose(0, 1).to(dv.dtype)
        return dq, dk, dv


class TorchVarlenKernel:
    """``torch.nn.attention.varlen``'s custom ops (PyTorch's flash kernel); CUDA, fp16/bf16, no dropout.

    The ops are private and their schemas change between releases (torch 2.13 added ``enable_gqa``): arguments go
    by the installed schema's names, a sliding window the installed op cannot take is refused, and GQA without
    ``enable_gqa`` runs on kv heads repeated to the query heads, their gradients summed back per group.
    """

    name = "varlen"

    @staticmethod
    def _call(op, names: dict[str, Any]):
        schema = op.default._schema
        taken = {a.name for a in schema.arguments}
        missing = [a.name for a in schema.arguments if a.name not in names and not a.has_default_value()]
        if missing:
            raise ConfigError(f"this torch's {schema.name} needs {missing}, which packer does not know; "
                              "use backend 'flash' or 'sdpa'")
        return op(**{k: v for k, v in names.items() if k in taken})

    @staticmethod
    def _check_window(op, window) -> None:
        if tuple(window) not in ((-1, 0), (-1, -1)) and "window_size" not in {
                a.name for a in op.default._schema.arguments}:
            raise ConfigError("this torch's varlen_attn takes no window_size: a sliding-window layer needs "
                              "torch >= 2.11 with it, or backend 'flash' / 'sdpa'")

    @staticmethod
    def _native_gqa() -> bool:
        op = torch.ops.torch_attn._varlen_attn
        return "enable_gqa" in {a.name for a in op.default._schema.arguments}

    def forward(self, q, k, v, plan, *, scale, window):
        import torch.nn.attention.varlen  # noqa: F401  (registers torch.ops.torch_attn)

        op = torch.ops.torch_attn._varlen_attn
        self._check_window(op, window)
        gqa = q.shape[1] != k.shape[1]
        if gqa and not self._native_gqa():
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        out, lse, rng_state = self._call(op, dict(
            query=q, key=k, value=v, cu_seq_q=plan.cu_seqlens_q, cu_seq_k=plan.cu_seqlens_k,
            max_q=plan.max_seqlen_q, max_k=plan.max_seqlen_k, is_causal=tuple(window) == (-1, 0), scale=scale,
            window_size=list(window), enable_gqa=gqa,
        ))  # (Tq, H, D), (H, Tq) fp32
        return out, lse, rng_state

    def backward(self, dout, q, k, v, out, lse, plan, *, scale, window, state):
        op = torch.ops.torch_attn._varlen_attn_backward
        group = q.shape[1] // k.shape[1]
        if group > 1 and not self._native_gqa():
            k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        dq, dk, dv = self._call(op, dict(
            grad_out=dout.contiguous(), query=q, key=k, value=v, out=out.contiguous(), lse=lse.contiguous(),
            cu_seq_q=plan.cu_seqlens_q, cu_seq_k=plan.cu_seqlens_k, max_q=plan.max_seqlen_q,
            max_k=plan.max_seqlen_k, is_causal=tuple(window) == (-1, 0), rng_state=state, scale=scale,
            window_size=list(window),
        ))
        if dk.shape[1] != q.shape[1] // group:  # kv heads were repeated: each kv head's gradient is its group's sum
            dk, dv = (x.unflatten(1, (-1, group)).sum(2) for x in (dk, dv))
        return dq, dk, dv


def _pad8(*xs: torch.Tensor) -> list[torch.Tensor]:
    """flash-attn takes head dims in multiples of 8 (its own varlen_func pads the same way)."""
    d = xs[0].shape[-1]
    return list(xs) if d % 8 == 0 else [F.pad(x, [0, 8 - d % 8]) for x in xs]


class FlashKernel:
    """flash-attn's ``_flash_attn_varlen_forward`` / ``_backward`` (>= 2.7, the ones its autograd runs); CUDA,
    fp16/bf16, no dropout (the merge replays no dropout pattern)."""

    name = "flash"

    @staticmethod
    def _ops():
        from flash_attn import flash_attn_interface as fa

        fwd = getattr(fa, "_flash_attn_varlen_forward", None)
        if fwd is None or "window_size_left" not in inspect.signature(fwd).parameters:
            raise ConfigError("bidirectional spans on backend 'flash' need flash-attn >= 2.7 (its raw varlen "
                              "forward/backward pair); upgrade it, or use backend 'varlen' or 'flex'")
        return fwd, fa._flash_attn_varlen_backward

    def forward(self, q, k, v, plan, *, scale, window):
        fwd, _ = self._ops()
        d = q.shape[-1]
        qp, kp, vp = _pad8(q, k, v)
        out, lse, _, rng_state = fwd(
            qp, kp, vp, plan.cu_seqlens_q, plan.cu_seqlens_k, plan.max_seqlen_q, plan.max_seqlen_k,
            dropout_p=0.0, softmax_scale=scale, causal=tuple(window) == (-1, 0),
            window_size_left=window[0], window_size_right=window[1],
        )  # (Tq, H, Dp), (H, Tq) fp32
        return out[..., :d], lse, rng_state

    def backward(self, dout, q, k, v, out, lse, plan, *, scale, window, state):
        _, bwd = self._ops()
        d = q.shape[-1]
        dop, qp, kp, vp, op = _pad8(dout.contiguous(), q, k, v, out.contiguous())
        dq, dk, dv = torch.empty_like(qp), torch.empty_like(kp), torch.empty_like(vp)
        bwd(
            dop, qp, kp, vp, op, lse.contiguous(), dq, dk, dv, plan.cu_seqlens_q, plan.cu_seqlens_k,
            plan.max_seqlen_q, plan.max_seqlen_k, dropout_p=0.0, softmax_scale=scale,
            causal=tuple(window) == (-1, 0), window_size_left=window[0], window_size_right=window[1],
            softcap=0.0, alibi_slopes=None, deterministic=False, rng_state=state,
        )
        return dq[..., :d], dk[..., :d], dv[..., :d]


KERNELS: dict[str, VarlenKernel] = {k.name: k for k in (ReferenceKernel(), TorchVarlenKernel(), FlashKernel())}
