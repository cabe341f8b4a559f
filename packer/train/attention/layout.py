"""The boundaries of one packed batch (``PackedLayout``) and what attention derives from them.

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

Bidirectional spans (one image each, e.g. [1, 4) below) add "a span's tokens see each other". The varlen
kernels run one mask shape per call, so ``span_plan`` adds a second call, merged with the first by
``packer.train.attention.spans`` (whose docstring derives it): each span's tokens but its last as queries
against its tokens but its first as keys, window "key at or after the query's diagonal", i.e. exactly the
pairs j > i inside a span that the causal call leaves out.

    row:  | t i i i t |   span [1, 4)     call 1 (varlen_plan): the causal tree mask above
    span call: queries [1, 3), keys [2, 4): q1 sees k2 k3, q2 sees k3   cu_seqlens = [0, 2]

Local attention layers count along each root-to-leaf path, as the path run alone would: positions, not row
offsets (siblings sit between a branch and its parent). A sliding window (Gemma 3) keeps keys less than ``window``
positions back; a chunked layer (Llama 4) keeps keys of the query's own chunk, positions [c*C, (c+1)*C) with
c = pos // C, causal inside it. The varlen kernels take chunks as more segments (``chunk_plan``): each node's
queries cut where their chunk changes, each piece against its path's keys from its chunk's start, causal
bottom-right; no mask.

    path positions  P:0 1 2 | a:3 4 | b:3 4 5      chunk C = 2: chunks {0,1} {2,3} {4,5}
    chunk plan      queries P0 P1 -> keys P0 P1;  P2 -> P2;  a3 -> P2 a3;  a4 -> a4;  b3 -> P2 b3;  b4 b5 -> b4 b5

The tree structure itself (validation, token -> node, ancestors, predecessors) is ``packer.core.tree``;
this module turns it into torch masks and plans, cached per device on the layout object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from packer.core import arrays, tree
from packer.errors import ConfigError, ShardError


def span_ids(num_tokens: int, spans: torch.Tensor | None) -> torch.Tensor:
    """Group of the bidirectional span holding each token, -1 outside every span.  # (T,) long

    ``spans`` is (S, 2) of [start, end) row offsets, sorted and disjoint: each span is its own group (its
    index). (S, 3) rows (start, end, group) name the group, >= 0: spans of one group see each other.
    """
    out = torch.full((num_tokens,), -1, dtype=torch.long)
    if spans is None or len(spans) == 0:
        return out
    spans = torch.as_tensor(spans, dtype=torch.long)
    spans = spans.reshape(-1, spans.shape[-1] if spans.dim() == 2 else 2)
    t = torch.arange(num_tokens)
    idx = torch.searchsorted(spans[:, 0].contiguous(), t, right=True) - 1  # (T,) last span starting <= t
    inside = (idx >= 0) & (t < spans[idx.clamp(min=0), 1])
    group = spans[idx.clamp(min=0), 2] if spans.shape[1] == 3 else idx
    return torch.where(inside, group, out)


def image_spans(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(S, 2) [start, end) of every run of ``image_token_id`` (one image each, as Qwen2-VL lays them out):
    the bidirectional spans of a Molmo-style model."""
    ids = input_ids.reshape(-1)
    is_img = (ids == image_token_id).to(torch.int8)
    edges = torch.diff(is_img, prepend=is_img.new_zeros(1), append=is_img.new_zeros(1))  # (T+1,)
    starts = (edges == 1).nonzero().reshape(-1)
    ends = (edges == -1).nonzero().reshape(-1)
    return torch.stack([starts, ends], dim=1)


