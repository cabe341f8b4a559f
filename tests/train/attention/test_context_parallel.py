"""packer.train.attention.context_parallel: each CP rank's THD view of a collated batch.

The views are checked four ways. Put back together, they give the padded row. A ring attention simulated
over the ranks in one process (log-sum-exp merges) equals unsplit packed SDPA. The ranks' summed loss and its
gradients equal the unsplit packed loss. And the token placement equals Transformer Engine's partition kernel,
transliterated token by token.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError, ShardError
from packer.train.attention.context_parallel import (
    context_parallel_view,
    context_parallel_views,
    padded_cu_seqlens,
    partition_index,
    te_thd_kwargs,
)

VOCAB = 23
PAD = 0  # the views' default pad_token_id

LAYOUTS = {
    "odd": [5, 1, 9, 3, 7],  # odd lengths, one example of a single token
    "short": [1, 2, 3],  # every example shorter than 2*cp_size for cp_size 2 and 4
    "exact": [8, 16],  # a row filled exactly: lengths are multiples of 2*cp_size (cp_size <= 4), no padding
    "one": [29],  # one long example
}


def make_batch(lengths: list[int], *, mrope: bool = False, seed: int = 0) -> dict:
    """A collated linear batch built by hand with ``collate``'s keys (docs/format.md): random ids, positions
    restarting per example, a label on about 60% of the tokens, never on an example's first."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)  # (E+1,)
    ids = torch.randint(1, VOCAB, (1, T), generator=g)  # (1, T)
    labels = torch.where(torch.rand(1, T, generator=g) < 0.6, ids, IGNORE_INDEX)  # (1, T)
    labels[0, cu[:-1].long()] = IGNORE_INDEX
    pos = torch.cat([torch.arange(n) for n in lengths])[None]  # (1, T)
    if mrope:  # rows 1-3 (t, h, w) differ from the text row, as inside an image span
        thw = torch.stack([pos[0], pos[0] // 2, 2 * pos[0] % 5])  # (3, T)
        pos = torch.cat([pos, thw])[:, None]  # (4, 1, T)
    shift = torch.full_like(labels, IGNORE_INDEX)  # (1, T)
    shift[:, :-1] = labels[:, 1:]
    return {
        "input_ids": ids,
        "labels": labels,
        "shift_labels": shift,
        "position_ids": pos,
        "cu_seqlens": cu,
        "max_seqlen": max(lengths),
        "node_offsets": cu[:-1].clone(),
        "node_parents": torch.full((len(lengths),), -1, dtype=torch.int32),
        "num_loss_tokens": int((labels != IGNORE_INDEX).sum()),
        "example_ids": [f"f.jsonl:{i + 1}" for i in range(len(lengths))],
    }


def te_kernel_index(cu_padded: list[int], cp_size: int, rank: int) -> list[int]:
    """TE's ``thd_partition_indices_kernel`` (transformer_engine/common/fused_attn/context_parallel.cu), one
    token at a time: the reference for ``partition_index``."""
    cu_s = [c // cp_size for c in cu_padded]
    out = []
    for token in range(cu_padded[-1] // cp_size):
        seq = max(i for i in range(len(cu_s) - 1) if cu_s[i] <= token)
        seq_len = cu_s[seq + 1] - cu_s[seq]
        index = token - cu_s[seq]
        offset = rank if index < seq_len // 2 else (cp_size - 1) * 2 - rank
        out.append(index + cu_s[seq] * cp_size + seq_len // 2 * offset)
    return out


def real_positions(lengths: list[int], cp_size: int) -> torch.Tensor:
    """Where each token of the unpadded row sits in the padded row (independent of the module)."""
    out, start = [], 0
    for n in lengths:
        out.extend(range(start, start + n))
        start += -(-n // (2 * cp_size)) * 2 * cp_size
    return torch.tensor(out)


def reassemble(views: list[dict], key: str) -> torch.Tensor:
    """Scatter every rank's tokens back to their padded-row positions."""
    Tp = sum(len(v["cp_index"]) for v in views)
    full = torch.full((*views[0][key].shape[:-1], Tp), -12345, dtype=views[0][key].dtype)
    for v in views:
        full[..., v["cp_index"]] = v[key]
    return full


def assert_same_view(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k


# -- the layout ---------------------------------------------------------------------------------------------


def test_golden_two_ranks():
    """The module docstring's picture: 5 tokens -> 8, and 1 token -> 4, split over 2 ranks."""
    batch = make_batch([5, 1])
    r0, r1 = context_parallel_views(batch, cp_size=2)
    assert_same_view(r1, context_parallel_view(batch, cp_size=2, cp_rank=1))
    assert padded_cu_seqlens([0, 5, 6], cp_size=2).tolist() == [0, 8, 12]
    assert r0["cp_index"].tolist() == [0, 1, 6, 7, 8, 11]
    assert r1["cp_index"].tolist() == [2, 3, 4, 5, 9, 10]
    ids = batch["input_ids"][0].tolist()
    assert r0["input_ids"][0].tolist() == [ids[0], ids[1], PAD, PAD, ids[5], PAD]
    assert r1["input_ids"][0].tolist() == [ids[2], ids[3], ids[4], PAD, PAD, PAD]
    assert r0["position_ids"][0].tolist() == [0, 1, 6, 7, 0, 3]  # pads continue their example's positions
    assert r1["position_ids"][0].tolist() == [2, 3, 4, 5, 1, 2]
    for v in (r0, r1):
        assert v["cu_seqlens_q"].tolist() == [0, 5, 6] and v["cu_seqlens_q"].dtype == torch.int32
        assert v["cu_seqlens_q_padded"].tolist() == [0, 8, 12] and v["cu_seqlens_q_padded"].dtype == torch.int32
        assert v["cu_seqlens_local"].tolist() == [0, 4, 6] and v["cu_seqlens_local"].dtype == torch.int32
        assert (v["max_seqlen_q"], v["max_seqlen_local"]) == (8, 4)
        assert "cu_seqlens" not in v and "max_seqlen" not in v  # packer's non-CP backends would read these
    skip = te_thd_kwargs(r1, skip_pads=True)  # TE's semantics: real lengths beside the padded ones
    assert skip["cu_seqlens_q"].tolist() == [0, 5, 6] and skip["cu_seqlens_q_padded"].tolist() == [0, 8, 12]
    assert skip["qkv_format"] == "thd" and skip["attn_mask_type"] == "padding_causal" and skip["pad_between_seqs"]
    assert skip["cu_seqlens_kv"] is skip["cu_seqlens_q"] and skip["max_seqlen_kv"] == 8
    as_tokens = te_thd_kwargs(r1)  # Megatron's current choice: pads attended as tokens of their example
    assert as_tokens["cu_seqlens_q"].tolist() == [0, 8, 12] and not as_tokens["pad_between_seqs"]


@pytest.mark.parametrize("cp_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_partition_matches_transformer_engine_kernel(layout, cp_size):
    cu_p = padded_cu_seqlens(np.cumsum([0, *LAYOUTS[layout]]), cp_size=cp_size).tolist()
    for rank in range(cp_size):
        ours = partition_index(cu_p, cp_size=cp_size, cp_rank=rank)
        assert ours.tolist() == te_kernel_index(cu_p, cp_size, rank)


@pytest.mark.parametrize("mrope", [False, True])
@pytest.mark.parametrize("cp_size", [1, 2, 4])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_reassembled_views_are_the_padded_row(layout, cp_size, mrope):
    lengths = LAYOUTS[layout]
    batch = make_batch(lengths, mrope=mrope)
    views = context_parallel_views(batch, cp_size=cp_size)
    cu_p = views[0]["cu_seqlens_q_padded"].long()
    Tp = int(cu_p[-1])
    assert torch.cat([v["cp_index"] for v in views]).sort().values.tolist() == list(range(Tp))  # each slot once
    assert all(v["input_ids"].shape == (1, Tp // cp_size) for v in views)
    real = real_positions(lengths, cp_size)
    pad = torch.ones(Tp, dtype=torch.bool)
    pad[real] = False
    if layout == "exact" and cp_size <= 4:
        assert not pad.any() and not te_thd_kwargs(views[0], skip_pads=True)["pad_between_seqs"]
    for key in ("input_ids", "labels", "shift_labels", "position_ids"):
        full = reassemble(views, key)
        assert torch.equal(full[..., real], batch[key]), key  # the real tokens, in order
    assert (reassemble(views, "input_ids")[0, pad] == PAD).all()
    assert (reassemble(views, "labels")[0, pad] == IGNORE_INDEX).all()
    assert (reassemble(views, "shift_labels")[0, pad] == IGNORE_INDEX).all()
    pos = reassemble(views, "position_ids").reshape(-1, Tp)  # (1 or 4, Tp)
    for e in range(len(lengths)):
        last = int(real[sum(lengths[: e + 1]) - 1])
        for t in range(last + 1, int(cu_p[e + 1])):  # pads continue from the example's last position
            assert torch.equal(pos[:, t], pos[:, last] + (t - last)), (e, t)
    counts = [v["num_loss_tokens"] for v in views]
    assert sum(counts) == batch["num_loss_tokens"] == views[0]["global_num_loss_tokens"]
    assert all(v["global_num_loss_tokens"] == batch["num_loss_tokens"] for v in views)
    assert all(v["example_ids"] == batch["example_ids"] for v in views)


@pytest.mark.parametrize("lengths", [[4, 6, 2], [3, 5, 1]], ids=["even", "odd"])
def test_cp_size_one_is_the_identity_but_padded(lengths):
    batch = make_batch(lengths)
    (view,) = context_parallel_views(batch, cp_size=1)
    assert_same_view(view, context_parallel_view(batch, cp_size=1, cp_rank=0))
    Tp = int(view["cu_seqlens_q_padded"][-1])
    assert view["cp_index"].tolist() == list(range(Tp))  # one rank, the row in order
    assert torch.equal(view["cu_seqlens_local"], view["cu_seqlens_q_padded"])
    if all(n % 2 == 0 for n in lengths):  # nothing to pad: exactly the batch
        for key in ("input_ids", "labels", "shift_labels", "position_ids"):
            assert torch.equal(view[key], batch[key]), key
        assert torch.equal(view["cu_seqlens_q_padded"], batch["cu_seqlens"])
    else:  # odd examples get one pad each
        assert Tp == sum(lengths) + sum(n % 2 for n in lengths)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_every_rank_does_the_same_causal_work(cp_size):
    """Chunks r and 2*cp-1-r: on the padded row, every rank's queries see as many causal same-example keys."""
    views = context_parallel_views(make_batch(LAYOUTS["odd"]), cp_size=cp_size)
    cu_p = views[0]["cu_seqlens_q_padded"].long()
    work = []
    for v in views:
        g = v["cp_index"]
        start = cu_p[torch.searchsorted(cu_p, g, right=True) - 1]
        work.append(int((g - start + 1).sum()))  # a query at padded offset o sees o + 1 keys
    assert len(set(work)) == 1, work


def test_real_collate_batch():
    """packer's own ``collate`` (two rows, mRoPE): the views put back together give its tokens, and the
    shift done on the padded row agrees with collate's on every real token."""
    try:  # the collate function's module is being split out of dataset.py
        collate = importlib.import_module("packer.train.data.collate").collate
    except ModuleNotFoundError:
        collate = importlib.import_module("packer.train.data.dataset").collate

    def row(lengths: list[int], seed: int) -> dict:
        b = make_batch(lengths, mrope=True, seed=seed)
        return {"input_ids": b["input_ids"][0].numpy(), "labels": b["labels"][0].numpy(),
                "position_ids": b["position_ids"][0, 0].numpy(),
                "mrope_position_ids": b["position_ids"][1:, 0].numpy(), "cu_seqlens": b["cu_seqlens"].numpy(),
                "node_offsets": b["node_offsets"].numpy(), "node_parents": b["node_parents"].numpy(),
                "example_ids": b["example_ids"], "images": []}

    batch = collate([row([5, 3], 1), row([7], 2)])
    views = context_parallel_views(batch, cp_size=2)
    real = real_positions([5, 3, 7], 2)
    for key in ("input_ids", "labels", "shift_labels", "position_ids"):
        assert torch.equal(reassemble(views, key)[..., real], batch[key]), key
    assert sum(v["num_loss_tokens"] for v in views) == batch["num_loss_tokens"]


# -- ring attention and the loss -----------------------------------------------------------------------------


class TinyModel:
    """Embedding (token + one table per position row: text, and t/h/w for mRoPE) -> one attention layer
    -> LM head, in fp32. Positions enter the embedding: a rank with wrong positions gives wrong outputs."""

    def __init__(self, *, heads: int = 2, dim: int = 4, max_pos: int = 48, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        c = heads * dim
        self.heads, self.dim = heads, dim
        self.params = {
            "tok": torch.randn(VOCAB, c, generator=g),
            "pos": 0.5 * torch.randn(4, max_pos, c, generator=g),
            "wq": torch.randn(c, c, generator=g) / c**0.5,
            "wk": torch.randn(c, c, generator=g) / c**0.5,
            "wv": torch.randn(c, c, generator=g) / c**0.5,
            "head": torch.randn(c, VOCAB, generator=g) / c**0.5,
        }
        for p in self.params.values():
            p.requires_grad_(True)

    def qkv(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        T = input_ids.shape[-1]
        x = self.params["tok"][input_ids[0]]  # (T, C)
        for i, row in enumerate(position_ids.reshape(-1, T)):  # (1 or 4, T)
            x = x + self.params["pos"][i][row]
        return tuple((x @ self.params[w]).view(T, self.heads, self.dim).transpose(0, 1)  # (H, T, D)
                     for w in ("wq", "wk", "wv"))

    def logits(self, attn: torch.Tensor) -> torch.Tensor:
        return attn.transpose(0, 1).reshape(attn.shape[1], -1) @ self.params["head"]  # (T, V)


def packed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The unsplit reference: one SDPA over the whole unpadded row with the block-causal packed mask."""
    T = q.shape[1]
    seg = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), torch.diff(cu_seqlens.long()))  # (T,)
    mask = (seg[:, None] == seg[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (H, T, D)


def attention_with_lse(q, k, v, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """One ring step: SDPA's output and the log-sum-exp of the masked scores (what a flash kernel returns
    beside it). A query that sees no key of this chunk gets output 0 and lse -inf."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (H, Tq, Tk)
    lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (H, Tq)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (H, Tq, D)
    return out.masked_fill(~mask.any(-1)[None, :, None], 0.0), lse


def merge(out, lse, out_step, lse_step) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring attention's online-softmax merge of a step into the running output."""
    new = torch.logaddexp(lse, lse_step)  # (H, Tq)
    w_old = torch.exp(lse - new).nan_to_num(0.0)[..., None]  # -inf - -inf: nothing seen yet on either side
    w_step = torch.exp(lse_step - new).nan_to_num(0.0)[..., None]
    return out * w_old + out_step * w_step, new


def global_layout(view: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From a view's THD metadata alone: each local token's padded-row position, example, and whether it is
    real (within its example's real length, as TE reads cu_seqlens_q against cu_seqlens_q_padded)."""
    cu, cu_p, g = view["cu_seqlens_q"].long(), view["cu_seqlens_q_padded"].long(), view["cp_index"]
    e = torch.searchsorted(cu_p, g, right=True) - 1
    return g, e, (g - cu_p[e]) < (cu[e + 1] - cu[e])


def ring_attention(model: TinyModel, views: list[dict], *, skip_pads: bool = True) -> list[torch.Tensor]:
    """Every rank computes q, k, v from its own tokens; rank r's queries then meet the ranks' keys/values in
    ring order (its own first, then rank r-1's, r-2's, ...), each step masked in global positions
    (same example, causal, and real keys with ``skip_pads``, as TE given real lengths; without it pads are
    keys of their example, as Megatron's cu_seqlens_q = cu_seqlens_q_padded), merged by log-sum-exp."""
    cp = len(views)
    local = [model.qkv(v["input_ids"], v["position_ids"]) for v in views]
    meta = [global_layout(v) for v in views]
    outs = []
    for r in range(cp):
        q = local[r][0]
        gq, eq, _ = meta[r]
        out, lse = torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"))
        for step in range(cp):
            src = (r - step) % cp
            _, k, v = local[src]
            gk, ek, real_k = meta[src]
            mask = (eq[:, None] == ek[None, :]) & (gk[None, :] <= gq[:, None])  # (Tq, Tk)
            if skip_pads:
                mask &= real_k[None, :]
            out, lse = merge(out, lse, *attention_with_lse(q, k, v, mask))
        outs.append(out)
    return outs


def unpadded_index(view: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's real tokens (a mask) and their positions in the unpadded row."""
    g, e, real = global_layout(view)
    src = view["cu_seqlens_q"].long()[e] + g - view["cu_seqlens_q_padded"].long()[e]
    return real, src[real]


@pytest.mark.parametrize("mrope", [False, True])
@pytest.mark.parametrize("cp_size", [1, 2, 4])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_ring_attention_over_ranks_equals_unsplit_attention(layout, cp_size, mrope):
    batch = make_batch(LAYOUTS[layout], mrope=mrope, seed=3)
    model = TinyModel()
    with torch.no_grad():
        q, k, v = model.qkv(batch["input_ids"], batch["position_ids"])  # (H, T, D) each
        ref = packed_sdpa(q, k, v, batch["cu_seqlens"])  # (H, T, D)
        views = context_parallel_views(batch, cp_size=cp_size)
        diff = {}
        for skip_pads in (True, False):
            diff[skip_pads] = 0.0
            for view, out in zip(views, ring_attention(model, views, skip_pads=skip_pads), strict=True):
                real, src = unpadded_index(view)
                if real.any():  # with short examples a rank may hold only pads
                    diff[skip_pads] = max(diff[skip_pads], float((out[:, real] - ref[:, src]).abs().max()))
    scale = float(ref.abs().max())
    print(f"{layout} cp={cp_size} mrope={mrope}: max |ring - unsplit| = {diff[True]:.1e} skipping pads, "
          f"{diff[False]:.1e} attending them (outputs up to {scale:.1f})")
    assert max(diff.values()) <= 1e-6 * scale


@pytest.mark.parametrize("mrope", [False, True])
@pytest.mark.parametrize("cp_size", [2, 4])
@pytest.mark.parametrize("layout", ["odd", "short"])
def test_loss_summed_over_ranks_equals_unsplit_loss(layout, cp_size, mrope):
    """Each rank's cross-entropy (sum, with its shift_labels) adds up to the unsplit packed loss, and so do
    the gradients of every parameter."""
    lengths = LAYOUTS[layout]
    batch = make_batch(lengths, mrope=mrope, seed=5)
    model = TinyModel(seed=1)

    q, k, v = model.qkv(batch["input_ids"], batch["position_ids"])  # (H, T, D) each
    logits = model.logits(packed_sdpa(q, k, v, batch["cu_seqlens"]))  # (T, V)
    cu, labels = batch["cu_seqlens"].tolist(), batch["labels"][0]
    ref = sum(F.cross_entropy(logits[s:e - 1], labels[s + 1:e], ignore_index=IGNORE_INDEX, reduction="sum")
              for s, e in zip(cu[:-1], cu[1:], strict=True))  # per example: token t-1's logit predicts label t
    ref_grads = torch.autograd.grad(ref, list(model.params.values()))

    views = context_parallel_views(batch, cp_size=cp_size)
    per_rank = [F.cross_entropy(model.logits(out), view["shift_labels"][0], ignore_index=IGNORE_INDEX,
                                reduction="sum")
                for view, out in zip(views, ring_attention(model, views), strict=True)]
    total = sum(per_rank)
    grads = torch.autograd.grad(total, list(model.params.values()))

    total, ref = float(total.detach()), float(ref.detach())
    rel = abs(total - ref) / abs(ref)
    grad_diff = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads, ref_grads, strict=True))
    print(f"{layout} cp={cp_size} mrope={mrope}: loss {ref:.6f}, rel diff {rel:.1e}, "
          f"max grad diff / grad scale {grad_diff:.1e}")
    assert rel <= 1e-6
    assert grad_diff <= 1e-5
    counts = [view["num_loss_tokens"] for view in views]
    assert sum(counts) == views[0]["global_num_loss_tokens"] == batch["num_loss_tokens"]


def test_shift_labels_cross_chunk_boundaries():
    """The last token of a chunk predicts the first token of the next chunk, held by another rank: the shift
    is taken on the padded row before the split, never per rank."""
    batch = make_batch([8])
    batch["labels"][0, 1:] = batch["input_ids"][0, 1:]  # a loss on every token but the first
    r0, r1 = context_parallel_views(batch, cp_size=2)  # chunks of 2: rank 0 holds 0,1 | 6,7; rank 1 holds 2..5
    ids = batch["input_ids"][0].tolist()
    assert r0["shift_labels"][0].tolist() == [ids[1], ids[2], ids[7], IGNORE_INDEX]  # token 1 predicts token 2
    assert r1["shift_labels"][0].tolist() == [ids[3], ids[4], ids[5], ids[6]]  # token 5 predicts token 6
    assert (r0["num_loss_tokens"], r1["num_loss_tokens"]) == (3, 4)


# -- refusals ------------------------------------------------------------------------------------------------


def test_tree_rows_are_refused():
    batch = make_batch([6, 4])
    batch["node_offsets"] = torch.tensor([0, 3, 6], dtype=torch.int32)
    batch["node_parents"] = torch.tensor([-1, 0, -1], dtype=torch.int32)
    with pytest.raises(ConfigError, match="linear rows only.*node_parents >= 0"):
        context_parallel_view(batch, cp_size=2, cp_rank=0)


def test_bidirectional_spans_are_refused():
    batch = make_batch([6, 4])
    batch["bidirectional_spans"] = torch.tensor([[1, 4]], dtype=torch.int32)
    with pytest.raises(ConfigError, match="causal examples only: this batch has bidirectional image spans"):
        context_parallel_view(batch, cp_size=2, cp_rank=0)
    batch["bidirectional_spans"] = torch.zeros(0, 2, dtype=torch.int32)  # none in this batch: fine
    context_parallel_view(batch, cp_size=2, cp_rank=0)


@pytest.mark.parametrize("cp_size,cp_rank,match", [
    (0, 0, "'cp_size' must be a positive integer, got 0"),
    (2.0, 0, "'cp_size' must be a positive integer, got 2.0"),
    (True, 0, "'cp_size' must be a positive integer, got True"),
    (2, 2, r"'cp_rank' must be an integer in \[0, 1\] for cp_size=2, got 2"),
    (2, -1, r"'cp_rank' must be an integer in \[0, 1\] for cp_size=2, got -1"),
])
def test_bad_cp_arguments(cp_size, cp_rank, match):
    with pytest.raises(ConfigError, match=match):
        context_parallel_view(make_batch([3]), cp_size=cp_size, cp_rank=cp_rank)


def test_bad_batches():
    batch = make_batch([3, 4])
    batch["labels"][0, 3] = 7  # a label on example 1's first token: nothing predicts it
    with pytest.raises(ShardError, match="example 1 \\(token 3\\) has a label on its first token"):
        context_parallel_views(batch, cp_size=2)
    two_rows = make_batch([3, 4])
    two_rows["input_ids"] = two_rows["input_ids"].expand(2, -1)
    with pytest.raises(ConfigError, match=r"one collated row of shape \(1, T\), got input_ids \(2, 7\)"):
        context_parallel_views(two_rows, cp_size=2)
    with pytest.raises(ConfigError, match=r"multiple of 2\*cp_size=4, got \[6\]"):
        partition_index([0, 6], cp_size=2, cp_rank=0)
