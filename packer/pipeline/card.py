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
      description: 'packer build of 83 packed rows; shards sha256 3f1c...'
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

Why the config carries the shards' digest: ``datasets`` caches what it generated from a local directory under
``<cache>/<directory name>/<config>/<version>/<hash>``, and ``hash`` covers only the card's dataset infos and
builder configs (``datasets.load.LocalDatasetModuleFactory``: data files as *patterns*, never the files). A card
naming ``shard-*.parquet`` with the same features is the same hash for every packer output, so a second output
called ``out`` (or the same one rebuilt with ``--overwrite``) was served the first one's cached rows. The
config's ``description`` (a ``BuilderConfig`` field, hashed with it) names the sha256 of the manifest's shard
checksums, so the key changes whenever a shard byte does, and stays the same (a cache hit) for the same shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from packer.core.media import MEDIA
from packer.shards.io import write_text_atomic
from packer.shards.schema import SCHEMA
from packer.shards.store import ObjectPath

CARD = "README.md"


def feature_yaml(dtype: pa.DataType) -> Any:
    """An Arrow type as a ``datasets`` YAML feature: ``int32``, ``{"list": int32}``, a struct's field list."""
    if pa.types.is_list(dtype):
        return {"list": feature_yaml(dtype.value_type)}
    if pa.types.is_struct(dtype):
        return [{"name": f.name, **_typed(f.type)} for f in dtype]
    names = {pa.int32(): "int32", pa.int64(): "int64", pa.float32(): "float32", pa.float64(): "float64",
             pa.string(): "string", pa.binary(): "binary", pa.bool_(): "bool"}
    return names[dtype]


def _typed(dtype: pa.DataType) -> dict[str, Any]:
    value = feature_yaml(dtype)
    return value if isinstance(value, dict) else {"struct" if isinstance(value, list) else "dtype": value}


def features(schema: pa.Schema = SCHEMA) -> list[dict[str, Any]]:
    """``dataset_info.features`` of the shards: one ``{"name", "dtype" | "list"}`` per column."""
    return [{"name": f.name, **_typed(f.type)} for f in schema]


def shards_digest(shards: Iterable[Mapping[str, Any]]) -> str:
    """sha256 over the shard files' names and checksums (the manifest's ``shards`` entries, in order): one value
    that changes whenever any shard byte does."""
    h = hashlib.sha256()
    for entry in shards:
        h.update(f"{entry['file']} {entry['sha256']}\n".encode())
    return h.hexdigest()


MEDIA_COLUMNS = tuple(m.plural for m in MEDIA)  # every medium's list column (core.media)


def card_text(*, title: str, packer_version: str, profile: str, tokenizer: str, max_length: int,
              stats_table: str, num_rows: int, shards: Iterable[Mapping[str, Any]], trl_exact: bool = False) -> str:
    """The README.md of a build (front matter + a short human section).

    ``shards`` are the manifest's shard entries (``file``, ``sha256``): their digest goes into the config, so
    ``datasets``' cache key is this build's (module docstring). ``trl_exact``: every row has ``seq_lengths``
    (linear text, no mRoPE); the config then leaves out the media columns, always empty in such a build, which
    TRL takes for a vision dataset (``SFTTrainer`` refuses a text model on one, and padding-free on any). A
    build with a tree, an image, a video or mRoPE keeps them: TRL's padding-free path refuses it, which is right,
    as it would rebuild those rows wrongly (docs/training.md, "TRL").
    """
    import yaml

    digest = shards_digest(shards)
    config: dict[str, Any] = {"config_name": "default",
                              "data_files": [{"split": "train", "path": "shard-*.parquet"}],
                              "description": f"packer build of {num_rows} packed rows; shards sha256 {digest}"}
    schema = SCHEMA
    if trl_exact:
        schema = pa.schema([f for f in SCHEMA if f.name not in MEDIA_COLUMNS])
        config["columns"] = schema.names
    meta = {
        "configs": [config],
        "dataset_info": {"features": features(schema)},
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


def write_card(out: Path | ObjectPath, **fields: Any) -> Path | ObjectPath:
    """Write ``OUT/README.md`` atomically; returns its path."""
    path = out / CARD
    write_text_atomic(path, card_text(**fields))
    return path
