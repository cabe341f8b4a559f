"""Encoded examples -> Arrow tables, rows gathered from the encode cache, and examples -> pack rows.

Gathering and pack assembly work on Arrow buffers with numpy (offsets + values), never with per-token Python
objects.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from packer.core.types import IGNORE_INDEX, Encoded, EncodedAudio, EncodedImage, EncodedVideo
from packer.errors import ShardError
from packer.shards import derived
from packer.shards.mrope import SPARSE_COLUMNS, example_columns, row_columns
from packer.shards.mrope import dense as dense_positions
from packer.shards.schema import (
    AUDIO_TYPE,
    EXAMPLE_SCHEMA,
    F32_LIST,
    I32_LIST,
    IMAGE_TYPE,
    MAX_EXACT_POSITION,
    ROW_SCHEMA,
    SCHEMA,
    VIDEO_TYPE,
)
from packer.shards.store import ObjectPath, local_file, store_path

if TYPE_CHECKING:
    from packer.encode.finish import Row


def encoded_table(encoded: Sequence[Encoded | Row]) -> pa.Table:
    """``encoded`` as an EXAMPLE_SCHEMA table, column by column: each token column one concatenation + offsets,
    the counts from whole-chunk reductions, only the media structs converted from Python (a few per chunk).
    Equal, value and buffer, to ``pa.Table.from_pylist`` of ``encoded_record`` per example (the reference,
    tests/shards/test_encoded_table.py), at ~1/4 of its CPU (docs/benchmarks.md, "Fast paths").

    A ``Row`` (``Encoder.encode_batch(rows=True)``: a record ``batch-finish`` took) is read as columns: a run
    of rows of one batch gives each column one gather from the batch's flat arrays (``Rows.columns``), no
    Encoded and no array per record; Encodeds between them are read one by one, in record order."""
    if not encoded:
        return EXAMPLE_SCHEMA.empty_table()
    n = len(encoded)
    lengths_p: list[np.ndarray] = []
    ids_p: list[np.ndarray] = []
    labels_p: list[np.ndarray] = []
    pos_p: list[np.ndarray] = []
    mrope_p: list[np.ndarray | None] = []  # per run of rows or per Encoded: (3, T), or None
    mrope_n: list[int] = []  # rows each part covers
    node_n: list[np.ndarray] = []
    node_off_p: list[np.ndarray] = []
    node_par_p: list[np.ndarray] = []
    weights: list[np.ndarray | None] = []
    img_n: list[np.ndarray] = []
    sources: list[str] = []
    data: list[bytes | None] = []
    img_int: list[np.ndarray] = []  # (M, 5) grid_t, grid_h, grid_w, offset, num_tokens
    vision = np.zeros(n, dtype=np.int64)
    videos: list[list[dict[str, Any]]] = []
    audios: list[list[dict[str, Any]]] = []
    n_video = np.zeros(n, dtype=np.int64)
    n_audio = np.zeros(n, dtype=np.int64)
    video_tok = np.zeros(n, dtype=np.int64)
    audio_tok = np.zeros(n, dtype=np.int64)
    k = 0
    while k < n:
        e = encoded[k]
        if isinstance(e, Encoded):
            lengths_p.append(np.array([e.input_ids.shape[0]], dtype=np.int64))
            ids_p.append(e.input_ids)
            labels_p.append(e.labels)
            pos_p.append(e.position_ids)
            mrope_p.append(None if e.mrope_position_ids is None else np.asarray(e.mrope_position_ids))
            mrope_n.append(1)
            node_n.append(np.array([e.node_offsets.shape[0]], dtype=np.int64))
            node_off_p.append(e.node_offsets)
            node_par_p.append(e.node_parents)
            weights.append(e.loss_weights)
            img_n.append(np.array([len(e.images)], dtype=np.int64))
            for im in e.images:
                sources.append(im.source)
                data.append(im.data)
            img_int.append(np.array([(*im.grid_thw, im.offset, im.num_tokens) for im in e.images],
                                    dtype=np.int64).reshape(-1, 5))
            vision[k] = e.num_vision_tokens
            videos.append([_video_record(v) for v in e.videos])
            audios.append([_audio_record(a) for a in e.audios])
            n_video[k], n_audio[k] = len(e.videos), len(e.audios)
            video_tok[k], audio_tok[k] = e.num_video_tokens, e.num_audio_tokens
            k += 1
            continue
        block, j = e.block, k  # a run of rows of one batch
        while j < n and not isinstance(encoded[j], Encoded) and encoded[j].block is block:
            j += 1
        cols = block.columns(np.fromiter((encoded[q].r for q in range(k, j)), dtype=np.int64, count=j - k))
        lengths_p.append(cols["lengths"])
        ids_p.append(cols["input_ids"])
        labels_p.append(cols["labels"])
        pos_p.append(cols["position_ids"])
        mrope_p.append(cols["mrope"])
        mrope_n.append(j - k)
        node_n.append(cols["node_counts"])
        node_off_p.append(cols["node_offsets"])
        node_par_p.append(cols["node_parents"])
        weights += [None] * (j - k)
        img_n.append(cols["image_counts"])
        picked = cols["images"]
        for q in picked.tolist():
            ref = block.images[q][0]
            sources.append(ref.path if ref.data is None else "")
            data.append(ref.data)
        tokens = block.img_tokens[picked]
        img_int.append(np.concatenate([block.img_grids[picked], block.img_offsets[picked, None], tokens[:, None]],
                                      axis=1))
        sums = np.zeros(picked.shape[0] + 1, dtype=np.int64)
        np.cumsum(tokens, out=sums[1:])
        ends = np.cumsum(cols["image_counts"])
        vision[k:j] = sums[ends] - sums[ends - cols["image_counts"]]
        videos += [[] for _ in range(j - k)]
        audios += [[] for _ in range(j - k)]
        k = j
    lengths = np.concatenate(lengths_p)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate(ids_p).astype(np.int32, copy=False)
    labels = np.concatenate(labels_p)
    loss = np.flatnonzero(labels != IGNORE_INDEX)  # where the loss tokens are: ~10x cheaper than a (T,) cumsum
    num_loss = np.searchsorted(loss, offsets[1:]) - np.searchsorted(loss, offsets[:-1])
    loss_weight = num_loss.astype(np.float64)
    for q, e in enumerate(encoded):  # as ``Encoded.weighted_loss_tokens`` sums it (pairwise, float64)
        if weights[q] is not None:
            loss_weight[q] = e.weighted_loss_tokens
    nodes = np.concatenate(node_n)
    node_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(nodes, out=node_offsets[1:])
    counts = np.concatenate(img_n)
    columns = {
        "example_id": pa.array([e.example_id for e in encoded], pa.string()),
        "source_name": pa.array([e.source_name for e in encoded], pa.string()),
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
        **_derived_columns(ids, labels, np.concatenate(pos_p), offsets),
        "loss_weights": _optional_list(weights, lengths, np.float32),
        **_mrope_columns(encoded, lengths, mrope_p, mrope_n),
        "node_offsets": _list(node_offsets, node_off_p, np.int32),
        "node_parents": _list(node_offsets, node_par_p, np.int32),
        "images": _images(counts, sources, data, np.concatenate(img_int)),
        "videos": pa.array(videos, pa.list_(VIDEO_TYPE)),
        "audios": pa.array(audios, pa.list_(AUDIO_TYPE)),
        "num_tokens": pa.array(lengths.astype(np.int32)),
        "num_loss_tokens": pa.array(num_loss.astype(np.int32)),
        "loss_weight": pa.array(loss_weight),
        "num_vision_tokens": pa.array(vision.astype(np.int32)),
        "num_video_tokens": pa.array(video_tok.astype(np.int32)),
        "num_audio_tokens": pa.array(audio_tok.astype(np.int32)),
        "num_images": pa.array(counts.astype(np.int32)),
        "num_videos": pa.array(n_video.astype(np.int32)),
        "num_audios": pa.array(n_audio.astype(np.int32)),
    }
    return pa.Table.from_arrays([columns[f.name] for f in EXAMPLE_SCHEMA], schema=EXAMPLE_SCHEMA)


def _derived_columns(ids: np.ndarray, labels: np.ndarray, positions: np.ndarray, offsets: np.ndarray
                     ) -> dict[str, pa.Array]:
    """The cache's ``labels``, ``label_runs`` and ``position_ids`` columns (``derived.compact``)."""
    parts = derived.compact(ids, labels, positions, offsets)
    return {name: pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), pa.array(values, pa.int32()))
            for name, (off, values) in zip(("labels", "label_runs", "position_ids"), parts, strict=True)}


