"""The build's fixed costs moved off its critical path (pipeline/build.py, local.py) give what the plain path
gives: the inputs scanned on a pool worker, each chunk's plan columns read as it lands, the cache's row index
from those row counts, the planner warmed in a thread, the encoder preloaded in the workers (its bytes:
tests/pipeline/test_build.py::test_one_pool_encodes_and_writes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.pipeline.build import build
from packer.pipeline.cache import EncodeCache
from packer.pipeline.columns import Columns, read_chunk
from packer.pipeline.local import LocalExecutor
from packer.pipeline.stages import CHUNK_LINES, plan_packs, scan_chunks, warm_planner


def _corpus(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            if i % 97 == 5:
                f.write("\n")  # a blank line: counted by the scan, not a record
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Count to {i % 30}."},
                                             {"role": "assistant", "content": " ".join(map(str, range(i % 30 + 1)))}]})
                    + "\n")
    return path


@pytest.mark.slow
def test_scan_on_a_worker_equals_the_scan_here(tmp_path):
    a, b = _corpus(tmp_path / "a.jsonl", 2 * CHUNK_LINES + 7), _corpus(tmp_path / "b.jsonl", 40)
    config = BuildConfig.from_inputs([str(a), str(b)], str(tmp_path / "out"), profile="qwen2-vl", max_length=512,
                                     num_proc=2)
    missing = BuildConfig.from_inputs([str(tmp_path / "nope.jsonl")], str(tmp_path / "out"), profile="qwen2-vl")
    executor = LocalExecutor(2)
    executor.start()
    try:
        assert executor.submit(scan_chunks, config)() == scan_chunks(config)  # 4 chunks, in file order
        with pytest.raises(ConfigError, match="matches no file"):  # a worker's error reaches the caller
            executor.submit(scan_chunks, missing)()
    finally:
        executor.close()
    assert LocalExecutor(1).submit(scan_chunks, config)() == scan_chunks(config)


@pytest.mark.slow
def test_chunk_reads_and_row_counts_equal_a_pass_over_the_cache(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl", 2 * CHUNK_LINES + 7)
    config = BuildConfig.from_inputs([str(corpus)], str(tmp_path / "out"), profile="qwen2-vl", max_length=512,
                                     rows_per_shard=4)
    one = build(config, progress=False)
    cache = EncodeCache(Path(one.output) / ".packer" / "encode", 3)
    parts = [cache.read(i) for i in range(3)]
    assert cache.open(parts=parts).equals(cache.open())
    assert np.array_equal(cache.indexed([t.num_rows for t in parts]).starts, cache.indexed().starts)
    sel = np.array([3, 0, CHUNK_LINES + 2, 2 * CHUNK_LINES + 6])
    assert cache.indexed([t.num_rows for t in parts]).take(sel).equals(cache.indexed().take(sel))
    with pytest.raises(ValueError, match="2 row counts for 3 chunks"):
        cache.indexed([1, 2])
    # the planner warmed first plans the same (numba's kernels loaded, not different ones)
    def columns() -> Columns:
        return Columns.gather([read_chunk(cache, i, config, "") for i in range(3)], ["", "", ""])

    before = plan_packs(columns(), config)
    warm_planner(config)
    after = plan_packs(columns(), config)
    assert np.array_equal(after.order, before.order) and np.array_equal(after.bounds, before.bounds)


@pytest.mark.slow
def test_a_preloaded_encoder_file_is_removed_by_close(tmp_path):
    from packer.pipeline.stages import make_encoder

    config = BuildConfig.from_inputs([str(_corpus(tmp_path / "c.jsonl", 3))], str(tmp_path / "out"),
                                     profile="qwen2-vl")
    executor = LocalExecutor(2)
    executor.start()
    executor.preload(make_encoder(config))
    blob = executor._preloaded[1]
    assert blob.exists()
    executor.close()  # a build that fails before encoding (a bad input, Ctrl-C) leaves no 8 MB file behind
    assert not blob.exists()
