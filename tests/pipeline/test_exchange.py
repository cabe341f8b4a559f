"""The exchange (``stages.map_tasks``, ``stages.exchange_map``): a build of many shards whose map tasks each read
consecutive chunks once and whose writers read one section of each map output writes the same bytes as writers
that read every chunk file, and an interrupted exchange resumes. Tiny chunks (``CHUNK_LINES`` 4) and shards
(4 packs) make a few hundred records exercise several map tasks and writers in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packer.config import BuildConfig, SourceConfig
from packer.pipeline import stages
from packer.pipeline.build import build
from packer.pipeline.faults import Hooks
from packer.pipeline.local import LocalExecutor
from packer.shards import assemble
from tests.pipeline.crash_setup import word_records, word_tokenizer

WORDS = [f"w{i}" for i in range(300)]
OPTS = dict(profile="text", max_length=128, rows_per_shard=4, rows_per_row_group=2)


class Record(Hooks):
    """Counts the map outputs written (``exchange:N``); optionally raises after ``stop`` of them."""

    def __init__(self, stop: int | None = None):
        self.written: list[int] = []
        self.stop = stop

    def at(self, point: str, n: int = 0, **state) -> None:
        if point == "exchange":
            self.written.append(n)
            if self.stop is not None and len(self.written) == self.stop:
                raise RuntimeError(f"stopped after map {n}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("exchange")
    rng = np.random.default_rng(3)
    for name, n in (("a", 300), ("b", 170)):
        lines = word_records(rng, n, words=WORDS, lengths=(3, 60), chat_every=4, bad_every=53, question_chars=40)
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return root, word_tokenizer(root / "tok", words=WORDS)


def _small(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(stages, "CHUNK_LINES", 4)
    mp.setattr(stages, "EXCHANGE_MIN_FAN", 2)  # ~120 chunks, ~20 shards: a few chunks per map task
    mp.setattr(stages, "EXCHANGE_MIN_VISITS", 0)  # the exchange also where one process writes every shard


def _config(corpus: tuple[Path, str], out: Path | str, **kw) -> BuildConfig:
    root, tokenizer = corpus
    # two sources, one up-sampled: the map tasks take planned examples by ``plan.index``, copies included
    sources = (SourceConfig(name="a", paths=(str(root / "a.jsonl"),), weight=1.5),
               SourceConfig(name="b", paths=(str(root / "b.jsonl"),)))
    return BuildConfig(sources=sources, output=str(out), tokenizer=tokenizer, **{**OPTS, **kw})


def _files(out: Path) -> dict[str, bytes]:
    """Every shard, stats, rejects, and the manifest less its run-time fields."""
    files = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}
    files.update({n: (out / n).read_bytes() for n in ("stats.json", "rejects.jsonl")})
    manifest = json.loads((out / "manifest.json").read_text())
    for k in ("num_proc", "output"):  # where and how it ran
        manifest["config"].pop(k)
    manifest.pop("base_dir", None)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, bytes]:
    """The build without the exchange: every writer reads the chunk files."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "CHUNK_LINES", 4)
        mp.setattr(stages, "EXCHANGE_MIN_SHARDS", 10**9)
        out = tmp_path_factory.mktemp("ref") / "out"
        build(_config(corpus, out), progress=False)
    assert not (out / ".packer" / "exchange").exists()
    return _files(out)


def test_the_exchange_writes_the_same_bytes(corpus, reference, tmp_path, monkeypatch):
    _small(monkeypatch)
    hooks = Record()
    out = tmp_path / "out"
    build(_config(corpus, out), progress=False, hooks=hooks)
    assert len(reference) > 2 + 10  # many shards
    assert len(hooks.written) >= 4  # several map tasks, each over several chunks
    assert _files(out) == reference
    assert not (out / ".packer" / "exchange").exists()  # deleted once the shards are written


