"""Attention over packed rows: one call, several backends, explicit boundaries.

``packed_attention(q, k, v, layout, backend=...)`` runs the tree mask of a ``PackedLayout``
(``packer.train.attention.layout``, whose docstring draws the mask and the varlen plan). Backends (``BACKENDS``):

- ``flash``: flash-attn ``flash_attn_varlen_func`` on the varlen plan (CUDA, ``pip install packer[flash]``).
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` on the same plan (CUDA, in PyTorch itself).
- ``flex``: ``flex_attention`` with a BlockMask from the tree metadata; any mask incl. bidirectional image spans.
  torch 2.13 runs it on CPU forward-only (no CPU backward), so CPU training uses ``sdpa``/``sdpa_varlen``.
- ``sdpa``: SDPA with the explicit (T, T) boolean mask of ``build_attention_mask``: the reference.
- ``sdpa_varlen``: the varlen plan run as one SDPA call per segment, on any device. It checks the plan (the
  gather the CUDA kernels use) on CPU, and it is the fastest CPU backend: no (T, T) mask (measured in
  docs/training.md, "Backends").

Bidirectional image spans run on every backend: flex and sdpa put them in the mask; flash, varlen and
sdpa_varlen add a second varlen call over the spans and merge the two by their log-sum-exps
(``packer.train.attention.spans``; sdpa_varlen runs both calls on the plain-torch reference kernel of
``packer.train.attention.varlen_kernels``). No attention dropout with spans on those three.

Local layers count along each root-to-leaf path (positions, not row offsets; layout.py): a sliding window
(``window``, Gemma 3) on every backend; attention chunks (``chunk``, Llama 4) on every backend as well: sdpa and flex
put them in the mask, flash, varlen and sdpa_varlen run ``PackedLayout.chunk_plan`` (more segments, causal). Chunks
with bidirectional spans run on sdpa and flex only; the varlen backends refuse them (``ConfigError``).

For transformers, ``packer.train.attention.hf`` registers these backends in ``AttentionInterface``.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import warnings

import torch
import torch.nn.functional as F

from packer.errors import ConfigError, ShardError
from packer.train.attention.layout import PackedLayout, VarlenPlan
from packer.train.attention.spans import span_attention
from packer.train.attention.varlen_kernels import KERNELS
from packer.train.options import Backend, check, choices

BACKENDS = choices(Backend)[1:]  # the concrete ones: ("flash", "varlen", "flex", "sdpa", "sdpa_varlen")


# Inputs are varlen-shaped: q (T, H, D), k and v (T, Hkv, D); the output is (T, H, D).


def flash_available() -> bool:
    """flash-attn is installed and a CUDA device is present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def varlen_available() -> bool:
    """torch's varlen_attn can run: CUDA with PyTorch's flash kernels."""
    if not torch.cuda.is_available() or importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return False
    return bool(torch.backends.cuda.is_flash_attention_available())


def resolve_backend(backend: Backend, device: torch.device | str, *, bidirectional: bool = False) -> str:
    """Pick a concrete backend: "auto" -> flash, varlen, flex on CUDA; sdpa_varlen (sdpa with spans) on CPU."""
    if check("backend", backend, Backend) != "auto":
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


def _plan(layout: PackedLayout, device: torch.device, chunk: int | None) -> VarlenPlan:
    """The causal varlen plan of a layer: its nodes' segments, or for a chunked layer its (node, chunk) segments."""
    return layout.varlen_plan(device) if chunk is None else layout.chunk_plan(device, chunk)


def _varlen_args(q, k, v, layout: PackedLayout, chunk: int | None) -> tuple[tuple, torch.dtype]:
    """The positional arguments both varlen kernels take, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k), k and v gathered by the layer's plan and all three in the kernels' precision; and q's dtype."""
    plan = _plan(layout, q.device, chunk)
    kg, vg = _gather_kv(k, v, plan)
    qkv, dtype = _low_precision(q, kg, vg)
    return (*qkv, plan.cu_seqlens_q, plan.cu_seqlens_k, plan.max_seqlen_q, plan.max_seqlen_k), dtype


def _flash(q, k, v, layout: PackedLayout, scale: float, dropout: float, window: int | None,
           chunk: int | None) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    if layout.span_plan(q.device) is not None:
        return _two_calls(q, k, v, layout, scale, dropout, "flash", window, chunk)
    args, dtype = _varlen_args(q, k, v, layout, chunk)
    # causal=True is bottom-right aligned when seqlen_q != seqlen_k (flash-attn >= 2.1): a node's queries are
    # the last rows of its [ancestors ; node] key range. GQA: kv may have fewer heads than q.
    out = flash_attn_varlen_func(
        *args,
        dropout_p=dropout,
        softmax_scale=scale,
        causal=True,
        window_size=(-1, -1) if window is None else (window - 1, 0),  # segments are contiguous path positions
    )  # (T, H, D)
    return out.to(dtype)


