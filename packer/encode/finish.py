"""The ``batch-finish`` fast path: the common records of a batch finished together, as columns.

A linear conversation (one node) whose media are images its family lays out as the placeholder repeated (no
blocks, no run ids, no lead), with no per-token loss weight, that fits ``max_length`` and carries loss: its
draft (``draft.tree_draft``), media runs (``media.expand``) and positions (``Encoder._encoded``: 1-D and
``positions.extra``) are one pass over the batch's flat ids, not a dozen numpy calls per record:

    placeholders  one ``is_placeholder`` lookup over the batch; each record's count checked in one bincount
    runs          one ``np.repeat`` of the batch's ids and labels (each image's placeholder -> its run)
    positions     ``arange`` less each record's start; mRoPE by ``expected_mrope`` over the records as a forest

What stays per record is what is one per record: the check that it is eligible, each image's plan (its size,
cached per file), its ``EncodedImage`` and the ``Encoded`` around views of the batch's arrays.

Anything it cannot prove identical goes to the general path (``Encoder._finish``), which is the reference:
a tree, a ``text`` record, videos or audio, image blocks (Gemma 3), a run of named tokens or text (InternVL,
Molmo), a family's own ``media_runs`` or positions other than flat or Qwen2-VL's mRoPE, adjacent image
placeholders (one run of image tokens for two images: mRoPE's error), loss weights, an example over
``max_length``, one with no loss token and every media-count error (the general path raises them, located).
tests/encode/test_finish.py compares the two on random records; docs/benchmarks.md, "Fast paths", its gain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packer.core.types import IGNORE_INDEX, Encoded, EncodedImage, Example, ImageRef
from packer.encode.context import EncodeContext
from packer.encode.draft import Tokens
from packer.encode.render import Staged
from packer.models.base import ModelProfile
from packer.models.rules import MediaRun, Positions
from packer.models.shared.mrope import MRoPE, expected_mrope


class BatchFinish:
    """``finish`` a batch's eligible records; built once per Encoder (None where its profile has no such path:
    ``BatchFinish.of``)."""

    def __init__(self, ctx: EncodeContext, mrope: MRoPE | None):
        self.ctx = ctx
        self.mrope = mrope
        self._runs: dict[tuple[int, int], MediaRun | None] = {}  # image size -> its run, None: not a plain run

    @classmethod
    def of(cls, ctx: EncodeContext) -> BatchFinish | None:
        """The batch finish for this encoder's profile, or None: a family with its own ``media_runs`` or
        positions other than flat / Qwen2-VL's mRoPE (exactly those classes: a subclass may differ)."""
        profile = ctx.profile
        if type(profile).media_runs is not ModelProfile.media_runs:
            return None
        positions = type(profile.positions)
        if positions is Positions:
            return cls(ctx, None)
        if positions is MRoPE and ctx.image_token_id is not None:
            return cls(ctx, profile.positions)
        return None

    def _run(self, ref: ImageRef) -> MediaRun | None:
        """The image's run where it is the placeholder repeated (``num_tokens`` >= 1, no blocks, names, text or
        lead) and, with mRoPE, its grid's merged tokens; else None."""
        rule = self.ctx.profile.image
        size = rule.plan(ref)
        if size in self._runs:
            return self._runs[size]
        run: MediaRun | None = rule.run(size)
        if (rule.blocks(size) is not None or run.tokens is not None or run.text is not None or run.lead
                or run.inside or run.num_tokens < 1):
            run = None
        elif self.mrope is not None:
            t, h, w = (int(x) for x in run.grid)
            m = self.mrope.merge_size
            if t * (h // m) * (w // m) != run.num_tokens:
                run = None
        if len(self._runs) >= 4096:  # a dataset has few sizes; bound the cache all the same
            self._runs.clear()
        self._runs[size] = run
        return run

    def finish(self, examples: Sequence[Example], staged: Sequence[Staged], tokens: Tokens,
               max_length: int | None) -> list[Encoded | None]:
        """Each example's Encoded, or None where it takes the general path (``Encoder._finish``)."""
        ctx = self.ctx
        out: list[Encoded | None] = [None] * len(examples)
        if tokens.weights is not None:  # per-token loss weights: the general path
            return out
        # per eligible record: its index, text, and images (ref, run) in order
        chosen: list[int] = []
        texts: list[int] = []
        images: list[list[tuple[ImageRef, MediaRun]]] = []
        for i, (example, s) in enumerate(zip(examples, staged, strict=True)):
            if example.kind == "text" or len(s.nodes) != 1:
                continue
            refs = [p for m in s.nodes[0].messages for p in m.parts if not isinstance(p, str)]
            mine: list[tuple[ImageRef, MediaRun]] = []
            if refs:
                if self.ctx.profile.image is None or not all(type(r) is ImageRef for r in refs):
                    continue
                try:
                    runs = [self._run(r) for r in refs]
                except Exception:  # noqa: BLE001 - a bad image: the general path raises it, located
                    continue
                if any(r is None for r in runs):
                    continue
                mine = list(zip(refs, runs, strict=True))  # type: ignore[arg-type]
            chosen.append(i)
            texts.append(s.first)
            images.append(mine)
        if not chosen:
            return out
        starts = np.asarray(tokens.starts, dtype=np.int64)
        ids = tokens.ids
        n_texts = starts.shape[0] - 1
        k = np.asarray(texts, dtype=np.int64)
        lo, hi = starts[k], starts[k + 1]
        # every placeholder (image, video or audio token) of the batch, by text
        pos = np.flatnonzero(ctx.is_placeholder[ids])
        text_of = np.searchsorted(starts, pos, side="right") - 1
        is_image = ids[pos] == ctx.image_token_id if ctx.image_token_id is not None else np.zeros(pos.shape[0], bool)
        per_text = np.bincount(text_of, minlength=n_texts)
        images_per_text = np.bincount(text_of[is_image], minlength=n_texts)
        want = np.array([len(im) for im in images], dtype=np.int64)
        # every placeholder an image named, none adjacent to another (one mRoPE run), the text not empty
        adjacent = np.zeros(n_texts, dtype=bool)
        if pos.shape[0] > 1:
            touch = (pos[1:] == pos[:-1] + 1) & (text_of[1:] == text_of[:-1])
            adjacent[text_of[1:][touch]] = True
        ok = (per_text[k] == want) & (images_per_text[k] == want) & ~adjacent[k] & (hi > lo)
        # the runs: each placeholder of an eligible text repeated its run's num_tokens times
        spans = np.array([run.num_tokens for im in images for _, run in im], dtype=np.int64)
        mine = np.isin(text_of, k[ok]) if pos.shape[0] else np.zeros(0, dtype=bool)
        # the placeholders of eligible texts, in order, are those images in order (counts checked above)
        img_ok = np.repeat(ok, want)
        repeats = np.ones(ids.shape[0], dtype=np.int64)
        placed = pos[mine]
        repeats[placed] = spans[img_ok]
        labels = tokens.labels.copy()
        labels[placed] = IGNORE_INDEX
        new_ids = np.repeat(ids, repeats)
        new_labels = np.repeat(labels, repeats)
        ends = np.cumsum(repeats)  # token t's run ends at ends[t] in the new layout
        new_starts = ends - repeats  # token t's first position in the new layout
        a = new_starts[lo]
        b = np.where(hi > lo, ends[np.maximum(hi - 1, lo)], a)
        length = b - a
        new_labels[a[ok]] = IGNORE_INDEX  # nothing predicts an example's first token
        loss = np.zeros(new_labels.shape[0] + 1, dtype=np.int64)
        np.cumsum(new_labels != IGNORE_INDEX, out=loss[1:])
        ok &= loss[b] - loss[a] > 0  # no loss token: the general path raises it
        if max_length is not None:
            ok &= length <= max_length
        if not ok.any():
            return out
        # positions over the eligible records only, as one forest of roots
        sel = np.flatnonzero(ok)
        rec_a, rec_len = a[sel], length[sel]
        rec_off = np.zeros(sel.shape[0] + 1, dtype=np.int64)
        np.cumsum(rec_len, out=rec_off[1:])
        total = int(rec_off[-1])
        gather = np.repeat(rec_a - rec_off[:-1], rec_len) + np.arange(total)  # new layout index of each token
        out_ids = new_ids[gather]
        out_labels = new_labels[gather]
        positions = (np.arange(total) - np.repeat(rec_off[:-1], rec_len)).astype(np.int32)
        # each image's offset in its record
        img_first = np.zeros(len(images) + 1, dtype=np.int64)
        np.cumsum(want, out=img_first[1:])
        img_sel = np.flatnonzero(np.repeat(ok, want))  # the images of the records finished here
        img_pos = pos[mine]  # placeholders of texts that passed the first checks, in order
        img_index = np.flatnonzero(img_ok)  # their image numbers
        where = np.full(img_first[-1], -1, dtype=np.int64)
        where[img_index] = new_starts[img_pos]
        rec_of_img = np.repeat(np.arange(len(images)), want)
        offsets = where - a[rec_of_img]  # offset inside its record (valid for eligible records)
        mrope = None
        if self.mrope is not None:
            grids = np.array([run.grid for im in images for _, run in im], dtype=np.int64).reshape(-1, 3)[img_sel]
            flat_off = offsets[img_sel] + np.repeat(rec_off[:-1], want[sel])
            mrope = expected_mrope(total, rec_off[:-1], np.full(sel.shape[0], -1, dtype=np.int64), flat_off,
                                   grids, spatial_merge_size=self.mrope.merge_size).astype(np.int32)
        offsets_list = offsets.tolist()
        ctx.paths["finish:batch"] += int(sel.shape[0])
        for j, r in enumerate(sel.tolist()):
            example = examples[chosen[r]]
            x, y = int(rec_off[j]), int(rec_off[j + 1])
            first = int(img_first[r])
            out[chosen[r]] = Encoded(
                example_id=example.example_id,
                input_ids=out_ids[x:y],
                labels=out_labels[x:y],
                position_ids=positions[x:y],
                node_offsets=np.zeros(1, dtype=np.int32),
                node_parents=np.full(1, -1, dtype=np.int32),
                images=[EncodedImage(source=ref.path if ref.data is None else "", data=ref.data,
                                     grid_thw=tuple(int(v) for v in run.grid), offset=int(offsets_list[first + q]),
                                     num_tokens=int(run.num_tokens))
                        for q, (ref, run) in enumerate(images[r])],
                mrope_position_ids=None if mrope is None else mrope[:, x:y],
                source_name=example.source_name,
            )
        return out
