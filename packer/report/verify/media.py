"""Media in the rows, one loop over ``core.media.MEDIA``: the ``num_*_tokens`` totals, each item's span of tokens
(inside the row and one example, in order, no overlap, its token count from its grid or feature length, no
label on it), each placeholder id exactly on its spans, and each video's and clip's plan under the family's rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import packer.report.verify.family as family
from packer.core.media import MEDIA
from packer.core.types import IGNORE_INDEX
from packer.report.verify.decode import Rows, row_of, rows_with, within_row_pairs
from packer.report.verify.report import RowCheck

if TYPE_CHECKING:
    from packer.models.base import ModelProfile


@dataclass(frozen=True)
class Spans:
    """One medium's spans in a row group, as the family lays them out (``family.spans``), after their checks."""

    offsets: np.ndarray  # (R+1,) spans per row
    fields: dict[str, np.ndarray]  # field -> (S,)
    sound_rows_tokens: np.ndarray  # (L,) tokens of rows whose spans are all sound
    sound: np.ndarray  # (S,) spans of such rows
    grids: np.ndarray  # (S, 3) (t, h, w); zeros for audio
    covered: np.ndarray  # (L,) tokens inside a sound span
    starts: np.ndarray  # (S,) each span's first token in the flat token stream


def check_token_totals(d: Rows, check: RowCheck) -> None:
    """``num_vision_tokens`` = the images' and videos' tokens, ``num_video_tokens``, ``num_audio_tokens`` the
    videos' and clips' (each medium's items summed into its token columns)."""
    sums = {}
    for m in MEDIA:
        items = d.media[m.name]
        tokens = np.bincount(row_of(items.offsets), weights=items.fields["num_tokens"],
                             minlength=d.num_rows).astype(np.int64)
        for column in dict.fromkeys((m.token_column, m.own_tokens_column)):  # once each, in order
            if column is not None:
                sums.setdefault(column, []).append((m, tokens))
    for column, parts in sums.items():
        have = sum(tokens for _, tokens in parts)
        stored = d.totals[column]
        names = " and ".join(m.items_noun for m, _ in parts)
        check(have != stored, column, lambda i, have=have, stored=stored, column=column, names=names:
              f"{column} is {stored[i]}, the {names} have {have[i]}")


def check_spans(d: Rows, check: RowCheck, profile: ModelProfile, medium: str, token_id: int | None
                ) -> tuple[Spans, int | None]:
    """One medium's spans: inside the row, in order, no overlap, one example and one tree node each, their
    ``num_tokens`` from their grid (or feature length), labels -100 on them. Returns the spans and the id lying
    on them (which the placeholder check holds to exactly the spans), or None."""
    items = d.media[medium]
    ids, row_starts = d.input_ids.values, d.row_starts
    offsets, fields, on = family.spans(profile, medium, ids, row_starts, items.offsets, items.fields, token_id)
    on = (token_id if on else None) if isinstance(on, bool) else on  # the id lying exactly on the spans
    L = len(ids)
    span_row = row_of(offsets)
    s, n = fields["offset"], fields["num_tokens"]
    inside = (n >= 1) & (s >= 0) & (s + n <= d.num_tokens[span_row])
    overlap = np.zeros(len(s), dtype=bool)
    overlap[1:] = (s[1:] < s[:-1] + n[:-1]) & within_row_pairs(offsets)
    flat = row_starts[span_row] + s
    example_starts = d.examples[0]
    node_offsets = d.forest[0]
    last = flat + np.maximum(n, 1) - 1
    crosses = ((np.searchsorted(example_starts, flat, side="right") != np.searchsorted(example_starts, last, side="right"))
               | (np.searchsorted(node_offsets, flat, side="right") != np.searchsorted(node_offsets, last, side="right")))
    misplaced = ~inside | overlap | (inside & crosses)
    check(rows_with(misplaced, span_row, d.num_rows), f"{medium} spans",
          lambda i: f"a {medium}'s tokens are outside the row, overlap another {medium}, are out of order or cross "
          "an example or tree-node boundary")
    miscounted, grids = _check_span_token_counts(d, check, profile, medium, fields, span_row)
    rows_ok = ~rows_with(misplaced | miscounted, span_row, d.num_rows)
    sound = rows_ok[span_row]
    depth = np.zeros(L + 1, dtype=np.int64)
    np.add.at(depth, flat[sound], 1)
    np.add.at(depth, flat[sound] + n[sound], -1)
    covered = np.cumsum(depth)[:L] > 0  # (L,) token lies in some span
    sound_tokens = rows_ok[d.input_ids.row_of]
    article = "an" if medium in ("image", "audio") else "a"
    check(rows_with(sound_tokens & covered & (d.labels.values != IGNORE_INDEX), d.input_ids.row_of, d.num_rows),
          f"{medium} labels", lambda i: f"{article} {medium} token carries a label (media tokens carry no loss)")
    if on is None and token_id is None and sound.any():  # an old manifest: the id the first span holds
        on = int(ids[flat[sound][0]])
    spans = Spans(offsets, fields, sound_tokens, sound, grids, covered & sound_tokens, flat)
    return spans, on


