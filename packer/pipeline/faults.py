"""Fault hooks: named points of a build where a test can act, e.g. kill the build there.

Production code calls ``hooks.at(point, n)`` at each point below and the default ``Hooks`` does nothing; no
environment variable is read and no test logic runs in a build. Tests inject their own (the crash tests run
``python -m tests.pipeline.crashing_build``, a ``packer build`` that kills itself at a named point), so an
interrupted build can be tested at exact, deterministic places. The points are ``POINTS``, in build order
(``n`` numbers the chunk or shard, 0 where a point happens once).
"""

from __future__ import annotations

from typing import Any

POINTS: dict[str, str] = {
    "encode-partial": "chunk n's rejects are written, its .arrow (the chunk's commit) not; in the process encoding it",
    "encode": "n chunks are encoded (the parent, as each chunk's counts arrive in order)",
    "plan": "the plan is made, no shard is written",
    "exchange": "map task n's output is committed (in the process running it; builds of many shards only)",
    "shard-write": "shard n is about to be written; state: table (its first rows: the first slice the write "
                   "assembles), path (where it goes)",
    "shard": "shard n is renamed into place, its marker is not written",
    "rejects": "rejects.jsonl is written",
    "manifest": "everything but manifest.json is written",
}


class Hooks:
    """No-op hooks: what a build gets unless a test passes its own.

    An executor sends the instance to every process that runs a task (``LocalExecutor`` pickles it into its
    pool workers' initializer), so a subclass must be defined at module level and pickle.
    """

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        """The build reached ``point`` (one of ``POINTS``), number ``n``; ``state`` is what the point offers."""
