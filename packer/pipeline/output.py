"""The output directory: its fingerprint (which build it holds), creating or reusing it, and the files an
interrupted run leaves (temp files, shards of an earlier plan). ``out`` is a local ``Path`` or an
``ObjectPath`` (shards/store.py): the same steps on an object-store prefix.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from packer import __version__
from packer.config import BuildConfig
from packer.core.location import absolute, file_version
from packer.errors import ConfigError
from packer.pipeline.card import CARD
from packer.pipeline.stages import CHUNK_LINES
from packer.shards.io import write_text_atomic
from packer.shards.schema import MANIFEST, SCHEMA_VERSION, WORK_DIR
from packer.shards.store import ObjectPath, remove_tree


def build_fingerprint(config: BuildConfig, *, tokenizer_fp: str, chat_template_sha256: str, files: list[str]) -> str:
    """sha256 of what determines the output: config (less run-time knobs), tokenizer, the chat template used
    (a ``--chat-template`` FILE is in the config by name only), input files (names, sizes, mtimes)."""
    cfg = config.to_dict()
    for k in ("output", "num_proc", "executor", "ray_address", "overwrite", "strict", "max_reject_fraction"):
        cfg.pop(k)
    h = hashlib.sha256()
    # CHUNK_LINES: the encode cache is indexed by chunk, so a cache of another chunking must not be reused.
    h.update(json.dumps({"config": cfg, "schema": SCHEMA_VERSION, "packer": __version__, "chunk_lines": CHUNK_LINES,
                         "chat_template_sha256": chat_template_sha256}, sort_keys=True).encode())
    h.update(tokenizer_fp.encode())
    for f in files:
        size, version = file_version(f)  # an object's ETag where a file's mtime
        h.update(f"{absolute(f)}:{size}:{version}".encode())
    return h.hexdigest()


def prepare_output(out: Path | ObjectPath, fingerprint: str, *, overwrite: bool) -> Path | ObjectPath:
    """Create or reuse the output directory; refuse to mix with a different build unless ``overwrite``."""
    work = out / WORK_DIR
    marker = work / "fingerprint"
    if out.exists() and any(out.iterdir()) and not _only_empty_work_dir(out, work):
        same = marker.exists() and marker.read_text().strip() == fingerprint
        if not same:
            if not overwrite and ((out / MANIFEST).exists() or work.exists()):
                raise ConfigError(
                    f"{out} holds a different packer build; pass --overwrite to replace it or choose another --output"
                )
            if not overwrite:
                raise ConfigError(f"{out} is not empty; pass --overwrite to replace its contents")
            for child in out.iterdir():
                remove_tree(child)
        else:
            if (out / MANIFEST).exists():
                (out / MANIFEST).unlink()  # rebuilding in place: the old manifest must not vouch for new shards
            if (out / CARD).exists():
                (out / CARD).unlink()  # nor the old card (its shard digest keys `datasets`' cache)
            remove_stale_temp_files(out)
    elif work.is_dir():
        remove_stale_temp_files(out)  # a fingerprint.tmp-PID of a build killed at its very start
    work.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, fingerprint + "\n")  # a half-written fingerprint would read as "a different build"
    return work


def _only_empty_work_dir(out: Path | ObjectPath, work: Path | ObjectPath) -> bool:
    """True for what a build killed between creating its work dir and writing the fingerprint leaves."""
    return ([p.name for p in out.iterdir()] == [WORK_DIR] and work.is_dir()
            and all(".tmp-" in p.name for p in work.iterdir()))


def remove_stale_temp_files(out: Path | ObjectPath) -> list[Path | ObjectPath]:
    """Delete the ``*.tmp-PID`` files an interrupted run of this build left (half-written shards, chunks, JSON).

    Every writer writes ``NAME.tmp-PID`` and renames it; a temp name is never a finished file, so removing
    them loses nothing. (Two builds writing one directory at once are not supported.)
    """
    stale = []
    for d in (out, out / WORK_DIR, out / WORK_DIR / "encode", out / WORK_DIR / "shards", out / WORK_DIR / "inputs"):
        if d.is_dir():
            stale.extend(p for p in d.glob("*.tmp-*") if p.is_file())
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def remove_stale_shards(out: Path | ObjectPath, keep: set[str]) -> None:
    """Delete ``shard-*.parquet`` files not in ``keep``: shards of an earlier, larger plan of this directory."""
    for stale in out.glob("shard-*.parquet"):
        if stale.name not in keep:
            stale.unlink()


def write_rejects(path: Path | ObjectPath, rejects: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rejects))