def _check_span_token_counts(d: Rows, check: RowCheck, profile: ModelProfile, medium: str,
                             fields: dict[str, np.ndarray], span_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S,) spans whose ``num_tokens`` disagree with the family's count, and (S, 3) their grids."""
    n = fields["num_tokens"]
    if medium == "audio":  # a clip's count follows from its feature length (the family's rule)
        bad = family.num_tokens(profile, medium, fields) != n
        check(rows_with(bad, span_row, d.num_rows), "audio tokens count",
              lambda i: f"an audio clip's num_tokens does not match its feature_length under profile {profile.name!r}")
        return bad, np.zeros((len(n), 3), dtype=np.int64)
    grids = np.stack([fields["grid_t"], fields["grid_h"], fields["grid_w"]], axis=1)  # (S, 3)
    bad = family.num_tokens(profile, medium, fields) != n
    check(rows_with(bad, span_row, d.num_rows), f"{medium} grid",
          lambda i: f"a {medium}'s num_tokens does not match its grid (t, h, w) under profile {profile.name!r}")
    return bad, grids


def check_placeholders(d: Rows, check: RowCheck, spans: dict[str, Spans], on: dict[str, int | None],
                       token_ids: dict[str, int | None]) -> np.ndarray:
    """Each placeholder (and each id a family says its spans hold) lies exactly on the spans that claim it: a
    family that lays its runs out in other tokens claims none (its placeholder then appears nowhere), and
    GLM-4.6V's video frames claim its image placeholder beside its images. Returns (L,) the tokens of rows
    whose spans of every medium are sound."""
    ids = d.input_ids.values
    L = len(ids)
    claims, named = {}, {}
    for m in MEDIA:
        tid = on[m.name]
        if tid is not None:
            claims[tid] = claims.get(tid, np.zeros(L, dtype=bool)) | spans[m.name].covered
            named.setdefault(tid, m.name)
        if token_ids[m.name] is not None:
            named.setdefault(token_ids[m.name], m.name)
    sound = np.logical_and.reduce([spans[m.name].sound_rows_tokens for m in MEDIA])
    for tid, what in named.items():
        stray = sound & (claims.get(tid, np.zeros(L, dtype=bool)) != (ids == tid))
        check(rows_with(stray, d.input_ids.row_of, d.num_rows), f"{what} tokens",
              lambda i, tid=tid, what=what: f"{what} spans and {what} tokens (id {tid}) disagree: a span over other "
              f"tokens, or a stray {what} token")
    return sound


def _check_plans(d: Rows, check: RowCheck, medium: str, faults, fault: str) -> None:
    """``faults(fields)`` flags the medium's entries whose numbers disagree; their rows fail "<medium> plan"."""
    entries = d.media[medium]
    if not len(entries.fields["offset"]):
        return
    check(rows_with(faults(entries.fields), row_of(entries.offsets), d.num_rows), f"{medium} plan", lambda i: fault)


def check_video_plans(d: Rows, check: RowCheck, profile: ModelProfile) -> None:
    """Each video's grid agrees with its stored frame size and sampled frame count, its token count with its
    grid, and its ``second_per_grid_t`` is positive."""
    _check_plans(d, check, "video", lambda v: family.video_faults(profile, v),
                 f"a video's grid, frame size, frame count or second_per_grid_t disagree under profile "
                 f"{profile.name!r}")


def check_audio_plans(d: Rows, check: RowCheck, profile: ModelProfile) -> None:
    """Each clip's numbers under the family's rule: its sample rate, >= 1 sample, its feature length from its
    samples (and its padded_samples, v5, where set: never fewer than its samples)."""
    _check_plans(d, check, "audio", lambda a: family.audio_faults(profile, a),
                 f"an audio clip's sample rate, samples or feature length disagree under profile "
                 f"{profile.name!r} (or its padded_samples, where set)")
