"""``packer verify``: check a finished build against every invariant of docs/format.md.

What is checked (each failure is one ``Violation``: file, row, what):

- the manifest: present, schema version, every shard present with its row count and sha256, no stray
  ``shard-*`` files, totals equal to the sums over the shards, rejects.jsonl and stats.json agree with it;
- each shard's Arrow schema is ``packer.shards.schema``;
- per row, vectorized over a whole row group at once (numpy, no per-token Python):
  list lengths agree (labels, positions, 3·T mRoPE, E+1 cu_seqlens, E ids), ``num_*`` columns equal the
  recomputed totals; ``cu_seqlens`` starts at 0, increases strictly, ends at T; the row is within the
  capacity and the vision / image / example budgets of the manifest config; labels are -100 at every
  example start and on every image token, and equal ``input_ids`` elsewhere; the node layout keeps every
  rule of ``packer.core.tree.LAYOUT_RULES`` (offsets rise from 0, roots exactly at the example starts,
  parents earlier nodes of the same example); 1-D positions equal ``packer.core.tree.tree_position_ids``
  of the row's node forest; images lie inside one example, in order, without
  overlap, over exactly the image-token run of their ``num_tokens`` (no stray image token), with
  ``num_tokens`` matching the grid; videos the same way over their video-token runs, and each video's grid
  agrees with its stored frame size and sampled frame count (``VideoRule.faults``); audio clips the
  same way over their audio-token runs (a video's sound track: the family's spans inside the video's run), each
  clip's ``feature_length`` from its ``num_samples`` (and its ``padded_samples``, schema v5, where set: never
  fewer than its samples) and ``num_tokens`` from its ``feature_length`` by the
  family's rule (``audio_feature_lengths``, ``audio_num_tokens``), ``num_audio_tokens`` and the audio budgets
  (``max_audio_tokens``, ``max_audios``); mRoPE positions (float32 since v5, compared as stored: a fraction
  an integer family's positions must not have is a difference)
  equal an independent vectorized recomputation of ``get_rope_index`` along each tree path (with each
  video's ``second_per_grid_t``);
- example ids are unique across the whole dataset;
- with ``inputs``: every non-blank input line (every row of a Parquet/Arrow input) is packed (``path:line`` in
  ``example_ids``) or rejected (in rejects.jsonl) exactly once (a source weight w packs floor(w) or ceil(w)
  copies ``path:line#k``); a source whose paths match no file any more is a violation (its copy counts cannot
  be checked); a text split by ``--long-docs split`` is packed as chunks ``path:line@k``, each counted like a
  record, k = 0..n-1 with none missing, and its tokens re-tokenized to check that no token was lost
  (split_docs.py).

Cost: one pass over the shards, each row group decoded once (docs/benchmarks.md, "Verify"). Memory: one row
group plus the example ids (for the uniqueness check).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.core import tree
from packer.core.ids import ID_PATTERN
from packer.core.types import IGNORE_INDEX
from packer.errors import REJECT_REASONS, ConfigError
from packer.report.split_docs import ChunkDigests, check_split_documents
from packer.report.tokenizer_check import RecordDigests, check_tokens
from packer.shards.io import open_shards, parquet_file, sha256_file
from packer.shards.schema import MANIFEST, REJECTS, SCHEMAS, STATS, Manifest

if TYPE_CHECKING:
    from packer.models.base import ModelProfile

DEFAULT_LIMIT = 20  # violations listed per (file, check); the rest are counted in one summary line
DEFAULT_TOKENIZER_CHECK = 64  # input records re-tokenized with the HF tokenizer by ``verify --input``
AUDIO_FIELDS = ("offset", "num_tokens", "num_samples", "feature_length", "sample_rate")  # what verify reads


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where (file, row in that file or None) and what."""

    file: str
    row: int | None
    what: str

    def __str__(self) -> str:
        return f"{self.file}:row {self.row}: {self.what}" if self.row is not None else f"{self.file}: {self.what}"


@dataclass
class VerifyReport:
    """The outcome of ``verify_build``: violations (at most ``limit`` per check and file) and what was read."""

    violations: list[Violation] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # (file, check) -> number of violations
    shards: int = 0
    rows: int = 0
    examples: int = 0
    input_records: int | None = None  # non-blank input lines checked with ``inputs``
    tokenized: int = 0  # input records re-tokenized with the HF tokenizer and compared (tokenizer_check.py)
    limit: int = DEFAULT_LIMIT

    @property
    def ok(self) -> bool:
        return not self.counts

    @property
    def num_violations(self) -> int:
        return sum(self.counts.values())

    def add(self, file: str, row: int | None, what: str, check: str) -> None:
        self.counts[(file, check)] += 1
        if self.counts[(file, check)] <= self.limit:
            self.violations.append(Violation(file, row, what))

    def rows_bad(self, file: str, rows: np.ndarray, check: str, describe) -> None:
        """Report ``rows`` (row numbers in ``file``) failing ``check``; ``describe(i)`` for the listed ones."""
        if len(rows) == 0:
            return
        done = self.counts[(file, check)]
        for k, r in enumerate(rows.tolist()):
            if done + k >= self.limit:
                break
            self.violations.append(Violation(file, int(r), describe(k)))
        self.counts[(file, check)] += len(rows)

    def lines(self) -> list[str]:
        """Every listed violation, then one line per check whose violations were not all listed."""
        out = [str(v) for v in self.violations]
        for (file, check), n in sorted(self.counts.items()):
            if n > self.limit:
                out.append(f"{file}: ... {n - self.limit} more '{check}' violations not listed")
        return out


