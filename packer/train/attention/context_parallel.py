"""Context parallelism for packed rows: each CP rank's share of a collated batch, in the THD (packed) layout
Transformer Engine and Megatron-LM use.

Context parallelism (CP) splits a long row (32k+ tokens) over ``cp_size`` ranks; ring attention keeps each
rank's queries in place and passes keys/values around the ring. Under a causal mask, cutting the row into
``cp_size`` contiguous pieces would give the last rank most of the work, so each example is padded to a
multiple of 2·cp_size, cut into 2·cp_size equal chunks, and rank r takes chunks r and 2·cp_size−1−r:

    one example of 5 tokens, cp_size = 2: padded to 8 (a multiple of 2·cp_size), 4 chunks of 2 tokens

    padded row:  | t0 t1 | t2 t3 | t4 ·  | ·  ·  |     · = pad: id pad_token_id, label -100, positions continue
    chunk:           0       1       2       3
    rank 0:      chunks 0 and 3  ->  t0 t1 · ·        cp_index = [0, 1, 6, 7]
    rank 1:      chunks 1 and 2  ->  t2 t3 t4 ·       cp_index = [2, 3, 4, 5]

Every example of the batch is split this way; a rank holds its two chunks of every example, in example order,
so its local boundaries are ``cu_seqlens_q_padded // cp_size``. With chunks of c tokens, rank r's causal work on
one example is c(c+1)/2 + r·c² + c(c+1)/2 + (2·cp_size−1−r)·c² query-key pairs: the same on every rank.

Convention, followed exactly:

- which tokens a rank holds: Transformer Engine's ``thd_get_partitioned_indices(cu_seqlens_padded,
  total_tokens, cp_size, cp_rank)`` (``thd_partition_indices_kernel`` in
  transformer_engine/common/fused_attn/context_parallel.cu, which asserts every padded length is a multiple
  of 2·cp_size). Megatron-LM's ``get_batch_on_this_cp_rank`` calls it for THD batches. ``cp_index`` here is
  its result (``partition_index`` computes it on CPU).
- the boundaries: TE ``DotProductAttention(qkv_format="thd")`` and Megatron's ``PackedSeqParams``.
  ``cu_seqlens_q`` holds the *global* cumulative real lengths (the collated batch's ``cu_seqlens``), and
  ``cu_seqlens_q_padded`` the global cumulative padded lengths, i.e. where each example starts in memory.
  ``max_seqlen_q`` is global too. TE's ring attention (``AttnFuncWithCPAndKVP2P``) divides the padded ones by
  cp_size itself and derives each rank's real tokens per chunk (``get_cu_seqlens_on_cp_rank``), so the kernel
  gets the global values on every rank. Megatron's ``get_batch_on_this_cp_rank`` leaves them unsplit too
  (megatron/core/utils.py, ``_get_batch_on_this_cp_rank_per_document_balancing``). ``te_thd_kwargs``
  spells out the call, including Megatron's current choice of treating pads as tokens.

Loss. ``shift_labels`` is computed on the whole padded row *before* the split: a chunk boundary is not an
example boundary, and the last token of a chunk predicts the first token of the next chunk, which lives on
another rank. Each rank's ``cross_entropy(logits, shift_labels, reduction="sum")`` is then exact, and the
rank sums add up to the unsplit packed loss. Divide by ``global_num_loss_tokens`` (the same on every rank),
never by a rank's own count.

Pads are never seen by a real token: they sit at the end of their example, and a causal mask hides every
later key. So the padding is exact even for a kernel that only knows ``cu_seqlens_local``. It costs a few
percent of tokens (measured in docs/training.md, "Context parallel"); a row packed to ``max_length`` grows by
up to E·(2·cp_size−1) tokens.

Trees are refused (``ConfigError``). The THD kernels take causal segments only, but a tree branch must skip its
siblings, which lie between it and its ancestors in the row. Tree loss also needs one logit to feed k
targets, which ``shift_labels`` cannot express. Flattening every root-to-leaf path into its own example
would work, but it duplicates the shared prefixes, so the compute and the loss count change. It is not
done here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError, ShardError

# Keys passed through unchanged: provenance and resume bookkeeping, and every family's per-image inputs (the
# vision tower is not split here; a CP model embeds the whole row's images and keeps its rows with `cp_index`).
_SPLIT = ("input_ids", "position_ids")  # per-token forward inputs, split below
MEDIA_OFFSETS = ("image_offsets", "video_offsets", "audio_offsets")  # batch offsets a padded row moves


def _pass_through() -> tuple[str, ...]:
    from packer.models import forward_keys

    return ("example_ids", "packer_state", *(k for k in forward_keys() if k not in _SPLIT))


def _check_cp(cp_size: Any, cp_rank: Any = 0) -> None:
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise ConfigError(f"'cp_size' must be a positive integer, got {cp_size!r}")
    if isinstance(cp_rank, bool) or not isinstance(cp_rank, int) or not 0 <= cp_rank < cp_size:
        raise ConfigError(
            f"'cp_rank' must be an integer in [0, {cp_size - 1}] for cp_size={cp_size}, got {cp_rank!r}"
        )


def padded_cu_seqlens(cu_seqlens: Any, *, cp_size: int) -> np.ndarray:
    """(E+1,) int32: each example's length rounded up to a multiple of 2·cp_size, accumulated from 0.

    ``padded_cu_seqlens([0, 5, 6], cp_size=2)`` -> ``[0, 8, 12]``.
    """
    _check_cp(cp_size)
    cu = np.asarray(cu_seqlens, dtype=np.int64).reshape(-1)
    multiple = 2 * cp_size
    lens = -(-np.diff(cu) // multiple) * multiple  # (E,) ceil to a multiple of 2·cp_size
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def partition_index(cu_seqlens_padded: Any, *, cp_size: int, cp_rank: int) -> np.ndarray:
    """(T_padded / cp_size,) int64: the padded-row positions rank ``cp_rank`` holds, in its local order.

    The same as TE's ``thd_get_partitioned_indices(cu_seqlens_padded, T_padded, cp_size, cp_rank)``. Each
    example contributes chunk ``cp_rank``, then chunk ``2·cp_size−1−cp_rank``, of ``len / (2·cp_size)`` tokens.
    ``partition_index([0, 8, 12], cp_size=2, cp_rank=0)`` -> ``[0, 1, 6, 7, 8, 11]``.
    """
    _check_cp(cp_size, cp_rank)
    cu_p = np.asarray(cu_seqlens_padded, dtype=np.int64).reshape(-1)
    lens = np.diff(cu_p)  # (E,)
    if (lens % (2 * cp_size)).any():
        raise ConfigError(
            f"every padded length must be a multiple of 2*cp_size={2 * cp_size}, got {lens.tolist()}"
        )
    chunk = lens // (2 * cp_size)  # (E,)
    example = np.repeat(np.arange(len(lens)), 2 * chunk)  # (Tl,) each local token's example
    local = np.arange(len(example)) - np.repeat(cu_p[:-1] // cp_size, 2 * chunk)  # (Tl,) offset in its 2 chunks
    c = chunk[example]  # (Tl,)
    second = local >= c  # the token belongs to the mirrored chunk 2·cp_size−1−r
    within = np.where(second, local - c, local)
    which = np.where(second, 2 * cp_size - 1 - cp_rank, cp_rank)
    return cu_p[:-1][example] + which * c + within


def _linear_layout(batch: Mapping[str, Any]) -> tuple[np.ndarray, int]:
    """The batch's cu_seqlens (validated), its token count, and a refusal for trees."""
    input_ids = batch["input_ids"]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ConfigError(
            f"context parallel takes one collated row of shape (1, T), got input_ids {tuple(input_ids.shape)}"
        )
    T = int(input_ids.shape[1])
    cu = torch.as_tensor(batch["cu_seqlens"]).reshape(-1).cpu().numpy().astype(np.int64)
    if len(cu) == 0 or cu[0] != 0 or cu[-1] != T or (np.diff(cu) <= 0).any():
        raise ShardError(f"'cu_seqlens' must start at 0, increase strictly and end at T={T}, got {cu.tolist()}")
    parents = batch.get("node_parents")
    if parents is not None and bool((torch.as_tensor(parents) >= 0).any()):
        raise ConfigError(
            "context parallel covers linear rows only: this batch has tree nodes (node_parents >= 0), whose "
            "branches skip their siblings and whose loss feeds several targets from one logit; train tree rows "
            "without context parallelism (a packer attention backend and packed_cross_entropy)"
        )
    spans = batch.get("bidirectional_spans")
    if spans is not None and len(spans) > 0:
        raise ConfigError(
            "context parallel runs causal examples only: this batch has bidirectional image spans, which TE's "
            "THD attention cannot express; train it without context parallelism (a packer attention backend)"
        )
    return cu, T


