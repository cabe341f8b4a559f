"""Where a build lives: a local directory, or a prefix on an object store (``s3://bucket/prefix``).

    store_path("out/")                         -> Path("out")                 (today's code paths, unchanged)
    store_path("s3://bucket/run1", {...})      -> ObjectPath("s3://bucket/run1")
    store_path("s3://bucket/run1") / "shard-00000.parquet"   ->   ObjectPath("s3://bucket/run1/shard-00000.parquet")

``ObjectPath`` has the slice of ``pathlib.Path``'s API that packer's writers and readers use (``/``, ``name``,
``exists``, ``glob``, ``read_text``, ``unlink`` ...), so the pipeline and the readers do not branch on where
the files are; the few operations a local file does differently live here: ``write_atomic``, ``remove_tree``,
``open_input`` and ``local_file``.

The filesystem is fsspec's (``s3fs`` for ``s3://``, the ``s3`` extra): ``storage_options`` (YAML
``storage_options:``, ``PackedDataset(storage_options=...)``) is the mapping pandas, ``datasets`` and Dask pass
through to fsspec, so the same keys work here; without them botocore reads the standard AWS environment and
config (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``~/.aws/config``). Why fsspec rather than
``pyarrow.fs``: one API for every store by protocol (gcsfs, adlfs install the same way), that storage_options
convention, and filesystem objects that pickle by their arguments (a Ray task or a DataLoader worker rebuilds
its own client); fsspec itself is already installed with ``datasets``. pyarrow reads Parquet and Arrow IPC
through fsspec's files with ranged reads (a footer, the row groups or columns it needs).

Atomic publish on a store: a file is written under ``NAME.tmp-PID-RANDOM``, copied to ``NAME`` and the temp
deleted (an object store has no rename; a copy is one server-side request and makes the object appear whole),
so a reader never sees a partial file under its final name; a build without ``manifest.json`` is unfinished,
and a rerun deletes the stray temps as it does on a local disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from packer.core.location import _filesystem, is_url, naming  # noqa: F401 (is_url: where callers found it)


def store_path(location: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> Path | ObjectPath:
    """``location`` as a ``Path`` (a local directory or file) or an ``ObjectPath`` (a URL)."""
    if isinstance(location, ObjectPath):
        return location
    if is_url(location):
        return ObjectPath(str(location), storage_options)
    return Path(location)


class ObjectPath:
    """A file or prefix on an object store, with the part of ``pathlib.Path``'s API packer uses.

    Object stores have no directories: a prefix "exists" once an object is under it and ``mkdir`` does
    nothing. Pickles as its URL and options; each process makes its own client.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None):
        protocol, _, key = url.partition("://")
        self.protocol, self.key = protocol, key.rstrip("/")
        self.storage_options = dict(storage_options or {})

    @property
    def fs(self) -> Any:
        """This process's client (looked up per call, not kept: a forked DataLoader worker must not use its
        parent's, whose event-loop thread did not survive the fork)."""
        return _filesystem(self.protocol, self.storage_options)

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.key}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectPath, (self.url, self.storage_options))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> ObjectPath:
        return ObjectPath(f"{self.url}/{name}", self.storage_options)

    def _at(self, key: str) -> ObjectPath:
        return ObjectPath(f"{self.protocol}://{key}", self.storage_options)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        return self._at(self.key.rsplit("/", 1)[0])

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def resolve(self) -> ObjectPath:
        return self  # a URL is absolute

    def exists(self) -> bool:
        return self.fs.exists(self.key)

    def is_file(self) -> bool:
        return self.fs.isfile(self.key)

    def is_dir(self) -> bool:
        return self.fs.isdir(self.key)

    def iterdir(self) -> Iterator[ObjectPath]:
        if not self.fs.isdir(self.key):
            return iter(())
        return iter(self._at(k.rstrip("/")) for k in sorted(self.fs.ls(self.key, detail=False)))

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        return iter(self._at(k) for k in sorted(self.fs.glob(f"{self.key}/{pattern}")))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: an object store has no directories."""

    def read_bytes(self) -> bytes:
        with naming(f"reading {self.url}"):
            return self.fs.cat_file(self.key)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Put ``data`` under this name in one request (not atomic across a crash of a multi-part upload; the
        build writes through ``write_atomic``)."""
        with naming(f"writing {self.url}"):
            self.fs.pipe_file(self.key, data)

    def open(self, mode: str = "rb", **kw: Any) -> IO[Any]:
        return self.fs.open(self.key, mode, **kw)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise


def write_atomic(path: Path | ObjectPath, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to a temp name beside ``path`` and move it into place; the temp is deleted on failure.

    A local file is renamed (``os.replace``; ``fsync`` first if asked); an object is copied (server side) and
    its temp deleted. Either way ``path`` holds the old content or all of the new, never a part.
    """
    if isinstance(path, ObjectPath):
        # pid + random: two nodes may run the same task (a retry) with equal pids
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_bytes(data)
            with naming(f"publishing {path.url} (a copy of its temp object)"):
                path.fs.copy(tmp.key, path.key)
        finally:
            with contextlib.suppress(Exception):  # a temp left behind is deleted by the next run (output.py)
                tmp.unlink(missing_ok=True)
        return
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_tree(path: Path | ObjectPath) -> None:
    """Delete a file or a whole directory (prefix)."""
    if isinstance(path, ObjectPath):
        path.fs.rm(path.key, recursive=True)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def open_input(path: Path | ObjectPath) -> str | IO[bytes]:
    """What pyarrow opens ``path`` from: the local path itself (memory-mapped / read by pyarrow's own file),
    or an fsspec file that serves pyarrow's ranged reads."""
    return path.open("rb") if isinstance(path, ObjectPath) else str(path)


def local_file(path: Path | ObjectPath) -> Path:
    """A local file with ``path``'s content, to memory-map: the path itself, or a copy of the object in this
    machine's mirror (``$TMPDIR/packer-store``), downloaded once per object version (its ``ukey``; on S3 a
    hash of size, ETag and mtime) and shared by every process on the machine. The shard writers read the
    encode cache this way: a shard's rows come from most chunk files, so each machine downloads each chunk
    once instead of once per shard."""
    if not isinstance(path, ObjectPath):
        return path
    key = hashlib.sha256(f"{path.url}\0{path.fs.ukey(path.key)}".encode()).hexdigest()[:24]
    copy = mirror_dir(path.parent) / f"{key}-{path.name}"
    if not copy.exists():
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_name(f"{copy.name}.tmp-{os.getpid()}")
        try:
            with naming(f"downloading {path.url} to {tmp}"):
                path.fs.get_file(path.key, str(tmp))
            os.replace(tmp, copy)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return copy


def mirror_dir(prefix: ObjectPath, tmp: str | Path | None = None) -> Path:
    """This machine's directory of downloaded copies of the objects under ``prefix`` (``local_file``), in its
    temp directory (``tmp``: another machine's, a test's view of a node)."""
    root = Path(tmp if tmp is not None else tempfile.gettempdir())
    return root / "packer-store" / hashlib.sha256(prefix.url.encode()).hexdigest()[:16]


def drop_mirrors(prefixes: Iterable[ObjectPath]) -> None:
    """Delete this machine's copies of the objects under each prefix (``local_file``)."""
    for prefix in prefixes:
        shutil.rmtree(mirror_dir(prefix), ignore_errors=True)