# ---------------------------------------------------------------------------------------- arrow helpers
def _lists(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(int64 offsets starting at 0, flat values) of a list column, whatever its chunking and slicing."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    off = arr.offsets.to_numpy().astype(np.int64)
    return off - off[0], arr.values.slice(int(off[0]), int(off[-1] - off[0]))


def _ints(column) -> tuple[np.ndarray, np.ndarray]:
    off, values = _lists(column)
    return off, values.to_numpy(zero_copy_only=False).astype(np.int64)


def _row_of(offsets: np.ndarray) -> np.ndarray:
    """Row index of every flat element of a list column with these offsets."""
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _rows_with(flags: np.ndarray, row_of: np.ndarray, num_rows: int) -> np.ndarray:
    """Boolean per row: does any flat element of that row have ``flags`` set."""
    return np.bincount(row_of[flags], minlength=num_rows) > 0


def _within_row_pairs(offsets: np.ndarray) -> np.ndarray:
    """Mask over ``np.diff(flat)``: True where both elements belong to the same row."""
    n = int(offsets[-1])
    same = np.ones(max(n - 1, 0), dtype=bool)
    cross = offsets[1:-1] - 1  # the pair (last of row r, first of row r+1)
    cross = cross[(cross >= 0) & (cross < n - 1)]
    same[cross] = False
    return same


# ---------------------------------------------------------------------------------------- row groups
@dataclass(frozen=True)
class _Limits:
    """What the manifest promises about every row."""

    max_length: int | None
    max_vision_tokens: int | None
    max_images: int | None
    max_examples: int | None
    max_videos: int | None
    profile: ModelProfile
    image_token_id: int | None
    video_token_id: int | None
    max_audio_tokens: int | None = None
    max_audios: int | None = None
    audio_token_id: int | None = None


class _Rows:
    """The decoded columns of some rows of one row group (flat numpy values + offsets per list column)."""

    def __init__(self, table: pa.Table, rows: np.ndarray):
        self.table = table
        self.rows = rows  # row numbers in the shard file, one per table row
        self.R = table.num_rows
        self.tok_off, self.ids = _ints(table.column("input_ids"))
        self.T = np.diff(self.tok_off)
        self.lab_off, self.labels = _ints(table.column("labels"))
        self.pos_off, self.pos = _ints(table.column("position_ids"))
        mrope = table.column("mrope_position_ids")
        self.mrope_null = mrope.is_null().to_numpy(zero_copy_only=False)
        self.mr_off, mrope_values = _lists(mrope)
        self.mrope = mrope_values.to_numpy(zero_copy_only=False)  # float32 (v5) or int32 as stored: an int cast
        # would truncate a fraction an integer family's positions must not have
        self.cu_off, self.cu = _ints(table.column("cu_seqlens"))
        self.no_off, self.noff = _ints(table.column("node_offsets"))
        self.np_off, self.npar = _ints(table.column("node_parents"))
        self.ex_off, self.ex_ids = _lists(table.column("example_ids"))
        self.src_off, _ = _lists(table.column("example_sources"))
        self.E = np.diff(self.ex_off)
        self.N = np.diff(self.no_off)
        self.img_off, imgs = _lists(table.column("images"))
        self.I = np.diff(self.img_off)
        self.img = {
            f: imgs.field(f).to_numpy(zero_copy_only=False).astype(np.int64)
            for f in ("offset", "num_tokens", "grid_t", "grid_h", "grid_w")
        }
        self.vid_off, vids = _lists(table.column("videos"))
        self.vid = {
            f: vids.field(f).to_numpy(zero_copy_only=False).astype(np.int64)
            for f in ("offset", "num_tokens", "grid_t", "grid_h", "grid_w", "height", "width")
        }
        self.vid["second_per_grid_t"] = vids.field("second_per_grid_t").to_numpy(zero_copy_only=False)
        self.vid["num_frames"] = np.diff(vids.field("frame_indices").offsets.to_numpy()).astype(np.int64)
        self.num_tokens = table.column("num_tokens").to_numpy().astype(np.int64)
        self.num_loss = table.column("num_loss_tokens").to_numpy().astype(np.int64)
        self.num_vision = table.column("num_vision_tokens").to_numpy().astype(np.int64)
        self.num_video = table.column("num_video_tokens").to_numpy().astype(np.int64)
        self.lw = None  # schema v4: (null mask, offsets, values) of loss_weights where any row has them
        if "loss_weights" in table.column_names and table.column("loss_weights").null_count < table.num_rows:
            weights = table.column("loss_weights")
            off, vals = _lists(weights)
            self.lw = (weights.is_null().to_numpy(zero_copy_only=False), off, vals.to_numpy(zero_copy_only=False))
        self.has_audio = "audios" in table.column_names  # schema v4
        if self.has_audio:
            self.aud_off, auds = _lists(table.column("audios"))
            self.num_audio = table.column("num_audio_tokens").to_numpy().astype(np.int64)
        else:  # an older build: no row has audio
            self.aud_off = np.zeros(self.R + 1, dtype=np.int64)
            auds = pa.array([], pa.struct([(f, pa.int32()) for f in AUDIO_FIELDS] + [("video", pa.bool_())]))
            self.num_audio = np.zeros(self.R, dtype=np.int64)
        self.aud = {f: auds.field(f).to_numpy(zero_copy_only=False).astype(np.int64) for f in AUDIO_FIELDS}
        self.aud["video"] = auds.field("video").to_numpy(zero_copy_only=False).astype(bool)
        # schema v5: the samples a clip was padded to beside its example's others (-1: null, the clip's alone)
        padded = auds.field("padded_samples") if auds.type.get_field_index("padded_samples") >= 0 else None
        self.aud["padded_samples"] = (np.full(len(auds), -1, dtype=np.int64) if padded is None
                                      else padded.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
        self.has_seq_lengths = "seq_lengths" in table.column_names  # schema v3
        if self.has_seq_lengths:
            lengths = table.column("seq_lengths")
            self.sl_null = lengths.is_null().to_numpy(zero_copy_only=False)
            self.sl_off, self.sl = _ints(lengths)

    def keep(self, good: np.ndarray) -> _Rows:
        return self if good.all() else _Rows(self.table.filter(pa.array(good)), self.rows[good])


def _check_shapes(d: _Rows, lim: _Limits, rep: VerifyReport, file: str) -> np.ndarray:
    """List lengths and scalar columns that everything else relies on; returns the rows that pass."""
    good = np.ones(d.R, dtype=bool)

    def check(bad: np.ndarray, name: str, describe) -> None:
        nonlocal good
        rep.rows_bad(file, d.rows[bad], name, lambda k, idx=np.flatnonzero(bad): describe(int(idx[k])))
        good &= ~bad

    check(d.T < 1, "empty row", lambda i: "row has no tokens")
    check(d.E < 1, "no examples", lambda i: "row has no example_ids")
    check(np.diff(d.lab_off) != d.T, "labels length", lambda i: f"labels has {d.lab_off[i + 1] - d.lab_off[i]} values, input_ids {d.T[i]}")
    check(np.diff(d.pos_off) != d.T, "position_ids length",
          lambda i: f"position_ids has {d.pos_off[i + 1] - d.pos_off[i]} values, input_ids {d.T[i]}")
    check(d.num_tokens != d.T, "num_tokens", lambda i: f"num_tokens is {d.num_tokens[i]}, the row has {d.T[i]} tokens")
    check(np.diff(d.cu_off) != d.E + 1, "cu_seqlens length",
          lambda i: f"cu_seqlens has {d.cu_off[i + 1] - d.cu_off[i]} values for {d.E[i]} examples (want E+1)")
    check(np.diff(d.src_off) != d.E, "example_sources length",
          lambda i: f"example_sources has {d.src_off[i + 1] - d.src_off[i]} values for {d.E[i]} examples")
    check((d.N < 1) | (np.diff(d.np_off) != d.N), "node arrays length",
          lambda i: f"{d.N[i]} node_offsets and {d.np_off[i + 1] - d.np_off[i]} node_parents (want equal, >= 1)")
    if lim.profile.positions.mrope:
        check(d.mrope_null, "mrope missing", lambda i: "mrope_position_ids is null but the profile uses mRoPE")
        check(~d.mrope_null & (np.diff(d.mr_off) != 3 * d.T), "mrope length",
              lambda i: f"mrope_position_ids has {d.mr_off[i + 1] - d.mr_off[i]} values, want 3*T = {3 * d.T[i]}")
    else:
        check(~d.mrope_null, "mrope present", lambda i: "mrope_position_ids is set but the profile has no mRoPE")
    return good


def _check_boundaries(d: _Rows, lim: _Limits, rep: VerifyReport, file: str) -> np.ndarray:
    """cu_seqlens, budgets and the node forest (``packer.core.tree.layout_faults`` over the whole row group);
    returns the rows whose structure is sound."""
    good = np.ones(d.R, dtype=bool)

    def check(bad: np.ndarray, name: str, describe, structural: bool = True) -> None:
        nonlocal good
        rep.rows_bad(file, d.rows[bad], name, lambda k, idx=np.flatnonzero(bad): describe(int(idx[k])))
        if structural:
            good &= ~bad

    faults = tree.layout_faults(d.T, d.noff, d.npar, d.cu, node_splits=d.no_off, cu_splits=d.cu_off)
    first, last = d.cu[d.cu_off[:-1]], d.cu[d.cu_off[1:] - 1]  # rows have E+1 >= 2 values (_check_shapes)
    describe = {
        "cu_seqlens length": lambda i: f"cu_seqlens has {d.cu_off[i + 1] - d.cu_off[i]} values (want >= 2)",
        "cu_seqlens start": lambda i: f"cu_seqlens starts at {first[i]}, not 0",
        "cu_seqlens end": lambda i: f"cu_seqlens ends at {last[i]}, the row has {d.T[i]} tokens",
        "cu_seqlens increasing": lambda i: f"cu_seqlens is not strictly increasing: {d.cu[d.cu_off[i]:d.cu_off[i + 1]][:12].tolist()}",
        "node offsets": lambda i: "node_offsets do not start at 0 and rise strictly inside [0, T): "
        f"{d.noff[d.no_off[i]:d.no_off[i + 1]][:12].tolist()}",
        "node parents": lambda i: f"node_parents must be -1 or an earlier node: {d.npar[d.no_off[i]:d.no_off[i + 1]][:12].tolist()}",
        "roots": lambda i: f"{int((d.npar[d.no_off[i]:d.no_off[i + 1]] == -1).sum())} root nodes (parent -1) for {d.E[i]} examples",
        "roots at starts": lambda i: "a root node does not start where its example starts (cu_seqlens)",
        "parent example": lambda i: "a node's parent belongs to another example",
    }
    for name in ("cu_seqlens length", "cu_seqlens start", "cu_seqlens end", "cu_seqlens increasing"):
        check(faults.pop(name), name, describe[name])

    # --- budgets of the manifest config (not structural: the row is still checked further)
    if lim.max_length is not None:
        check(d.T > lim.max_length, "capacity", lambda i: f"{d.T[i]} tokens > max_length {lim.max_length}", False)
    if lim.max_examples is not None:
        check(d.E > lim.max_examples, "examples budget",
              lambda i: f"{d.E[i]} examples > max_examples_per_pack {lim.max_examples}", False)
    if lim.max_images is not None:
        check(d.I > lim.max_images, "image budget", lambda i: f"{d.I[i]} images > max_images {lim.max_images}", False)
    if lim.max_videos is not None:
        nv = np.diff(d.vid_off)
        check(nv > lim.max_videos, "video budget", lambda i: f"{nv[i]} videos > max_videos {lim.max_videos}", False)
    if lim.max_vision_tokens is not None:
        check(d.num_vision > lim.max_vision_tokens, "vision budget",
              lambda i: f"{d.num_vision[i]} vision tokens > max_vision_tokens {lim.max_vision_tokens}", False)
    if lim.max_audios is not None:
        na = np.diff(d.aud_off)
        check(na > lim.max_audios, "audio clip budget", lambda i: f"{na[i]} audio clips > max_audios {lim.max_audios}",
              False)
    if lim.max_audio_tokens is not None:
        check(d.num_audio > lim.max_audio_tokens, "audio budget",
              lambda i: f"{d.num_audio[i]} audio tokens > max_audio_tokens {lim.max_audio_tokens}", False)

    # --- nodes: offsets, parents, roots exactly at the example starts, parents in the same example
    for name, bad in faults.items():
        check(bad, name, describe[name])
    return good


def _check_content(d: _Rows, lim: _Limits, rep: VerifyReport, file: str) -> None:
    """Labels, totals, positions, images and mRoPE of rows whose structure passed."""

    def check(bad: np.ndarray, name: str, describe) -> None:
        rep.rows_bad(file, d.rows[bad], name, lambda k, idx=np.flatnonzero(bad): describe(int(idx[k])))

    L = len(d.ids)
    row_of_tok = _row_of(d.tok_off)
    row_base = d.tok_off[:-1]
    row_of_cu = _row_of(d.cu_off)
    is_start_cu = np.ones(len(d.cu), dtype=bool)
    is_start_cu[d.cu_off[1:] - 1] = False
    g_starts = row_base[row_of_cu[is_start_cu]] + d.cu[is_start_cu]  # (total E,) in the flat stream

    # --- labels and loss totals
    start_lab = d.labels[g_starts]
    check(_rows_with(start_lab != IGNORE_INDEX, row_of_cu[is_start_cu], d.R), "label at start",
          lambda i: "an example's first label is not -100 (nothing predicts an example's first token)")
    wrong = (d.labels != IGNORE_INDEX) & (d.labels != d.ids)
    check(_rows_with(wrong, row_of_tok, d.R), "labels",
          lambda i: "a label is neither -100 nor the token's own id (labels are unshifted)")
    loss = np.bincount(row_of_tok, weights=d.labels != IGNORE_INDEX, minlength=d.R).astype(np.int64)
    check(loss != d.num_loss, "num_loss_tokens", lambda i: f"num_loss_tokens is {d.num_loss[i]}, labels have {loss[i]}")
    if d.lw is not None:
        null, lw_off, lw = d.lw
        have = np.diff(lw_off)
        want = np.where(null, 0, np.diff(d.tok_off))
        check(have != want, "loss_weights", lambda i: f"loss_weights has {have[i]} entries for {want[i]} tokens")
        if (have == want).all():
            weighted = np.repeat(~null, np.diff(d.tok_off))  # (T,) tokens of rows with weights
            lab = d.labels[weighted]
            bad = ~np.isfinite(lw) | (lw < 0) | ((lab == IGNORE_INDEX) & (lw != 0)) | ((lab != IGNORE_INDEX) & (lw == 0))
            check(_rows_with(bad, row_of_tok[weighted], d.R), "loss_weights",
                  lambda i: "a loss weight is not finite, negative, set on a token without loss, or 0 on a loss token")
    video = np.bincount(_row_of(d.vid_off), weights=d.vid["num_tokens"], minlength=d.R).astype(np.int64)
    vision = np.bincount(_row_of(d.img_off), weights=d.img["num_tokens"], minlength=d.R).astype(np.int64) + video
    check(vision != d.num_vision, "num_vision_tokens",
          lambda i: f"num_vision_tokens is {d.num_vision[i]}, the images and videos have {vision[i]}")
    check(video != d.num_video, "num_video_tokens",
          lambda i: f"num_video_tokens is {d.num_video[i]}, the videos have {video[i]}")
    audio = np.bincount(_row_of(d.aud_off), weights=d.aud["num_tokens"], minlength=d.R).astype(np.int64)
    check(audio != d.num_audio, "num_audio_tokens",
          lambda i: f"num_audio_tokens is {d.num_audio[i]}, the audio clips have {audio[i]}")

    # --- 1-D positions: the row's nodes as one forest in the flat stream (roots restart at 0)
    row_of_node = _row_of(d.no_off)
    g_off = row_base[row_of_node] + d.noff
    g_par = np.where(d.npar < 0, -1, d.npar + d.no_off[:-1][row_of_node])
    expected = tree.tree_position_ids(L, g_off, g_par).astype(np.int64) if L else np.zeros(0, np.int64)
    check(_rows_with(expected != d.pos, row_of_tok, d.R), "position_ids",
          lambda i: "position_ids differ from the tree positions (0 at each example, a branch continues from its parent)")

    # --- images, then videos: one contiguous run of their tokens each, in order, inside one example
    spans, checked, claims, named = {}, {}, {}, {}
    for what, lists, fields, token_id in (("image", d.img_off, d.img, lim.image_token_id),
                                          ("video", d.vid_off, d.vid, lim.video_token_id),
                                          ("audio", d.aud_off, d.aud, lim.audio_token_id)):
        # the family's spans of its placeholders (Qwen3-VL: a video's temporal patches, each a run of its own)
        rule = getattr(lim.profile, what)  # the medium's rule (packer.models.rules), None where the family lacks it
        if rule is not None:
            lists, fields, on = rule.spans(d.ids, row_base, lists, fields, token_id)
        else:
            on = True
        on = (token_id if on else None) if isinstance(on, bool) else on  # the id lying exactly on the spans
        spans[what] = _check_spans(d, lim, check, what, lists, fields, g_starts, g_off)
        checked[what] = lists, fields
        _, sel_k, _, in_span = spans[what]
        if on is None and token_id is None and sel_k.any():  # an old manifest: the id the first span holds
            on = int(d.ids[(row_base[_row_of(lists)] + fields["offset"])[sel_k][0]])
        if on is not None:
            claims[on] = claims.get(on, np.zeros(L, dtype=bool)) | in_span
            named.setdefault(on, what)
        if token_id is not None:
            named.setdefault(token_id, what)
    tok_ok = spans["image"][0] & spans["video"][0] & spans["audio"][0]
    # Each placeholder (and each id a family says its spans hold) lies exactly on the spans that claim it: a
    # family that lays its runs out in other tokens claims none (its placeholder then appears nowhere), and
    # GLM-4.6V's video frames claim its image placeholder beside its images.
    for tid, what in named.items():
        stray = tok_ok & (claims.get(tid, np.zeros(L, dtype=bool)) != (d.ids == tid))
        check(_rows_with(stray, row_of_tok, d.R), f"{what} tokens",
              lambda i, tid=tid, what=what: f"{what} spans and {what} tokens (id {tid}) disagree: a span over other "
              f"tokens, or a stray {what} token")
    vid_off, vid = checked["video"]
    img_off, img = checked["image"]
    if len(d.vid["offset"]):
        video = lim.profile.video
        faults = np.ones(len(d.vid["offset"]), dtype=bool) if video is None else (
            video.faults(d.vid) | (video.tokens(d.vid) != d.vid["num_tokens"]))
        check(_rows_with(faults, _row_of(d.vid_off), d.R), "video plan",
              lambda i: f"a video's grid, frame size, frame count or second_per_grid_t disagree under profile "
              f"{lim.profile.name!r}")
    if len(d.aud["offset"]):  # each clip's numbers under the family's rule: samples -> frames (-> tokens: spans)
        audio = lim.profile.audio
        faults = np.ones(len(d.aud["offset"]), dtype=bool) if audio is None else audio.faults(d.aud)
        check(_rows_with(faults, _row_of(d.aud_off), d.R), "audio plan",
              lambda i: f"an audio clip's sample rate, samples or feature length disagree under profile "
              f"{lim.profile.name!r} (or its padded_samples, where set)")

    # --- mRoPE: recomputed along each tree path by the model family
    if lim.profile.positions.mrope and L:
        got = d.mrope.reshape(-1, 3).T  # (3, L): token-major storage
        _, img_sel, img_grids, _ = spans["image"]
        _, vid_sel, vid_grids, _ = spans["video"]
        img_starts = (row_base[_row_of(img_off)] + img["offset"])[img_sel]
        videos = dict(offset=(row_base[_row_of(vid_off)] + vid["offset"])[vid_sel], grid=vid_grids[vid_sel],
                      second_per_grid_t=vid["second_per_grid_t"][vid_sel])
        _, aud_sel, _, _ = spans["audio"]
        aud_off, aud = checked["audio"]  # the family's spans, as for videos (aud_sel selects among them)
        audios = {k: aud[k][aud_sel] for k in ("feature_length", "num_tokens", "video")}
        audios["offset"] = (row_base[_row_of(aud_off)] + aud["offset"])[aud_sel]
        want = lim.profile.positions.expected(L, g_off, g_par, images=dict(offset=img_starts, grid=img_grids[img_sel]),
                                              videos=videos, audios=audios)
        bad = (got != want).any(axis=0) & tok_ok
        check(_rows_with(bad, row_of_tok, d.R), "mrope_position_ids",
              lambda i: "mrope_position_ids differ from get_rope_index of each example's tree paths")

    if d.has_seq_lengths:
        _check_seq_lengths(d, check)


def _check_seq_lengths(d: _Rows, check) -> None:
    """v3's ``seq_lengths``: the examples' lengths exactly where TRL's padding-free collator is exact (every example
    one node, no image or video, no mRoPE), null elsewhere (assemble._seq_lengths)."""
    plain = d.mrope_null & (d.N == d.E) & (d.I == 0) & (np.diff(d.vid_off) == 0) & (np.diff(d.aud_off) == 0)
    if d.lw is not None:
        plain &= d.lw[0]  # v4: a row with loss weights, which TRL's own loss would ignore
    check(plain & d.sl_null, "seq_lengths missing",
          lambda i: "seq_lengths is null but every example of the row is linear, without media or mRoPE")
    check(~plain & ~d.sl_null, "seq_lengths set",
          lambda i: "seq_lengths is set but the row has a tree, an image, a video, audio, mRoPE positions (TRL would "
          "rebuild its positions and attention wrongly) or loss weights (TRL's loss would ignore them)")
    both = plain & ~d.sl_null
    counts = np.diff(d.sl_off)
    lengths_ok = np.ones(d.R, dtype=bool)
    lengths_ok[both] = counts[both] == d.E[both]
    check(~lengths_ok, "seq_lengths length", lambda i: f"seq_lengths has {counts[i]} values for {d.E[i]} examples")
    rows = np.flatnonzero(both & lengths_ok)
    if len(rows):
        got = np.concatenate([d.sl[d.sl_off[r]:d.sl_off[r + 1]] for r in rows])
        want = np.concatenate([np.diff(d.cu[d.cu_off[r]:d.cu_off[r + 1]]) for r in rows])
        row_of = np.repeat(rows, d.E[rows])
        check(_rows_with(got != want, row_of, d.R), "seq_lengths",
              lambda i: f"seq_lengths {d.sl[d.sl_off[i]:d.sl_off[i + 1]][:8].tolist()} differ from np.diff(cu_seqlens)")


def _check_spans(d: _Rows, lim: _Limits, check, what: str, lists: np.ndarray, fields: dict[str, np.ndarray],
                 g_starts: np.ndarray, g_off: np.ndarray):
    """Images' (or videos') spans: inside the row, in order, no overlap, one example and one tree node each,
    ``num_tokens`` matching the grid, labels -100 there (which token lies on them: the caller checks).

    Returns ((T_total,) tokens of rows whose spans are sound, (I,) spans of such rows, (I, 3) grids,
    (T_total,) tokens inside a sound span).
    """
    L = len(d.ids)
    row_base, row_of_tok = d.tok_off[:-1], _row_of(d.tok_off)
    row_of_img = _row_of(lists)
    s, n = fields["offset"], fields["num_tokens"]
    img_ok = (n >= 1) & (s >= 0) & (s + n <= d.T[row_of_img])
    overlap = np.zeros(len(s), dtype=bool)
    overlap[1:] = (s[1:] < s[:-1] + n[:-1]) & _within_row_pairs(lists)
    gs = row_base[row_of_img] + s
    ex_first = np.searchsorted(g_starts, gs, side="right")
    ex_last = np.searchsorted(g_starts, gs + np.maximum(n, 1) - 1, side="right")
    node_first = np.searchsorted(g_off, gs, side="right")
    node_last = np.searchsorted(g_off, gs + np.maximum(n, 1) - 1, side="right")
    spans_bad = ~img_ok | overlap | (img_ok & ((ex_first != ex_last) | (node_first != node_last)))
    check(_rows_with(spans_bad, row_of_img, d.R), f"{what} spans",
          lambda i: f"a {what}'s tokens are outside the row, overlap another {what}, are out of order or cross "
          "an example or tree-node boundary")
    rule = getattr(lim.profile, what)  # without the medium every entry is wrong
    want = np.full(len(s), -1, dtype=np.int64) if rule is None else rule.tokens(fields)
    if what == "audio":  # a clip's count follows from its feature length (the family's rule)
        grids = np.zeros((len(s), 3), dtype=np.int64)
        grid_bad = want != n
        check(_rows_with(grid_bad, row_of_img, d.R), "audio tokens count",
              lambda i: f"an audio clip's num_tokens does not match its feature_length under profile "
              f"{lim.profile.name!r}")
    else:
        grids = np.stack([fields["grid_t"], fields["grid_h"], fields["grid_w"]], axis=1)  # (I, 3)
        grid_bad = want != n
        check(_rows_with(grid_bad, row_of_img, d.R), f"{what} grid",
              lambda i: f"a {what}'s num_tokens does not match its grid (t, h, w) under profile {lim.profile.name!r}")
    img_rows_ok = ~_rows_with(spans_bad | grid_bad, row_of_img, d.R)
    sel = img_rows_ok[row_of_img]
    in_image = np.zeros(L + 1, dtype=np.int64)
    np.add.at(in_image, gs[sel], 1)
    np.add.at(in_image, gs[sel] + n[sel], -1)
    in_image = np.cumsum(in_image)[:L] > 0  # (L,) token lies in some span
    tok_ok = img_rows_ok[row_of_tok]
    check(_rows_with(tok_ok & in_image & (d.labels != IGNORE_INDEX), row_of_tok, d.R), f"{what} labels",
          lambda i: f"an {what} token carries a label (media tokens carry no loss)" if what in ("image", "audio") else
          f"a {what} token carries a label (media tokens carry no loss)")
    return tok_ok, sel, grids, in_image & tok_ok


# ---------------------------------------------------------------------------------------- whole build
def _limits(manifest: Manifest) -> _Limits:
    from packer.models import get_profile

    cfg = manifest.config
    profile = get_profile(manifest.profile, **cfg.profile_overrides())
    return _Limits(
        max_length=cfg.max_length,
        max_vision_tokens=cfg.max_vision_tokens,
        max_images=cfg.max_images,
        max_examples=cfg.max_examples_per_pack,
        max_videos=cfg.max_videos,
        profile=profile,
        image_token_id=manifest.image_token_id,
        video_token_id=manifest.video_token_id,
        max_audio_tokens=cfg.max_audio_tokens,
        max_audios=cfg.max_audios,
        audio_token_id=manifest.audio_token_id,
    )


def _schema_problem(schema: pa.Schema, version: int) -> str | None:
    """The file's schema against the manifest's schema version (``SCHEMAS``: a v2 build is checked as v2)."""
    want = SCHEMAS[version]
    if not schema.remove_metadata().equals(want.remove_metadata()):
        return f"schema differs from packer.shards.schema (v{version}): {schema.remove_metadata()}"
    found = (schema.metadata or {}).get(b"packer.schema_version")
    if found != str(version).encode():
        return f"schema metadata packer.schema_version is {found!r}, want {version}"
    return None


def verify_build(path: str | Path, *, inputs: list[str] | None = None, limit: int = DEFAULT_LIMIT,
                 tokenizer_check: int | str = DEFAULT_TOKENIZER_CHECK) -> VerifyReport:
    """Check the build in ``path`` (and, with ``inputs``, that every input record is accounted for, and that
    ``tokenizer_check`` of them, an int or "all", encode with the HF tokenizer to the packed tokens and labels).

    Raises ShardError only when there is nothing to check (no directory / no readable manifest of this
    schema version); every other problem is a Violation in the report.
    """
    shards = open_shards(path)
    root, manifest = shards.root, shards.manifest
    rep = VerifyReport(limit=limit)
    lim = _limits(manifest)
    totals = Counter()
    id_chunks: list[pa.Array] = []  # every example id, in dataset order
    id_where: list[tuple[str, np.ndarray]] = []  # (file, row of each id) per chunk, to place duplicates
    listed = set()
    digests = ChunkDigests() if inputs is not None and manifest.config.long_docs == "split" else None
    if tokenizer_check != "all" and (not isinstance(tokenizer_check, int) or tokenizer_check < 0):
        raise ConfigError(f"tokenizer_check must be a count >= 0 or 'all', got {tokenizer_check!r}")
    records = RecordDigests() if inputs is not None and tokenizer_check != 0 else None
    for entry in shards.shards:
        file = entry.file
        listed.add(file)
        spath = root / file
        rep.shards += 1
        if not spath.is_file():
            rep.add(file, None, "listed in the manifest but missing", "missing shard")
            continue
        if sha256_file(spath) != entry.sha256:
            rep.add(file, None, f"sha256 differs from the manifest ({entry.sha256})", "checksum")
        try:
            pf = parquet_file(spath)
        except Exception as e:  # noqa: BLE001 - any Parquet/Arrow failure is this file's violation
            rep.add(file, None, f"unreadable Parquet: {type(e).__name__}: {e}", "unreadable")
            continue
        if pf.metadata.num_rows != entry.rows:
            rep.add(file, None, f"{pf.metadata.num_rows} rows, the manifest says {entry.rows}", "row count")
        problem = _schema_problem(pf.schema_arrow, manifest.schema_version)
        if problem:
            rep.add(file, None, problem, "schema")
            continue
        base = 0
        for g in range(pf.metadata.num_row_groups):
            try:
                table = pf.read_row_group(g)
            except Exception as e:  # noqa: BLE001
                rep.add(file, None, f"row group {g} unreadable: {type(e).__name__}: {e}", "unreadable")
                break
            rows = np.arange(base, base + table.num_rows)
            base += table.num_rows
            d = _Rows(table, rows)
            rep.rows += d.R
            rep.examples += int(d.E.sum())
            totals["tokens"] += int(d.T.sum())
            totals["loss_tokens"] += int(d.num_loss.sum())
            totals["vision_tokens"] += int(d.num_vision.sum())
            id_chunks.append(d.ex_ids)
            id_where.append((file, np.repeat(rows, d.E)))
            d = d.keep(_check_shapes(d, lim, rep, file))
            d = d.keep(_check_boundaries(d, lim, rep, file))
            if d.R:
                _check_content(d, lim, rep, file)
            if digests is not None and d.R:
                _add_digests(d, digests)
            if records is not None and d.R:
                _add_digests(d, records)
    for stray in sorted(p.name for p in root.glob("shard-*")):
        if stray not in listed:
            rep.add(stray, None, "a shard file the manifest does not list (stale or temporary)", "stray file")

    ids = pa.chunked_array(id_chunks, pa.string()) if id_chunks else pa.chunked_array([], pa.string())
    _check_unique_ids(ids, id_where, rep)
    rejects = _read_rejects(root, rep)
    later = int(pc.sum(pc.match_substring_regex(ids.combine_chunks(), r"@[1-9][0-9]*$")).as_py() or 0) if len(ids) else 0
    _check_totals(manifest, root, rep, totals, rejects, later)
    if inputs is not None:
        _check_inputs(manifest, root, ids, rejects, inputs, rep, digests, records,
                      None if tokenizer_check == "all" else int(tokenizer_check))
    return rep


def _add_digests(d: _Rows, digests: ChunkDigests | RecordDigests) -> None:
    """The chunks of split documents (split_docs.py), or the records packed whole (tokenizer_check.py), among
    rows whose structure passed."""
    row_of_cu = _row_of(d.cu_off)
    is_start = np.ones(len(d.cu), dtype=bool)
    is_start[d.cu_off[1:] - 1] = False
    at = np.flatnonzero(is_start)
    base = d.tok_off[:-1][row_of_cu[at]]
    digests.add(d.ex_ids, d.ids, d.labels, base + d.cu[at], base + d.cu[at + 1])


def _check_unique_ids(ids: pa.ChunkedArray, where: list[tuple[str, np.ndarray]], rep: VerifyReport) -> None:
    if len(ids) == 0:
        return
    counts = pc.value_counts(ids.combine_chunks())
    dup_values = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(dup_values) == 0:
        return
    for chunk, (file, rows) in zip(ids.chunks, where, strict=True):
        hit = pc.is_in(chunk, value_set=dup_values).to_numpy(zero_copy_only=False)
        for k in np.flatnonzero(hit):
            rep.add(file, int(rows[k]), f"example id {chunk[int(k)].as_py()!r} appears more than once in the dataset",
                    "duplicate example id")


def _read_rejects(root: Path, rep: VerifyReport) -> list[dict[str, Any]]:
    path = root / REJECTS
    if not path.exists():
        rep.add(REJECTS, None, "missing", "rejects")
        return []
    out = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                r = json.loads(raw)
                ok = isinstance(r, dict) and r.get("reason") in REJECT_REASONS and isinstance(r.get("path"), str) \
                    and isinstance(r.get("line"), int) and r["line"] >= 1
            except json.JSONDecodeError:
                ok = False
            if not ok:
                rep.add(REJECTS, n, f"not a reject record with path, line and a known reason: {raw[:120]!r}", "rejects")
                continue
            out.append(r)
    return out


def _check_totals(manifest: Manifest, root: Path, rep: VerifyReport, sums: Counter,
                  rejects: list[dict[str, Any]], later_chunks: int = 0) -> None:
    totals = manifest.totals
    by_reason = dict(sorted(Counter(r["reason"] for r in rejects).items()))
    if totals is None:
        rep.add(MANIFEST, None, "has no 'totals': the whole-build counts cannot be checked", "totals")
    else:
        want = {"packs": rep.rows, "examples": rep.examples, **sums, "rejected": len(rejects)}
        for key, value in want.items():
            if getattr(totals, key) != value:
                rep.add(MANIFEST, None, f"totals.{key} is {getattr(totals, key)}, the build holds {value}", "totals")
        if totals.rejects_by_reason != by_reason:
            rep.add(MANIFEST, None, f"totals.rejects_by_reason is {totals.rejects_by_reason}, rejects.jsonl has "
                    f"{by_reason}", "totals")
        records = rep.examples - later_chunks  # a split text is one record, n examples
        if all(s.weight == 1.0 for s in manifest.config.sources) and totals.input_records != records + len(rejects):
            chunks = f" - {later_chunks} later chunks of split texts" if later_chunks else ""
            rep.add(MANIFEST, None, f"totals.input_records is {totals.input_records}, but {rep.examples} examples"
                    f"{chunks} + {len(rejects)} rejects = {records + len(rejects)}", "totals")
    stats_path = root / STATS
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        rep.add(STATS, None, f"unreadable: {e}", "stats")
        return
    for key in ("examples", "packs", "rejected", "input_records", "tokens"):
        if key in stats and totals is not None and stats[key] != getattr(totals, key):
            rep.add(STATS, None, f"{key} is {stats[key]}, the manifest says {getattr(totals, key)}", "stats")
    if "rejects_by_reason" in stats and stats["rejects_by_reason"] != by_reason:
        rep.add(STATS, None, f"rejects_by_reason is {stats['rejects_by_reason']}, rejects.jsonl has {by_reason}", "stats")


# ---------------------------------------------------------------------------------------- inputs
def input_lines(path: str) -> np.ndarray:
    """1-based numbers of the records of an input file: a JSONL file's non-blank lines, by the build's own
    rule, or every row of a Parquet/Arrow file (counted from its metadata).

    Lines split at ``\\n`` only; a line of ASCII whitespace (incl. a CRLF's ``\\r``, or a lone BOM on line 1)
    is blank.
    """
    from packer.formats.tables import is_table, unit_rows

    if is_table(path):
        return np.arange(1, sum(unit_rows(path)) + 1, dtype=np.int64)
    numbers = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if raw.strip():
                numbers.append(n)
    return np.asarray(numbers, dtype=np.int64)


def _source_weights(manifest: Manifest, rep: VerifyReport) -> dict[str, float]:
    """Resolved input file -> its source's weight (files the config's paths match now).

    A source whose paths match no file any more is a violation: its records' copy counts cannot be checked.
    """
    from packer.formats.read import expand_inputs

    out = {}
    for s in manifest.config.sources:
        try:
            files = expand_inputs([manifest.resolve(p) for p in s.paths])
        except ConfigError as e:
            rep.add(MANIFEST, None, f"source {s.name!r} (weight {s.weight}): {e}; the copy counts of its records "
                    "cannot be checked", "source weights")
            continue
        for f in files:
            out[os.path.realpath(f)] = s.weight
    return out


def _check_inputs(manifest: Manifest, root: Path, ids: pa.ChunkedArray, rejects: list[dict[str, Any]],
                  inputs: list[str], rep: VerifyReport, digests: ChunkDigests | None = None,
                  records: RecordDigests | None = None, sample: int | None = None) -> None:
    """Every non-blank line of ``inputs`` is packed (with its source's copy count) or rejected, exactly once;
    a split text's chunks each count as a record (``@k``, k = 0..n-1), its tokens checked by ``digests``."""
    from packer.formats.read import expand_inputs

    def resolve(path: str) -> str:
        return os.path.realpath(manifest.resolve(path))

    files = {os.path.realpath(f): f for f in expand_inputs(inputs)}
    weights = _source_weights(manifest, rep)
    lines = {real: input_lines(f) for real, f in files.items()}
    rep.input_records = int(sum(len(v) for v in lines.values()))
    # Parse ids "path:line[@chunk][#copy]" (core/ids.py) in bulk (Arrow regex), then group them by path.
    by_path: dict[str, np.ndarray] = {}  # id path as written -> indices of its ids
    id_lines = id_copies = id_chunks = np.zeros(0, np.int64)
    if len(ids):
        parts = pc.extract_regex(ids.combine_chunks(), ID_PATTERN)
        unparsed = len(parts) - int(pc.sum(pc.is_valid(parts)).as_py() or 0)
        if unparsed:
            rep.add("<dataset>", None, f"{unparsed} example ids are not of the form path:line[@chunk][#copy]",
                    "example id form")
            parts = parts.filter(pc.is_valid(parts))
        id_lines = pc.cast(parts.field("line"), pa.int64()).to_numpy()
        copy = parts.field("copy")  # "" when there is no #copy suffix
        id_copies = pc.cast(pc.if_else(pc.equal(copy, ""), "0", copy), pa.int64()).to_numpy()
        chunk = parts.field("chunk")  # "" for a record packed whole: -1
        id_chunks = pc.cast(pc.if_else(pc.equal(chunk, ""), "-1", chunk), pa.int64()).to_numpy()
        enc = pc.dictionary_encode(parts.field("path"))
        codes = enc.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(enc.dictionary)))])
        for k, p in enumerate(enc.dictionary.to_pylist()):
            by_path[p] = order[bounds[k] : bounds[k + 1]]
    rej_by_path: dict[str, list[int]] = defaultdict(list)
    for r in rejects:
        rej_by_path[r["path"]].append(r["line"])

    for real, numbers in lines.items():
        name = files[real]
        n_lines = int(numbers[-1]) if len(numbers) else 0
        packed = np.zeros(n_lines + 2, dtype=np.int64)  # copies of the record (of a split text: of chunk 0)
        packed_any = np.zeros(n_lines + 2, dtype=np.int64)  # examples of any chunk
        max_copy = np.full(n_lines + 2, -1, dtype=np.int64)
        rejected = np.zeros(n_lines + 2, dtype=np.int64)
        mine = [idx for p, idx in by_path.items() if resolve(p) == real]
        idx = np.concatenate(mine) if mine else np.zeros(0, np.int64)
        ln, cp, ck = np.clip(id_lines[idx], 0, n_lines + 1), id_copies[idx], id_chunks[idx]
        first = ck <= 0
        np.add.at(packed, ln[first], 1)
        np.add.at(packed_any, ln, 1)
        np.maximum.at(max_copy, ln[first], cp[first])
        for p, lns in rej_by_path.items():
            if resolve(p) == real:
                np.add.at(rejected, np.clip(np.asarray(lns, np.int64), 0, n_lines + 1), 1)
        is_record = np.zeros(n_lines + 2, dtype=bool)
        is_record[numbers] = True
        w = weights.get(real, 1.0)
        lo, hi = math.floor(w), math.ceil(w)
        for bad in np.flatnonzero(~is_record & ((packed_any > 0) | (rejected > 0))).tolist():
            rep.add(name, None, f"line {bad} is not a record (blank or past the end) but is "
                    f"{'packed' if packed_any[bad] else 'rejected'}", "unknown record")
        rec = is_record
        both = rec & (packed_any > 0) & (rejected > 0)
        lost = rec & (packed_any == 0) & (rejected == 0) & (lo > 0)
        twice_rej = rec & (rejected > 1)
        wrong_copies = rec & (rejected == 0) & ((packed < lo) | (packed > hi)) & ~lost
        bad_suffix = rec & (packed > 0) & (max_copy != packed - 1)
        for mask, what in ((lost, "is neither packed nor rejected"), (both, "is both packed and rejected"),
                           (twice_rej, "is rejected more than once"),
                           (wrong_copies, f"is packed the wrong number of times (source weight {w}: {lo}..{hi})"),
                           (bad_suffix, "has copies whose #k suffixes are not 0..n-1")):
            for bad in np.flatnonzero(mask).tolist():
                extra = f" ({packed[bad]} times)" if mask is wrong_copies else ""
                rep.add(name, None, f"line {bad} {what}{extra}", "input accounting")
        for what in _chunk_accounting(ln, cp, ck, lo=lo, hi=hi, weight=w):
            rep.add(name, None, what, "input accounting")
    if digests is not None:
        check_split_documents(manifest, digests, files, lambda file, what: rep.add(file, None, what, "split documents"))
    if records is not None:
        rep.tokenized = check_tokens(manifest, records, files, lambda file, what: rep.add(file, None, what, "tokenizer"),
                                     sample=sample)
    # Records of build inputs not passed here are not checked (the caller's choice); records of files that
    # are no input of this build at all cannot be right.
    build_inputs = {resolve(p) for p in manifest.inputs} | set(files)
    for p in sorted({p for p in list(by_path) + list(rej_by_path) if resolve(p) not in build_inputs}):
        rep.add("<dataset>", None, f"holds records of {p!r}, which is not an input of this build", "unknown input")