def build_attention_mask(
    num_tokens: int,
    cu_seqlens: Any,
    node_offsets: Any = None,
    node_parents: Any = None,
    *,
    bidirectional_spans: Any = None,
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


@dataclass(frozen=True)
class VarlenPlan:
    """Segments of one varlen call: segment s runs queries ``bounds_q[s]:bounds_q[s+1]`` of the (gathered)
    queries against keys ``bounds_k[s]:bounds_k[s+1]`` of the gathered keys.

    ``varlen_plan``: one segment per node, the node's queries against [ancestors ; node] keys, causal
    bottom-right; for a linear pack (no trees) the segments are the examples and nothing is gathered.
    ``span_plan``: one segment per bidirectional span (see the module docstring), q and k both gathered.
    ``chunk_plan``: one segment per (node, chunk of positions its queries reach), keys gathered from the path.
    """

    cu_seqlens_q: torch.Tensor  # (S+1,) int32
    cu_seqlens_k: torch.Tensor  # (S+1,) int32
    max_seqlen_q: int
    max_seqlen_k: int
    k_index: torch.Tensor | None  # (Tk,) long: the row position of each gathered key, None for identity
    bounds_q: list[int]  # cu_seqlens_q as Python ints (the per-segment SDPA loop)
    bounds_k: list[int]
    q_index: torch.Tensor | None = None  # (Tq,) long: the row position of each gathered query, None for identity


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
    """(S, 2) int64 [start, end) spans with full attention inside (Molmo-style images), sorted, disjoint,
    each inside one node; or (S, 3) with a group per span: a group's spans see each other (Molmo2 joins all
    the images of a sequence), and lie on one root-to-leaf path; None for none."""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        tree.check_layout(self.num_tokens, self.node_offsets, self.node_parents, self.cu_seqlens)
        if self.bidirectional_spans is not None:
            _check_spans(self.num_tokens, self.node_offsets.numpy(), self.bidirectional_spans.numpy())
            if self.bidirectional_spans.shape[1] == 3:
                _check_groups(self.node_offsets.numpy(), self.ancestors().numpy(), self.bidirectional_spans.numpy())

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
        """Build from boundary arrays (tensors, numpy or lists); missing nodes mean one node per example.

        Zero-token nodes (allowed by the shard format, and transparent) are dropped first, and so are empty
        spans; spans are sorted by start.
        """
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int32).reshape(-1).cpu()
        if node_offsets is None or len(node_offsets) == 0:
            offsets = cu[:-1].clone()
            parents = torch.full_like(offsets, -1)
        else:
            if node_parents is None:
                raise ShardError("'node_parents' is missing while 'node_offsets' is given")
            off, par = tree.drop_empty_nodes(int(num_tokens), _numpy(node_offsets), _numpy(node_parents))
            offsets = torch.from_numpy(off.astype(np.int32))
            parents = torch.from_numpy(par.astype(np.int32))
        spans = None
        if bidirectional_spans is not None and len(bidirectional_spans) > 0:
            spans = torch.as_tensor(bidirectional_spans, dtype=torch.long).cpu()
            spans = spans.reshape(-1, spans.shape[-1] if spans.dim() == 2 else 2)  # (S, 2), or (S, 3) with groups
            spans = spans[spans[:, 1] > spans[:, 0]]
            spans = spans[spans[:, 0].argsort(stable=True)] if len(spans) else None
        return cls(int(num_tokens), cu, offsets, parents, spans)

    @classmethod
    def from_batch(cls, batch: Mapping[str, Any], *, bidirectional_spans: Any = None) -> PackedLayout:
        """Build from a collated batch (``packer.train.data.collate.collate``): input_ids, cu_seqlens, node_offsets/parents
        and, for a profile with ``bidirectional_images``, ``bidirectional_spans`` (an explicit argument wins)."""
        missing = [k for k in ("input_ids", "cu_seqlens") if k not in batch]
        if missing:
            raise ShardError(f"the batch has no {missing}; found keys {sorted(batch)}")
        num_tokens = int(batch["input_ids"].shape[-1])
        return cls.from_tensors(
            num_tokens,
            batch["cu_seqlens"],
            batch.get("node_offsets"),
            batch.get("node_parents"),
            bidirectional_spans=bidirectional_spans if bidirectional_spans is not None else batch.get("bidirectional_spans"),
        )

    # ---- basic properties

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
        return self._cached((name, str(device)), lambda: copy_to(getattr(self, name), device))

    # ---- derived structure (CPU, cached): packer.core.tree on the layout's arrays

    def token_nodes(self) -> torch.Tensor:
        """(T,) node index of each token."""
        return self._cached(
            ("token_nodes",), lambda: torch.from_numpy(tree.token_nodes(self.num_tokens, self.node_offsets.numpy()))
        )

    def ancestors(self) -> torch.Tensor:
        """(N, N) bool ancestor-or-self matrix."""
        return self._cached(("ancestors",), lambda: torch.from_numpy(tree.ancestor_matrix(self.node_parents.numpy())))

    def predecessors(self) -> torch.Tensor:
        """(T,) long row position whose logit predicts each token, -1 at an example start."""
        return self._cached(
            ("predecessors",),
            lambda: torch.from_numpy(
                tree.predecessor_index(self.num_tokens, self.node_offsets.numpy(), self.node_parents.numpy())
            ),
        )

    def path_positions(self) -> torch.Tensor:
        """(T,) long position of each token on its root-to-leaf path: what it is when its path runs alone, so
        a sliding window counts along the path, not along the row (siblings sit between a branch and its parent)."""
        return self._cached(
            ("path_positions",),
            lambda: torch.from_numpy(
                tree.tree_position_ids(self.num_tokens, self.node_offsets.numpy(), self.node_parents.numpy())
            ).long(),
        )

    def span_ids(self) -> torch.Tensor:
        """(T,) bidirectional span of each token, -1 outside."""
        return self._cached(("span_ids",), lambda: span_ids(self.num_tokens, self.bidirectional_spans))

    def dense_mask(self, device: torch.device | str = "cpu", window: int | None = None,
                   chunk: int | None = None) -> torch.Tensor:
        """(T, T) bool mask, built once per device, window and chunk.

        ``window`` (a sliding-window layer's): key j also needs pos(j) > pos(i) - window, positions along the
        path (transformers' ``sliding_window_overlay`` ANDed onto causal-or-span, as Gemma 3 composes it).
        ``chunk`` (a chunked-attention layer's, Llama 4): key j also needs pos(j) // chunk == pos(i) // chunk
        (transformers' ``chunked_overlay``, ANDed the same way).
        """
        _check_local(window, chunk)
        if chunk is not None:
            return self._cached(
                ("dense_mask", str(torch.device(device)), "chunk", chunk),
                lambda: self.dense_mask(device) & _same_chunk(self.path_positions().to(device), chunk),
            )
        if window is not None:
            return self._cached(
                ("dense_mask", str(torch.device(device)), window),
                lambda: self.dense_mask(device) & _in_window(self.path_positions().to(device), window),
            )

        def build() -> torch.Tensor:
            dev = torch.device(device)
            node = copy_to(self.token_nodes(), dev)  # (T,)
            anc = copy_to(self.ancestors(), dev)  # (N, N)
            t = torch.arange(self.num_tokens, device=dev)
            mask = anc[node[:, None], node[None, :]] & (t[None, :] <= t[:, None])  # (T, T)
            if self.bidirectional_spans is not None:
                span = self.span_ids().to(dev)
                mask |= (span[:, None] == span[None, :]) & (span[:, None] >= 0)
            return mask

        return self._cached(("dense_mask", str(torch.device(device))), build)

    def mask_mod(self, device: torch.device | str, window: int | None = None, chunk: int | None = None,
                 pad: tuple[int, int] | None = None):
        """The flex_attention ``mask_mod(b, h, q_idx, kv_idx)`` of this layout, over tensors on ``device``.

        ``pad=(P, NP)``: the mask of the row padded to P tokens with NP >= N + 1 nodes, its padding tokens one
        extra node (NP - 1) that sees only itself: no real token sees padding, and padding sees no real token.
        """
        dev = torch.device(device)
        _check_local(window, chunk)
        tokens, nodes = pad if pad is not None else (self.num_tokens, self.num_nodes)
        if tokens < self.num_tokens or nodes < self.num_nodes + (pad is not None):
            raise ValueError(f"pad {pad} is smaller than the row ({self.num_tokens} tokens, {self.num_nodes} nodes)")

        def per_token(x: torch.Tensor, fill: int) -> torch.Tensor:
            return torch.cat([x, x.new_full((tokens - x.numel(),), fill)]).to(dev)

        if chunk is not None:
            inner = self.mask_mod(dev, pad=pad)
            cid = per_token(torch.div(self.path_positions(), chunk, rounding_mode="floor"), 0)

            def mask_mod_chunk(b, h, q_idx, kv_idx):
                return inner(b, h, q_idx, kv_idx) & (cid[kv_idx] == cid[q_idx])

            return mask_mod_chunk
        if window is not None:
            inner, pos = self.mask_mod(dev, pad=pad), per_token(self.path_positions(), 0)

            def mask_mod_window(b, h, q_idx, kv_idx):
                return inner(b, h, q_idx, kv_idx) & (pos[kv_idx] > pos[q_idx] - window)

            return mask_mod_window
        node = per_token(self.token_nodes(), nodes - 1)
        anc = self.ancestors()
        if pad is not None:
            grown = torch.zeros(nodes, nodes, dtype=anc.dtype)
            grown[: anc.shape[0], : anc.shape[1]] = anc
            grown[nodes - 1, nodes - 1] = True
            anc = grown
        anc = anc.to(dev)
        if self.bidirectional_spans is None:

            def mask_mod(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx) & anc[node[q_idx], node[kv_idx]]

            return mask_mod
        span = per_token(self.span_ids(), -1)

        def mask_mod_bidirectional(b, h, q_idx, kv_idx):
            tree_mask = (kv_idx <= q_idx) & anc[node[q_idx], node[kv_idx]]
            return tree_mask | ((span[q_idx] == span[kv_idx]) & (span[q_idx] >= 0))

        return mask_mod_bidirectional

    def block_mask(self, device: torch.device | str, window: int | None = None, chunk: int | None = None,
                   pad: tuple[int, int] | None = None):
        """The flex_attention BlockMask, built once per device, window, chunk and ``pad`` (see ``mask_mod``);
        compiled on CUDA: no T x T tensor."""
        from torch.nn.attention.flex_attention import create_block_mask

        dev = torch.device(device)
        length = self.num_tokens if pad is None else pad[0]
        return self._cached(
            ("block_mask", str(dev), window, chunk, pad),
            lambda: create_block_mask(
                self.mask_mod(dev, window, chunk, pad),
                B=None,
                H=None,
                Q_LEN=length,
                KV_LEN=length,
                device=dev,
                _compile=dev.type == "cuda",
            ),
        )

    def varlen_plan(self, device: torch.device | str = "cpu") -> VarlenPlan:
        """The per-node segments the varlen kernels run (see the module docstring), once per device."""

        def build() -> VarlenPlan:
            dev = torch.device(device)
            offsets = self.node_offsets.numpy().astype(np.int64)
            q_lens = tree.node_lengths(self.num_tokens, offsets)  # (N,)
            cu_q = np.append(offsets, self.num_tokens)  # nodes are contiguous: no q gather
            if self.is_linear:
                k_index, cu_k, k_lens = None, cu_q, q_lens
            else:
                # Segment n's keys are the tokens of n's ancestors and of n, in row order: the (n, m) pairs of
                # the ancestor matrix in row-major order, each expanded to node m's token range.
                seg, m = np.nonzero(self.ancestors().numpy())  # (P,) pairs
                span = q_lens[m]  # (P,) tokens per pair
                k_lens = np.bincount(seg, weights=span, minlength=len(offsets)).astype(np.int64)  # (N,)
                k_index = torch.from_numpy(arrays.spans(offsets[m], span))  # (Tk,)
                cu_k = np.concatenate([[0], np.cumsum(k_lens)])
            return VarlenPlan(
                cu_seqlens_q=copy_to(torch.from_numpy(cu_q), dev, torch.int32),
                cu_seqlens_k=copy_to(torch.from_numpy(cu_k), dev, torch.int32),
                max_seqlen_q=int(q_lens.max()),
                max_seqlen_k=int(k_lens.max()),
                k_index=None if k_index is None else copy_to(k_index, dev),
                bounds_q=cu_q.tolist(),
                bounds_k=cu_k.tolist(),
            )

        return self._cached(("varlen_plan", str(torch.device(device))), build)

    def chunk_plan(self, device: torch.device | str, chunk: int) -> VarlenPlan:
        """The varlen segments of a chunked-attention layer (see the module docstring), once per device and chunk.

        ``varlen_plan``'s segment of node n runs its queries (path positions p0 .. p0 + lq - 1, p0 its ancestors'
        tokens) against its path's keys (positions 0 .. p0 + lq - 1, in path order). Here each such segment is cut
        where the queries' chunk c = pos // chunk changes: the queries of chunk c against the path's keys from
        position c * chunk up to the last of those queries, causal bottom-right, so query p sees exactly the keys
        c * chunk .. p. Queries stay in row order (no q gather); every segment has at most ``chunk`` keys.
        """
        if int(chunk) != chunk or chunk < 1:
            raise ConfigError(f"attention chunk must be a positive integer, got {chunk!r}")
        chunk = int(chunk)

        def build() -> VarlenPlan:
            base = self.varlen_plan("cpu")
            bq, bk = np.asarray(base.bounds_q, dtype=np.int64), np.asarray(base.bounds_k, dtype=np.int64)
            lq, lk = np.diff(bq), np.diff(bk)  # (N,)
            p0 = lk - lq  # (N,) path position of each node's first query
            first, last = p0 // chunk, (p0 + lq - 1) // chunk  # (N,) the chunks each node's queries reach
            pieces = last - first + 1  # (N,)
            node = np.repeat(np.arange(len(lq)), pieces)  # (S,) the node of each segment
            c = arrays.spans(first, pieces)
            qa = np.maximum(c * chunk, p0[node])  # (S,) path positions of the segment's queries [qa, qb)
            qb = np.minimum((c + 1) * chunk, p0[node] + lq[node])
            kstart = bk[node] + c * chunk  # (S,) its keys: the node's path keys from the chunk's start up to qb
            klen = qb - c * chunk
            gathered = arrays.spans(kstart, klen)  # (Tk,) indices into the base plan's keys
            keys = gathered if base.k_index is None else base.k_index.cpu().numpy()[gathered]
            cu_q = np.append(bq[node] + (qa - p0[node]), self.num_tokens)
            cu_k = np.concatenate([[0], np.cumsum(klen)])
            dev = torch.device(device)
            return VarlenPlan(
                cu_seqlens_q=copy_to(torch.from_numpy(cu_q), dev, torch.int32),
                cu_seqlens_k=copy_to(torch.from_numpy(cu_k), dev, torch.int32),
                max_seqlen_q=int((qb - qa).max()),
                max_seqlen_k=int(klen.max()),
                k_index=copy_to(torch.from_numpy(keys.astype(np.int64)), dev),
                bounds_q=cu_q.tolist(),
                bounds_k=cu_k.tolist(),
            )

        return self._cached(("chunk_plan", str(torch.device(device)), chunk), build)

    def span_plan(self, device: torch.device | str = "cpu") -> VarlenPlan | None:
        """The second varlen call of ``packer.train.attention.spans``, once per device; None when no span has two
        tokens (a one-token span adds nothing to the causal mask).

        Span [a, b) becomes one segment: queries a .. b-2 (``q_index``) against keys a+1 .. b-1 (``k_index``),
        b-a-1 of each; run with window (0, -1) (key >= query along the segment's diagonal), query i sees the
        keys j with i < j < b: the span's pairs the causal call leaves out, and no other. A group of spans
        (S, 3) is one segment the same way over its tokens in row order (g_0 < g_1 < ...): queries g_0 ..
        g_{n-2} against keys g_1 .. g_{n-1}, so g_p sees the group's later tokens, on its path (checked).
        """

        def build() -> VarlenPlan | None:
            if self.bidirectional_spans is None:
                return None
            spans = self.bidirectional_spans.numpy()
            groups = spans[:, 2] if spans.shape[1] == 3 else np.arange(len(spans))
            order = np.lexsort((spans[:, 0], groups))  # group-major, then row order
            spans, groups = spans[order], groups[order]
            lens = spans[:, 1] - spans[:, 0]  # (S,)
            tokens = arrays.spans(spans[:, 0], lens)  # (Tg,) every span token, group-major
            _, first, sizes = np.unique(np.repeat(groups, lens), return_index=True, return_counts=True)
            big = np.repeat(sizes >= 2, sizes)  # a one-token group adds nothing to the causal mask
            if not big.any():
                return None
            last = np.zeros(len(tokens), dtype=bool)
            last[first + sizes - 1] = True
            head = np.zeros(len(tokens), dtype=bool)
            head[first] = True
            q_index, k_index = tokens[big & ~last], tokens[big & ~head]  # (T2,) each
            seg = sizes[sizes >= 2] - 1  # queries (= keys) per segment
            cu = np.concatenate([[0], np.cumsum(seg)])
            dev = torch.device(device)
            return VarlenPlan(
                cu_seqlens_q=copy_to(torch.from_numpy(cu), dev, torch.int32),
                cu_seqlens_k=copy_to(torch.from_numpy(cu), dev, torch.int32),
                max_seqlen_q=int(seg.max()),
                max_seqlen_k=int(seg.max()),
                k_index=copy_to(torch.from_numpy(k_index), dev),
                bounds_q=cu.tolist(),
                bounds_k=cu.tolist(),
                q_index=copy_to(torch.from_numpy(q_index), dev),
            )

        return self._cached(("span_plan", str(torch.device(device))), build)


