"""The ``batch-finish`` fast path: the common records of a batch finished together, as columns.

A conversation, linear or a tree, whose media are images its family lays out as the placeholder repeated or,
with flat positions, as a run laid out in tokens of its own (named tokens: InternVL, Molmo2, Mistral 3; or a
text that begins and ends with a special token: SmolVLM; the run's ids written over the placeholder repeated, its
entry ``lead`` tokens in), or, with flat positions, as blocks of such runs (Gemma 3's pan-and-scan: each block's
placeholder an entry of its own), with no per-token loss weight, that fits
``max_length`` and carries loss: its draft (``draft.tree_draft``: nodes as path deltas), media runs
(``media.expand``) and positions (``Encoder._encoded``: 1-D and ``positions.extra``) are one pass over the batch's
flat ids, not a dozen numpy calls per record:

    nodes         each node's segment of its path's tokens (past its parent's path), gathered back to back;
                  every child's path compared with its parent's in one token compare
    placeholders  one ``is_placeholder`` lookup over that layout; each node's count checked in one bincount
    runs          one ``np.repeat`` of the ids and labels (each image's placeholder -> its run)
    positions     ``tree_position_ids`` and mRoPE (``expected_mrope``) over the records as one forest

No step needs a loop, so no compiled kernel: numpy over the whole batch. What stays per record is what is one
per record: the check that it is eligible and each image's plan (its size, cached per file). The records stay
columns (``Rows``: the batch's flat arrays, a ``Row`` per record naming its index): a build's chunk table
(``shards.assemble.encoded_table``) gathers each column from them in one step, and an ``Encoded`` (views of
those arrays) is made only where a caller asks for one (``Encoder.encode_batch`` without ``rows``).

A ``text`` record is [bos] + its tokens + eos, positions 0..L-1: the batch's text records are one ``Rows`` of
their own (``_text_rows``), with no forest to lay out.

Anything it cannot prove identical goes to the general path (``Encoder._finish``), which is the reference: a
``text`` record over ``max_length`` (its length policy), holding a media token or of fewer than 2 tokens, videos
or audio, image blocks with mRoPE or beside a family's own ``media_runs``, a run of text whose ends are not special
tokens (its edges are checked in place), named tokens or text with mRoPE, a family's own ``media_runs`` where it
gives other runs, positions other than flat or Qwen2-VL's mRoPE (``BatchFinish.of``),
adjacent image placeholders (one run of image tokens for two images: mRoPE's error), loss weights, a node with no
tokens, a path that does not extend its parent's, an example over ``max_length``, one with no loss token and every
media-count error (the general path raises them, located). tests/encode/test_finish.py compares the two on random
batches; docs/benchmarks.md, "Fast paths", its gain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packer.core import arrays
from packer.core.tree import tree_position_ids
from packer.core.types import IGNORE_INDEX, Encoded, EncodedImage, Example, ImageRef
from packer.encode.context import EncodeContext
from packer.encode.draft import Tokens
from packer.encode.render import Staged
from packer.models.base import ModelProfile
from packer.models.rules import Media, MediaRun, Positions, flat_mrope
from packer.models.shared.mrope import MRoPE, expected_mrope


class BatchFinish:
    """``finish`` a batch's eligible records; built once per Encoder (None where its profile has no such path:
    ``BatchFinish.of``)."""

    def __init__(self, ctx: EncodeContext, mrope: MRoPE | None):
        self.ctx = ctx
        self.mrope = mrope
        self._runs: dict[tuple[int, int], tuple[MediaRun, ...] | None] = {}  # image size -> its entries' runs
        # a family's own media_runs (the cross-medium hook) is asked per record with images, as the general path asks
        self._own_runs = type(ctx.profile).media_runs is not ModelProfile.media_runs
        # whether the vocabulary holds any placeholder token (a text profile's does not): else no record's tokens
        # are looked up for one
        self._placeholders = bool(ctx.is_placeholder.any())

    @classmethod
    def of(cls, ctx: EncodeContext) -> BatchFinish | None:
        """The batch finish for this encoder's profile, or None: positions other than flat (exactly ``Positions``)
        or Qwen2-VL's mRoPE for images (an ``MRoPE`` whose ``extra`` is MRoPE's, as Qwen3-VL's subclass, which
        differs in its videos' spans only; or one that says its own gives MRoPE's answer for images,
        ``images_as_qwen2``: GLM's). Videos are the general path's."""
        positions = ctx.profile.positions
        if type(positions) is Positions:
            return cls(ctx, None)
        if (isinstance(positions, MRoPE) and (type(positions).extra is MRoPE.extra or positions.images_as_qwen2)
                and ctx.image_token_id is not None):
            return cls(ctx, positions)
        return None

    def _run(self, ref: ImageRef) -> tuple[MediaRun, ...] | None:
        """The image's entries' runs (one, or one per block: ``_blocks``) where each is ``_plain``; else None."""
        rule = self.ctx.profile.image
        size = rule.plan(ref)
        if size in self._runs:
            return self._runs[size]
        blocks = rule.blocks(size)
        runs: tuple[MediaRun, ...] | None
        if blocks is None:
            one = self._plain(rule.run(size))
            runs = None if one is None else (one,)
        else:
            runs = self._blocks(blocks.runs)
        if len(self._runs) >= 4096:  # a dataset has few sizes; bound the cache all the same
            self._runs.clear()
        self._runs[size] = runs
        return runs

    def _plain(self, run: MediaRun) -> MediaRun | None:
        """The run where it is the placeholder repeated (``num_tokens`` >= 1, no lead) and, with mRoPE, its
        grid's merged tokens, or, with flat positions, laid out in tokens of its own (``_laid``); else None."""
        laid = run.tokens is not None or run.text is not None
        if run.inside or run.num_tokens < 1 or (not laid and run.lead) or (laid and self.mrope is not None):
            return None
        if laid:
            return run if self._laid(run) else None
        if self.mrope is not None:
            t, h, w = (int(x) for x in run.grid)
            m = self.mrope.merge_size
            if t * (h // m) * (w // m) != run.num_tokens:
                return None
        return run

    def _laid(self, run: MediaRun) -> bool:
        """Whether the run's ids are the same wherever it lies: named tokens (InternVL's <img>...</img>,
        Molmo's, Mistral 3's; its entry ``lead`` tokens in), or a text (SmolVLM's ``<fake_token_around_image>``
        ... ``<row_1_col_1>`` ...) that begins and ends with a special token, so that ``RunIds.check_edges``
        has nothing to check. A ConfigError (a token the tokenizer lacks) is the general path's to raise."""
        ids = self.ctx.runs.ids(run, _NO_IDS, 0)  # cached per run; no edge checked with no ids around it
        if run.tokens is not None:
            return True
        special = self.ctx.tokens.is_special
        return ids is not None and ids.shape[0] > 0 and bool(special[ids[0]]) and bool(special[ids[-1]])

    def _blocks(self, runs: tuple[MediaRun, ...]) -> tuple[MediaRun, ...] | None:
        """An image the processor writes as blocks (Gemma 3's pan-and-scan: the render stage already wrote them,
        one placeholder each), with flat positions and no family ``media_runs`` (asked of plain images only):
        each block an entry of its own, where every block's run is ``_plain``."""
        if self.mrope is not None or self._own_runs:
            return None
        return runs if all(self._plain(r) is not None for r in runs) else None

    def _same_runs(self, s: Staged, wants: list[int], mine: list[tuple[ImageRef, MediaRun]]) -> bool:
        """Whether the family's own ``media_runs`` gives this record's images their plain runs (``mine``): where
        it gives others, or raises, the record is the general path's."""
        nodes = [n for n, w in enumerate(wants) for _ in range(w)]
        try:
            got = self.ctx.profile.media_runs([Media(r, n) for (r, _), n in zip(mine, nodes, strict=True)],
                                              np.asarray(s.parents, dtype=np.int64))
            return len(got) == len(mine) and all(a == b for a, (_, b) in zip(got, mine, strict=False))
        except Exception:  # noqa: BLE001 - the general path raises it, located
            return False

    def _media(self, s: Staged, mine: list[tuple[ImageRef, MediaRun]], wants: list[int]) -> bool:
        """Each node's media entries of ``s`` (into ``mine``, their counts into ``wants``); False where a medium
        or an image is the general path's."""
        ctx = self.ctx
        for node in s.nodes:
            refs = [p for m in node.messages for p in m.parts if not isinstance(p, str)]
            entries: list[tuple[ImageRef, MediaRun]] = []  # one per entry: per block of an image in blocks
            if refs:
                if ctx.profile.image is None or not all(type(r) is ImageRef for r in refs):
                    return False
                try:
                    runs = [self._run(r) for r in refs]
                except Exception:  # noqa: BLE001 - a bad image: the general path raises it, located
                    return False
                if any(r is None for r in runs):
                    return False
                entries = [(r, run) for r, rs in zip(refs, runs, strict=True) for run in rs]  # type: ignore[union-attr]
                mine += entries
            wants.append(len(entries))
        return True

    def finish(self, examples: Sequence[Example], staged: Sequence[Staged], tokens: Tokens,
               max_length: int | None) -> list[Encoded | None]:
        """Each example's Encoded, or None where it takes the general path (``Encoder._finish``)."""
        return [None if row is None else row.encoded() for row in self.rows(examples, staged, tokens, max_length)]

    def rows(self, examples: Sequence[Example], staged: Sequence[Staged], tokens: Tokens,
             max_length: int | None) -> list[Row | None]:
        """Each example's Row (its columns in the batch's ``Rows``), or None where it takes the general path.

        A record is its nodes' segments of the batch's texts (node i: its path's tokens past its parent's path,
        as ``draft.join_nodes``), gathered back to back; everything after is one pass over that layout."""
        ctx = self.ctx
        out: list[Row | None] = [None] * len(examples)
        self._text_rows(examples, staged, tokens, max_length, out)
        if tokens.weights is not None:  # per-token loss weights: the general path
            return out
        starts = tokens.starts
        chosen: list[int] = []  # per record taken: its example's index, its first node (then one past the last)
        first_node: list[int] = [0]
        images: list[tuple[ImageRef, MediaRun]] = []  # every record's images (ref, run), in token order
        seg_text: list[int] = []  # per node: its path's text, tokens skipped (its parent's path), images named
        seg_skip: list[int] = []
        seg_want: list[int] = []
        parents: list[int] = []  # per node, the node index in this batch's forest (-1 for a root)
        prefix: list[tuple[int, int]] = []  # (node's text, parent's text) of every child, to compare as tokens
        for i, (example, s) in enumerate(zip(examples, staged, strict=True)):
            if example.kind == "text" or not s.nodes:
                continue
            if s.plain and len(s.nodes) == 1:  # a linear text chat (most records): one root node, no media
                seg_text.append(s.first)
                seg_skip.append(0)
                parents.append(-1)
                chosen.append(i)
                first_node.append(first_node[-1] + 1)
                seg_want.append(0)
                continue
            mine: list[tuple[ImageRef, MediaRun]] = []
            wants: list[int] = []
            fine = True
            if s.plain:  # every message one text (``render.stage_batch``): no media to look for
                wants = [0] * len(s.nodes)
            else:
                fine = self._media(s, mine, wants)
            if not fine or (mine and self._own_runs and not self._same_runs(s, wants, mine)):
                continue
            base = first_node[-1]
            if len(s.nodes) == 1:  # a linear conversation: one root node, nothing to compare
                seg_text.append(s.first)
                seg_skip.append(0)
                parents.append(-1)
                chosen.append(i)
                first_node.append(base + 1)
                images += mine
                seg_want += wants
                continue
            for n, parent in enumerate(s.parents):
                k = s.first + n
                seg_text.append(k)
                if parent < 0:
                    seg_skip.append(0)
                    parents.append(-1)
                else:
                    if not s.texts[n].startswith(s.texts[parent]):
                        break  # the general path's template_error
                    seg_skip.append(starts[s.first + parent + 1] - starts[s.first + parent])
                    parents.append(base + parent)
                    prefix.append((k, s.first + parent))
            else:
                chosen.append(i)
                first_node.append(base + len(s.nodes))
                images += mine
                seg_want += wants
                continue
            del seg_text[base:], seg_skip[base:], parents[base:]  # undo this record's nodes
            prefix = [(k, q) for k, q in prefix if k < s.first]
        if not chosen:
            return out
        ids, batch_starts = tokens.ids, np.asarray(starts, dtype=np.int64)
        n_rec = len(chosen)
        rec_nodes = np.asarray(first_node, dtype=np.int64)  # (R + 1,) each record's first node
        k = np.asarray(seg_text, dtype=np.int64)
        lo = batch_starts[k] + np.asarray(seg_skip, dtype=np.int64)
        seg_len = batch_starts[k + 1] - lo
        ok = np.ones(n_rec, dtype=bool)
        node_rec = np.repeat(np.arange(n_rec), np.diff(rec_nodes))  # (N,) record of each node
        ok[node_rec[seg_len <= 0]] = False  # a node with no tokens (a child's: template_error)
        if prefix:  # each child's path starts with its parent's path, token for token
            pk, pq = np.asarray(prefix, dtype=np.int64).T
            plen = batch_starts[pq + 1] - batch_starts[pq]
            short = batch_starts[pk + 1] - batch_starts[pk] < plen  # fewer tokens than its parent's path
            bad = short | _unprefixed(ids, batch_starts[pk], batch_starts[pq], np.where(short, 0, plen))
            node_of_text = np.full(batch_starts.shape[0], -1, dtype=np.int64)
            node_of_text[k] = np.arange(k.shape[0])
            ok[node_rec[node_of_text[pk[bad]]]] = False
        if not ok.all():  # those records leave the forest: every node left holds tokens
            keep = ok[node_rec]
            renumber = np.cumsum(keep) - 1
            forest = np.asarray(parents, dtype=np.int64)[keep]
            parents = np.where(forest >= 0, renumber[np.maximum(forest, 0)], -1).tolist()
            k, lo, seg_len = k[keep], lo[keep], seg_len[keep]
            rec_images = np.add.reduceat(np.asarray(seg_want, dtype=np.int64), rec_nodes[:-1])
            images = [im for im, x in zip(images, np.repeat(ok, rec_images).tolist(), strict=True) if x]
            seg_want = [w for w, x in zip(seg_want, keep.tolist(), strict=True) if x]
            counts = np.diff(rec_nodes)[ok]
            rec_nodes = np.zeros(int(ok.sum()) + 1, dtype=np.int64)
            np.cumsum(counts, out=rec_nodes[1:])
            chosen = [c for c, x in zip(chosen, ok.tolist(), strict=True) if x]
            n_rec = len(chosen)
            node_rec = np.repeat(np.arange(n_rec), counts)
            ok = np.ones(n_rec, dtype=bool)
            if not chosen:
                return out
        # the records' nodes back to back (the draft's layout), then every placeholder of it
        seg_off = np.zeros(k.shape[0] + 1, dtype=np.int64)
        np.cumsum(seg_len, out=seg_off[1:])
        gather = np.repeat(lo - seg_off[:-1], seg_len) + np.arange(int(seg_off[-1]))
        g_ids, g_labels = ids[gather], tokens.labels[gather]
        pos = np.flatnonzero(ctx.is_placeholder[g_ids]) if self._placeholders else np.zeros(0, dtype=np.int64)
        node_of = np.searchsorted(seg_off, pos, side="right") - 1
        want = np.asarray(seg_want, dtype=np.int64)
        is_image = g_ids[pos] == ctx.image_token_id if ctx.image_token_id is not None else np.zeros(pos.shape[0], bool)
        found = np.bincount(node_of, minlength=k.shape[0])
        found_images = np.bincount(node_of[is_image], minlength=k.shape[0])
        ok[node_rec[(found != want) | (found_images != want)]] = False  # media-count errors: the general path's
        touch = pos[1:] == pos[:-1] + 1  # two placeholders side by side: one run of image tokens (mRoPE's error)
        ok[node_rec[node_of[1:][touch]]] = False
        # the runs: each placeholder of a record still eligible repeated its run's num_tokens times
        rec_images = np.add.reduceat(want, rec_nodes[:-1])
        img_ok = np.repeat(ok, rec_images)
        rec_of_pos = node_rec[node_of]
        placed = pos[ok[rec_of_pos]]
        named = [None if run.tokens is None and run.text is None else ctx.runs.ids(run, _NO_IDS, 0)
                 for _, run in images]  # runs laid out in tokens of their own (``_laid``)
        spans = np.array([run.num_tokens for _, run in images], dtype=np.int64)  # each entry's stored tokens
        runs = np.array([run.num_tokens if x is None else x.shape[0] for (_, run), x in zip(images, named, strict=True)],
                        dtype=np.int64)  # each run's tokens in the example
        if placed.shape[0]:
            repeats = np.ones(gather.shape[0], dtype=np.int64)
            repeats[placed] = runs[img_ok]
            g_labels[placed] = IGNORE_INDEX
            new_ids, new_labels = np.repeat(g_ids, repeats), np.repeat(g_labels, repeats)
            moved = np.zeros(gather.shape[0] + 1, dtype=np.int64)  # the draft's token x -> its first in the new layout
            np.cumsum(repeats, out=moved[1:])
            node_start = moved[seg_off]  # (N + 1,)
        else:  # no image placed (text chats): the layout is the draft's, token for token
            new_ids, new_labels = g_ids, g_labels
            moved = None
            node_start = seg_off
        rec_start = node_start[rec_nodes]  # (R + 1,)
        length = np.diff(rec_start)
        new_labels[rec_start[:-1][ok]] = IGNORE_INDEX  # nothing predicts an example's first token
        # no loss token: the general path raises it (counted from where the loss tokens are: a (T,) cumsum of
        # the mask costs ~10x the flatnonzero on this box)
        loss = np.flatnonzero(new_labels != IGNORE_INDEX)
        ok &= np.searchsorted(loss, rec_start[1:]) - np.searchsorted(loss, rec_start[:-1]) > 0
        if max_length is not None:
            ok &= length <= max_length
        if not ok.any():
            return out
        # positions of the whole forest: each root restarts at 0 (a record that left is computed and dropped)
        total = int(rec_start[-1])
        forest_parents = np.asarray(parents, dtype=np.int64)
        positions = tree_position_ids(total, node_start[:-1], forest_parents)
        img_first = np.zeros(n_rec + 1, dtype=np.int64)
        np.cumsum(rec_images, out=img_first[1:])
        where = np.zeros(spans.shape[0], dtype=np.int64)
        if moved is not None:
            where[np.flatnonzero(img_ok)] = moved[placed]  # each image's first token, in the new layout
        lead = np.zeros(spans.shape[0], dtype=np.int64)
        laid = [q for q, x in enumerate(named) if x is not None and img_ok[q]]
        if laid:  # the named runs' own ids over their placeholder repeated, as ``media.expand`` writes them
            lead[laid] = [images[q][1].lead for q in laid]
            new_ids[arrays.spans(where[laid], runs[laid])] = np.concatenate([named[q] for q in laid])
        offsets = where + lead - np.repeat(rec_start[:-1], rec_images)  # each entry inside its record
        grids = np.array([run.grid for _, run in images], dtype=np.int64).reshape(-1, 3)
        mrope = None
        if self.mrope is not None:
            use = np.repeat(ok, rec_images)
            mrope = expected_mrope(total, node_start[:-1], forest_parents, where[use], grids[use],
                                   spatial_merge_size=self.mrope.merge_size).astype(np.int32)
        sel = np.flatnonzero(ok)
        ctx.paths["finish:batch"] += int(sel.shape[0])
        block = Rows(ids=new_ids, labels=new_labels, positions=positions, mrope=mrope, bounds=rec_start,
                     node_start=node_start, rec_nodes=rec_nodes, parents=forest_parents, images=images,
                     img_first=img_first, img_offsets=offsets, img_tokens=spans, img_grids=grids)
        for r in sel.tolist():
            example = examples[chosen[r]]
            out[chosen[r]] = Row(block, r, example.example_id, example.source_name)
        return out

    def chats(self, tokens: Tokens, paths: np.ndarray, max_length: int | None) -> tuple[Rows, np.ndarray]:
        """``rows`` of a batch of text chats (``Encoder.encode_chats``: every message one text, no image or per-token
        weight to look at): record k's texts are its paths ``paths[k]`` .. ``paths[k + 1] - 1``, its root's first,
        then its branches' (a linear chat: one), each node the tokens of its path past its root's path. Returns
        the Rows and (R,) whether each record is one ``rows`` takes: a node of no token, a branch's path that
        does not start with its root's tokens, a placeholder token (a media-count error), over ``max_length`` or
        no loss token and it is not (the general path decides it)."""
        ctx = self.ctx
        starts = np.asarray(tokens.starts, dtype=np.int64)
        n_rec, n = paths.shape[0] - 1, starts.shape[0] - 1  # records, and their nodes (one path each)
        size = np.diff(starts)
        rec_of = np.repeat(np.arange(n_rec), np.diff(paths))
        root = paths[:-1][rec_of]  # each node's root (itself for a root)
        child = np.flatnonzero(root != np.arange(n))
        skip = np.zeros(n, dtype=np.int64)  # a branch's: its root's path, which its path starts with
        skip[child] = size[root[child]]
        seg_len = size - skip
        ok = np.ones(n_rec, dtype=bool)
        ok[rec_of[seg_len <= 0]] = False
        seg_len = np.maximum(seg_len, 0)
        ids, labels = tokens.ids, tokens.labels
        if child.shape[0]:  # each branch's path starts with its root's, token for token
            bad = _unprefixed(ids, starts[child], starts[root[child]], np.where(seg_len[child] > 0, skip[child], 0))
            ok[rec_of[child[bad]]] = False
        node_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(seg_len, out=node_start[1:])
        total = int(node_start[-1])
        if child.shape[0]:  # each node's segment, back to back
            gather = np.repeat(starts[:-1] + skip - node_start[:-1], seg_len) + np.arange(total)
            ids, labels = ids[gather], labels[gather]
        if self._placeholders:
            ok[rec_of[np.searchsorted(node_start, np.flatnonzero(ctx.is_placeholder[ids]), side="right") - 1]] = False
        bounds = node_start[paths]  # (R + 1,) each record's first token
        labels[bounds[:-1][ok]] = IGNORE_INDEX  # nothing predicts an example's first token
        loss = np.flatnonzero(labels != IGNORE_INDEX)
        ok &= np.searchsorted(loss, bounds[1:]) - np.searchsorted(loss, bounds[:-1]) > 0
        if max_length is not None:
            ok &= np.diff(bounds) <= max_length
        parents = np.where(root == np.arange(n), -1, root)
        positions = tree_position_ids(total, node_start[:-1], parents)
        # mRoPE of text alone: each token's three positions are its 1-D one (``expected_mrope`` with no image)
        mrope = None if self.mrope is None else flat_mrope(positions)
        empty = np.zeros(0, dtype=np.int64)
        ctx.paths["finish:batch"] += int(ok.sum())
        block = Rows(ids=ids, labels=labels, positions=positions, mrope=mrope, bounds=bounds, node_start=node_start,
                     rec_nodes=paths, parents=parents, images=[], img_first=np.zeros(n_rec + 1, dtype=np.int64),
                     img_offsets=empty, img_tokens=empty, img_grids=empty.reshape(0, 3))
        return block, ok

    def _text_rows(self, examples: Sequence[Example], staged: Sequence[Staged], tokens: Tokens,
                   max_length: int | None, out: list[Row | None]) -> None:
        """The batch's ``text`` records as one ``Rows`` of their own (into ``out``): ``texts`` of their texts."""
        chosen = [i for i, e in enumerate(examples) if e.kind == "text"]
        if not chosen:
            return
        k = np.fromiter((staged[i].first for i in chosen), dtype=np.int64, count=len(chosen))
        block, ok = self.texts(tokens.ids, tokens.starts, max_length, k)
        if block is None:
            return
        for r in np.flatnonzero(ok).tolist():
            example = examples[chosen[r]]
            out[chosen[r]] = Row(block, r, example.example_id, example.source_name)

    def texts(self, flat: np.ndarray, text_starts: list[int], max_length: int | None, k: np.ndarray | None = None
              ) -> tuple[Rows | None, np.ndarray]:
        """``text`` records, texts ``k`` (default: every one) of a batch's tokens (``flat``, text j's from
        ``text_starts[j]``), as one ``Rows`` of their own: each is
        ``text_draft``'s [bos] + its text's tokens + eos, loss on every token but the first, positions 0..L-1
        (mRoPE's three rows equal to them); and (R,) whether each is taken. Left to the general path: a record
        holding a media token literally, one over ``max_length`` (its length policy) and one of fewer than 2
        tokens (no loss token). None for the Rows where none is taken."""
        ctx = self.ctx
        starts = np.asarray(text_starts, dtype=np.int64)
        if k is None:
            k = np.arange(starts.shape[0] - 1)
        lo, body = starts[k], starts[k + 1] - starts[k]
        bos, eos = ctx.tokens.bos_id, ctx.tokens.eos_id
        head, tail = int(bos is not None), int(eos is not None)
        length = body + head + tail
        n = k.shape[0]
        bounds = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(length, out=bounds[1:])
        total = int(bounds[-1])
        first = bounds[:-1]
        ids = np.empty(total, dtype=np.int32)
        keep = np.ones(total, dtype=bool)  # body tokens
        if head:
            ids[first] = bos
            keep[first] = False
        if tail:
            ids[bounds[1:] - 1] = eos
            keep[bounds[1:] - 1] = False
        at = np.flatnonzero(keep)
        ids[at] = flat[at + np.repeat(lo - first - head, body)]
        rec = np.repeat(np.arange(n), length)
        ok = length >= 2
        if max_length is not None:
            ok &= length <= max_length
        if self._placeholders:  # a media token written literally: the general path raises it
            ok[rec[ctx.is_placeholder[ids]]] = False
        if not ok.any():
            return None, ok
        labels = ids.copy()
        labels[first] = IGNORE_INDEX  # nothing predicts an example's first token
        positions = (np.arange(total, dtype=np.int64) - np.repeat(first, length)).astype(np.int32)
        mrope = None if self.mrope is None else flat_mrope(positions)
        empty = np.zeros(0, dtype=np.int64)
        block = Rows(ids=ids, labels=labels, positions=positions, mrope=mrope, bounds=bounds, node_start=bounds,
                     rec_nodes=np.arange(n + 1, dtype=np.int64), parents=np.full(n, -1, dtype=np.int64), images=[],
                     img_first=np.zeros(n + 1, dtype=np.int64), img_offsets=empty, img_tokens=empty,
                     img_grids=empty.reshape(0, 3))
        ctx.paths["finish:batch"] += int(ok.sum())
        return block, ok


class Rows:
    """A batch's finished records as flat columns (what ``BatchFinish.rows`` computed): each record ``r`` its
    tokens ``bounds[r]:bounds[r + 1]``, its nodes ``rec_nodes[r]:rec_nodes[r + 1]`` (starts ``node_start``,
    forest ``parents``), its images ``img_first[r]:img_first[r + 1]``. Records that left the batch path stay in
    it, unread. ``shards.assemble.encoded_table`` gathers its rows' columns straight from these arrays."""

    __slots__ = ("ids", "labels", "positions", "mrope", "bounds", "node_start", "rec_nodes", "parents", "images",
                 "img_first", "img_offsets", "img_tokens", "img_grids")

    def __init__(self, *, ids: np.ndarray, labels: np.ndarray, positions: np.ndarray, mrope: np.ndarray | None,
                 bounds: np.ndarray, node_start: np.ndarray, rec_nodes: np.ndarray, parents: np.ndarray,
                 images: list[tuple[ImageRef, MediaRun]], img_first: np.ndarray, img_offsets: np.ndarray,
                 img_tokens: np.ndarray, img_grids: np.ndarray):
        self.ids, self.labels, self.positions, self.mrope = ids, labels, positions, mrope
        self.bounds, self.node_start, self.rec_nodes, self.parents = bounds, node_start, rec_nodes, parents
        self.images, self.img_first, self.img_offsets, self.img_tokens = images, img_first, img_offsets, img_tokens
        self.img_grids = img_grids  # (M, 3) each image's grid

    def columns(self, rs: np.ndarray) -> dict[str, np.ndarray]:
        """Records ``rs``' columns back to back: ``lengths``, ``input_ids``, ``labels``, ``position_ids``,
        ``mrope`` ((3, T) or None), ``node_counts``, ``node_offsets``, ``node_parents`` (int32, each inside its
        record), ``image_counts`` and ``images``: the gathered image indices (into ``self.images``)."""
        x, y = self.bounds[rs], self.bounds[rs + 1]
        nf, nl = self.rec_nodes[rs], self.rec_nodes[rs + 1]
        if rs.shape[0] and (np.diff(rs) == 1).all():  # consecutive records (the common case): views
            tokens: np.ndarray | slice = slice(int(x[0]), int(y[-1]))
            nodes: np.ndarray | slice = slice(int(nf[0]), int(nl[-1]))
            images = np.arange(self.img_first[rs[0]], self.img_first[rs[-1] + 1], dtype=np.int64)
        else:
            tokens, nodes = arrays.spans(x, y - x), arrays.spans(nf, nl - nf)
            images = arrays.spans(self.img_first[rs], self.img_first[rs + 1] - self.img_first[rs])
        node_counts = nl - nf
        parents = self.parents[nodes]
        return {
            "lengths": y - x,
            "input_ids": self.ids[tokens],
            "labels": self.labels[tokens],
            "position_ids": self.positions[tokens],
            "mrope": None if self.mrope is None else self.mrope[:, tokens],
            "node_counts": node_counts,
            "node_offsets": (self.node_start[nodes] - np.repeat(x, node_counts)).astype(np.int32),
            "node_parents": np.where(parents >= 0, parents - np.repeat(nf, node_counts), -1).astype(np.int32),
            "image_counts": self.img_first[rs + 1] - self.img_first[rs],
            "images": images,
        }

    def encoded(self, r: int, example_id: str, source_name: str) -> Encoded:
        """Record ``r`` as an Encoded (views of the batch's arrays): what ``encode_batch`` returns."""
        x, y = int(self.bounds[r]), int(self.bounds[r + 1])
        nf, nl = int(self.rec_nodes[r]), int(self.rec_nodes[r + 1])
        first, last = int(self.img_first[r]), int(self.img_first[r + 1])
        one = nl - nf == 1
        return Encoded(
            example_id=example_id,
            input_ids=self.ids[x:y],
            labels=self.labels[x:y],
            position_ids=self.positions[x:y],
            node_offsets=np.zeros(1, dtype=np.int32) if one else (self.node_start[nf:nl] - x).astype(np.int32),
            node_parents=np.full(1, -1, dtype=np.int32) if one else
            np.where(self.parents[nf:nl] >= 0, self.parents[nf:nl] - nf, -1).astype(np.int32),
            images=[EncodedImage(source=ref.path if ref.data is None else "", data=ref.data,
                                 grid_thw=tuple(int(v) for v in run.grid), offset=int(self.img_offsets[first + q]),
                                 num_tokens=int(run.num_tokens))
                    for q, (ref, run) in enumerate(self.images[first:last])],
            mrope_position_ids=None if self.mrope is None else self.mrope[:, x:y],
            source_name=source_name,
        )


def _unprefixed(ids: np.ndarray, at: np.ndarray, parent_at: np.ndarray, plen: np.ndarray) -> np.ndarray:
    """(K,) whether ``ids[at[i]:at[i] + plen[i]]`` differs from ``ids[parent_at[i]:...]``: a child's path that does
    not start with its parent's tokens (``BatchFinish.rows`` and ``chats`` alike)."""
    idx = arrays.ranges(plen)
    diff = ids[np.repeat(at, plen) + idx] != ids[np.repeat(parent_at, plen) + idx]
    bad = np.zeros(plen.shape[0], dtype=bool)
    np.logical_or.at(bad, np.repeat(np.arange(plen.shape[0]), plen), diff)
    return bad


def concat_rows(blocks: Sequence[Rows]) -> tuple[Rows, list[int]]:
    """One Rows holding the records of ``blocks`` back to back (one encoder's: their mRoPE all present or all
    absent), and each block's first record there: rows of several batches, interleaved, read as one block
    (``pipeline.stages``: a chunk's text chats and the general path's records in line order)."""
    tokens, nodes, recs, images = [0], [0], [0], [0]  # each block's first token, node, record, image
    for b in blocks:
        tokens.append(tokens[-1] + b.ids.shape[0])
        nodes.append(nodes[-1] + b.parents.shape[0])
        recs.append(recs[-1] + b.bounds.shape[0] - 1)
        images.append(images[-1] + len(b.images))

    def starts(name: str, at: list[int]) -> np.ndarray:  # (n + 1,) offsets of each block, shifted, then the end
        return np.concatenate([*(getattr(b, name)[:-1] + a for b, a in zip(blocks, at[:-1], strict=True)), [at[-1]]])

    mrope = [b.mrope for b in blocks]
    return Rows(
        ids=np.concatenate([b.ids for b in blocks]), labels=np.concatenate([b.labels for b in blocks]),
        positions=np.concatenate([b.positions for b in blocks]),
        mrope=None if mrope[0] is None else np.concatenate(mrope, axis=1), bounds=starts("bounds", tokens),
        node_start=starts("node_start", tokens), rec_nodes=starts("rec_nodes", nodes),
        parents=np.concatenate([np.where(b.parents >= 0, b.parents + a, -1) for b, a in zip(blocks, nodes[:-1], strict=True)]),
        images=[im for b in blocks for im in b.images], img_first=starts("img_first", images),
        img_offsets=np.concatenate([b.img_offsets for b in blocks]), img_tokens=np.concatenate([b.img_tokens for b in blocks]),
        img_grids=np.concatenate([b.img_grids for b in blocks]),
    ), recs[:-1]


class Row:
    """One record finished by ``batch-finish``, not yet an Encoded: its batch's ``Rows`` and its index there
    (``Encoder.encode_batch(rows=True)``; ``encoded_table`` reads it as columns, ``encoded()`` makes the
    Encoded)."""

    __slots__ = ("block", "r", "example_id", "source_name")

    def __init__(self, block: Rows, r: int, example_id: str, source_name: str):
        self.block, self.r, self.example_id, self.source_name = block, r, example_id, source_name

    def encoded(self) -> Encoded:
        return self.block.encoded(self.r, self.example_id, self.source_name)


_NO_IDS = np.zeros(0, dtype=np.int32)  # ``RunIds.ids``' example ids: a named run's ids do not depend on them