def _varlen(q, k, v, layout: PackedLayout, scale: float, dropout: float, window: int | None,
            chunk: int | None) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    if dropout:
        raise ConfigError("backend 'varlen' has no attention dropout (torch hardcodes 0); use 'flash' or 'sdpa'")
    if layout.span_plan(q.device) is not None:
        return _two_calls(q, k, v, layout, scale, dropout, "varlen", window, chunk)
    args, dtype = _varlen_args(q, k, v, layout, chunk)
    gqa = {}
    if q.shape[1] != k.shape[1]:
        if _takes_enable_gqa(varlen_attn):
            gqa = {"enable_gqa": True}
        else:  # torch < 2.13 has no enable_gqa: query head h reads kv head h // (Hq / Hkv), as GQA defines it
            group = q.shape[1] // k.shape[1]
            args = (args[0], args[1].repeat_interleave(group, dim=1), args[2].repeat_interleave(group, dim=1),
                    *args[3:])
    # window_size=(-1, 0) is how varlen_attn spells causal; PyTorch's flash kernel aligns it bottom-right.
    out = varlen_attn(*args, scale=scale, window_size=(-1 if window is None else window - 1, 0), **gqa)  # (T, H, D)
    return out.to(dtype)


@functools.cache
def _takes_enable_gqa(fn) -> bool:
    return "enable_gqa" in inspect.signature(fn).parameters


_COMPILED_FLEX = None


def flex_padding(num_tokens: int, num_nodes: int) -> tuple[int, int]:
    """The static shape a CUDA flex call runs at: tokens and tree nodes rounded up to powers of two.

    ``torch.compile(flex_attention, dynamic=True)`` fails to lower on CUDA (pytorch/pytorch#147756: inductor's
    NoValidChoicesError, seen on an H200 with torch 2.11), so flex is compiled with static shapes; rounding them
    up bounds the recompiles to a few per run, and the block mask skips the padding's blocks.
    """
    return max(128, 1 << (num_tokens - 1).bit_length()), max(16, 1 << num_nodes.bit_length())


def _flex(q, k, v, layout: PackedLayout, scale: float, dropout: float, window: int | None,
          chunk: int | None) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED_FLEX
    if dropout:
        raise ConfigError("backend 'flex' has no attention dropout; set attention_dropout=0 or use 'sdpa'")
    gqa = q.shape[1] != k.shape[1]
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, H, T, D)
    if q.device.type == "cpu":
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ConfigError(
                "backend 'flex' cannot train on CPU: torch 2.13's flex_attention has no CPU backward. "
                "Use backend='sdpa' or 'sdpa_varlen' on CPU (flex works on CPU under torch.no_grad)"
            )
        qh, kh, vh = qh.detach(), kh.detach(), vh.detach()  # torch refuses requires_grad leaves even under no_grad
        with warnings.catch_warnings():
            # On CPU the unfused path is deliberate (inductor's CPU flex kernel has no backward either).
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = flex_attention(qh, kh, vh, block_mask=layout.block_mask(q.device, window, chunk), scale=scale,
                                 enable_gqa=gqa)
        return out[0].transpose(0, 1)  # (T, H, D)
    if _COMPILED_FLEX is None:  # the fused kernel; eager flex materializes the full score matrix
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    qh, kh, vh, pad, scale = flex_static_inputs(qh, kh, vh, layout, scale)
    out = _COMPILED_FLEX(qh, kh, vh, block_mask=layout.block_mask(q.device, window, chunk, pad), scale=scale,
                         enable_gqa=gqa)
    return out[0, :, : layout.num_tokens, : q.shape[-1]].transpose(0, 1)  # (T, H, D)


def flex_static_inputs(qh, kh, vh, layout: PackedLayout, scale: float | None):
    """(1, H, T, D) inputs at the static shape CUDA flex runs (``flex_padding``), and the scale to pass.

    Rows are zero-padded to P tokens (the padded mask isolates them). Head dims under 16 are zero-padded to 16,
    the smallest inductor's flex kernel takes ("NYI: embedding dimension ... at least 16"; tiny test models
    have 8): zeros add nothing to q.k, v's extra columns come out zero and are cut, and the scale stays
    1/sqrt(D) of the real D.
    """
    d = qh.shape[-1]
    pad = flex_padding(layout.num_tokens, layout.num_nodes)
    grow = (0, max(0, 16 - d), 0, pad[0] - layout.num_tokens)
    return *(F.pad(x, grow) for x in (qh, kh, vh)), pad, (1 / math.sqrt(d) if scale is None else scale)