def test_the_exchange_in_a_pool_writes_the_same_bytes(corpus, reference, tmp_path, monkeypatch):
    _small(monkeypatch)
    out = tmp_path / "out"
    build(_config(corpus, out, num_proc=2), progress=False, executor=LocalExecutor(2))
    assert _files(out) == reference


def test_one_process_of_few_shards_x_chunks_reads_the_chunk_files(corpus, reference, tmp_path, monkeypatch):
    """Where this process writes every shard and shards x chunk files stay below ``EXCHANGE_MIN_VISITS``, no map
    output is written: the writers read the chunk files, each file's layout remembered, the same bytes. A pool's
    writers (its own processes) still get the exchange."""
    _small(monkeypatch)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_VISITS", 10**6)
    monkeypatch.setattr(assemble, "_LAYOUTS", {})
    hooks = Record()
    build(_config(corpus, tmp_path / "out"), progress=False, hooks=hooks)
    assert hooks.written == []
    assert len(assemble._LAYOUTS) > 10  # every chunk file's layout, kept from each file's first visit
    assert _files(tmp_path / "out") == reference
    assert LocalExecutor(1).writes_here(10**9, 10) and not LocalExecutor(2).writes_here(10**9, 10)
    assert LocalExecutor(2).writes_here(10, 10)  # too few examples to pay for a pool: written here


def test_an_interrupted_exchange_resumes(corpus, reference, tmp_path, monkeypatch):
    _small(monkeypatch)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="stopped after map 2"):
        build(_config(corpus, out), progress=False, hooks=Record(stop=3))
    exchange = out / ".packer" / "exchange"
    assert sorted(p.name for p in exchange.iterdir()) == [f"map-{i:06d}.arrow" for i in range(3)]
    # what a kill leaves: a half-written output under its temp name; and map 1 replaced by map 0's bytes (an
    # output of other positions): neither is taken for map 1's or 3's output
    (exchange / "map-000003.arrow.tmp-123").write_bytes((exchange / "map-000000.arrow").read_bytes()[:100])
    (exchange / "map-000001.arrow").write_bytes((exchange / "map-000000.arrow").read_bytes())
    hooks = Record()
    build(_config(corpus, out), progress=False, hooks=hooks)
    assert 0 not in hooks.written and 2 not in hooks.written  # committed: not written again
    assert 1 in hooks.written and 3 in hooks.written
    assert _files(out) == reference
    assert not exchange.exists()


def test_a_rerun_after_every_shard_is_written_runs_no_exchange(corpus, reference, tmp_path, monkeypatch):
    _small(monkeypatch)
    out = tmp_path / "out"
    build(_config(corpus, out), progress=False)
    (out / "manifest.json").unlink()  # killed before the manifest
    hooks = Record()
    build(_config(corpus, out), progress=False, hooks=hooks)
    assert hooks.written == []
    assert _files(out) == reference


