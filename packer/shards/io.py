"""Atomic shard and JSON writes, checksums, and opening a finished build (``ShardSet``)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from packer.config import BuildConfig
from packer.errors import ShardError
from packer.shards.schema import MANIFEST, Manifest, ShardEntry


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
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text (UTF-8) to a temp file and rename it into place."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class ShardSet:
    """A finished build: its directory and manifest."""

    root: Path
    manifest: Manifest

    @property
    def shards(self) -> tuple[ShardEntry, ...]:
        return self.manifest.shards

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def shard_path(self, i: int) -> Path:
        return self.root / self.shards[i].file

    @property
    def config(self) -> BuildConfig:
        return self.manifest.config


def open_shards(path: str | Path) -> ShardSet:
    """Open a finished build; ShardError if the manifest is missing (unfinished build), of another version, or
    lacks a key a reader needs."""
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
        data = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShardError(f"{mpath} is unreadable: {e}") from e
    return ShardSet(root=root, manifest=Manifest.from_dict(data, where=str(mpath)))
