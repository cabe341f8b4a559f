"""``packer build`` that interrupts itself at a named point, for the crash tests:

    python -m tests.pipeline.crashing_build POINT:N[:SIGNAL] [packer build arguments...]

runs the real ``packer build`` command (its config, error handling and exit codes) with a ``CrashAt`` hook
(packer/pipeline/faults.py), which sends SIGNAL (KILL, INT or STOP; default KILL) to the build when it
reaches POINT number N, from whichever process reaches it (a pool worker takes the whole build down, as a
``kill -9`` of the command would). ``shard-partial:N`` leaves what a kill in the middle of writing shard N
leaves, a half-written ``NAME.tmp-PID``, then dies: a real write cannot be interrupted at a chosen byte.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from packer.pipeline.faults import POINTS, Hooks


class CrashAt(Hooks):
    def __init__(self, spec: str):
        point, _, rest = spec.partition(":")
        count, _, sig = rest.partition(":")
        if point not in (*POINTS, "shard-partial"):
            raise SystemExit(f"unknown crash point {point!r}; known: {', '.join(POINTS)}, shard-partial")
        self.point, self.n = point, int(count or 0)
        self.signal = getattr(signal, f"SIG{sig or 'KILL'}")  # STOP: freeze here, for a test to signal the group
        self.build_pid = os.getpid()  # pickled into pool workers, so they know whom to signal

    def at(self, point: str, n: int = 0, **state: Any) -> None:
        if n != self.n:
            return
        if self.point == "shard-partial" and point == "shard-write":
            path, table = state["path"], state["table"]
            import pyarrow as pa
            import pyarrow.parquet as pq

            sink = pa.BufferOutputStream()
            pq.write_table(table, sink)
            data = sink.getvalue().to_pybytes()
            path.with_name(f"{path.name}.tmp-{os.getpid()}").write_bytes(data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        if point == self.point:
            os.kill(self.build_pid, self.signal)
            if os.getpid() != self.build_pid and self.signal == signal.SIGKILL:
                os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    import packer.pipeline.build

    hooks = CrashAt(argv[0])
    real_build = packer.pipeline.build.build

    def build(config, **kw):
        return real_build(config, **kw, hooks=hooks)

    packer.pipeline.build.build = build  # what the `packer build` command calls
    from packer.cli import cli

    cli.main(["build", *argv[1:]], prog_name="packer")


if __name__ == "__main__":
    main(sys.argv[1:])