@pytest.mark.slow  # ~30 s wall on a loaded 2-core box (11 CPU-s): moto answers each of ~500 requests slowly
def test_the_exchange_on_an_object_store_writes_the_same_bytes(corpus, tmp_path, monkeypatch):
    """Output on S3 (a moto server): map outputs are objects (written as a temp object, then copied into place),
    read by the writers from this machine's copies, and deleted with their copies once the shards are written.
    Bigger chunks and shards than above: every object costs a few requests."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    import logging

    from packer.shards.store import mirror_dir, store_path
    from tests.pipeline.s3_cluster import s3_server

    monkeypatch.setattr(stages, "CHUNK_LINES", 32)  # 15 chunks
    opts = dict(rows_per_shard=24)  # 5 shards: 4 map tasks
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "EXCHANGE_MIN_SHARDS", 10**9)
        build(_config(corpus, tmp_path / "ref", **opts), progress=False)
    reference = {k: v for k, v in _files(tmp_path / "ref").items() if k != "manifest.json"}
    monkeypatch.setattr(stages, "EXCHANGE_MIN_FAN", 2)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_VISITS", 0)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with s3_server():
        hooks = Record()
        build(_config(corpus, "s3://packer/exchange-out", **opts), progress=False, hooks=hooks)
        root = store_path("s3://packer/exchange-out")
        files = {p.name: p.read_bytes() for p in root.glob("shard-*.parquet")}
        files.update({n: (root / n).read_bytes() for n in ("stats.json", "rejects.jsonl")})
        exchange = root / ".packer" / "exchange"
        assert len(hooks.written) >= 3
        assert not list(exchange.glob("*")) and not mirror_dir(exchange).exists()
    assert files == reference


def test_images_go_through_the_exchange_unchanged(coco_images, tmp_path, monkeypatch):
    """qwen2-vl rows with COCO images, message trees and rejects (test_build's mixed records): the media lists and
    mRoPE positions go through the map outputs (take_rows' per-file path) to the bytes of a build whose writers
    read 512-line chunks."""
    from tests.pipeline.test_build import _mixed_records, _write_jsonl

    (tmp_path / "images").mkdir()
    records = _mixed_records(tmp_path / "images", coco_images[:4])
    for k in range(2):
        _write_jsonl(tmp_path / f"{k}.jsonl", records[k:] + records[:k])
    opts = dict(profile="qwen2-vl", max_length=1024, max_pixels=128 * 28 * 28, rows_per_shard=2, rows_per_row_group=2)
    monkeypatch.chdir(tmp_path)
    build(BuildConfig.from_inputs(["0.jsonl", "1.jsonl"], "ref", **opts), progress=False)
    monkeypatch.setattr(stages, "CHUNK_LINES", 4)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_SHARDS", 2)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_FAN", 1)
    monkeypatch.setattr(stages, "EXCHANGE_MIN_VISITS", 0)
    hooks = Record()
    build(BuildConfig.from_inputs(["0.jsonl", "1.jsonl"], "out", **opts), progress=False, hooks=hooks)
    assert len(hooks.written) >= 2
    assert _files(tmp_path / "out") == _files(tmp_path / "ref")


class FirstSlices(Record):
    """The rows of each shard's first slice (``shard-write``'s table), and the map outputs written."""

    def __init__(self):
        super().__init__()
        self.rows: list[int] = []

    def at(self, point: str, n: int = 0, **state) -> None:
        super().at(point, n, **state)
        if point == "shard-write":
            self.rows.append(state["table"].num_rows)


@pytest.mark.parametrize(("num_proc", "exchange"), [(1, False), (2, False), (1, True), (2, True)])
def test_shards_written_a_row_group_at_a_time_are_the_same_bytes(corpus, reference, tmp_path, monkeypatch, num_proc,
                                                                 exchange):
    """``SLICE_TOKENS`` 1: each shard's rows gathered (from the map outputs: a gather per slice), assembled and
    written one row group (2 packs) at a time, the dense labels and positions in one reused pair of buffers: the
    same files as a whole shard at once."""
    if exchange:
        _small(monkeypatch)
    else:
        monkeypatch.setattr(stages, "CHUNK_LINES", 4)
        monkeypatch.setattr(stages, "EXCHANGE_MIN_SHARDS", 10**9)
    monkeypatch.setattr(stages, "SLICE_TOKENS", 1)
    hooks = FirstSlices()  # (a pool's count in its workers)
    out = tmp_path / "out"
    build(_config(corpus, out, num_proc=num_proc), progress=False, hooks=hooks,
          executor=LocalExecutor(num_proc) if num_proc > 1 else None)
    shards = [pq.ParquetFile(p).metadata for p in sorted(out.glob("shard-*.parquet"))]
    assert len(shards) > 10 and all(m.num_row_groups == 2 for m in shards[:-1])
    if num_proc == 1:
        assert hooks.rows and max(hooks.rows) == 2  # each shard's first slice: one row group of its 4 packs
        assert bool(hooks.written) == exchange  # the writers read the map outputs (or the chunk files)
    assert _files(out) == reference
    assert not (out / ".packer" / "exchange").exists()
