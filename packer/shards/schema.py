"""The shard contract (docs/format.md) as code: the Parquet schema, the encode-cache schema, file names.

Writer and readers import ``SCHEMA`` from here, so the two sides cannot drift.
"""

from __future__ import annotations

import pyarrow as pa

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
