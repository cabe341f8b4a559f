"""Where an input lives: a local path or a URL (``s3://bucket/data/a.jsonl``), and the fsspec client per process.

Input files (JSONL, media) are named by a local path or a URL. On a cluster with no shared disk every task
reads its chunk and its media from the store: a relative media path in a record resolves against its
input's URL (``parent_of``, ``resolve``), never a node's working directory. Inputs use the client the
environment configures (``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...); ``storage_options`` is the output's
(``packer.shards.store``, which shares this module's clients). S3 requests are retried by botocore's
``standard`` mode (``S3_RETRIES`` attempts, exponential backoff with jitter: 5xx, throttling, a connection
reset) and s3fs's own loop (a body cut short); what still fails raises a StorageError naming the object
(``naming``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

from packer.errors import ConfigError, PackerError, StorageError

S3_RETRIES = 8  # attempts per request (botocore's standard mode: backoff 2^k x random, at most 20 s each)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(location: str | os.PathLike) -> bool:
    """True for ``s3://...`` and other ``protocol://`` locations (``file://`` included)."""
    return bool(_URL.match(str(location)))


_FILESYSTEMS: dict[tuple[int, str, str, str | None], Any] = {}  # (pid, protocol, options, endpoint) -> client


def _filesystem(protocol: str, storage_options: Mapping[str, Any]) -> Any:
    """The fsspec filesystem of ``protocol`` with these options, made once per process (making an s3fs
    client costs more than a request)."""
    # the endpoint from the environment too: a process that points AWS_ENDPOINT_URL elsewhere gets a new client
    key = (os.getpid(), protocol, json.dumps(storage_options, sort_keys=True, default=str),
           os.environ.get("AWS_ENDPOINT_URL"))
    if key not in _FILESYSTEMS:
        _FILESYSTEMS[key] = _new_filesystem(protocol, storage_options)
    return _FILESYSTEMS[key]


def _new_filesystem(protocol: str, storage_options: Mapping[str, Any]) -> Any:
    try:
        import fsspec

        options = dict(storage_options)
        if protocol in ("s3", "s3a"):  # not cached: other processes (pool workers, Ray tasks) add files meanwhile
            options.setdefault("use_listings_cache", False)
            if not {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ):  # botocore reads those itself
                options.setdefault("config_kwargs", {"retries": {"max_attempts": S3_RETRIES, "mode": "standard"}})
        options.setdefault("skip_instance_cache", True)  # fsspec's own cache would ignore a changed endpoint
        return fsspec.filesystem(protocol, **options)
    except ImportError as e:
        extra = " (pip install 'packer[s3]')" if protocol in ("s3", "s3a") else ""
        raise ConfigError(f"{protocol}:// paths need fsspec's {protocol} filesystem{extra}: {e}") from None
    except ValueError as e:  # fsspec: "Protocol not known"
        raise ConfigError(f"cannot use {protocol}:// paths: {e}") from None


@contextmanager
def naming(what: str) -> Iterator[None]:
    """Raise what an I/O call inside raises past its retries as a StorageError that says ``what`` (the
    operation and the object); a missing file stays FileNotFoundError (callers decide what missing means)."""
    try:
        yield
    except (FileNotFoundError, PackerError):
        raise
    except Exception as e:  # noqa: BLE001 - s3fs/botocore raise OSError, ClientError, connection errors ...
        raise StorageError(f"{what}: {type(e).__name__}: {e}") from e


def _object(path: str) -> tuple[Any, str]:
    """(filesystem, key) of an input URL."""
    protocol, _, key = str(path).partition("://")
    return _filesystem(protocol, {}), key


def absolute(path: str) -> str:
    """``os.path.abspath`` for a local path; a URL is already absolute."""
    return str(path) if is_url(path) else os.path.abspath(path)


def parent_of(path: str) -> str:
    """The directory (prefix) of ``path``, absolute: what relative media paths in its records resolve against."""
    if is_url(path):
        protocol, _, key = str(path).partition("://")
        return f"{protocol}://{key.rsplit('/', 1)[0]}" if "/" in key else f"{protocol}://{key}"
    return os.path.dirname(os.path.abspath(path))


def resolve(source: str, root: str) -> str:
    """``source`` (a path or URL named by a record) made absolute against ``root`` (a directory or URL prefix)."""
    if is_url(source) or os.path.isabs(source):
        return source
    if is_url(root):
        import posixpath

        protocol, _, key = root.partition("://")
        return f"{protocol}://{posixpath.normpath(posixpath.join(key, source))}"
    return os.path.normpath(os.path.join(root, source))


def is_file(path: str) -> bool:
    if is_url(path):
        fs, key = _object(path)
        return bool(fs.isfile(key))
    return os.path.isfile(path)


def is_dir(path: str) -> bool:
    if is_url(path):
        fs, key = _object(path)
        return bool(fs.isdir(key))
    return os.path.isdir(path)


def glob_files(pattern: str) -> list[str]:
    """Files matching ``pattern`` (a URL pattern: fsspec's glob), as URLs."""
    fs, key = _object(pattern)
    protocol = str(pattern).partition("://")[0]
    return [f"{protocol}://{k}" for k in sorted(fs.glob(key)) if fs.isfile(k)]


def open_file(path: str, block_size: int = 1 << 22) -> IO[bytes]:
    """A binary file object on a local path or an input URL (seekable; an object is read in ranged GETs of
    ``block_size``). FileNotFoundError where there is none."""
    if is_url(path):
        fs, key = _object(path)
        return fs.open(key, "rb", block_size=block_size)
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def file_size(path: str) -> int:
    if is_url(path):
        fs, key = _object(path)
        return int(fs.size(key))
    return os.path.getsize(path)


def file_version(path: str) -> tuple[int, str]:
    """(size, version) of an input: its mtime locally, its ETag (else mtime) on a store. Two reads of one
    unchanged file give the same pair (the build's fingerprint, media header caches)."""
    if is_url(path):
        fs, key = _object(path)
        with naming(f"reading the size and ETag of {path}"):
            info = fs.info(key)
        return int(info["size"]), str(info.get("ETag") or info.get("LastModified") or info.get("mtime"))
    st = os.stat(path)
    return st.st_size, str(st.st_mtime_ns)


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a local file or an input URL (one ranged GET). A read that returns fewer
    bytes than asked (a connection cut mid-body the client did not notice, a file cut since the scan) raises
    StorageError naming the object and the range, never a chunk silently short."""
    if is_url(path):
        fs, key = _object(path)
        with naming(f"reading bytes [{start}, {end}) of {path}"):
            data = fs.cat_file(key, start=start, end=end)
    else:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
    if len(data) != end - start:
        raise StorageError(f"reading {path}: got {len(data)} of the {end - start} bytes of [{start}, {end}) (a short "
                           "read, or the file changed since the scan)")
    return data
