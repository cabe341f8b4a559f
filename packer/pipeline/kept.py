"""Encoders kept between builds, in ``$PACKER_CACHE/engines`` (``packer.encode.tokenizers.cache_dir``).

Two things a build would otherwise make again at every start, kept by the build that made them and used by the next
of the same key: the string fastokens' native tokenizer of a local tokenizer builds from (``engine_file``, one per
tokenizer: ``Encoder.engine_json``, its tokenizer.json or the ``tiktoken_spec`` of it; the native tokenizer builds
from it before the encoder exists), and the encoder itself with its tokenizer record
(``encoder_entry``: the pickle a worker loads, keyed by everything it is made from). An entry is this user's own
file, whole or absent, checked by its key and sha256 before it is unpickled; anything in doubt is made again and
replaces it. ``LocalExecutor.load_encoder`` (a forked pool) and ``Executor.load_encoder`` (a build that makes its
encoder in its own process: one process, a spawned pool, Ray's driver) read and keep them; docs/reliability.md,
"Kept encoders".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from packer.config import BuildConfig
    from packer.encode.encoder import Encoder


def engine_file(name: str) -> Path | None:
    """Where fastokens' string (``Encoder.engine_json``) for the tokenizer ``name`` is kept between builds
    (``load_encoder``): a local tokenizer (a builtin, a directory), one file per tokenizer; None for a hub name."""
    import hashlib

    from packer.encode.tokenizers import builtin_path, builtin_tokenizers, cache_dir

    path = builtin_path(name) if name in builtin_tokenizers() else Path(name)
    if not path.is_dir():
        return None
    return cache_dir() / "engines" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] + ".json")


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def keep_engine(path: Path | None, json: str | None, kept: str | None) -> None:
    """Keep ``json`` (an encoder's ``engine_json``) at ``path`` for the next build, unless kept already; a
    cache that cannot be written is skipped (the next build is serial, as without it)."""
    if path is None or json is None or json == kept:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


ENTRIES_KEPT = 8
"""Kept encoders (``keep_entry``) beyond this many, the least recently used first, are removed (~9 MB each)."""
ENTRY_MAGIC = b"packer-encoder-entry 1\n"
"""The first line of a kept encoder entry (``keep_entry``): a change of the layout below changes it."""


def encoder_entry(config: BuildConfig, max_length: int | None) -> tuple[Path, str] | None:
    """Where ``load_encoder`` keeps the encoder of ``config`` (and its tokenizer record) between builds, and the key
    the entry must hold to be used: everything the pickled encoder and the record are made from. The tokenizer's
    files (path, size, mtime_ns: ``output.tokenizer_source``, as a rebuild trusts its encode mark), every
    BuildConfig field ``make_encoder`` reads (the profile and its options, the chat template's text, the length
    policy, ``max_length``), packer's own files (name, size, mtime_ns: its classes are what unpickles), the
    installed distributions (every dist-info's name-version and mtime: transformers, tokenizers, fastokens,
    jinja2, numpy...) and python's version. The file is named by the tokenizer, the options and where packer and
    its environment are installed, so that a new source or version replaces its entry rather than adding one, while
    two installs sharing one cache (two venvs, two checkouts) keep one each instead of replacing each other's at
    every build. None for a hub tokenizer (nothing is kept for it)."""
    import hashlib
    import json

    import packer
    from packer.config import chat_template_source
    from packer.encode.tokenizers import cache_dir
    from packer.pipeline.output import tokenizer_source

    name = config.tokenizer_name()
    source = tokenizer_source(name)
    if source is None:
        return None
    template = chat_template_source(config)
    options = {"tokenizer": os.path.dirname(source[0][0]), "profile": config.profile,
               "profile_overrides": repr(sorted(config.profile_overrides().items())),
               "chat_template": None if template is None else hashlib.sha256(template.encode()).hexdigest(),
               "max_length": max_length or config.max_length, "overlong": config.overlong,
               "long_docs": config.long_docs, "long_docs_overlap": config.long_docs_overlap}
    named = json.dumps({**options, "installed_at": [str(Path(packer.__file__).parent), sys.prefix]}, sort_keys=True)
    key = json.dumps({"options": options, "tokenizer_files": source,
                      "packer": tree_stats(Path(packer.__file__).parent), "installed": installed(),
                      "python": sys.version, "platform": sys.platform}, sort_keys=True)
    file = cache_dir() / "engines" / (hashlib.sha256(named.encode()).hexdigest()[:16] + ".encoder")
    return file, key


def tree_stats(root: Path) -> list[list[Any]]:
    """(path, size, mtime_ns) of every file under ``root`` but __pycache__'s (~200 for packer: a few ms)."""
    out: list[list[Any]] = []
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(e.path)
                elif e.is_file():
                    st = e.stat()
                    out.append([os.path.relpath(e.path, root), st.st_size, st.st_mtime_ns])
    return sorted(out)


def installed() -> list[list[Any]]:
    """The dist-info (egg-info) directories of every directory on sys.path but the working directory, with their
    mtime_ns: each installed distribution's name and version, and when it was installed (a reinstall of the same
    version too), read without importlib.metadata (~0.1 s); ~1 ms for ~160 distributions."""
    names: list[list[Any]] = []
    for d in sys.path:
        if not d or not os.path.isabs(d):
            continue
        try:
            with os.scandir(d) as it:
                names += [[e.name, e.stat().st_mtime_ns] for e in it if e.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
    return sorted(names)


def read_entry(path: Path, key: str) -> tuple[bytes, dict[str, Any]] | None:
    """The encoder's pickle and tokenizer record kept at ``path``, where it holds ``key`` and its bytes their
    sha256; None for anything else (no file, another layout, another key, a damaged file, a file of another user
    or one that others may write)."""
    import hashlib
    import json

    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            # a pickle runs code as it loads: only this user's own file, which no one else may write
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            raw = f.read()
        if not raw.startswith(ENTRY_MAGIC):
            return None
        end = raw.index(b"\n", len(ENTRY_MAGIC))
        header = json.loads(raw[len(ENTRY_MAGIC):end])
        data = raw[end + 1:]
        if (not isinstance(header, dict) or header.get("key") != key or not isinstance(header.get("record"), dict)
                or header.get("sha256") != hashlib.sha256(data).hexdigest()):
            return None
    except (OSError, ValueError):
        return None
    return data, header["record"]


def keep_entry(path: Path, key: str, data: bytes, record: dict[str, Any]) -> None:
    """Keep the encoder's pickle ``data`` and its tokenizer ``record`` at ``path`` under ``key`` for the next build
    (``read_entry``); written whole or not at all, and skipped where the cache cannot be written."""
    import hashlib
    import json

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        header = json.dumps({"key": key, "record": record, "sha256": hashlib.sha256(data).hexdigest()})
        path.parent.mkdir(parents=True, exist_ok=True)
        # this user's alone, whatever the umask (``read_entry`` loads no file that others may write)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(ENTRY_MAGIC + header.encode() + b"\n")
            f.write(data)
        tmp.replace(path)
    except (OSError, TypeError, ValueError):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return
    prune_entries(path.parent, ENTRIES_KEPT)


def prune_entries(here: Path, keep: int) -> None:
    """Remove the entries in ``here`` past the ``keep`` last used (by mtime: ``load_encoder`` touches the one it
    uses): each is ~9 MB, and a sweep over options keeps one per option."""
    try:
        entries = sorted(((p.stat().st_mtime_ns, p) for p in here.glob("*.encoder")), reverse=True)
        for _, p in entries[keep:]:
            p.unlink(missing_ok=True)
    except OSError:  # one removed meanwhile (another build's prune): the next write prunes again
        pass


class Kept(NamedTuple):
    """What ``kept_encoder`` found for a build: its entry (None: nothing is kept for it) and, where that entry
    served, the encoder and its tokenizer record."""

    entry: tuple[Path, str] | None
    encoder: Encoder | None = None
    record: dict[str, Any] | None = None


def kept_encoder(config: BuildConfig, max_length: int | None) -> Kept:
    """``Executor.load_encoder``'s kept encoder (a build whose encoder is made in its own process: one process, a
    spawned pool, Ray's driver): the entry an earlier build kept under this build's key (``encoder_entry``,
    ``read_entry``: the same entries, key and refusals as a forked pool's build), unpickled, where it is an
    Encoder of this build's very profile (``same_profile``). The entry used is touched (the last to go,
    ``prune_entries``). Anything else (no entry, a damaged one, another key, a pickle that does not load) is
    ``Kept(entry)``: the encoder is made, and ``keep_encoder`` replaces the entry."""
    try:
        entry = encoder_entry(config, max_length)
    except OSError:  # a tokenizer or packer file gone or unreadable meanwhile: nothing kept, nothing read
        return Kept(None)
    hit = read_entry(*entry) if entry is not None else None
    if hit is None:
        return Kept(entry)
    import pickle

    from packer.encode.encoder import Encoder

    try:
        encoder = pickle.loads(hit[0])
    except Exception:  # noqa: BLE001 - a stale or damaged entry: made again, as without it
        return Kept(entry)
    if not isinstance(encoder, Encoder) or not same_profile(encoder, config):
        return Kept(entry)
    try:
        os.utime(entry[0])
    except OSError:
        pass
    return Kept(entry, encoder, hit[1])


def same_profile(encoder: Encoder, config: BuildConfig) -> bool:
    """Is the kept encoder's profile the one this build would make it with? The key names the profile and its
    options, and packer's files define the builtin profiles; a profile registered at run time (a user's own
    family, a test's) is defined elsewhere, so the kept one is compared with it whole."""
    from packer.models import get_profile

    try:
        return bool(encoder.profile == get_profile(config.profile, **config.profile_overrides()))
    except Exception:  # noqa: BLE001 - not comparable (or an unknown profile, which the build reports): made
        return False


def keep_encoder(kept: Kept, encoder: Encoder, record: dict[str, Any]) -> None:
    """Keep the encoder ``Executor.load_encoder`` made (``kept_encoder`` found none) under its entry, pickled
    as a worker receives it (before any encode); nothing where no entry applies (a hub tokenizer)."""
    if kept.entry is None or kept.encoder is not None:
        return
    import pickle

    try:
        data = pickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - an encoder that does not pickle (a test's profile): nothing kept
        return
    keep_entry(*kept.entry, data, record)