def _images(counts: np.ndarray, sources: list[str], data: list[bytes | None], ints: np.ndarray) -> pa.ListArray:
    """The ``images`` column: ``counts[i]`` images in row i; ``ints`` (M, 5) grid_t, grid_h, grid_w, offset,
    num_tokens of each."""
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    ints = ints.astype(np.int32)
    fields = [pa.array(sources, pa.string()), pa.array(data, pa.binary())]
    fields += [pa.array(np.ascontiguousarray(ints[:, c])) for c in range(5)]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays(fields, fields=list(IMAGE_TYPE)))


def _list(offsets: np.ndarray | None, parts: list[np.ndarray], dtype: type) -> pa.ListArray:
    """One list per part, the parts back to back (``offsets``: their starts, computed here when None)."""
    if offsets is None:
        offsets = np.zeros(len(parts) + 1, dtype=np.int32)
        np.cumsum([p.shape[0] for p in parts], out=offsets[1:])
    values = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _optional_list(parts: list[np.ndarray | None], lengths: np.ndarray, dtype: type,
                   values: np.ndarray | None = None) -> pa.ListArray:
    """``_list`` where a None part is a null list (a row without the column's values); ``values``: the parts
    already back to back."""
    null = np.fromiter((p is None for p in parts), dtype=bool, count=len(parts))
    if null.all():
        return pa.nulls(len(parts), pa.list_(pa.from_numpy_dtype(dtype)))
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum(np.where(null, 0, lengths), out=offsets[1:])
    if values is None:
        values = np.concatenate([p for p in parts if p is not None])
    mask = pa.array(null) if null.any() else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(dtype, copy=False)), mask=mask)


def _mrope_columns(encoded: Sequence[Encoded | Row], lengths: np.ndarray, parts: list[np.ndarray | None],
                   rows: list[int]) -> dict[str, pa.Array]:
    """The mRoPE columns (``mrope.example_columns``) of ``mrope_values`` of every example (3 * L each), or null.
    ``parts``: (3, T) of ``rows[i]`` examples side by side (a run of Rows, or one Encoded), or None."""
    present = [p for p in parts if p is not None]
    if not present:
        return example_columns(None, lengths)
    null = np.repeat([p is None for p in parts], rows)
    ints = [p for p in present if p.dtype.kind in "iu"]
    if all(p.dtype.kind in "iu" or p.dtype == np.float32 for p in present) and max(
            (int(np.abs(p).max(initial=0)) for p in ints), default=0) < MAX_EXACT_POSITION:
        # (3, T) of every example side by side, then token-major (t, h, w per token) in one transpose
        values = np.ascontiguousarray(np.concatenate(present, axis=1).T, dtype=np.float32).reshape(-1)
    else:  # what float32 may not hold exactly: each example checked alone (ShardError naming the first)
        enc = [e if isinstance(e, Encoded) else e.encoded() for e in encoded]
        values = np.concatenate([mrope_values(e.mrope_position_ids, e.example_id) for e in enc
                                 if e.mrope_position_ids is not None])
    return example_columns(values, lengths, null if null.any() else None)


def encoded_record(enc: Encoded) -> dict[str, Any]:
    """One ``Encoded`` example as a dict of EXAMPLE_SCHEMA columns (what ``encoded_table`` must equal, row by row); the mRoPE
    columns those of its token-major (t, h, w per token) float32 positions (``mrope.example_columns``), or None."""
    mrope = None if enc.mrope_position_ids is None else mrope_values(enc.mrope_position_ids, enc.example_id)
    sparse = {name: None if mrope is None else col[0].as_py() for name, col in example_columns(
        mrope, np.array([enc.num_tokens])).items()}
    ids, labels, positions = enc.input_ids.tolist(), enc.labels.tolist(), enc.position_ids.tolist()
    runs: list[int] = []  # the derived rule (``derived``), token by token
    if all(lab in (IGNORE_INDEX, i) for lab, i in zip(labels, ids, strict=True)):
        for k, lab in enumerate(labels):
            if lab != IGNORE_INDEX:
                if runs and runs[-2] + runs[-1] == k:
                    runs[-1] += 1
                else:
                    runs += [k, 1]
        labels = []
    return {
        "example_id": enc.example_id,
        "source_name": enc.source_name,
        "input_ids": enc.input_ids,
        "labels": labels,
        "label_runs": runs,
        "loss_weights": enc.loss_weights,
        "position_ids": [] if positions == list(range(len(positions))) else positions,
        **sparse,
        "node_offsets": enc.node_offsets,
        "node_parents": enc.node_parents,
        "images": [_image_record(im) for im in enc.images],
        "videos": [_video_record(v) for v in enc.videos],
        "audios": [_audio_record(a) for a in enc.audios],
        "num_tokens": enc.num_tokens,
        "num_loss_tokens": enc.num_loss_tokens,
        "loss_weight": enc.weighted_loss_tokens,
        "num_vision_tokens": enc.num_vision_tokens,
        "num_video_tokens": enc.num_video_tokens,
        "num_audio_tokens": enc.num_audio_tokens,
        "num_images": len(enc.images),
        "num_videos": len(enc.videos),
        "num_audios": len(enc.audios),
    }