def _check_spans(num_tokens: int, node_offsets: np.ndarray, spans: np.ndarray) -> None:
    """Spans are sorted, disjoint, non-empty, inside the row and each inside one node (an image never straddles
    nodes: ``packer verify`` checks the shards for it), which the span call relies on (its keys are the
    span's own tokens, all in the query's node)."""
    start, end = spans[:, 0], spans[:, 1]
    if len(spans) and (start.min() < 0 or end.max() > num_tokens or (end <= start).any()):
        raise ShardError(f"bidirectional spans must be non-empty [start, end) ranges inside 0..{num_tokens}, "
                         f"got {spans[:8].tolist()}")
    if (start[1:] < end[:-1]).any():
        raise ShardError(f"bidirectional spans overlap: {spans[:8].tolist()}")
    node_first = np.searchsorted(node_offsets, start, side="right")
    node_last = np.searchsorted(node_offsets, end - 1, side="right")
    if (node_first != node_last).any():
        s = int(np.flatnonzero(node_first != node_last)[0])
        raise ShardError(f"bidirectional span {spans[s].tolist()} crosses a node boundary "
                         f"(node_offsets {node_offsets[:16].tolist()}): a span must lie inside one node")


def _check_groups(node_offsets: np.ndarray, anc: np.ndarray, spans: np.ndarray) -> None:
    """Grouped spans (sorted by start) lie on one root-to-leaf path per group: each span's node descends from
    (or is) the node of the group's previous span, so the span call's keys are all visible to every path
    holding the query (and a group never joins two examples)."""
    if (spans[:, 2] < 0).any():
        raise ShardError(f"bidirectional span groups must be >= 0, got {spans[:8].tolist()}")
    order = np.lexsort((spans[:, 0], spans[:, 2]))
    nodes = np.searchsorted(node_offsets, spans[order, 0], side="right") - 1
    same = spans[order[1:], 2] == spans[order[:-1], 2]
    bad = same & ~anc[nodes[1:], nodes[:-1]]
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ShardError(f"bidirectional spans {spans[order[k]].tolist()} and {spans[order[k + 1]].tolist()} share "
                         "a group but not a root-to-leaf path")


