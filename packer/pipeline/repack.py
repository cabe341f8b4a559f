"""``packer repack OUT -o NEW``: the encoded examples of a finished build packed again with other packing options
(``output.PACKING_FIELDS``: max length, budgets, algorithm, seed, the sources' weights, shard size), without
re-tokenizing.

NEW gets a copy of OUT's encode cache (hard links where the file system allows, else copies: OUT stays as it
was), then ``build`` runs on NEW with OUT's config and the changes: its encode fingerprint matches, so it
encodes nothing and scans nothing, and its shards are byte-identical to a fresh build with the same options.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.pipeline.build import BuildResult, build
from packer.pipeline.cache import CACHE_FORMAT
from packer.pipeline.output import KEPT, PACKING_FIELDS, RUN_FIELDS, encode_ceiling, read_encode_mark
from packer.shards.schema import MANIFEST, WORK_DIR

CHANGEABLE = PACKING_FIELDS + RUN_FIELDS
"""What a repack may change: the packing, and how the run runs."""


def repack(source: str | Path, output: str | Path, *, weights: dict[str, float] | None = None,
           progress: bool = True, **changes: Any) -> BuildResult:
    """Pack the encoded examples of the finished build ``source`` into ``output`` with ``changes`` (config
    fields of ``CHANGEABLE``) and ``weights`` (source name -> sampling weight); ConfigError saying what is
    needed where the cache cannot serve (a longer max_length than it kept, an encoding option)."""
    src, out = Path(source), Path(output)
    manifest_path = src / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(f"{src} has no {MANIFEST}: repack needs a finished build (rerun its `packer build` "
                          "command to complete it)")
    manifest = json.loads(manifest_path.read_text())
    other = sorted(set(changes) - set(CHANGEABLE))
    if other:
        raise ConfigError(f"repack changes only packing options; {', '.join(other)} decide the encoded examples: "
                          "run `packer build` with them")
    stored = dict(manifest["config"])
    names = [s["name"] for s in stored["sources"]]
    unknown = sorted(set(weights or {}) - set(names))
    if unknown:
        raise ConfigError(f"--weight names no source of {src}: {unknown} (its sources: {names})")
    stored["sources"] = [{**s, "weight": float((weights or {}).get(s["name"], s.get("weight", 1.0)))}
                         for s in stored["sources"]]
    base = manifest.get("base_dir", os.getcwd())
    relative = [p for s in stored["sources"] for p in s["paths"] if not os.path.isabs(p)]
    if relative and os.path.realpath(base) != os.path.realpath(os.getcwd()):
        raise ConfigError(f"{src} was built from {base} with relative inputs ({relative[0]}, ...): run packer "
                          f"repack from there")
    stored.update(overwrite=False, **{k: v for k, v in changes.items() if v is not None}, output=str(out))
    config = BuildConfig.from_dict(stored)
    mark = read_encode_mark(src / WORK_DIR)
    if mark is None or mark.get("chunks") is None:
        raise ConfigError(f"{src}/{WORK_DIR}/encode holds no complete encode cache of this packer (built before "
                          "repack existed, or removed): rebuild it with `packer build`")
    if mark.get("format", 1) != CACHE_FORMAT:
        raise ConfigError(f"{src}/{WORK_DIR}/encode is an encode cache of format {mark.get('format', 1)}, this packer "
                          f"reads format {CACHE_FORMAT} (labels and positions stored only where not derivable): rebuild "
                          "it with its `packer build` command (it encodes again), then repack")
    kept = mark.get("keeps_up_to")
    if kept is None and config.max_length != manifest["config"]["max_length"]:
        raise ConfigError(f"{src} was built with --overlong {config.overlong} --long-docs {config.long_docs}: its "
                          f"max_length {manifest['config']['max_length']} shaped the encoded rows, so another "
                          "--max-length needs them encoded again: run `packer build` with it")
    if kept is not None and config.max_length > kept:
        raise ConfigError(f"{src}'s encode cache keeps examples of up to {kept} tokens; --max-length "
                          f"{config.max_length} needs the longer ones it never kept: run `packer build` with "
                          f"--max-length {config.max_length} (a build with --keep-up-to N lets later repacks go "
                          "up to N)")
    if encode_ceiling(config) is not None and config.keep_up_to is not None and config.keep_up_to > kept:
        raise ConfigError(f"{src}'s encode cache keeps examples of up to {kept} tokens, not --keep-up-to "
                          f"{config.keep_up_to}: run `packer build` with it")
    _prepare(src, out, overwrite=bool(changes.get("overwrite")))
    return build(config, progress=progress, trust_cache=True)  # its examples are src's: no tokenizer loaded


def _prepare(src: Path, out: Path, *, overwrite: bool) -> None:
    """``out`` empty (or emptied, with ``overwrite``), then given ``src``'s encode cache and spilled inputs."""
    if out.resolve() == src.resolve():
        raise ConfigError(f"repack writes another directory than {src}; to repack in place rerun its `packer "
                          "build` command with the new options and --overwrite (it reuses the encode cache)")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"{out} is not empty; pass --overwrite to replace its contents")
        shutil.rmtree(out)
    for name in KEPT:
        if (src / WORK_DIR / name).is_dir():
            _link_tree(src / WORK_DIR / name, out / WORK_DIR / name)
    if (src / "media").is_dir():  # a tar's videos, which the shards name beside them
        _link_tree(src / "media", out / "media")


def _link_tree(src: Path, dst: Path) -> None:
    """``src``'s files under ``dst``: hard links (no bytes copied; every cache file is written once, by rename,
    so a link never sees a change), copies across file systems."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, ignore=shutil.ignore_patterns("*.tmp-*"))