def mrope_values(positions: np.ndarray, example_id: str = "") -> np.ndarray:
    """(3, L) mRoPE positions (int32, or float32 for a family whose ``Positions.fractional``) as the stored float32
    values, token-major. ShardError where float32 would not hold them exactly (an integer position of 2^24 or
    more: an example far longer than any model's context), never a rounded position."""
    positions = np.asarray(positions)
    values = np.ascontiguousarray(positions.T, dtype=np.float32).reshape(-1)  # (3*L,) t, h, w per token
    if positions.dtype != np.float32 and len(values) and (
            not np.isfinite(values).all() or np.abs(values).max() >= MAX_EXACT_POSITION
            or not np.array_equal(values, np.ascontiguousarray(positions.T).reshape(-1))):
        raise ShardError(f"example {example_id!r}: mRoPE positions up to {np.abs(positions).max()} do not fit "
                         f"float32 exactly (the shards hold positions below {MAX_EXACT_POSITION}); shorten it")
    return values


def _image_record(im: EncodedImage) -> dict[str, Any]:
    t, h, w = im.grid_thw
    return {"source": im.source, "data": im.data, "grid_t": t, "grid_h": h, "grid_w": w, "offset": im.offset,
            "num_tokens": im.num_tokens}


def _video_record(v: EncodedVideo) -> dict[str, Any]:
    t, h, w = v.grid_thw
    return {"source": v.source, "frames": v.frames, "video_start": v.video_start, "video_end": v.video_end,
            "frame_indices": v.frame_indices, "video_fps": v.video_fps, "grid_t": t, "grid_h": h, "grid_w": w,
            "height": v.height, "width": v.width, "utils_height": v.utils_height, "utils_width": v.utils_width,
            "offset": v.offset, "num_tokens": v.num_tokens, "second_per_grid_t": v.second_per_grid_t}


def _audio_record(a: EncodedAudio) -> dict[str, Any]:
    return {"source": a.source, "data": a.data, "audio_start": a.audio_start, "audio_end": a.audio_end,
            "video": a.video, "sample_rate": a.sample_rate, "num_samples": a.num_samples,
            "feature_length": a.feature_length, "offset": a.offset, "num_tokens": a.num_tokens,
            "padded_samples": a.padded_samples}


def _flat(t: pa.DataType) -> bool:
    """A column of strings or of lists of numbers: offsets + one values buffer, copied with numpy."""
    return pa.types.is_string(t) or (pa.types.is_list(t) and pa.types.is_primitive(t.value_type))