def _chunk_accounting(lines: np.ndarray, copies: np.ndarray, chunks: np.ndarray, *, lo: int, hi: int,
                      weight: float) -> list[str]:
    """What is wrong with one file's split texts: ids of lines (n,), their #copy and @chunk (-1: whole).

    A line is packed whole or split, never both; each chunk k >= 1 is counted like a record (lo..hi copies,
    suffixes 0..n-1; chunk 0 is checked with the line); with lo >= 1 no chunk of 0..max is missing.
    """
    split = chunks >= 0
    if not split.any():
        return []
    out = []
    whole_lines = set(lines[~split].tolist())
    out += [f"line {n} is packed both whole and split" for n in sorted(set(lines[split].tolist()) & whole_lines)]
    later = chunks >= 1
    if later.any():
        key = np.stack([lines[later], chunks[later]], axis=1)
        units, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        top = np.full(len(units), -1, dtype=np.int64)
        np.maximum.at(top, inverse.reshape(-1), copies[later])
        for (n, k), c, t in zip(units.tolist(), counts.tolist(), top.tolist(), strict=True):
            if not lo <= c <= hi:
                out.append(f"line {n} chunk {k} is packed the wrong number of times (source weight {weight}: "
                           f"{lo}..{hi}) ({c} times)")
            elif t != c - 1:
                out.append(f"line {n} chunk {k} has copies whose #k suffixes are not 0..n-1")
    if lo >= 1:
        key = np.unique(np.stack([lines[split], chunks[split]], axis=1), axis=0)
        for n in np.unique(key[:, 0]).tolist():
            have = key[key[:, 0] == n, 1]
            if len(have) != int(have.max()) + 1:
                missing = sorted(set(range(int(have.max()) + 1)) - set(have.tolist()))
                out.append(f"line {n} is split, but chunks {missing[:8]} are missing")
    return out
