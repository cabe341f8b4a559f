"""The output directory as a Hugging Face dataset: ``OUT/README.md``, a dataset card.

Its YAML front matter names the shards as the ``train`` split and types every column, so
``datasets.load_dataset("OUT")`` and the Hub's viewer read the shards with no arguments (without it they
would guess a format among the shards, stats.json and rejects.jsonl)::

    ---
    configs:
    - config_name: default
      data_files:
      - split: train
        path: shard-*.parquet
    dataset_info:
      features:
      - name: input_ids
        list: int32
      ...
    ---
    # <title>   what packed it (packer version, profile, tokenizer, max_length) and the stats table

The features are derived from ``shards.schema.SCHEMA`` (the test compares them with what ``datasets`` itself
derives), so the card cannot drift from the shards. The card is written before the manifest (which stays
last) and touches no shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from packer.shards.io import write_text_atomic
from packer.shards.schema import SCHEMA

CARD = "README.md"


def feature_yaml(dtype: pa.DataType) -> Any:
    """An Arrow type as a ``datasets`` YAML feature: ``int32``, ``{"list": int32}``, a struct's field list."""
    if pa.types.is_list(dtype):
        return {"list": feature_yaml(dtype.value_type)}
    if pa.types.is_struct(dtype):
        return [{"name": f.name, **_typed(f.type)} for f in dtype]
    names = {pa.int32(): "int32", pa.int64(): "int64", pa.float64(): "float64", pa.string(): "string",
             pa.binary(): "binary"}
    return names[dtype]


def _typed(dtype: pa.DataType) -> dict[str, Any]:
    value = feature_yaml(dtype)
    return value if isinstance(value, dict) else {"struct" if isinstance(value, list) else "dtype": value}


def features(schema: pa.Schema = SCHEMA) -> list[dict[str, Any]]:
    """``dataset_info.features`` of the shards: one ``{"name", "dtype" | "list"}`` per column."""
    return [{"name": f.name, **_typed(f.type)} for f in schema]


def card_text(*, title: str, packer_version: str, profile: str, tokenizer: str, max_length: int,
              stats_table: str, num_rows: int) -> str:
    """The README.md of a build (front matter + a short human section)."""
    import yaml

    meta = {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "shard-*.parquet"}]}],
        "dataset_info": {"features": features()},
        "tags": ["packer", "packed-sequences"],
    }
    return (
        "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n"
        f"# {title}\n\n"
        f"Packed sequences written by packer {packer_version}: profile `{profile}`, tokenizer `{tokenizer}`, "
        f"max_length {max_length}. {num_rows:,} rows; one row is one packed sequence (tokens, labels, "
        "positions, `cu_seqlens`, the message tree, images). Read them for training with "
        "`packer.PackedDataset`, or with `datasets.load_dataset` (columns as above; docs/format.md of packer "
        "says what each holds). `manifest.json` records the exact config and inputs, `rejects.jsonl` what "
        "was left out and why.\n\n"
        "```\n" + stats_table + "\n```\n"
    )


def write_card(out: Path, **fields: Any) -> Path:
    """Write ``OUT/README.md`` atomically; returns its path."""
    path = Path(out) / CARD
    write_text_atomic(path, card_text(**fields))
    return path