def _sdpa(q, k, v, layout: PackedLayout, scale: float, dropout: float, window: int | None,
          chunk: int | None) -> torch.Tensor:
    mask = layout.dense_mask(q.device, window, chunk)  # (T, T)
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, H, T, D)
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )  # (1, H, T, D)
    return out[0].transpose(0, 1)  # (T, H, D)


def _sdpa_varlen(q, k, v, layout: PackedLayout, scale: float, dropout: float, window: int | None,
                 chunk: int | None) -> torch.Tensor:
    if layout.span_plan(q.device) is not None:
        return _two_calls(q, k, v, layout, scale, dropout, "reference", window, chunk)
    plan = _plan(layout, q.device, chunk)
    kg, vg = _gather_kv(k, v, plan)
    pos = layout.path_positions().to(q.device)  # (T,)
    pos_k = pos if plan.k_index is None else pos[plan.k_index]  # (Tk,)
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, kg, vg))  # (1, H, T, D), (1, Hkv, Tk, D)
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for s in range(len(plan.bounds_q) - 1):
        q0, q1, k0, k1 = plan.bounds_q[s], plan.bounds_q[s + 1], plan.bounds_k[s], plan.bounds_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        # SDPA's is_causal is top-left aligned, so a node's segment (lq < lk) gets an explicit bottom-right mask.
        mask = None if lq == lk else torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        if window is not None:  # a segment's keys are its path, so the window is a band on positions
            band = pos_k[None, k0:k1] > pos[q0:q1, None] - window  # (lq, lk)
            mask = band & (pos_k[None, k0:k1] <= pos[q0:q1, None])
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


def _two_calls(q, k, v, layout: PackedLayout, scale: float, dropout: float, kernel: str,
               window: int | None, chunk: int | None) -> torch.Tensor:
    """The causal varlen call plus the span call, merged (``packer.train.attention.spans``)."""
    if chunk is not None:
        name = "sdpa_varlen" if kernel == "reference" else kernel
        raise ConfigError(f"attention chunks ({chunk}) with bidirectional spans run on backend 'sdpa' or 'flex', not "
                          f"{name!r} (its span call would cross chunks)")
    if dropout:
        raise ConfigError("attention dropout with bidirectional spans needs backend 'sdpa' (the two merged "
                          "varlen calls cannot share a dropout pattern); set attention_dropout=0 or use 'sdpa'")
    if kernel == "reference":
        return span_attention(q, k, v, layout, KERNELS[kernel], scale=scale, window=window)
    (q16, k16, v16), dtype = _low_precision(q, k, v)
    return span_attention(q16, k16, v16, layout, KERNELS[kernel], scale=scale, window=window).to(dtype)  # (T, H, D)


_KERNELS = {"flash": _flash, "varlen": _varlen, "flex": _flex, "sdpa": _sdpa, "sdpa_varlen": _sdpa_varlen}


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: PackedLayout,
    *,
    backend: Backend = "auto",
    scale: float | None = None,
    dropout: float = 0.0,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Attention over one packed row with the tree mask of ``layout``.

    Args:
        q: (T, H, D) queries. k, v: (T, Hkv, D) keys and values; H a multiple of Hkv (GQA).
        layout: the row's boundaries.
        backend: one of ``BACKENDS`` or "auto" (see ``resolve_backend``).
        scale: softmax scale, default 1/sqrt(D).
        dropout: attention dropout probability (sdpa, sdpa_varlen and flash only).
        window: a sliding-window layer's window (Gemma 3's local layers): a key must also lie less than
            ``window`` positions back along the query's path (positions, not row offsets: see layout.py).
        chunk: a chunked-attention layer's chunk (Llama 4's RoPE layers): a key must also lie in the query's chunk
            of positions along its path, pos // chunk equal (layout.py). Not with ``window``.

    Returns:
        (T, H, D), in q's dtype.
    """
    if q.shape[0] != layout.num_tokens:
        raise ShardError(f"q has {q.shape[0]} tokens but the layout describes {layout.num_tokens}")
    name = resolve_backend(backend, q.device, bidirectional=layout.bidirectional_spans is not None)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if window is not None and chunk is not None:
        raise ConfigError(f"a layer with both a sliding window ({window}) and attention chunks ({chunk}) is not supported")
    return _KERNELS[name](q, k, v, layout, scale, dropout, window, chunk)