def _offsets_and_values(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A flat column's (offsets, values) as zero-copy numpy views: offsets index ``values``."""
    if pa.types.is_string(arr.type):
        _, offsets, data = arr.buffers()
        values = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
        return np.frombuffer(offsets, dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4), values
    return arr.offsets.to_numpy(), arr.values.to_numpy(zero_copy_only=True)


def _values_dtype(t: pa.DataType) -> np.dtype:
    return np.dtype(np.uint8) if pa.types.is_string(t) else np.dtype(t.value_type.to_pandas_dtype())


def _from_offsets(t: pa.DataType, offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    """A flat column of type ``t`` from int64 offsets and its values (what ``_offsets_and_values`` reads)."""
    off32 = offsets.astype(np.int32)
    if pa.types.is_string(t):
        return pa.Array.from_buffers(t, len(off32) - 1, [None, pa.py_buffer(off32), pa.py_buffer(values)])
    return pa.ListArray.from_arrays(pa.array(off32), pa.array(values))


def _kinds() -> tuple[dict[str, pa.DataType], list[str], list[str], list[str]]:
    """EXAMPLE_SCHEMA's types and its columns by kind: flat (offsets + values), media lists, fixed-width."""
    types = {f.name: f.type for f in EXAMPLE_SCHEMA}
    flat = [name for name, t in types.items() if _flat(t)]
    media = [name for name, t in types.items() if pa.types.is_list(t) and not _flat(t)]
    return types, flat, media, [name for name in types if name not in flat and name not in media]


_TYPES, _FLAT, _MEDIA, _FIXED = _kinds()
_FIXED_WIDTHS = np.array([np.dtype(_TYPES[name].to_pandas_dtype()).itemsize for name in _FIXED], np.int64)
_FLAT_WIDTHS = np.array([_values_dtype(_TYPES[name]).itemsize for name in _FLAT], np.int64)


def take_rows(files: Sequence[str | Path | ObjectPath], starts: np.ndarray, sel: np.ndarray, *,
              remember: bool = False) -> pa.Table:
    """``take(sel)`` on the EXAMPLE_SCHEMA Arrow IPC ``files`` (the encode cache's chunks) read as one table,
    reading from each file only the rows ``sel`` names. ``starts``: (len(files) + 1,) the index of each
    file's first row in that table, then its length.

    pyarrow's take on the whole memory-mapped table first concatenates entire columns (measured: a 5% take
    of the 50k-record bench cache touched all 381 MB), so every shard cost the whole cache, and the touched
    pages stayed mapped: peak RSS grew with the corpus. Here the columns are copied with numpy straight from
    one mapped file at a time into one array per column (a first pass reads the offsets and the fixed-width
    columns, a second the strings' and lists' values), so memory is the rows taken plus one file, and a file
    leaves no Arrow objects behind: a shard draws from nearly every file (10k at 5M examples), and a small
    table kept per file cost ~46 KB each (docs/scale.md). Only columns that numpy cannot copy flat (media
    lists with items in the rows taken, a column null in some of them) take pyarrow's per-file path. Files on
    an object store are read from this machine's copy (``store.local_file``).

    ``remember``: the caller will take rows of these files again in this process (a writer's next shards):
    where each buffer of a file lies is kept (``_Layout``: one small array a file; not past ``LAYOUTS_MAX``
    files), and a later visit maps the file and copies every fixed and flat column's rows in one compiled call a
    pass (``gather.visit_lengths``, ``gather.visit_copy``), no Arrow reader (docs/benchmarks.md, "Write stage: a
    writer's file visits").
    """
    from packer.shards.gather import copy_ranges, visit_copy, visit_lengths

    n = sel.shape[0]
    remember = remember and len(files) <= LAYOUTS_MAX
    chunk = np.searchsorted(starts, sel, side="right") - 1  # (n,) file of each selected example
    order = np.argsort(chunk, kind="stable")  # selected examples grouped by file
    bounds = np.searchsorted(chunk[order], np.arange(starts.shape[0]))
    used = np.flatnonzero(bounds[1:] > bounds[:-1]).tolist()
    local = {c: (sel[order[bounds[c] : bounds[c + 1]]] - starts[c]).astype(np.int64, copy=False)
             for c in used}  # rows to read, per file
    dest = {c: order[bounds[c] : bounds[c + 1]] for c in used}  # where they go in the output
    # resolved once, not once per pass; a local ``str`` as it is (a shard visits hundreds of files)
    paths = {c: files[c] if isinstance(files[c], str) and "://" not in files[c]
             else str(local_file(store_path(files[c]))) for c in used}
    types, flat, media, fixed = _TYPES, _FLAT, _MEDIA, _FIXED

    def read(c: int) -> tuple[dict[str, pa.Array], int, int]:
        """File ``c``'s columns (zero-copy views of its mapping), the mapping's address and size."""
        with pa.memory_map(paths[c]) as src:
            whole = src.read_buffer()  # the whole mapping, zero-copy
            src.seek(0)
            reader = ipc.open_file(src)
            if reader.num_record_batches == 1:  # the cache's chunks, the map outputs: no table to combine
                batch = reader.get_batch(0)
                return dict(zip(batch.schema.names, batch.columns, strict=True)), whole.address, whole.size
            table = reader.read_all().combine_chunks()
            return {name: table.column(name).chunk(0) for name in table.schema.names}, whole.address, whole.size

    # pass 1: each flat column's lengths, each media list's items, the fixed-width columns, the nulls; and
    # where each flat column's offsets and values lie in the file, so that pass 2 maps the file and views
    # them with numpy instead of opening it with Arrow again (~0.2 ms a file, a shard visits hundreds)
    # each kind's columns in one array (a row per column) that a remembered visit fills in one call
    all_lengths = np.empty((len(flat), n), dtype=np.int64)
    lengths = dict(zip(flat, all_lengths, strict=True))
    all_fixed = np.empty((len(fixed), 8 * n), dtype=np.uint8)
    values = {name: all_fixed[f, : n * w].view(types[name].to_pandas_dtype())
              for f, (name, w) in enumerate(zip(fixed, _FIXED_WIDTHS.tolist(), strict=True))}
    nulls, items = dict.fromkeys(types, 0), dict.fromkeys(media, 0)
    spans: dict[int, dict[str, tuple[int, int, int, int]]] = {}  # file -> column -> its offsets' and values'
    known: dict[int, _Layout] = {}  # file -> its layout, where pass 1 used one
    # the media lists of the rows taken, through pyarrow while the file is open: from the first file whose
    # rows hold an item (or a null), the rows before it as empty lists (``without``), and so a remembered
    # file's rows that hold none; each column apart, so a column with no item yet (videos, audios of an image
    # corpus) takes nothing
    media_parts = {name: _Parts() for name in media}
    without = dict.fromkeys(media, 0)
    empties: dict[str, pa.Table] = {}  # per media column, n rows of empty lists: a run of them is a slice

    def flush_without(name: str) -> None:
        """The rows of media column ``name`` counted in ``without`` so far, as empty lists."""
        if without[name]:
            if name not in empties:
                empties[name] = _empty_lists(n, [name], types)
            media_parts[name].add(empties[name].slice(0, without[name]))
            without[name] = 0

    def add_media(name: str, taken: pa.Array) -> None:
        """The rows of one visit of media column ``name``, once the column has had an item."""
        flush_without(name)
        media_parts[name].add(pa.table({name: taken}))
    for c in used:
        rows, to = local[c], dest[c]
        key = _file_key(paths[c]) if remember else None
        layout = None if key is None else _LAYOUTS.get(key)
        if layout is not None:  # a file seen before: mapped, its columns copied in one call, no Arrow reader
            mapped = _mapped(paths[c])
            for name in layout.null:
                nulls[name] += rows.shape[0]
            visit_lengths(mapped, layout.fixed_spans, _FIXED_WIDTHS, layout.flat_spans, rows, to, all_fixed,
                          all_lengths)
            known[c] = layout
            for name, at, count in layout.media:  # never null here (``_remember``)
                taken = 0
                if count:
                    spec = layout.spans[at:].tolist()  # the list's length, nulls, validity, offsets, children
                    offsets = mapped[spec[4] : spec[4] + spec[5]].view(np.int32)
                    taken = int((offsets[rows + 1] - offsets[rows]).sum())
                    items[name] += taken
                if taken:  # one row (a visit at 1B): a slice, far cheaper than a take, copied when ``_Parts`` merges it
                    column = _rebuilt(pa.py_buffer(mapped.base), types[name], spec)[0]
                    add_media(name, column.slice(int(rows[0]), 1) if rows.shape[0] == 1 else
                              column.take(pa.array(rows)))
                else:  # empty lists, counted until the next part (a visit of a row or two at 1B: mostly these)
                    without[name] += rows.shape[0]
            mapped = offsets = None  # unmapped here
            continue
        columns_of, base, size = read(c)
        spans[c] = {}
        for name in types:
            arr = columns_of[name]
            nulls[name] += _nulls_at(arr, rows)
            if name in values:
                if arr.null_count == 0:  # else the column takes the per-file path below
                    values[name][to] = arr.to_numpy(zero_copy_only=False)[rows]
                continue
            if name in items:
                offsets = arr.offsets.to_numpy()
                items[name] += int((offsets[rows + 1] - offsets[rows]).sum())
                continue
            offsets, span = _flat_span(arr, base, size)
            lengths[name][to] = offsets[rows + 1] - offsets[rows]
            if span is not None:
                spans[c][name] = span
        for name in media:
            if items[name] or nulls[name]:
                add_media(name, columns_of[name].take(pa.array(rows)))
            else:
                without[name] += rows.shape[0]
        if key is not None:
            _remember(key, columns_of, spans[c], base, size, fixed=fixed, media=media)
        del columns_of  # unmapped here: only one file is mapped at a time
    columns: dict[str, Any] = {name: pa.array(values.pop(name), types[name]) for name in fixed}
    for name in media:  # no image, video or clip in the rows taken (every text row): empty lists
        columns[name] = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),
                                                 pa.array([], types[name].value_type))
    for name in flat:
        if nulls[name] == n:  # mRoPE positions of a non-mRoPE build, loss weights of an unweighted one
            columns[name] = pa.nulls(n, types[name])
    slow = [name for name in types if (name in items and (items[name] or nulls[name])) or 0 < nulls[name] < n
            or (name in fixed and nulls[name])]
    inverse = None
    if any(name in items for name in slow):  # the media lists of pass 1, back in ``sel`` order
        inverse = np.empty_like(order)
        inverse[order] = np.arange(n)  # back from file order to ``sel`` order
        for name in slow:
            if name in items:
                flush_without(name)
                columns[name] = media_parts[name].table().column(0).take(pa.array(inverse))
    media_parts.clear()
    slow = [name for name in slow if name not in items]
    # pass 2: the flat columns' values, one range per row (``gather.copy_ranges``), into one array per column;
    # per file through pyarrow the partly null columns, which numpy cannot copy flat
    # the dense columns' values in one byte array (each column from a 64-byte boundary), their offsets in one
    # array, so that a remembered visit copies them in one call (``visit_copy``)
    dense_at = np.array([f for f, name in enumerate(flat) if nulls[name] == 0], dtype=np.int64)
    dense = [flat[f] for f in dense_at.tolist()]
    all_offsets = np.zeros((len(dense), n + 1), dtype=np.int64)
    np.cumsum(all_lengths[dense_at], axis=1, out=all_offsets[:, 1:])
    del lengths, all_lengths
    out_offsets = dict(zip(dense, all_offsets, strict=True))
    dtypes = {name: _values_dtype(types[name]) for name in dense}  # once, not once a visit
    sizes = [-(-int(all_offsets[i, -1]) * dtypes[name].itemsize // 64) * 64 for i, name in enumerate(dense)]
    bases = np.zeros(len(dense), dtype=np.int64)
    np.cumsum(sizes[:-1], out=bases[1:])
    out = np.empty(sum(sizes), dtype=np.uint8)
    for i, name in enumerate(dense):
        values[name] = out[bases[i] : bases[i] + sizes[i]].view(dtypes[name])[: all_offsets[i, -1]]
    parts = _Parts() if slow else None
    for c in used:
        if c in known and not slow:  # a remembered layout: every dense column copied in one call, no Arrow
            visit_copy(_mapped(paths[c]), dense_at, known[c].flat_spans, _FLAT_WIDTHS, local[c], dest[c], out,
                       bases, all_offsets)
            continue
        if slow or any(name not in spans[c] for name in dense):
            columns_of = read(c)[0]
            if parts is not None:
                parts.add(pa.Table.from_arrays([columns_of[name] for name in slow], names=slow).take(
                    pa.array(local[c])))
            views = {name: _offsets_and_values(columns_of[name]) for name in dense}
        else:  # the file mapped and viewed where pass 1 found its columns: no Arrow reader
            mapped = _mapped(paths[c])
            columns_of = None
            views = {name: _views(mapped, spans[c][name], dtypes[name]) for name in dense}
            del mapped
        for name in dense:
            offsets, src = views[name]
            copy_ranges(src, offsets, local[c], values[name], out_offsets[name], dest[c])
        del columns_of, views  # unmapped here
    for name in dense:
        columns[name] = _from_offsets(types[name], out_offsets.pop(name), values.pop(name))
    if parts is not None:
        if inverse is None:
            inverse = np.empty_like(order)
            inverse[order] = np.arange(n)
        columns.update(zip(slow, parts.table().take(pa.array(inverse)).columns, strict=True))
        del parts
    return pa.Table.from_arrays([columns[name] for name in types], schema=EXAMPLE_SCHEMA)


@dataclass(frozen=True)
class _Spec:
    """Where one Arrow array's buffers lie in its mapped file (``(byte offset, bytes)`` each, None for an absent
    validity bitmap), its length and null count, its children's specs: enough to build it again zero-copy
    from another mapping of the same file (``_flat_spec``, then ``_rebuilt`` with the column's type)."""

    length: int
    null_count: int
    buffers: tuple[tuple[int, int] | None, ...]
    children: tuple[_Spec, ...]
    items: int = 0  # a list column's items (its values' length): none, and a take is empty lists


@dataclass(frozen=True, eq=False)
class _Layout:
    """What a visit of a file needs of it, learnt from its first (Arrow) visit: where each column's buffers lie
    in the file, as one int64 array (small enough to keep one for each of tens of thousands of map outputs).
    Only for a file whose columns are each null in no row or in every row (``null``)."""

    spans: np.ndarray  # EXAMPLE_SCHEMA's fixed columns' (byte offset, values), then its flat columns'
    # offsets' and values' (byte offset, count), -1 where a column is null here; then the media columns' specs
    # (``_flat_spec``)
    media: tuple[tuple[str, int, int], ...]  # media column -> (its spec's first index in ``spans``, its items)
    null: tuple[str, ...]  # columns null in every row

    fixed_spans: np.ndarray = field(init=False)  # (fixed columns, 2), a view of ``spans``: what
    # ``gather.visit_lengths`` reads
    flat_spans: np.ndarray = field(init=False)  # (flat columns, 4), a view: what it and ``gather.visit_copy`` read

    def __post_init__(self) -> None:  # the views made once, not at every visit
        object.__setattr__(self, "fixed_spans", self.spans[: 2 * len(_FIXED)].reshape(len(_FIXED), 2))
        object.__setattr__(self, "flat_spans", self.spans[2 * len(_FIXED) : 2 * len(_FIXED) + 4 * len(_FLAT)]
                           .reshape(len(_FLAT), 4))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _Layout) and self.media == other.media and self.null == other.null
                and np.array_equal(self.spans, other.spans))

    __hash__ = None  # type: ignore[assignment]


