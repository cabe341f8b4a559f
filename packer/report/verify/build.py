"""``verify_build``: one pass over the shards, each row group decoded once (``decode``) and put through the
named checks in order; then the whole-build accounting (``accounting``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import packer.report.verify.accounting as accounting
import packer.report.verify.labels as labels
import packer.report.verify.media as media
import packer.report.verify.positions as positions
import packer.report.verify.trees as trees
from packer.core.media import MEDIA
from packer.errors import ConfigError
from packer.report.split_docs import ChunkDigests
from packer.report.tokenizer_check import RecordDigests
from packer.report.verify.budgets import Promises, check_budgets, promises
from packer.report.verify.decode import Rows, decode, schema_problem
from packer.report.verify.family import uses_mrope
from packer.report.verify.report import DEFAULT_LIMIT, DEFAULT_TOKENIZER_CHECK, RowCheck, VerifyReport
from packer.shards.io import open_shards, parquet_file, sha256_file


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
    if tokenizer_check != "all" and (not isinstance(tokenizer_check, int) or tokenizer_check < 0):
        raise ConfigError(f"tokenizer_check must be a count >= 0 or 'all', got {tokenizer_check!r}")
    seen = _Seen(digests=ChunkDigests() if inputs is not None and manifest.config.long_docs == "split" else None,
                 records=RecordDigests() if inputs is not None and tokenizer_check != 0 else None)
    promised = promises(manifest)
    for entry in shards.shards:
        rep.shards += 1
        pf = _open_shard(root, entry, manifest.schema_version, rep)
        if pf is not None:
            _check_shard(pf, entry.file, promised, rep, seen)
    listed = {entry.file for entry in shards.shards}
    for stray in sorted(p.name for p in root.glob("shard-*")):
        if stray not in listed:
            rep.add(stray, None, "a shard file the manifest does not list (stale or temporary)", "stray file")

    ids = pa.chunked_array(seen.id_chunks, pa.string()) if seen.id_chunks else pa.chunked_array([], pa.string())
    accounting.check_unique_example_ids(ids, seen.id_where, rep)
    rejects = accounting.read_rejects(root, rep)
    later = int(pc.sum(pc.match_substring_regex(ids.combine_chunks(), r"@[1-9][0-9]*$")).as_py() or 0) if len(ids) else 0
    accounting.check_totals(manifest, root, rep, seen.totals, rejects, later)
    if inputs is not None:
        accounting.check_inputs(manifest, root, ids, rejects, inputs, rep, seen.digests, seen.records,
                                None if tokenizer_check == "all" else int(tokenizer_check))
    return rep


@dataclass
class _Seen:
    """What the pass over the shards collects for the whole-build checks."""

    digests: ChunkDigests | None  # split documents' chunks (``--input`` of a ``--long-docs split`` build)
    records: RecordDigests | None  # records packed whole, for the tokenizer check
    totals: Counter = field(default_factory=Counter)  # tokens, loss_tokens, vision_tokens
    id_chunks: list[pa.Array] = field(default_factory=list)  # every example id, in dataset order
    id_where: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (file, row of each id) per chunk


def _check_shard(pf, file: str, promised: Promises, rep: VerifyReport, seen: _Seen) -> None:
    """Every row group of one shard, decoded once and checked; what the whole-build checks need goes to ``seen``."""
    base = 0
    for g in range(pf.metadata.num_row_groups):
        try:
            table = pf.read_row_group(g)
        except Exception as e:  # noqa: BLE001
            rep.add(file, None, f"row group {g} unreadable: {type(e).__name__}: {e}", "unreadable")
            return
        d = decode(table, np.arange(base, base + table.num_rows))
        base += table.num_rows
        rep.rows += d.num_rows
        rep.examples += int(d.num_examples.sum())
        seen.totals["tokens"] += int(d.num_tokens.sum())
        seen.totals["loss_tokens"] += int(d.totals["num_loss_tokens"].sum())
        seen.totals["vision_tokens"] += int(d.totals["num_vision_tokens"].sum())
        seen.id_chunks.append(d.example_ids)
        seen.id_where.append((file, np.repeat(d.rows, d.num_examples)))
        sound = check_row_group(d, promised, rep, file)
        for collected in (seen.digests, seen.records):
            if collected is not None and sound.num_rows:
                _add_digests(sound, collected)


def _open_shard(root: Path, entry, version: int, rep: VerifyReport):
    """The shard's ParquetFile, or None when it is missing, unreadable or of another schema (each a violation);
    a checksum or row count differing from the manifest is reported and the shard still read."""
    file, spath = entry.file, root / entry.file
    if not spath.is_file():
        rep.add(file, None, "listed in the manifest but missing", "missing shard")
        return None
    if sha256_file(spath) != entry.sha256:
        rep.add(file, None, f"sha256 differs from the manifest ({entry.sha256})", "checksum")
    try:
        pf = parquet_file(spath)
    except Exception as e:  # noqa: BLE001 - any Parquet/Arrow failure is this file's violation
        rep.add(file, None, f"unreadable Parquet: {type(e).__name__}: {e}", "unreadable")
        return None
    if pf.metadata.num_rows != entry.rows:
        rep.add(file, None, f"{pf.metadata.num_rows} rows, the manifest says {entry.rows}", "row count")
    problem = schema_problem(pf.schema_arrow, version)
    if problem:
        rep.add(file, None, problem, "schema")
        return None
    return pf


def check_row_group(d: Rows, promised: Promises, rep: VerifyReport, file: str) -> Rows:
    """Every per-row check, in order; a row failing a structural one (list lengths, cu_seqlens, the node forest)
    is left out of the later ones. Returns the rows whose structure is sound."""
    profile = promised.profile
    d = d.keep(trees.check_list_lengths(d, RowCheck(rep, file, d.rows), mrope=uses_mrope(profile)))
    check = RowCheck(rep, file, d.rows)
    faults = trees.layout_faults(d)
    sound = trees.check_cu_seqlens(d, check, faults)
    check_budgets(d, check, promised)
    sound &= trees.check_node_forest(d, check, faults)
    d = d.keep(sound)
    if not d.num_rows:
        return d
    check = RowCheck(rep, file, d.rows)
    labels.check_first_label_ignored(d, check)
    labels.check_labels_unshifted(d, check)
    labels.check_loss_token_count(d, check)
    labels.check_loss_weights(d, check)
    media.check_token_totals(d, check)
    positions.check_tree_positions(d, check)
    spans, on = {}, {}
    for m in MEDIA:
        spans[m.name], on[m.name] = media.check_spans(d, check, profile, m.name, promised.token_ids[m.name])
    sound_tokens = media.check_placeholders(d, check, spans, on, promised.token_ids)
    media.check_video_plans(d, check, profile)
    media.check_audio_plans(d, check, profile)
    positions.check_mrope(d, check, profile, spans, sound_tokens)
    labels.check_seq_lengths(d, check)
    return d


def _add_digests(d: Rows, digests: ChunkDigests | RecordDigests) -> None:
    """The chunks of split documents (split_docs.py), or the records packed whole (tokenizer_check.py), among
    rows whose structure passed."""
    starts, ends, _ = d.examples
    digests.add(d.example_ids, d.input_ids.values, d.labels.values, starts, ends)
