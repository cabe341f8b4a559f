"""``packer verify``: check a finished build against every invariant of docs/format.md.

One module per concern, each check a named function (``check_*``) that reports its fault in words:

    decode.py      schema versions (v2-v5) decoded once into ``Rows``, the schema itself
    trees.py       list lengths, cu_seqlens, the node forest (structural: a failing row is not checked further)
    budgets.py     what the manifest promises: capacity, examples per pack, each budget of ``core.media.BUDGETS``
    labels.py      -100 at example starts, unshifted labels, loss totals and weights, TRL's seq_lengths
    positions.py   tree position_ids and mRoPE
    media.py       per medium of ``core.media.MEDIA``: token totals, spans, placeholders, video and audio plans
    accounting.py  unique ids, rejects, totals, stats.json, input records (``--input``)
    family.py      every call to the model family's hooks
    build.py       ``verify_build``: the pass over the shards

What is checked (each failure is one ``Violation``: file, row, what):

- the manifest: present, schema version, every shard present with its row count and sha256, no stray
  ``shard-*`` files, totals equal to the sums over the shards, rejects.jsonl and stats.json agree with it;
- each shard's Arrow schema is ``packer.shards.schema``;
- per row, vectorized over a whole row group at once (numpy, no per-token Python):
  list lengths agree (labels, positions, 3·T mRoPE, E+1 cu_seqlens, E ids), ``num_*`` columns equal the
  recomputed totals; ``cu_seqlens`` starts at 0, increases strictly, ends at T; the row is within the
  capacity, the examples budget and every budget of ``core.media.BUDGETS`` the manifest config sets; labels are -100 at every
  example start and on every image token, and equal ``input_ids`` elsewhere; the node layout keeps every
  rule of ``packer.core.tree.LAYOUT_RULES`` (offsets rise from 0, roots exactly at the example starts,
  parents earlier nodes of the same example); 1-D positions equal ``packer.core.tree.tree_position_ids``
  of the row's node forest; images lie inside one example, in order, without
  overlap, over exactly the image-token run of their ``num_tokens`` (no stray image token), with
  ``num_tokens`` matching the grid; videos the same way over their video-token runs, and each video's grid
  agrees with its stored frame size and sampled frame count (the video rule's ``faults``); audio clips the
  same way over their audio-token runs (a video's sound track: the family's spans inside the video's run), each
  clip's ``feature_length`` from its ``num_samples`` (and its ``padded_samples``, schema v5, where set: never
  fewer than its samples) and ``num_tokens`` from its ``feature_length`` by the
  family's audio rule (``feature_lengths``, ``num_tokens``), ``num_audio_tokens`` and the audio budgets
  (among the budgets above); mRoPE positions (float32 since v5, compared as stored: a fraction
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

from importlib import import_module
from typing import TYPE_CHECKING, Any

from packer.report.verify.report import DEFAULT_LIMIT, DEFAULT_TOKENIZER_CHECK, VerifyReport, Violation

# the checks (pyarrow.compute among their imports) load at first use: the CLI reads the defaults above only
_LAZY = {"input_lines": "accounting", "verify_build": "build", "AUDIO_FIELDS": "decode"}

if TYPE_CHECKING:
    from packer.report.verify.accounting import input_lines
    from packer.report.verify.build import verify_build
    from packer.report.verify.decode import AUDIO_FIELDS

__all__ = ["AUDIO_FIELDS", "DEFAULT_LIMIT", "DEFAULT_TOKENIZER_CHECK", "VerifyReport", "Violation", "input_lines",
           "verify_build"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'packer.report.verify' has no attribute {name!r}")
    value = getattr(import_module(f"packer.report.verify.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