def _padded_row(batch: Mapping[str, Any], cp_size: int, pad_token_id: int) -> dict[str, Any]:
    """The whole row with every example padded to a multiple of 2·cp_size, and shift_labels computed on it."""
    cu, T = _linear_layout(batch)
    cu_p = padded_cu_seqlens(cu, cp_size=cp_size).astype(np.int64)
    lens, plens = np.diff(cu), np.diff(cu_p)  # (E,), (E,)
    example = np.repeat(np.arange(len(lens)), plens)  # (Tp,)
    offset = np.arange(int(cu_p[-1])) - cu_p[:-1][example]  # (Tp,) position inside the padded example
    real = offset < lens[example]  # (Tp,)
    dev = batch["input_ids"].device
    src = torch.from_numpy(np.where(real, cu[:-1][example] + offset, cu[1:][example] - 1)).to(dev)  # (Tp,)
    real_t = torch.from_numpy(real).to(dev)  # (Tp,); pads read their example's last token (for its position)
    after = torch.from_numpy(np.maximum(offset - lens[example] + 1, 0)).to(dev)  # (Tp,) 1, 2, ... on pads, else 0

    labels = batch["labels"][0]  # (T,)
    starts = labels[torch.from_numpy(cu[:-1]).to(dev)]  # (E,)
    if bool((starts != IGNORE_INDEX).any()):
        e = int((starts != IGNORE_INDEX).nonzero()[0])
        raise ShardError(
            f"example {e} (token {int(cu[e])}) has a label on its first token, which nothing can predict"
        )
    ids = torch.where(real_t, batch["input_ids"][0][src], pad_token_id)  # (Tp,)
    lab = torch.where(real_t, labels[src], IGNORE_INDEX)  # (Tp,)
    shift = torch.full_like(lab, IGNORE_INDEX)  # (Tp,)
    shift[:-1] = lab[1:]
    shift[torch.from_numpy(cu_p[1:] - 1).to(dev)] = IGNORE_INDEX  # an example's last slot predicts nothing
    pos = batch["position_ids"]  # (1, T) or (4, 1, T): pads continue from the example's last position
    pos_p = pos[..., src] + after.to(pos.dtype)  # (1, Tp) or (4, 1, Tp)
    out = {"input_ids": ids[None], "labels": lab[None], "shift_labels": shift[None], "position_ids": pos_p,
           "cu_seqlens": cu, "cu_seqlens_padded": cu_p}
    for key in MEDIA_OFFSETS:  # each image's (video's, clip's) first token, in padded-row coordinates
        if batch.get(key) is not None:
            off = batch[key].cpu().numpy().astype(np.int64)  # (I,)
            e = np.searchsorted(cu, off, side="right") - 1
            out[key] = torch.from_numpy(off - cu[e] + cu_p[e])
    return out


