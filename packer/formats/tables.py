"""Table inputs: Parquet and Arrow files, and ``datasets`` directories -> rows, a range at a time.

A row is a dict like a JSONL record's JSON object, so it goes through the same registry
(``formats.parse_record``). What differs from JSONL:

- a record is a row; its number is 1-based like a JSONL line (``data.parquet:1`` is ``ds[0]``), so
  example ids, rejects and ``packer verify --input`` read the same for every input;
- a null column is an absent field (a table mixing ``messages`` and ``text`` rows has nulls in both);
- ``columns`` renames dataset columns onto packer's fields (``{"messages": "conversations"}``: packer's
  ``messages`` is the ``conversations`` column);
- images may be embedded (``{"bytes": ..., "path": ...}`` structs, which is how ``datasets.Image`` stores
  them); ``common.image_ref`` takes their bytes as they are.

Read with pyarrow, not ``datasets``: both files are plain Arrow/Parquet underneath, pyarrow reads one row
range (Parquet row group by row group, Arrow IPC batch by batch, memory-mapped) without loading a file, and
workers skip ``import datasets`` (~1 s each) and its cache directory. A ``datasets`` directory is resolved to
its files (``dataset_files``): ``save_to_disk`` output by its ``state.json``, a Hub snapshot by its README's
``configs`` or its ``data/`` folder; the ``train`` split is what a build packs.

    expand a directory      out/ (save_to_disk)  -> out/data-00000-of-00001.arrow
    count rows (scan)       parquet footer / IPC batch headers, no column data
    read rows [a, b)        decode only the row groups (batches) that hold them, one at a time
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from packer.errors import ConfigError

TABLE_SUFFIXES = (".parquet", ".arrow")
SPLIT = "train"  # the split a build packs from a directory with several


def is_table(path: str) -> bool:
    """True for a Parquet or Arrow file (by name)."""
    return path.endswith(TABLE_SUFFIXES)


def is_dataset_dir(path: str) -> bool:
    """True for a ``save_to_disk`` directory (``state.json`` / ``dataset_dict.json``) or a Hub snapshot
    (a README with ``configs``, or Parquet/Arrow files under ``data/``)."""
    return any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")) or bool(
        _readme_data_files(path) or _data_folder_files(path)
    )


def dataset_files(path: str, *, config: str | None = None, split: str | None = None) -> list[str]:
    """The files of a dataset directory's ``train`` split (the only split when there is one), in row order.

    ``save_to_disk``: ``state.json``'s ``_data_files``; a DatasetDict: its ``train/`` (``dataset_dict.json``).
    Hub snapshot: the README's ``configs`` (the ``default`` config, else the first), else ``data/*``
    files, those named ``train-*`` / ``train/`` when any are. ``config`` / ``split`` pick another README config
    and split by name, as ``datasets.load_dataset(name=..., split=...)`` does (a LLaMA-Factory entry's ``subset``
    and ``split``); ConfigError where the directory has none of that name.
    """
    if config is not None and not _readme_configs(path):
        raise ConfigError(f"{path} has no README configs, so no config named {config!r}; name its files instead")
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = json.loads(open(os.path.join(path, "dataset_dict.json")).read()).get("splits", [])
        return dataset_files(os.path.join(path, _pick_split(splits, path, split)))
    if os.path.isfile(os.path.join(path, "state.json")):
        if split not in (None, SPLIT):
            raise ConfigError(f"{path} holds one split, not one named {split!r}; name the split's files instead")
        state = json.loads(open(os.path.join(path, "state.json")).read())
        return [os.path.join(path, f["filename"]) for f in state.get("_data_files", [])]
    files = _readme_data_files(path, config, split)
    if not files and split not in (None, SPLIT):
        raise ConfigError(f"{path} has no README configs to find the split {split!r} in; name the split's files "
                          "instead")
    files = files or _data_folder_files(path)
    if not files:
        raise ConfigError(f"{path} is not a dataset directory: no state.json, README configs or data/*.parquet")
    return files


def _pick_split(splits: list[str], where: str, want: str | None = None) -> str:
    if want is not None:  # asked by name: that one or an error
        if want not in splits:
            raise ConfigError(f"{where} has splits {splits} and none named {want!r}")
        return want
    if SPLIT in splits or len(splits) != 1:
        if SPLIT not in splits:
            raise ConfigError(f"{where} has splits {splits} and none named {SPLIT!r}; name the split's files instead")
        return SPLIT
    return splits[0]


def _readme_configs(path: str) -> list[dict]:
    """The README's ``configs`` (Hub dataset card YAML); [] without them."""
    readme = os.path.join(path, "README.md")
    if not os.path.isfile(readme):
        return []
    text = open(readme, encoding="utf-8").read()
    if not text.startswith("---"):
        return []
    import yaml

    try:
        meta = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return []
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return configs if isinstance(configs, list) else []


