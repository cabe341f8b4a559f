"""``packer verify --input`` re-tokenizes input records with the HF tokenizer and compares with the shards.

The build may take fast paths (fastokens for the ids, byte lengths for the loss rule, a Python template); this
check takes none: each sampled record is parsed again from its input line and encoded by the build's encoder
(the manifest's tokenizer, its fingerprint checked, the same profile, template and length policy) with
``fast=False``, i.e. Jinja, the HF tokenizer and character offsets. Its tokens and labels must equal the packed
example's, byte for byte (sha256, as split_docs.py); a mismatch is reported at the input's ``file:line``.

Which records: ``sample`` of them spread evenly over the inputs' packed records (``--tokenizer-check N``), or
every one (``all``). Records packed whole only (a split document's chunks have their own check), copy 0 (the
row checks cover copies). JSONL inputs only: table rows are not re-read here.

Cost: while verify reads the shards, one sha256 per packed record (memory: a digest per record); then one
template rendering and tokenizer call per checked record.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.report.split_docs import digest

if TYPE_CHECKING:
    from packer.shards.schema import Manifest

_COPY = r"#[0-9]+$"


class RecordDigests:
    """The digest of every record packed whole (copy 0), row group by row group: (id path, line) -> (tokens, sha256)."""

    def __init__(self) -> None:
        self.by_record: dict[tuple[str, int], tuple[int, str]] = {}

    def add(self, ex_ids: pa.Array, ids: np.ndarray, labels: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """``ex_ids`` (E,) of some rows, with each example's ``[starts, ends)`` in the flat ``ids``/``labels``."""
        split = pc.match_substring_regex(ex_ids, r"@[0-9]+(#[0-9]+)?$").to_numpy(zero_copy_only=False)
        copy = pc.match_substring_regex(ex_ids, _COPY).to_numpy(zero_copy_only=False)
        copy0 = pc.match_substring_regex(ex_ids, r"#0$").to_numpy(zero_copy_only=False)
        for j in np.flatnonzero(~split & (~copy | copy0)).tolist():
            head = ex_ids[j].as_py()
            if copy0[j]:
                head = head[: -len("#0")]
            path, _, line = head.rpartition(":")
            s, e = int(starts[j]), int(ends[j])
            self.by_record[(path, int(line))] = (e - s, digest(ids[s:e], labels[s:e]))


def check_tokens(manifest: Manifest, digests: RecordDigests, files: dict[str, str], add, *,
                 sample: int | None) -> int:
    """Re-encode the sampled records (``sample`` of them, None: all) of ``files`` (resolved input path -> the
    name the user gave) with the general path and compare; ``add(file, what)`` reports. Returns how many were
    checked."""
    from packer.formats.read import chosen_lines, parse_line

    by_file: dict[str, list[tuple[int, tuple[int, str]]]] = defaultdict(list)
    for (path, line), value in digests.by_record.items():
        real = os.path.realpath(manifest.resolve(path))
        if real in files and not real.endswith((".parquet", ".arrow")):
            by_file[real].append((line, value))
    keys = sorted((real, line, value) for real, rows in by_file.items() for line, value in rows)
    if sample is not None and len(keys) > sample:
        keys = [keys[i] for i in np.linspace(0, len(keys) - 1, num=sample).round().astype(int).tolist()] if sample else []
    if not keys:
        return 0
    ref = manifest.tokenizer
    if ref is None:
        add("<dataset>", "the manifest names no tokenizer: records cannot be re-tokenized")
        return 0
    try:
        encoder = _general_encoder(manifest)
    except Exception as e:  # noqa: BLE001 - any loading failure means the check cannot run; say so
        add("<dataset>", f"cannot load the build's tokenizer {ref.name!r} to re-tokenize records: {e}")
        return 0
    from packer.encode.tokenizers import fingerprint

    if fingerprint(encoder.tokenizer) != ref.fingerprint:
        add("<dataset>", f"tokenizer {ref.name!r} differs from the build's (fingerprint); records not re-tokenized")
        return 0
    config = manifest.config
    source_of = _file_sources(manifest)
    wanted: dict[str, dict[int, tuple[int, str]]] = defaultdict(dict)
    for real, line, value in keys:
        wanted[real][line] = value
    for real, lines in sorted(wanted.items()):
        name = files[real]
        for n, raw in chosen_lines(real, lines):
            value = lines[n]
            try:
                example = parse_line(raw, path=real, line=n, base_dir=os.path.dirname(real),
                                     **config.record_options(source_of.get(real, "")))
                got = encoder.encode(example)
            except Exception as e:  # noqa: BLE001 - a packed record must encode again
                add(name, f"line {n} is packed but does not encode again with the HF tokenizer: {e}")
                continue
            if isinstance(got, list):
                continue  # split: split_docs.py checks it
            if (got.num_tokens, digest(got.input_ids, got.labels)) != value:
                add(name, f"line {n}: the packed tokens/labels ({value[0]} tokens) differ from the HF tokenizer's "
                    f"({got.num_tokens} tokens), e.g. a fast path that is not exact")
    return len(keys)


def _file_sources(manifest: Manifest) -> dict[str, str]:
    """Resolved input file -> the name of the source it belongs to (whose mapping its records parse with)."""
    from packer.errors import ConfigError
    from packer.formats.read import expand_inputs

    out = {}
    for s in manifest.config.sources:
        try:
            files = expand_inputs([manifest.resolve(p) for p in s.paths])
        except ConfigError:
            continue  # verify's source-weights check reports a source that matches nothing
        out.update((os.path.realpath(f), s.name) for f in files)
    return out


def _general_encoder(manifest: Manifest):
    """The build's encoder (``config.make_encoder``: profile, tokenizer, template, length policy) on the general
    path only."""
    from packer.config import make_encoder

    return make_encoder(manifest.config, fast=False)