def _rank_view(batch: Mapping[str, Any], padded: dict[str, Any], cp_size: int, cp_rank: int) -> dict[str, Any]:
    cu, cu_p = padded["cu_seqlens"], padded["cu_seqlens_padded"]
    index = torch.from_numpy(partition_index(cu_p, cp_size=cp_size, cp_rank=cp_rank))  # (Tl,), Tl = Tp / cp_size
    shift = padded["shift_labels"][:, index]  # (1, Tl)
    max_padded = int(np.diff(cu_p).max()) if len(cu_p) > 1 else 0
    view: dict[str, Any] = {
        "input_ids": padded["input_ids"][:, index],  # (1, Tl)
        "labels": padded["labels"][:, index],  # (1, Tl) unshifted: never shift per rank, use shift_labels
        "shift_labels": shift,  # (1, Tl)
        "position_ids": padded["position_ids"][..., index],  # (1, Tl) or (4, 1, Tl)
        # TE's / Megatron's THD metadata: global, the same on every rank (q and kv alike)
        "cu_seqlens_q": torch.from_numpy(cu.astype(np.int32)),  # (E+1,) real lengths
        "cu_seqlens_q_padded": torch.from_numpy(cu_p.astype(np.int32)),  # (E+1,) padded lengths
        "max_seqlen_q": max_padded,
        # this rank's tensor: every example's two chunks, len / (2·cp_size) tokens each
        "cu_seqlens_local": torch.from_numpy((cu_p // cp_size).astype(np.int32)),  # (E+1,)
        "max_seqlen_local": max_padded // cp_size,
        "cp_index": index,  # (Tl,) padded-row position of each local token
        "cp_size": cp_size,
        "cp_rank": cp_rank,
        "num_loss_tokens": int((shift != IGNORE_INDEX).sum()),  # this rank's
        "global_num_loss_tokens": int((padded["shift_labels"] != IGNORE_INDEX).sum()),  # the divisor
    }
    for key in MEDIA_OFFSETS:
        if key in padded:
            view[key] = padded[key]
    view.update({k: batch[k] for k in _pass_through() if k in batch})
    return view


def context_parallel_view(
    batch: Mapping[str, Any], *, cp_size: int, cp_rank: int, pad_token_id: int = 0
) -> dict[str, Any]:
    """Rank ``cp_rank``'s share of a collated linear batch (``collate``'s dict), in TE/Megatron's THD layout.

    Args:
        batch: the collated batch: ``input_ids`` (1, T), ``labels`` (1, T), ``position_ids`` (1, T) or
            (4, 1, T) for mRoPE, ``cu_seqlens`` (E+1,), ``node_parents`` (trees are refused).
        cp_size: the number of context-parallel ranks (1 = no split, but still padded to even lengths).
        cp_rank: this rank, in [0, cp_size).
        pad_token_id: the id of the pad tokens. Any valid id gives the same result, because no real token
            attends to a pad and pads carry no loss; 0 is always inside the vocabulary.

    Returns a dict with Tl = T_padded / cp_size local tokens (see the module docstring for the picture):
        ``input_ids``, ``labels`` (unshifted), ``shift_labels``: (1, Tl) int64. The shift was done on the
            padded row before the split, so it is correct across chunk boundaries.
        ``position_ids``: (1, Tl), or (4, 1, Tl) for mRoPE; pads continue their example's last position.
        ``cu_seqlens_q`` / ``cu_seqlens_q_padded``: int32 (E+1,), global real / padded boundaries, and
            ``max_seqlen_q``, the longest padded example: TE's and Megatron's THD metadata, the same on every
            rank (``te_thd_kwargs`` spells out the kernel call).
        ``cu_seqlens_local``: int32 (E+1,) = cu_seqlens_q_padded // cp_size, each example's two chunks in this
            rank's tensor, and ``max_seqlen_local``.
        ``cp_index``: int64 (Tl,), the padded-row position of each local token (TE's partitioned indices).
        ``num_loss_tokens``: this rank's shift_labels != -100; ``global_num_loss_tokens``: the whole row's
            (the divisor for a token mean; equal to the batch's ``num_loss_tokens``).
        ``cp_size``, ``cp_rank``; ``image_offsets`` in padded-row coordinates; ``example_ids``,
        ``packer_state``, ``pixel_values``, ``image_grid_thw`` unchanged.

    No ``cu_seqlens`` / ``max_seqlen`` key, on purpose: packer's (non-CP) attention backends read those, and
    would attend with global boundaries over local tokens. Feed the view to a CP attention (TE's, or a ring
    attention that takes this layout), not to ``use_packed_attention``'s backends.
    """
    _check_cp(cp_size, cp_rank)
    return _rank_view(batch, _padded_row(batch, cp_size, pad_token_id), cp_size, cp_rank)


def context_parallel_views(
    batch: Mapping[str, Any], *, cp_size: int, pad_token_id: int = 0
) -> list[dict[str, Any]]:
    """Every rank's ``context_parallel_view``, in rank order, padding the row once (for tests, or for a
    loader that feeds all CP ranks from one process)."""
    _check_cp(cp_size)
    padded = _padded_row(batch, cp_size, pad_token_id)
    return [_rank_view(batch, padded, cp_size, r) for r in range(cp_size)]


def te_thd_kwargs(view: Mapping[str, Any], *, skip_pads: bool = False) -> dict[str, Any]:
    """The THD keyword arguments of Transformer Engine's ``DotProductAttention.forward`` for one view; the
    ``cu_seqlens_*`` / ``max_seqlen_*`` ones are also the fields of Megatron's ``PackedSeqParams``. q and kv
    get the same values (self-attention).

    ``skip_pads=False`` (default) is what Megatron-LM passes today (pretrain_gpt.py and
    megatron/core/datasets/data_schedule.py, which cite a TE bug): ``cu_seqlens_q = cu_seqlens_q_padded``, so
    TE attends over the pads as if they were tokens of their example. That is exact for every real token,
    because pads come last and the mask is causal; the pads' outputs carry no loss.

    ``skip_pads=True`` uses TE's documented semantics instead: the real ``cu_seqlens_q`` beside
    ``cu_seqlens_q_padded``, so TE skips the pads and zeroes their outputs. ``pad_between_seqs`` is then
    passed explicitly. TE up to 2.17.1 guessed it from the example starts (``cu_seqlens_padded[:-1]``
    against ``cu_seqlens[:-1]``), a guess that misses padding at the end of the last example, after which the
    CP attention is wrong (TransformerEngine issue #3331).

    Not run here: this environment has neither TE nor a GPU.
    """
    cu_p = view["cu_seqlens_q_padded"]
    cu = view["cu_seqlens_q"] if skip_pads else cu_p
    return {
        "qkv_format": "thd",
        "attn_mask_type": "padding_causal",
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
        "cu_seqlens_q_padded": cu_p,
        "cu_seqlens_kv_padded": cu_p,
        "max_seqlen_q": view["max_seqlen_q"],
        "max_seqlen_kv": view["max_seqlen_q"],
        "pad_between_seqs": not torch.equal(cu, cu_p),
    }
