"""Drop the planner's cached kernels when any planner source changed since they were compiled.

numba's on-disk cache (``cache=True``) keys a kernel by its own file's mtime and size only. The planner's kernels
call kernels of other modules (``bulk_budgets`` -> ``kernels``, ``balance`` -> ``kernels``) and read their
constants (``mixing.MARK``), and numba compiles the callee into the caller: after ``kernels.py`` changes (a
``git pull`` that leaves ``bulk_budgets.py`` alone), ``bulk_budgets``' cached machine code still runs the old
callee. So one digest of every ``packer/packing`` source guards their cache together: on a mismatch the cached
kernels of these modules are deleted (they compile again, once) and the new digest is written beside them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

STAMP = "packer-packing.stamp"
HERE = Path(__file__).resolve().parent


def sources_digest() -> str:
    """sha256 over the package's module sources, in name order."""
    h = hashlib.sha256()
    for path in sorted(HERE.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir() -> Path | None:
    """Where numba caches this package's kernels (in-tree ``__pycache__``, ``NUMBA_CACHE_DIR`` or the user-wide
    cache: numba's own choice, read off a cached dispatcher that is never compiled), or None when unknown."""
    from numba import njit

    @njit(cache=True)
    def probe() -> int:
        return 0

    path = getattr(getattr(probe, "_cache", None), "_cache_path", None)
    return None if path is None else Path(path)


def drop_stale_kernels(folder: Path | None = None) -> bool:
    """Delete this package's cached kernels in ``folder`` (numba's, by default) if they were compiled from other
    sources; True if it did."""
    folder = cache_dir() if folder is None else folder
    if folder is None or not folder.is_dir():
        return False
    digest, stamp = sources_digest(), folder / STAMP
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:
        pass
    modules = {p.stem for p in HERE.glob("*.py")}
    for path in folder.iterdir():
        if path.suffix in (".nbi", ".nbc") and path.name.split(".", 1)[0] in modules:
            try:
                path.unlink()
            except OSError:
                pass  # another process removed it first
    try:
        tmp = folder / f"{STAMP}.{os.getpid()}"
        tmp.write_text(digest)
        tmp.replace(stamp)
    except OSError:
        pass  # a read-only cache folder: numba does not write there either
    return True