def _readme_data_files(path: str, name: str | None = None, want: str | None = None) -> list[str]:
    """Files of the README's ``configs`` (Hub dataset card YAML), ``train`` split (config ``name`` and split
    ``want`` where given); [] without one."""
    readme = os.path.join(path, "README.md")
    configs = _readme_configs(path)
    if not configs:
        return []
    if name is not None:
        config = next((c for c in configs if c.get("config_name") == name), None)
        if config is None:
            raise ConfigError(f"{readme} has no config named {name!r} (its configs: "
                              f"{[c.get('config_name') for c in configs]})")
    else:
        config = next((c for c in configs if c.get("config_name") == "default"), configs[0])
    data_files = config.get("data_files")
    if isinstance(data_files, (str, list)) and not (isinstance(data_files, list) and data_files
                                                    and isinstance(data_files[0], dict)):
        patterns = {SPLIT: [data_files] if isinstance(data_files, str) else data_files}
    else:
        patterns = {d["split"]: [d["path"]] if isinstance(d["path"], str) else d["path"] for d in data_files or []}
    split = _pick_split(list(patterns), readme, want)
    found = sorted({m for p in patterns[split] for m in glob.glob(os.path.join(path, p), recursive=True)
                    if is_table(m) and os.path.isfile(m)})
    if not found:
        raise ConfigError(f"{readme}: the {split!r} split's data_files {patterns[split]} match no Parquet/Arrow file")
    return found


def _data_folder_files(path: str) -> list[str]:
    """``data/**`` Parquet/Arrow files; only the ``train`` ones when files are named by split."""
    found = sorted(m for m in glob.glob(os.path.join(path, "data", "**", "*"), recursive=True) if is_table(m))
    train = [m for m in found if os.path.relpath(m, os.path.join(path, "data")).startswith(SPLIT)]
    return train or found


# ------------------------------------------------------------------------------------------- reading
def _open_ipc(source: pa.MemoryMappedFile):
    """An Arrow IPC reader: the file format (footer) or the stream format ``datasets`` writes."""
    try:
        return ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return ipc.open_stream(source)


def _ipc_batches(path: str) -> Iterator[pa.RecordBatch]:
    with pa.memory_map(path) as source:  # zero-copy: a batch costs nothing until its values are touched
        reader = _open_ipc(source)
        if isinstance(reader, ipc.RecordBatchFileReader):
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
        else:
            yield from reader


def unit_rows(path: str) -> list[int]:
    """Rows of each reading unit of a table file: Parquet row groups or Arrow record batches (metadata only)."""
    try:
        if path.endswith(".parquet"):
            meta = pq.ParquetFile(path).metadata
            return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        return [b.num_rows for b in _ipc_batches(path)]
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"cannot read {path} as {'Parquet' if path.endswith('.parquet') else 'Arrow'}: {e}") from e


def column_names(path: str) -> list[str]:
    if path.endswith(".parquet"):
        return pq.ParquetFile(path).schema_arrow.names
    with pa.memory_map(path) as source:
        return _open_ipc(source).schema.names


def check_columns(path: str, columns: dict[str, str]) -> None:
    """ConfigError when a column ``columns`` maps is not in the file (every row would be rejected)."""
    names = column_names(path)
    missing = [c for c in columns.values() if c not in names]
    if missing:
        raise ConfigError(f"{path} has no column {', '.join(map(repr, missing))} (named by 'columns'); "
                          f"its columns: {', '.join(names)}")


def read_rows(path: str, start: int, end: int) -> Iterator[pa.RecordBatch | pa.Table]:
    """Rows ``[start, end)`` (0-based) of a table file as record batches, one reading unit at a time."""
    if path.endswith(".parquet"):
        first, mtime = 0, os.stat(path).st_mtime_ns
        meta = _parquet(path, mtime).metadata
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            lo, hi = max(start, first), min(end, first + n)
            if lo < hi:
                yield _row_group(path, mtime, g).slice(lo - first, hi - lo)
            first += n
            if first >= end:
                return
        return
    first = 0
    for batch in _ipc_batches(path):
        lo, hi = max(start, first), min(end, first + batch.num_rows)
        if lo < hi:
            yield batch.slice(lo - first, hi - lo)
        first += batch.num_rows
        if first >= end:
            return


@lru_cache(maxsize=1)
def _row_group(path: str, mtime_ns: int, group: int) -> pa.Table:
    """One decoded Parquet row group, kept for the next chunk of the same group: Parquet cannot seek to a row,
    so without it the k-th chunk of a 100k-row group would decode the group's first k*512 rows again (4x
    slower reading such a file, docs/benchmarks.md). Memory: one row group per process."""
    return _parquet(path, mtime_ns).read_row_group(group, use_threads=False)


@lru_cache(maxsize=4)
def _parquet(path: str, mtime_ns: int) -> pq.ParquetFile:
    """An open Parquet file (its footer parsed once per process, not once per chunk)."""
    return pq.ParquetFile(path)


def row_records(path: str, start: int, end: int) -> Iterator[dict[str, Any]]:
    """Rows ``[start, end)`` as records (dicts), null columns dropped."""
    for batch in read_rows(path, start, end):
        for row in batch.to_pylist():
            yield {k: v for k, v in row.items() if v is not None}