def _flat_spec(spec: _Spec, out: list[int]) -> None:
    """``spec``'s tree depth first onto ``out``: each node's length and null count, then each of its buffers'
    (byte offset, bytes), (-1, -1) where absent; its type is the column's (``_rebuilt``)."""
    out += (spec.length, spec.null_count)
    for b in spec.buffers:
        out += (-1, -1) if b is None else b
    for child in spec.children:
        _flat_spec(child, out)


_LAYOUTS: dict[tuple[str, int, int, int], _Layout] = {}
"""The files ``take_rows(remember=True)`` visited in this process, by (path, inode, mtime, size): a file
written again under the same name is another key."""
LAYOUTS_MAX = 65_536
"""At most this many layouts (their bytes, and a remembered visit's cost against an Arrow one's: docs/scale.md,
"The 1B estimate, session 25"), so that a writer visiting every map output of a 1B-example build (~39k) keeps
them all; a take over more files remembers none, another cache's drop the oldest."""


def _file_key(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return path, st.st_ino, st.st_mtime_ns, st.st_size


def _mapped(path: str) -> np.ndarray:
    """The file mapped (read-only), a numpy byte view of it (``.base``: the ``mmap``, for an Arrow buffer
    ``pa.py_buffer``), zero-copy; unmapped when every array viewing it is gone. ~10 us, against ~60 for
    ``pa.memory_map``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8)


def _spec(arr: pa.Array, base: int, size: int, buffers: list[pa.Buffer | None] | None = None) -> _Spec | None:
    """``arr``'s spec in the file mapped at ``base`` (``size`` bytes); None where a buffer is not in the
    mapping or an array is a slice (an offset). ``buffers``: what is left of the root's ``buffers()``
    (every buffer of the tree, depth first), consumed here."""
    if arr.offset:
        return None
    t = arr.type
    if buffers is None and pa.types.is_list(t) and not arr.null_count and not len(arr.values):  # a take: empty lists
        return _Spec(len(arr), 0, (), ())
    if buffers is None:
        buffers = arr.buffers()[::-1]  # popped from the end
    spans: list[tuple[int, int] | None] = []
    for _ in range(arr.type.num_buffers):
        buf = buffers.pop()
        if buf is None or buf.size == 0:
            spans.append(None if buf is None else (0, 0))
            continue
        at = buf.address - base
        if not (0 <= at and at + buf.size <= size):
            return None
        spans.append((at, buf.size))
    kids = [arr.values] if pa.types.is_list(t) else [arr.field(i) for i in range(t.num_fields)] \
        if pa.types.is_struct(t) else []
    children = []
    for k in kids:
        child = _spec(k, base, size, buffers)
        if child is None:
            return None
        children.append(child)
    return _Spec(len(arr), arr.null_count, tuple(spans), tuple(children),
                 items=len(kids[0]) if pa.types.is_list(t) else 0)


def _rebuilt(buffer: pa.Buffer, t: pa.DataType, spec: list[int], i: int = 0) -> tuple[pa.Array, int]:
    """The array of type ``t`` whose flattened spec (``_flat_spec``) starts at ``spec[i]``, on ``buffer`` (the
    file mapped again), zero-copy; and where the spec after it starts."""
    length, nulls = spec[i], spec[i + 1]
    i += 2
    buffers = []
    for _ in range(t.num_buffers):
        buffers.append(None if spec[i] < 0 else buffer.slice(spec[i], spec[i + 1]))
        i += 2
    kids = [t.value_type] if pa.types.is_list(t) else [t.field(k).type for k in range(t.num_fields)] \
        if pa.types.is_struct(t) else []
    children = []
    for kid in kids:
        child, i = _rebuilt(buffer, kid, spec, i)
        children.append(child)
    return pa.Array.from_buffers(t, length, buffers, nulls, children=children or None), i


def _remember(key: tuple[str, int, int, int], columns_of: dict[str, pa.Array], flat: dict[str, tuple[int, int, int, int]],
              base: int, size: int, *, fixed: list[str], media: list[str]) -> None:
    """Keep file ``key``'s layout (its first visit's Arrow columns, ``flat``: the spans pass 1 found), where
    every column is found in the mapping and null in no row or in every row; else the file stays on the Arrow
    path."""
    null = tuple(name for name, arr in columns_of.items() if arr.null_count and arr.null_count == len(arr))
    if any(0 < arr.null_count < len(arr) for arr in columns_of.values()):
        return
    spans = {}
    for name in fixed:
        if name in null:
            continue
        arr = columns_of[name]
        buf = arr.buffers()[1]
        at = buf.address - base if buf is not None else -1
        if arr.offset or not pa.types.is_primitive(arr.type) or pa.types.is_boolean(arr.type) or not (
                0 <= at and at + buf.size <= size):
            return
        spans[name] = (at, len(arr))
    specs = {}
    for name in media:
        if name in null:
            return
        spec = _spec(columns_of[name], base, size)
        if spec is None:
            return
        specs[name] = spec
    wanted = [name for name in columns_of if name not in null and name not in spans and name not in specs]
    if any(name not in flat for name in wanted):
        return
    if len(_LAYOUTS) >= LAYOUTS_MAX:
        del _LAYOUTS[next(iter(_LAYOUTS))]
    out: list[int] = []
    for name in _FIXED:
        out += spans.get(name, (-1, 0))
    for name in _FLAT:
        out += flat[name] if name in wanted else (-1, 0, -1, 0)
    where = []
    for name, spec in specs.items():
        where.append((name, len(out) if spec.items else -1, spec.items))
        if spec.items:
            _flat_spec(spec, out)
    _LAYOUTS[key] = _Layout(spans=np.array(out, dtype=np.int64), media=tuple(where), null=null)


def _flat_span(arr: pa.Array, base: int, size: int) -> tuple[np.ndarray, tuple[int, int, int, int] | None]:
    """A flat column's offsets (numpy) and where its offsets and values lie in the file mapped at ``base``
    (``size`` bytes), for pass 2 to view them with numpy; None where it cannot (nulls, 64-bit offsets, a buffer
    outside the mapping). ``take_rows``' pass 1 and ``learn_layouts`` alike."""
    offsets, src = _offsets_and_values(arr)
    span = (*_span(offsets, base, size), *_span(src, base, size))
    return offsets, span if arr.null_count == 0 and offsets.dtype == np.int32 and -1 not in span else None


