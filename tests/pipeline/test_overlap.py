"""The build's fixed costs moved off its critical path (pipeline/build.py, local.py) give what the plain path
gives: the inputs scanned on a pool worker, each chunk's plan columns read as it lands, the cache's row index
from those row counts, the planner warmed in a thread, the encoder preloaded in the workers (its bytes:
tests/pipeline/test_build.py::test_one_pool_encodes_and_writes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


@pytest.mark.slow
def test_encoder_files_of_killed_builds_leave_the_temp_dir(tmp_path, monkeypatch):
    """A build killed with SIGKILL cannot remove its encoder file from the temp dir; the next build there does,
    once the file is old and its process gone, and keeps every other file."""
    import signal
    import tempfile
    import time

    from packer.pipeline.local import ORPHAN_AGE_S
    from packer.pipeline.stages import make_encoder

    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    temp = tmp_path / "tmp"
    temp.mkdir()
    old = time.time() - ORPHAN_AGE_S - 60
    files = {}
    for name, pid, mtime in [("orphan", killed.pid, old), ("recent", killed.pid, None), ("live", alive.pid, old)]:
        files[name] = temp / f"encoder.pkl.tmp-{pid}-7f00-{len(files) + 1}"
        files[name].write_bytes(b"x")
        if mtime is not None:
            os.utime(files[name], (mtime, mtime))
    (temp / "other.tmp-1").write_bytes(b"y")
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    config = BuildConfig.from_inputs([str(_corpus(tmp_path / "c.jsonl", 3))], str(tmp_path / "out"),
                                     profile="qwen2-vl")
    executor = LocalExecutor(2)
    try:
        executor.start()
        executor.preload(make_encoder(config))
        assert executor._preloaded[1].parent == temp
        assert not files["orphan"].exists()
        assert files["recent"].exists() and files["live"].exists() and (temp / "other.tmp-1").exists()
    finally:
        executor.close()
        alive.kill()
        alive.wait()
    assert sorted(p.name for p in temp.iterdir()) == sorted([files["recent"].name, files["live"].name, "other.tmp-1"])


_FORKED = """
import json, os, sys, threading
from pathlib import Path
import packer.pipeline.kept as kept_store
import packer.pipeline.local as local
from packer.config import BuildConfig
from packer.encode import fastokens_bpe
from packer.pipeline.build import build
from packer.pipeline.stages import make_encoder

corpus, out = sys.argv[1], sys.argv[2]
opts = dict(profile="qwen2-vl", max_length=512, rows_per_shard=8)
# building fastokens' native tokenizer (what the parent does before it forks) starts no thread and encodes nothing
threads = len(os.listdir("/proc/self/task"))
encoder = make_encoder(BuildConfig.from_inputs([corpus], out + "-x", **opts))
encoder.prepare_fork()
assert len(os.listdir("/proc/self/task")) == threads and fastokens_bpe.fork_safe()
methods = []
new_pool = local._new_pool
local._new_pool = lambda n, method: methods.append(method) or new_pool(n, method)
kept = Path(out + "-engine.json")  # fastokens' tokenizer.json kept between builds (kept_store.engine_file)
kept_store.engine_file = lambda name: kept
kept_store.encoder_entry = lambda config, max_length: None  # no kept encoder (test_kept_encoder.py): the helper's way
two = build(BuildConfig.from_inputs([corpus], out + "-two", num_proc=2, **opts), progress=False)
assert methods == ["fork"], methods  # one pool, forked once the encoder existed
assert kept.read_text() == encoder.engine_json()  # kept for the next build
built = []
build_native = fastokens_bpe.build_native
fastokens_bpe.build_native = lambda json: built.append(json) or build_native(json)
# the next build loads the tokenizer in a helper process while this one builds fastokens' native tokenizer from
# the kept string, which the forked workers then hold (built once: the copy prepare_fork makes takes it)
helped = build(BuildConfig.from_inputs([corpus], out + "-helped", num_proc=2, **opts), progress=False)
assert methods == ["fork", "fork"] and built == [kept.read_text()], (methods, len(built))
kept.write_text("{}")  # stale: not this tokenizer's, so built again, as without it, and replaced
executor, built[:] = local.LocalExecutor(2), []
loaded, record = executor.load_encoder(BuildConfig.from_inputs([corpus], out + "-x", **opts), max_length=512)
# the writers' kernels loaded in a thread beside the native build (gather.warm), joined before the pool's fork
from packer.shards import gather
assert "packer-warm-kernels" not in [t.name for t in threading.enumerate()] and len(gather.copy_ranges.signatures) >= 2
executor.close()
assert loaded.tokenizer is None and built == ["{}", encoder.engine_json()] and kept.read_text() == built[1]
assert record["fingerprint"] == helped.manifest["tokenizer"]["fingerprint"] == two.manifest["tokenizer"]["fingerprint"]
assert helped.manifest["fingerprint"] == two.manifest["fingerprint"]
one = build(BuildConfig.from_inputs([corpus], out + "-one", **opts), progress=False)  # encodes here
assert not fastokens_bpe.fork_safe() and not local._forkable()  # rayon's pool runs here now: spawn from now on
print(json.dumps([[s["sha256"] for s in r.manifest["shards"]] for r in (two, helped, one)]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the pool is forked on Linux only")
def test_a_forked_pool_writes_what_one_process_writes(tmp_path):
    """On Linux a fresh process forks its pool once the encoder exists (local.py), the workers inheriting the
    encoder and fastokens' native tokenizer (built with no thread started, so rayon's pool starts in each
    child): the shards equal a one-process build's, also where the tokenizer loaded in a helper process while
    the native tokenizer was built from the string an earlier build kept (``load_encoder``); once fastokens has
    encoded in the process, no fork."""
    lines = [{"messages": [{"role": "user", "content": f"Count to {i}."},
                           {"role": "assistant", "content": " ".join(map(str, range(i % 40 + 1)))}]}
             for i in range(CHUNK_LINES + 100)]  # two encode chunks: the pool encodes
    corpus = tmp_path / "count.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = subprocess.run([sys.executable, "-c", _FORKED, str(corpus), str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    two, helped, one = json.loads(run.stdout.strip().splitlines()[-1])
    assert two == helped == one and len(one) > 1
