"""The Parquet shard contract (docs/format.md): schema, pack assembly, atomic writer, manifest, row decoding.

Writer and readers import ``SCHEMA`` from here, so the two sides cannot drift. Pack assembly works on Arrow
buffers with numpy (offsets + values), never with per-token Python objects.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ShardError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
REJECTS = "rejects.jsonl"
WORK_DIR = ".packer"

# Token ids and positions fit int32 (vocabularies < 2^31, rows < 2^31 tokens); int32 halves the bytes of int64.
IMAGE_TYPE = pa.struct(
    [
        ("source", pa.string()),  # resolved path, "" for inline bytes
        ("data", pa.binary()),  # inline image bytes, null for a path
        ("grid_t", pa.int32()),
        ("grid_h", pa.int32()),
        ("grid_w", pa.int32()),
        ("offset", pa.int32()),  # first vision token, relative to the row (example, in the encode cache)
        ("num_tokens", pa.int32()),
    ]
)
I32_LIST = pa.list_(pa.int32())

# One explicit schema: never inferred from the first row.
SCHEMA = pa.schema(
    [
        ("input_ids", I32_LIST),
        ("labels", I32_LIST),  # unshifted; -100 where no loss
        ("position_ids", I32_LIST),
        ("mrope_position_ids", I32_LIST),  # 3*T token-major (t,h,w per token); null without mRoPE
        ("cu_seqlens", I32_LIST),  # E+1, starts at 0, ends at T
        ("node_offsets", I32_LIST),
        ("node_parents", I32_LIST),
        ("images", pa.list_(IMAGE_TYPE)),
        ("example_ids", pa.list_(pa.string())),
        ("example_sources", pa.list_(pa.string())),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("num_vision_tokens", pa.int32()),
    ],
    metadata={"packer.schema_version": str(SCHEMA_VERSION)},
)

# The per-example encode cache (Arrow IPC files under .packer/encode/): same list columns, example-relative.
EXAMPLE_SCHEMA = pa.schema(
    [
        ("example_id", pa.string()),
        ("source_name", pa.string()),
        ("input_ids", I32_LIST),
        ("labels", I32_LIST),
        ("position_ids", I32_LIST),
        ("mrope_position_ids", I32_LIST),  # 3*L token-major, or null
        ("node_offsets", I32_LIST),
        ("node_parents", I32_LIST),
        ("images", pa.list_(IMAGE_TYPE)),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("num_vision_tokens", pa.int32()),
        ("num_images", pa.int32()),
    ]
)

ROW_LIST_COLUMNS = ("input_ids", "labels", "position_ids", "mrope_position_ids")


def encoded_to_record(enc) -> dict[str, Any]:
    """One ``Encoded`` example as a dict of EXAMPLE_SCHEMA columns (for ``pa.Table.from_pylist`` per chunk)."""
    mrope = enc.mrope_position_ids
    return {
        "example_id": enc.example_id,
        "source_name": enc.source_name,
        "input_ids": enc.input_ids,
        "labels": enc.labels,
        "position_ids": enc.position_ids,
        "mrope_position_ids": None if mrope is None else np.ascontiguousarray(mrope.T).reshape(-1),
        "node_offsets": enc.node_offsets,
        "node_parents": enc.node_parents,
        "images": [
            {
                "source": im.source,
                "data": im.data,
                "grid_t": im.grid_thw[0],
                "grid_h": im.grid_thw[1],
                "grid_w": im.grid_thw[2],
                "offset": im.offset,
                "num_tokens": im.num_tokens,
            }
            for im in enc.images
        ],
        "num_tokens": enc.num_tokens,
        "num_loss_tokens": enc.num_loss_tokens,
        "num_vision_tokens": enc.num_vision_tokens,
        "num_images": len(enc.images),
    }


def encoded_table(encoded: list) -> pa.Table:
    """A list of ``Encoded`` examples as an EXAMPLE_SCHEMA table."""
    return pa.Table.from_pylist([encoded_to_record(e) for e in encoded], schema=EXAMPLE_SCHEMA)


def _list_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(offsets as int64 numpy, flat values) of a list column, whatever its chunking and slicing."""
    if isinstance(column, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    else:
        arr = column
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values
    return offsets - offsets[0], values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _regroup(values: pa.Array, item_offsets: np.ndarray, pack_bounds: np.ndarray) -> pa.Array:
    """Concatenate consecutive examples' lists into one list per pack (zero-copy on the values)."""
    return pa.ListArray.from_arrays(pa.array(item_offsets[pack_bounds], pa.int32()), values)


def assemble_packs(examples: pa.Table, pack_sizes: np.ndarray) -> pa.Table:
    """Build shard rows from examples already ordered pack by pack.

    ``examples`` follows EXAMPLE_SCHEMA, ``pack_sizes[p]`` is how many consecutive examples form pack p.
    Example-relative offsets (node starts, parents, image offsets) are shifted to row-relative ones.
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
    for name in ("input_ids", "labels", "position_ids"):
        item_off, values = _list_parts(examples.column(name))
        cols[name] = _regroup(values, item_off, pack_bounds)

    mrope = examples.column("mrope_position_ids")
    if mrope.null_count == n:
        cols["mrope_position_ids"] = pa.nulls(len(pack_sizes), I32_LIST)
    elif mrope.null_count:
        raise ShardError("some examples have mRoPE positions and others do not")
    else:
        item_off, values = _list_parts(mrope)
        cols["mrope_position_ids"] = _regroup(values, item_off, pack_bounds)

    # cu_seqlens per pack: example start offsets within the row, then the row length.
    row_lengths = np.add.reduceat(lengths, pack_bounds[:-1]) if n else np.zeros(0, np.int64)
    cu_values = np.empty(n + len(pack_sizes), dtype=np.int32)
    cu_offsets = pack_bounds + np.arange(len(pack_bounds))  # each pack gets E+1 entries
    ends = cu_offsets[1:] - 1
    mask = np.ones(len(cu_values), dtype=bool)
    mask[ends] = False
    cu_values[mask] = ex_start_in_row
    cu_values[ends] = row_lengths
    cols["cu_seqlens"] = pa.ListArray.from_arrays(pa.array(cu_offsets, pa.int32()), pa.array(cu_values))

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

    img_off, img_vals = _list_parts(examples.column("images"))
    images_per_example = np.diff(img_off)
    if len(img_vals):
        shifted = img_vals.field("offset").to_numpy() + np.repeat(ex_start_in_row, images_per_example)
        fields = [img_vals.field(f.name) for f in IMAGE_TYPE]
        fields[IMAGE_TYPE.get_field_index("offset")] = pa.array(shifted.astype(np.int32))
        img_vals = pa.StructArray.from_arrays(fields, fields=list(IMAGE_TYPE))
    cols["images"] = _regroup(img_vals, img_off, pack_bounds)

    ids = examples.column("example_id").combine_chunks()
    srcs = examples.column("source_name").combine_chunks()
    bounds32 = pa.array(pack_bounds, pa.int32())
    cols["example_ids"] = pa.ListArray.from_arrays(bounds32, ids)
    cols["example_sources"] = pa.ListArray.from_arrays(bounds32, srcs)

    def per_pack(name: str) -> pa.Array:
        v = examples.column(name).to_numpy().astype(np.int64)
        return pa.array(np.add.reduceat(v, pack_bounds[:-1]).astype(np.int32) if n else v.astype(np.int32))

    cols["num_tokens"] = pa.array(row_lengths.astype(np.int32))
    cols["num_loss_tokens"] = per_pack("num_loss_tokens")
    cols["num_vision_tokens"] = per_pack("num_vision_tokens")
    return pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def write_shard(table: pa.Table, path: str | Path, *, rows_per_row_group: int) -> dict[str, Any]:
    """Write one shard atomically (temp name, fsync, rename); return its manifest entry."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            row_group_size=rows_per_row_group,
            use_dictionary=["example_sources"],
            write_statistics=["num_tokens", "num_loss_tokens", "num_vision_tokens"],
        )
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"file": path.name, "rows": table.num_rows, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to a temp file and rename it into place."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class ShardSet:
    """A finished build: its directory and manifest."""

    root: Path
    manifest: dict[str, Any]

    @property
    def shards(self) -> list[dict[str, Any]]:
        return self.manifest["shards"]

    @property
    def num_rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    def shard_path(self, i: int) -> Path:
        return self.root / self.shards[i]["file"]

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]


def open_shards(path: str | Path) -> ShardSet:
    """Open a finished build; ShardError if the manifest is missing (unfinished build) or of another version."""
    root = Path(path)
    if not root.is_dir():
        raise ShardError(f"{root} is not a directory of packer shards")
    mpath = root / MANIFEST
    if not mpath.exists():
        raise ShardError(
            f"{root} has no {MANIFEST}: the build did not finish (or this is not a packer output). "
            "Rerun the same `packer build` command to complete it."
        )
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShardError(f"{mpath} is unreadable: {e}") from e
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ShardError(f"{root} has shard schema v{version}; this packer reads v{SCHEMA_VERSION}")
    return ShardSet(root=root, manifest=manifest)


def list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) numpy views of a list<int32> column: row i is values[offsets[i]:offsets[i+1]]."""
    off, values = _list_parts(table.column(name))
    return off, values.to_numpy(zero_copy_only=False)
