"""``packer verify --input`` on a ``--long-docs split`` build: tokens lost = 0, checked against the build's own
tokenizer.

A split text's chunks ``path:line@k`` (packer.core.ids) are packed as separate examples. Shards store no
per-document record of the split, so verify re-tokenizes: it encodes each split document's input line whole
(the manifest's tokenizer, its fingerprint checked; no length limit), cuts that token stream by the
documented rule (``packer.encode.split``: windows of max_length, ``long_docs_overlap`` tokens of context with
label -100) and compares every packed chunk with its window, tokens and labels, by sha256. So a chunk that
lost, changed or reordered a token, a chunk count that differs from what the document's length makes, and
a loss carried twice all show. Why re-tokenize rather than store counts: counts would only show that the
lengths add up, not that the tokens are the document's.

Cost: while verify reads the shards, one sha256 per chunk (copy 0 only; memory: a digest per chunk); then one
tokenizer call per split document (its input line read again).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.core.types import Example, Node

if TYPE_CHECKING:
    from packer.shards.schema import Manifest

CHUNK_SUFFIX = r"@[0-9]+$"  # a chunk, copy 0 (copies repeat it byte for byte; verify's row checks cover them)


def digest(ids: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of a chunk's tokens and labels, as int32."""
    return hashlib.sha256(ids.astype(np.int32).tobytes() + labels.astype(np.int32).tobytes()).hexdigest()


class ChunkDigests:
    """The digest of every packed chunk, gathered row group by row group: (id path, line) -> {chunk: sha256}."""

    def __init__(self) -> None:
        self.by_doc: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)

    def add(self, ex_ids: pa.Array, ids: np.ndarray, labels: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """``ex_ids`` (E,) of some rows, with each example's ``[starts, ends)`` in the flat ``ids``/``labels``."""
        hit = np.flatnonzero(pc.match_substring_regex(ex_ids, CHUNK_SUFFIX).to_numpy(zero_copy_only=False))
        for j in hit.tolist():
            head, _, chunk = ex_ids[j].as_py().rpartition("@")
            path, _, line = head.rpartition(":")
            s, e = int(starts[j]), int(ends[j])
            self.by_doc[(path, int(line))][int(chunk)] = digest(ids[s:e], labels[s:e])


def check_split_documents(manifest: Manifest, digests: ChunkDigests, files: dict[str, str], add) -> None:
    """Compare every split document's packed chunks with its re-tokenized windows; ``add(file, what)`` reports.

    ``files``: resolved input path -> the name the user gave (only these files' documents are checked).
    """
    from packer.encode.encoder import Encoder
    from packer.encode.split import chunk_labels, split_windows
    from packer.encode.tokenizers import fingerprint, load_tokenizer
    from packer.formats.read import chosen_lines
    from packer.models import get_profile

    wanted: dict[str, dict[int, dict[int, str]]] = defaultdict(dict)  # resolved file -> line -> chunks
    for (path, line), chunks in digests.by_doc.items():
        real = os.path.realpath(manifest.resolve(path))
        if real in files:
            wanted[real][line] = chunks
    if not wanted:
        return
    cfg, ref = manifest.config, manifest.tokenizer
    if ref is None:
        add("<dataset>", "the manifest names no tokenizer: split documents cannot be re-tokenized")
        return
    try:
        tok = load_tokenizer(ref.name)
    except Exception as e:  # noqa: BLE001 - any loading failure means the check cannot run; say so
        add("<dataset>", f"cannot load the build's tokenizer {ref.name!r} to check split documents: {e}")
        return
    if fingerprint(tok) != ref.fingerprint:
        add("<dataset>", f"tokenizer {ref.name!r} differs from the build's (fingerprint); split documents not checked")
        return
    encoder = Encoder(tok, get_profile(manifest.profile, **cfg.profile_overrides()))  # no max_length: whole
    max_length, overlap = cfg.max_length, cfg.long_docs_overlap
    for real, lines in sorted(wanted.items()):
        name = files[real]
        for n, raw in chosen_lines(real, lines):
            chunks = lines[n]
            try:
                text = json.loads(raw)["text"]
                whole = encoder.encode(Example(root=Node(messages=[]), kind="text", path=name, line=n, text=text))
            except Exception as e:  # noqa: BLE001 - a line the build split must encode again
                add(name, f"line {n} is split but does not encode as a text record again: {e}")
                continue
            windows = split_windows(whole.num_tokens, max_length=max_length, overlap=overlap)
            if sorted(chunks) != list(range(len(windows))):
                add(name, f"line {n} is packed as chunks {sorted(chunks)[:8]}, but its {whole.num_tokens} tokens "
                    f"make {len(windows)} chunks (tokens lost or added)")
                continue
            ends = [0] + [b for _, b in windows[:-1]]
            for k, ((a, b), e) in enumerate(zip(windows, ends, strict=True)):
                want = digest(whole.input_ids[a:b], chunk_labels(whole.labels, a, b, context_end=e))
                if chunks[k] != want:
                    add(name, f"line {n} chunk {k} differs from the document's tokens [{a}, {b}) "
                        "(tokens or labels changed)")