def learn_layouts(files: Sequence[str]) -> int:
    """Remember the layout of each local chunk file of ``files`` (EXAMPLE_SCHEMA Arrow IPC, one record batch)
    as its first ``take_rows(remember=True)`` visit would (``_remember``, the same spans: the same helpers), without
    taking a row: no numpy copy, no media take, no pass 2 (~4x cheaper a file than a one-row take, which paid
    both passes for every file: docs/benchmarks.md, "Repack"). What a repack's process does before it forks the
    writers (``local._warm_writer``). Files remembered already, past ``LAYOUTS_MAX``, on an object store, or
    whose record batches are not one are left to ``take_rows``; returns how many it learnt."""
    if len(files) > LAYOUTS_MAX:
        return 0
    flat, media, fixed = _FLAT, _MEDIA, _FIXED
    learnt = 0
    for path in files:
        if not isinstance(path, str) or "://" in path:
            continue
        key = _file_key(path)
        if key in _LAYOUTS:
            continue
        with pa.memory_map(path) as src:
            whole = src.read_buffer()
            src.seek(0)
            reader = ipc.open_file(src)
            if reader.num_record_batches != 1:
                continue
            batch = reader.get_batch(0)
            columns_of = dict(zip(batch.schema.names, batch.columns, strict=True))
            base, size = whole.address, whole.size
            spans = {}
            for name in flat:  # as take_rows' pass 1 finds them
                span = _flat_span(columns_of[name], base, size)[1]
                if span is not None:
                    spans[name] = span
            _remember(key, columns_of, spans, base, size, fixed=fixed, media=media)
            learnt += key in _LAYOUTS
            del columns_of, batch, reader, whole  # unmapped here
    return learnt


