"""A pool's shards written in parts (``stages.ShardPart``, ``shards/splice.py``): each part by one worker, the
shard spliced by the worker that finishes its last part, the same bytes as a one-process build's; an error in
a part leaves no shard that looks written, and the rerun writes it. Tiny chunks and shards, as
tests/pipeline/test_exchange.py's, make a few hundred records a build of ~20 shards in seconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packer.pipeline import local, stages
from packer.pipeline.build import build
from packer.pipeline.faults import Hooks
from packer.pipeline.local import LocalExecutor
from tests.pipeline.test_exchange import _config, _files, corpus  # noqa: F401 (a fixture)


class Parts(Hooks):
    """Touches ``POINT-N-PID[-part]`` in ``root`` at each shard write and each shard renamed into place;
    raises at the write of ``fail`` (shard, part)."""

    def __init__(self, root: Path, fail: tuple[int, int] | None = None):
        self.root, self.fail = str(root), fail

    def at(self, point: str, n: int = 0, **state) -> None:
        if point not in ("shard-write", "shard"):
            return
        path = state.get("path")
        part = path.name.split("-")[1] if path is not None and path.parent.name == "parts" else "whole"
        Path(self.root, f"{point}-{n}-{os.getpid()}-{part}").touch()
        if self.fail is not None and point == "shard-write" and (n, part) == (self.fail[0], str(self.fail[1])):
            raise RuntimeError(f"stopped at shard {n} part {part}")


_POLICY = local._split_shards


def _every_big_shard(ranges, num_proc, config):
    """The split policy for every shard of two row groups or more (the real one splits only the last few)."""
    assert isinstance(ranges, stages.ShardRanges)
    return frozenset(s for s in range(len(ranges)) if ranges.num_packs(s) >= 2 * config.rows_per_row_group)


def _small(mp: pytest.MonkeyPatch, *, exchange: bool) -> None:
    mp.setattr(stages, "CHUNK_LINES", 4)
    mp.setattr(stages, "EXCHANGE_MIN_FAN", 2)
    if not exchange:
        mp.setattr(stages, "EXCHANGE_MIN_SHARDS", 10**9)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, bytes]:  # noqa: F811
    """One process, whole shards."""
    with pytest.MonkeyPatch.context() as mp:
        _small(mp, exchange=True)
        out = tmp_path_factory.mktemp("ref") / "out"
        build(_config(corpus, out, rows_per_shard=8, rows_per_row_group=2), progress=False)
    return _files(out)


def _events(root: Path) -> list[tuple[str, int, int, str]]:
    return [(p, int(n), int(pid), part) for p, n, pid, part in (f.name.rsplit("-", 3) for f in root.iterdir())]


@pytest.mark.parametrize("exchange", [True, False])
def test_shards_written_in_parts_are_the_same_bytes(corpus, reference, tmp_path, monkeypatch, exchange):  # noqa: F811
    _small(monkeypatch, exchange=exchange)
    monkeypatch.setattr(local, "_split_shards", _every_big_shard)
    (tmp_path / "ev").mkdir()
    out = tmp_path / "out"
    build(_config(corpus, out, rows_per_shard=8, rows_per_row_group=2, num_proc=2), progress=False,
          executor=LocalExecutor(2), hooks=Parts(tmp_path / "ev"))
    assert _files(out) == reference and len(reference) > 2 + 10
    events = _events(tmp_path / "ev")
    parts = {(n, part) for p, n, _, part in events if p == "shard-write"}
    assert {(0, "0"), (0, "1")} <= parts  # written in parts, each part once
    assert len(parts) == len([e for e in events if e[0] == "shard-write"])
    spliced = [pid for p, _, pid, _ in events if p == "shard"]
    assert len(spliced) == len(reference) - 3 and os.getpid() not in spliced  # each shard once, in a worker
    assert not (out / ".packer" / "parts").exists()


def test_an_error_in_a_part_leaves_no_shard_and_the_rerun_writes_it(corpus, reference, tmp_path, monkeypatch):  # noqa: F811
    _small(monkeypatch, exchange=True)
    monkeypatch.setattr(local, "_split_shards", _every_big_shard)
    (tmp_path / "ev").mkdir()
    out = tmp_path / "out"
    config = _config(corpus, out, rows_per_shard=8, rows_per_row_group=2, num_proc=2)
    with pytest.raises(RuntimeError, match="stopped at shard 3 part 1"):
        build(config, progress=False, executor=LocalExecutor(2), hooks=Parts(tmp_path / "ev", fail=(3, 1)))
    assert not (out / "shard-00003.parquet").exists() and not (out / ".packer" / "shards" / "00003.json").exists()
    assert not (out / "manifest.json").exists()
    # what a kill in the middle of a splice leaves: part files of another run, which are never spliced
    parts = out / ".packer" / "parts"
    parts.mkdir(exist_ok=True)
    (parts / "00003-0-1-2.parquet").write_bytes(b"PAR1 not this run's")
    (parts / "00003-1-1-2.parquet").write_bytes(b"PAR1 not this run's")
    build(config, progress=False, executor=LocalExecutor(2))
    assert _files(out) == reference
    assert not parts.exists()


def test_the_policy_splits_the_shards_that_would_run_alone(corpus, tmp_path, monkeypatch):  # noqa: F811
    """The real policy: of 2 workers, 3 shards of two row groups or more and a small one: the third is split."""
    _small(monkeypatch, exchange=True)
    seen = []

    def spy(ranges, num_proc, config):
        found = _POLICY(ranges, num_proc, config)
        seen.append(([ranges.num_packs(s) for s in range(len(ranges))], sorted(found)))
        return found

    monkeypatch.setattr(local, "_split_shards", spy)
    build(_config(corpus, tmp_path / "out", rows_per_shard=50, rows_per_row_group=8, num_proc=2), progress=False,
          executor=LocalExecutor(2))
    (packs, split), = seen
    assert packs == [50, 50, 50, 8] and split == [2]  # as a 200k text build: 2048 x 3 + 14