def _check_local(window: int | None, chunk: int | None) -> None:
    """A layer is sliding-window or chunked, never both (no model has both; their composition is not defined)."""
    if window is not None and chunk is not None:
        raise ConfigError(f"a layer with both a sliding window ({window}) and attention chunks ({chunk}) is not supported")


def _same_chunk(pos: torch.Tensor, chunk: int) -> torch.Tensor:
    """(T, T) bool: pos(i) // chunk == pos(j) // chunk, transformers' ``chunked_overlay`` on path positions."""
    cid = torch.div(pos, chunk, rounding_mode="floor")
    return cid[:, None] == cid[None, :]


def _in_window(pos: torch.Tensor, window: int) -> torch.Tensor:
    """(T, T) bool: pos(j) > pos(i) - window; it bounds the past only, as transformers' sliding_window_overlay."""
    return pos[None, :] > pos[:, None] - window


def copy_to(x: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x.to(device, dtype)``; a CPU tensor bound for CUDA goes through pinned memory without blocking.

    A plain host-to-device copy from pageable memory waits for the whole stream: once per layout array, that
    stalls a host-bound training step behind the GPU's queue every forward. The caching host allocator keeps the
    pinned block until its copy has run.
    """
    device = torch.device(device)
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _numpy(x: Any) -> np.ndarray:
    """A CPU view of a tensor (no copy), or the array itself."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
