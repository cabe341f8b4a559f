"""The ``Executor`` base class (packer/pipeline/executor.py): what ``build`` calls on any executor, in which
order, what the optional steps do by default, and what is refused. That an executor defining only
``encode`` and ``write`` writes the local executor's bytes: tests/pipeline/test_build.py::
test_another_executor_writes_the_same_bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.pipeline.build import build
from packer.pipeline.executor import Executor
from packer.pipeline.faults import Hooks
from packer.pipeline.local import LocalExecutor
from packer.pipeline.stages import encode_chunk, scan_chunks, write_shard_range


def _config(tmp_path: Path, n: int = 20) -> BuildConfig:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Count to {i}."},
                                                       {"role": "assistant", "content": " ".join(map(str, range(i)))}]})
                              + "\n" for i in range(1, n + 1)))
    return BuildConfig.from_inputs([str(corpus)], str(tmp_path / "out"), profile="qwen2-vl", max_length=256,
                                   rows_per_shard=2)


class _Recording(Executor):
    """Runs the tasks here and records each step ``build`` calls (``submit`` by the function's name)."""

    def __init__(self):
        self.calls: list[str] = []

    def start(self):
        self.calls.append("start")

    def submit(self, fn, /, *args, **kwargs):
        self.calls.append(f"submit {fn.__name__}")
        return super().submit(fn, *args, **kwargs)

    def preload(self, encoder):
        self.calls.append("preload")

    def close(self):
        self.calls.append("close")

    def encode(self, chunks, *, encoder, cache, config, hooks):
        self.calls.append("encode")
        for c in chunks:
            yield encode_chunk(c, encoder=encoder, cache=cache, config=config, hooks=hooks)

    def write(self, ranges, *, cache, config, hooks):
        self.calls.append("write")
        for r in ranges:
            yield write_shard_range(r, cache=cache, config=config, hooks=hooks)


class _FailAt(Hooks):
    def __init__(self, point: str):
        self.point = point

    def at(self, point: str, n: int = 0, **state) -> None:
        if point == self.point:
            raise RuntimeError(f"failed at {point}")


def test_build_calls_every_step_in_order(tmp_path):
    executor = _Recording()
    result = build(_config(tmp_path), progress=False, executor=executor)
    assert executor.calls == ["start", "submit scan_chunks", "preload", "encode", "write", "close"]
    assert result.stats["examples"] == 20


def test_close_runs_when_the_build_fails(tmp_path):
    executor = _Recording()
    with pytest.raises(RuntimeError, match="failed at plan"):
        build(_config(tmp_path), progress=False, executor=executor, hooks=_FailAt("plan"))
    assert executor.calls == ["start", "submit scan_chunks", "preload", "encode", "close"]


class _Minimal(Executor):
    def encode(self, chunks, **kw):
        yield from ()

    def write(self, ranges, **kw):
        yield from ()


def test_the_default_submit_runs_when_its_result_is_asked_for(tmp_path):
    ran: list[int] = []

    def task(x: int, *, y: int) -> int:
        ran.append(x)
        return x + y

    later = _Minimal().submit(task, 1, y=2)
    assert ran == []  # nothing ran yet: the build scans here, after the tokenizer load
    assert later() == 3 and ran == [1]
    config = _config(tmp_path)
    assert _Minimal().submit(scan_chunks, config)() == scan_chunks(config)
    failing = _Minimal().submit(scan_chunks, BuildConfig.from_inputs([str(tmp_path / "nope.jsonl")], str(tmp_path / "o"),
                                                                     profile="qwen2-vl"))
    with pytest.raises(ConfigError, match="matches no file"):  # raised when the result is asked for
        failing()


def test_the_optional_steps_default_to_nothing():
    executor = _Minimal()
    with executor as entered:  # start(), then close(), both no-ops
        assert entered is executor
        assert executor.preload(object()) is None
    executor.close()  # twice is fine


def test_an_executor_must_define_encode_and_write():
    class NoWrite(Executor):
        def encode(self, chunks, **kw):
            yield from ()

    with pytest.raises(TypeError, match="abstract"):
        NoWrite()


def test_an_object_that_is_not_an_executor_is_refused(tmp_path):
    class DuckTyped:  # the methods, not the base class
        def encode(self, chunks, **kw):
            yield from ()

        def write(self, ranges, **kw):
            yield from ()

    with pytest.raises(TypeError, match=r"packer\.pipeline\.executor\.Executor.*DuckTyped"):
        build(_config(tmp_path), progress=False, executor=DuckTyped())
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_the_local_executor_as_a_context_manager():
    with LocalExecutor(2) as executor:
        assert executor._pool is not None  # started: the workers are spawned
    assert executor._pool is None