def _empty_lists(n: int, names: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    """``n`` rows of empty lists in each of the columns ``names`` (rows of files that hold no item of them)."""
    zeros = pa.array(np.zeros(n + 1, np.int32))
    return pa.Table.from_arrays([pa.ListArray.from_arrays(zeros, pa.array([], types[name].value_type))
                                 for name in names], names=names)


def _span(view: np.ndarray, base: int, size: int) -> tuple[int, int]:
    """Where the numpy ``view`` of a file mapped at ``base`` lies in the file: (byte offset, elements); (-1, 0)
    where it is not inside the mapping (Arrow copied it), so the file is opened with Arrow again."""
    at = view.__array_interface__["data"][0] - base if view.size else 0
    return (at, view.size) if 0 <= at and at + view.nbytes <= size else (-1, 0)


def _views(mapped: np.ndarray, span: tuple[int, int, int, int], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """A flat column's (offsets, values) viewed in the mapped file where ``_span`` found them."""
    off_at, off_n, val_at, val_n = span
    return (mapped[off_at : off_at + 4 * off_n].view(np.int32),
            mapped[val_at : val_at + dtype.itemsize * val_n].view(dtype))


def _nulls_at(arr: pa.Array, rows: np.ndarray) -> int:
    """How many of ``arr[rows]`` are null (the rows taken, not the whole file: a column null in every row, the
    mRoPE positions of a text build, is then null in every row taken, and takes no per-file path)."""
    if arr.null_count == 0:
        return 0
    if arr.null_count == len(arr):
        return int(rows.shape[0])
    return int(np.asarray(arr.is_null())[rows].sum())


class _Parts:
    """Tables concatenated in the order added, merged 64 at a time as they come (then 64 merged ones, ...).

    A shard draws rows from nearly every chunk file (10k files at 5M examples), and each file's few rows kept
    as their own small table cost ~46 KB of C++ objects (arrays, buffers, the file's schema), not their bytes:
    the write workers' peak grew with the corpus (docs/scale.md). Merged as they come, at most 64 per level
    are held; each row is copied once per level (log64 of the files)."""

    _FAN = 64

    def __init__(self) -> None:
        self.levels: list[list[pa.Table]] = [[]]

    def add(self, table: pa.Table) -> None:
        self.levels[0].append(table)
        i = 0
        while len(self.levels[i]) == self._FAN:
            merged = pa.concat_tables(self.levels[i]).combine_chunks()
            self.levels[i] = []
            if i + 1 == len(self.levels):
                self.levels.append([])
            self.levels[i + 1].append(merged)
            i += 1

    def table(self) -> pa.Table:
        """Every table added, in order, as one table of one chunk per column."""
        tables = [t for level in reversed(self.levels) for t in level]  # a higher level holds earlier tables
        return pa.concat_tables(tables).combine_chunks()


def _list_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(offsets as int64 numpy, flat values) of a list column, whatever its chunking and slicing."""
    if isinstance(column, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    else:
        arr = column
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values
    return offsets - offsets[0], values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _list_numpy(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0 as int64, values) of a list column as numpy."""
    off, values = _list_parts(column)
    return off, values.to_numpy(zero_copy_only=False)


def _regroup(values: pa.Array, item_offsets: np.ndarray, pack_bounds: np.ndarray) -> pa.Array:
    """Concatenate consecutive examples' lists into one list per pack (zero-copy on the values)."""
    return pa.ListArray.from_arrays(pa.array(item_offsets[pack_bounds], pa.int32()), values)


def assemble_packs(examples: pa.Table, pack_sizes: np.ndarray, *, dense_mrope: bool = False,
                   buffers: derived.Buffers | None = None) -> pa.Table:
    """Build shard rows (``SCHEMA``: what a shard stores) from examples already ordered pack by pack.

    ``examples`` follows EXAMPLE_SCHEMA, ``pack_sizes[p]`` is how many consecutive examples form pack p.
    Example-relative offsets (node starts, parents, image offsets) are shifted to row-relative ones.
    ``dense_mrope``: the rows as readers get them instead (``ROW_SCHEMA``, the dense mRoPE column), for the online
    packer, whose rows go to the collator without a shard. ``buffers``: where the dense labels and positions are
    made (``derived.Buffers``: the table is then valid only until their next use), else new arrays.
    """
    n = examples.num_rows
    pack_bounds = np.concatenate([[0], np.cumsum(pack_sizes, dtype=np.int64)])  # (P+1,) in examples
    if pack_bounds[-1] != n:
        raise ValueError(f"pack sizes add up to {pack_bounds[-1]}, table has {n} examples")
    pack_of_example = np.repeat(np.arange(len(pack_sizes)), pack_sizes)  # (n,)
    lengths = examples.column("num_tokens").to_numpy().astype(np.int64)  # (n,)
    tok_end = np.cumsum(lengths)
    tok_bounds = np.concatenate([[0], tok_end])  # token offsets of examples in the flat stream
    ex_start_in_row = tok_bounds[:-1] - tok_bounds[pack_bounds[:-1]][pack_of_example]  # (n,)

    cols: dict[str, pa.Array] = {}
    item_off, values = _list_parts(examples.column("input_ids"))
    if not np.array_equal(np.diff(item_off), lengths):
        i = int(np.flatnonzero(np.diff(item_off) != lengths)[0])
        raise ShardError(f"example {i} has {np.diff(item_off)[i]} input_ids for {lengths[i]} tokens")
    cols["input_ids"] = _regroup(values, item_off, pack_bounds)
    labels, positions = derived.expand(item_off, values.to_numpy(zero_copy_only=False),
                                       *(_list_numpy(examples.column(c)) for c in ("labels", "label_runs",
                                                                                   "position_ids")),
                                       out=None if buffers is None else buffers.pair(int(item_off[-1])))
    cols["labels"] = _regroup(pa.array(labels), item_off, pack_bounds)
    cols["position_ids"] = _regroup(pa.array(positions), item_off, pack_bounds)

    # cu_seqlens per pack: example start offsets within the row, then the row length.
    row_lengths = np.add.reduceat(lengths, pack_bounds[:-1]) if n else np.zeros(0, np.int64)

    # mRoPE: each example's sparse columns (the cache's), merged into the rows' (schema v6) without the dense
    # positions; dense for the online packer only
    parts = {c: examples.column(c) for c in SPARSE_COLUMNS}
    null = parts["mrope_runs"].null_count
    mrope = null < n
    if null and mrope:
        raise ShardError("some examples have mRoPE positions and others do not")
    if not mrope:
        cols.update({c: pa.nulls(len(pack_sizes), parts[c].type) for c in SPARSE_COLUMNS} if not dense_mrope
                    else {"mrope_position_ids": pa.nulls(len(pack_sizes), F32_LIST)})
    else:
        runs, bases, rest = (_list_numpy(parts[c]) for c in SPARSE_COLUMNS)
        if dense_mrope:
            item_off, values = dense_positions(runs, bases, rest)
            if not np.array_equal(np.diff(item_off), 3 * lengths):
                i = int(np.flatnonzero(np.diff(item_off) != 3 * lengths)[0])
                raise ShardError(f"example {i} has {np.diff(item_off)[i]} mRoPE values for {lengths[i]} tokens "
                                 "(want 3 per token)")
            cols["mrope_position_ids"] = _regroup(pa.array(values, pa.float32()), item_off, pack_bounds)
        else:
            cols.update(row_columns(lengths, runs, bases, rest, pack_bounds))
    cu_values = np.empty(n + len(pack_sizes), dtype=np.int32)
    cu_offsets = pack_bounds + np.arange(len(pack_bounds))  # each pack gets E+1 entries
    ends = cu_offsets[1:] - 1
    mask = np.ones(len(cu_values), dtype=bool)
    mask[ends] = False
    cu_values[mask] = ex_start_in_row
    cu_values[ends] = row_lengths
    cols["cu_seqlens"] = pa.ListArray.from_arrays(pa.array(cu_offsets, pa.int32()), pa.array(cu_values))
    cols["seq_lengths"] = _seq_lengths(examples, lengths, pack_bounds, pack_of_example, mrope=mrope)

    # Nodes: shift starts by the example's start in the row, parents by the nodes before it in the row.
    node_off, node_vals = _list_parts(examples.column("node_offsets"))
    _, parent_vals = _list_parts(examples.column("node_parents"))
    nodes_per_example = np.diff(node_off)
    node_before = node_off[:-1] - node_off[pack_bounds[:-1]][pack_of_example]  # nodes earlier in the row
    starts = node_vals.to_numpy() + np.repeat(ex_start_in_row, nodes_per_example)
    parents = parent_vals.to_numpy()
    parents = np.where(parents < 0, -1, parents + np.repeat(node_before, nodes_per_example))
    cols["node_offsets"] = _regroup(pa.array(starts.astype(np.int32)), node_off, pack_bounds)
    cols["node_parents"] = _regroup(pa.array(parents.astype(np.int32)), node_off, pack_bounds)

    for name, kind in (("images", IMAGE_TYPE), ("videos", VIDEO_TYPE), ("audios", AUDIO_TYPE)):
        img_off, img_vals = _list_parts(examples.column(name))
        images_per_example = np.diff(img_off)
        if len(img_vals):
            shifted = img_vals.field("offset").to_numpy() + np.repeat(ex_start_in_row, images_per_example)
            fields = [img_vals.field(f.name) for f in kind]
            fields[kind.get_field_index("offset")] = pa.array(shifted.astype(np.int32))
            img_vals = pa.StructArray.from_arrays(fields, fields=list(kind))
        cols[name] = _regroup(img_vals, img_off, pack_bounds)

    ids = examples.column("example_id").combine_chunks()
    srcs = examples.column("source_name").combine_chunks()
    bounds32 = pa.array(pack_bounds, pa.int32())
    cols["example_ids"] = pa.ListArray.from_arrays(bounds32, ids)
    cols["example_sources"] = pa.ListArray.from_arrays(bounds32, srcs)

    def per_pack(name: str) -> pa.Array:
        v = examples.column(name).to_numpy().astype(np.int64)
        return pa.array(np.add.reduceat(v, pack_bounds[:-1]).astype(np.int32) if n else v.astype(np.int32))

    cols["loss_weights"] = _loss_weights(examples, labels, tok_bounds, pack_bounds, pack_of_example)
    cols["num_tokens"] = pa.array(row_lengths.astype(np.int32))
    cols["num_loss_tokens"] = per_pack("num_loss_tokens")
    cols["num_vision_tokens"] = per_pack("num_vision_tokens")
    cols["num_video_tokens"] = per_pack("num_video_tokens")
    cols["num_audio_tokens"] = per_pack("num_audio_tokens")
    schema = ROW_SCHEMA if dense_mrope else SCHEMA
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


def _seq_lengths(examples: pa.Table, lengths: np.ndarray, pack_bounds: np.ndarray, pack_of_example: np.ndarray, *,
                 mrope: bool) -> pa.Array:
    """Per pack, its examples' lengths (``np.diff(cu_seqlens)``) where TRL's padding-free collator rebuilds the row
    exactly from them (positions 0.. per example, attention inside each example): every example linear (one
    node), no image, video or audio, 1-D positions, no loss weights. Null elsewhere: a tree's branches, an image's
    pixels, mRoPE's three position rows are what TRL would rebuild wrongly, and loss weights what its loss would
    drop (docs/format.md, "seq_lengths")."""
    P = len(pack_bounds) - 1
    if mrope:
        return pa.nulls(P, I32_LIST)
    plain = ((np.diff(_list_parts(examples.column("node_offsets"))[0]) == 1)
             & (examples.column("num_images").to_numpy() == 0) & (examples.column("num_videos").to_numpy() == 0)
             & (examples.column("num_audios").to_numpy() == 0)
             & examples.column("loss_weights").is_null().to_numpy(zero_copy_only=False))  # TRL ignores weights
    mixed = np.zeros(P, dtype=bool)
    mixed[pack_of_example[~plain]] = True  # (P,) a pack with an example TRL cannot rebuild
    offsets = pa.array(pack_bounds.astype(np.int32), pa.int32())
    values = pa.array(lengths.astype(np.int32), pa.int32())
    return pa.ListArray.from_arrays(offsets, values, mask=pa.array(mixed))


def _loss_weights(examples: pa.Table, labels: np.ndarray, tok_bounds: np.ndarray, pack_bounds: np.ndarray,
                  pack_of_example: np.ndarray) -> pa.Array:
    """Per pack, each token's loss weight (0 where no loss), null where every example's are all 1 (null): an
    unweighted build stays as compact as before. An unweighted example in a weighted pack gets 1 on its labels
    (``labels``: (T,) every example's, dense; ``tok_bounds``: (n+1,) where each example's tokens start in it)."""
    P = len(pack_bounds) - 1
    column = examples.column("loss_weights")
    if column.null_count == examples.num_rows:
        return pa.nulls(P, pa.list_(pa.float32()))
    weighted = np.zeros(P, dtype=bool)
    weighted[pack_of_example[~column.is_null().to_numpy(zero_copy_only=False)]] = True  # (P,)
    lengths = np.diff(tok_bounds)
    parts = []
    for i, w in enumerate(column.to_pylist()):
        if weighted[pack_of_example[i]]:
            parts.append(np.asarray(w, dtype=np.float32) if w is not None
                         else (labels[tok_bounds[i] : tok_bounds[i + 1]] != IGNORE_INDEX).astype(np.float32))
    tokens = np.where(weighted[pack_of_example], lengths, 0)  # (n,) weights written per example
    pack_tokens = np.concatenate([[0], np.cumsum(np.add.reduceat(tokens, pack_bounds[:-1]) if len(tokens) else [])])
    values = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return pa.ListArray.from_arrays(pa.array(pack_tokens.astype(np.int32)), pa.array(values, pa.float32()),
                                    mask=pa.array(~weighted))


def list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) numpy views of a list<int32> column: row i is values[offsets[i]:offsets[i+1]]."""
    off, values = _list_parts(table.column(name))
    return off, values.to_numpy(zero_copy_only=False)
