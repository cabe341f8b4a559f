"""The output directory: its fingerprint (which build it holds), creating or reusing it, and the files an
interrupted run leaves (temp files, shards of an earlier plan). ``out`` is a local ``Path`` or an
``ObjectPath`` (shards/store.py): the same steps on an object-store prefix.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from packer import __version__
from packer.config import BuildConfig
from packer.core.location import absolute, file_version
from packer.errors import ConfigError
from packer.packing.budgets import FLAGS
from packer.pipeline.cache import CACHE_FORMAT
from packer.pipeline.card import CARD
from packer.pipeline.stages import CHUNK_LINES
from packer.shards.io import write_text_atomic
from packer.shards.schema import MANIFEST, SCHEMA_VERSION, WORK_DIR
from packer.shards.store import ObjectPath, remove_tree


def build_fingerprint(config: BuildConfig, *, tokenizer_fp: str, chat_template_sha256: str, files: list[str]) -> str:
    """sha256 of what determines the output: config (less run-time knobs), tokenizer, the chat template used
    (a ``--chat-template`` FILE is in the config by name only), input files (names, sizes, mtimes)."""
    cfg = config.to_dict()
    for k in RUN_FIELDS:
        cfg.pop(k)
    return _digest("config", cfg, tokenizer_fp=tokenizer_fp, chat_template_sha256=chat_template_sha256, files=files)


def _digest(key: str, cfg: dict[str, Any], *, tokenizer_fp: str, chat_template_sha256: str, files: list[str]) -> str:
    """sha256 of ``cfg`` (under ``key``), the schema, packer's version, the chunking, the encode cache's format
    (``cache.CACHE_FORMAT``), the chat template, the
    tokenizer and the input files (names, sizes, and an object's ETag where a file's mtime)."""
    h = hashlib.sha256()
    # CHUNK_LINES: the encode cache is indexed by chunk, so a cache of another chunking must not be reused.
    h.update(json.dumps({key: cfg, "schema": SCHEMA_VERSION, "packer": __version__, "chunk_lines": CHUNK_LINES,
                         "cache": CACHE_FORMAT, "chat_template_sha256": chat_template_sha256}, sort_keys=True).encode())
    h.update(tokenizer_fp.encode())
    for f in files:
        size, version = file_version(f)
        h.update(f"{absolute(f)}:{size}:{version}".encode())
    return h.hexdigest()


PACKING_FIELDS = ("max_length", "keep_up_to", *FLAGS, "max_examples_per_pack", "algorithm", "balance_vision",
                  "refine", "seed", "rows_per_shard", "rows_per_row_group")  # FLAGS: every medium's budgets
"""Config fields that decide only the packing of the encoded examples (and the sources' weights): a change of
them alone reuses the encode cache (``encode_fingerprint``). ``max_length`` only filters where
``encode_ceiling`` is not None; otherwise it is part of the encoding."""
RUN_FIELDS = ("output", "num_proc", "executor", "ray_address", "overwrite", "strict", "max_reject_fraction")
"""Run-time knobs: no part of any fingerprint."""
ENCODE_MARK = "fingerprint.json"  # in OUT/.packer/encode: which encoding the cache holds (``read_encode_mark``)
KEPT = ("encode", "inputs")  # what of OUT/.packer a rebuild with another packing keeps (with OUT/media)


def encode_ceiling(config: BuildConfig) -> int | None:
    """The longest example an encode cache of ``config`` keeps where ``max_length`` only filters (``overlong``
    drop, ``long_docs`` off): ``keep_up_to``, else ``max_length``; None where the length policy changes the
    encoded rows (then ``max_length`` is in ``encode_fingerprint``)."""
    if config.overlong == "drop" and config.long_docs == "off":
        return config.keep_up_to or config.max_length
    return None


def encode_fingerprint(config: BuildConfig, *, tokenizer_fp: str, chat_template_sha256: str, files: list[str]) -> str:
    """sha256 of what determines the encoded examples: ``build_fingerprint``'s less the packing options
    (``PACKING_FIELDS``, the sources' weights); ``max_length`` stays where it changes encoded rows."""
    packing = PACKING_FIELDS if encode_ceiling(config) is not None else tuple(f for f in PACKING_FIELDS
                                                                             if f != "max_length")
    cfg = {k: v for k, v in config.to_dict().items() if k not in RUN_FIELDS + packing}
    cfg["sources"] = [{k: v for k, v in s.items() if k != "weight"} for s in cfg["sources"]]
    return _digest("encode", cfg, tokenizer_fp=tokenizer_fp, chat_template_sha256=chat_template_sha256, files=files)


def tokenizer_record(tokenizer: Any, profile: Any, name: str, json: str | None = None) -> dict[str, Any]:
    """What a build needs of its tokenizer besides encoding, kept in the encode mark so that a build reusing the
    whole cache loads none (``recorded_tokenizer``): its fingerprint, its own chat template's sha256, the
    profile's media token ids (the manifest's), and the files it was loaded from (``tokenizer_source``).
    ``json``: its Rust tokenizer's ``to_str()`` where made already (``tokenizers.fingerprint``)."""
    from packer.encode.tokenizers import fingerprint

    tokens = {"image": profile.image_token, "video": profile.video_token, "audio": profile.audio_token}
    return {"fingerprint": fingerprint(tokenizer, json),
            "chat_template_sha256": hashlib.sha256(str(getattr(tokenizer, "chat_template", None) or "").encode())
            .hexdigest(),
            "token_ids": {k: tokenizer.convert_tokens_to_ids(t) if t else None for k, t in tokens.items()},
            "source": tokenizer_source(name)}


def recorded_tokenizer(mark: dict[str, Any], name: str, *, trust: bool = False) -> dict[str, Any] | None:
    """The encode mark's ``tokenizer_record`` where it still holds: ``trust`` (``packer repack``: its examples
    are the cache's, whatever the tokenizer is now), or the tokenizer ``name`` is loaded from the very files,
    unchanged (names, sizes, mtimes: as the input files are fingerprinted); None: load it and fingerprint it."""
    record = mark.get("tokenizer")
    if not isinstance(record, dict):
        return None  # a mark older than the record
    if trust or (record.get("source") is not None and record["source"] == tokenizer_source(name)):
        return record
    return None


def tokenizer_source(name: str) -> list[list[Any]] | None:
    """(path, size, mtime) of each file of the directory the tokenizer ``name`` loads from: a builtin's
    versioned directory (encode/tokenizers.py), a local directory; None for a hub name or a missing one."""
    from packer.encode.tokenizers import builtin_path, builtin_tokenizers

    path = builtin_path(name) if name in builtin_tokenizers() else Path(name)
    try:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []
        stats = [(os.path.abspath(p), p.stat()) for p in files]
    except OSError:
        return None
    return [[f, st.st_size, st.st_mtime_ns] for f, st in stats] or None


def read_encode_mark(work: Path | ObjectPath) -> dict[str, Any] | None:
    """The encode cache's mark: ``fingerprint`` (``encode_fingerprint``), ``keeps_up_to`` (``encode_ceiling``
    when it was made) and, once every chunk is committed, ``chunks``, ``inputs`` and ``files`` (what a rebuild
    needs instead of a scan); None where there is none (a cache older than the mark, or no cache)."""
    path = work / "encode" / ENCODE_MARK
    try:
        mark = json.loads(path.read_text()) if path.exists() else None
    except ValueError:
        return None  # half a mark (it is written atomically, so only by hand): as if none
    return mark if isinstance(mark, dict) and isinstance(mark.get("fingerprint"), str) else None


def write_encode_mark(work: Path | ObjectPath, mark: dict[str, Any]) -> None:
    (work / "encode").mkdir(parents=True, exist_ok=True)
    write_text_atomic(work / "encode" / ENCODE_MARK, json.dumps(mark, sort_keys=True) + "\n")


def reusable(mark: dict[str, Any] | None, fingerprint: str, ceiling: int | None) -> bool:
    """Does a cache of ``mark`` hold every example an encoding of ``fingerprint`` keeping up to ``ceiling``
    tokens would? The same encoding, kept up to at least as many tokens."""
    if mark is None or mark["fingerprint"] != fingerprint:
        return False
    kept = mark.get("keeps_up_to")
    return kept == ceiling if kept is None or ceiling is None else kept >= ceiling


def prepare_output(out: Path | ObjectPath, fingerprint: str, *, overwrite: bool,
                   encoding: tuple[str, int | None] | None = None) -> Path | ObjectPath:
    """Create or reuse the output directory; refuse to mix with a different build unless ``overwrite``.

    ``encoding``: (``encode_fingerprint``, ``encode_ceiling``) of this build. Where another build's encode cache
    holds the same encoding (``reusable``), replacing that build keeps the cache (a repack: only packing
    options changed), and a directory holding only such a cache (``packer repack``'s copy) is this build's."""
    work = out / WORK_DIR
    marker = work / "fingerprint"
    keep = encoding is not None and reusable(read_encode_mark(work), *encoding)
    if out.exists() and any(out.iterdir()) and not _only_empty_work_dir(out, work):
        same = marker.exists() and marker.read_text().strip() == fingerprint
        if not same and keep and _only_encode_cache(out, work):
            remove_stale_temp_files(out)
        elif not same:
            if not overwrite and ((out / MANIFEST).exists() or work.exists()):
                raise ConfigError(
                    f"{out} holds a different packer build; pass --overwrite to replace it or choose another --output"
                )
            if not overwrite:
                raise ConfigError(f"{out} is not empty; pass --overwrite to replace its contents")
            for child in out.iterdir():
                if keep and child.name == WORK_DIR:
                    for part in child.iterdir():
                        if part.name not in KEPT:
                            remove_tree(part)
                elif not (keep and child.name == "media"):  # a tar's videos, which the kept spill names
                    remove_tree(child)
            if keep:
                remove_stale_temp_files(out)
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


def _only_encode_cache(out: Path | ObjectPath, work: Path | ObjectPath) -> bool:
    """True for a directory holding an encode cache and nothing of a build's own (``packer repack``'s copy)."""
    return ({p.name for p in out.iterdir()} <= {WORK_DIR, "media"} and work.is_dir()
            and all(p.name in KEPT or ".tmp-" in p.name for p in work.iterdir()))


def _only_empty_work_dir(out: Path | ObjectPath, work: Path | ObjectPath) -> bool:
    """True for what a build killed between creating its work dir and writing the fingerprint leaves."""
    return ([p.name for p in out.iterdir()] == [WORK_DIR] and work.is_dir()
            and all(".tmp-" in p.name for p in work.iterdir()))


def remove_stale_temp_files(out: Path | ObjectPath, *, keep_own: bool = False) -> list[Path | ObjectPath]:
    """Delete the ``*.tmp-PID`` files an interrupted run of this build left (half-written shards, chunks, JSON).

    Every writer writes ``NAME.tmp-PID`` and renames it; a temp name is never a finished file, so removing
    them loses nothing. (Two builds writing one directory at once are not supported.) ``keep_own``: spare this
    process's, for a cleanup in the middle of a build whose driver is writing one (``columns.ColumnsFile``).
    """
    stale = []
    own = f".tmp-{os.getpid()}"
    for d in (out, out / WORK_DIR, *(out / WORK_DIR / sub for sub in ("encode", "shards", "inputs", "exchange"))):
        if d.is_dir():
            stale.extend(p for p in d.glob("*.tmp-*") if p.is_file() and not (keep_own and p.name.endswith(own)))
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
