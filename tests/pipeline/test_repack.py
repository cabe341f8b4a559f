"""Repacking without re-tokenizing (issue 32): ``packer repack`` and a rebuild with only packing options changed
reuse the encode cache, and write the bytes of a fresh build with the same options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import ensure_builtin, load_tokenizer
from packer.errors import ConfigError
from packer.pipeline.build import build
from packer.pipeline.cache import CACHE_FORMAT
from packer.pipeline.repack import repack
from packer.report.verify import verify_build


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _sums(out: Path) -> dict[str, str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {s["file"]: s["sha256"] for s in manifest["shards"]}


@pytest.fixture(scope="module")
def images_corpus(tmp_path_factory, coco_images) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for im in coco_images[:3]:
        shutil.copy(im, root / im.name)
    recs = []
    for i in range(40):
        words = " more" * (i * 23)  # 0 .. ~900 words: some over 512 tokens, one over 2048 with the prompt
        if i % 4 == 0:
            content = [{"type": "image", "image": coco_images[i % 3].name}, {"type": "text", "text": f"Q{i}?{words}"}]
        else:
            content = f"Question {i}?{words}"
        recs.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": f"Answer {i}."}]})
    recs.append({"messages": [{"role": "user", "content": "long " * 3000}, {"role": "assistant", "content": "ok"}]})
    return _write_jsonl(root / "data.jsonl", recs)


def _image_config(corpus: Path, out: Path, **kw) -> BuildConfig:
    opts = dict(profile="qwen2-vl", max_length=1024, max_pixels=64 * 28 * 28, rows_per_shard=4, rows_per_row_group=2)
    return BuildConfig.from_inputs([str(corpus)], str(out), **(opts | kw))


def test_repack_of_an_image_build_is_a_fresh_build_and_verifies(images_corpus, tmp_path, monkeypatch):
    first = build(_image_config(images_corpus, tmp_path / "out", keep_up_to=2048), progress=False)
    assert first.stats["rejects_by_reason"] == {"overlong": 1}  # the 3000-word one: over the ceiling too
    monkeypatch.setattr(Encoder, "encode_batch", lambda self, ex: (_ for _ in ()).throw(AssertionError("re-tokenized")))
    for options in ({"max_length": 2048}, {"max_length": 512, "max_vision_tokens": 200, "seed": 3, "algorithm": "ffd"},
                    {"rows_per_shard": 2, "refine": False}):
        new = tmp_path / f"new-{len(list(tmp_path.iterdir()))}"
        result = repack(tmp_path / "out", new, progress=False, **options)
        monkeypatch.undo()
        fresh = build(_image_config(images_corpus, tmp_path / f"fresh-{new.name}", **options), progress=False)
        assert _sums(new) == _sums(fresh.output) and len(_sums(new)) > 1
        assert (new / "rejects.jsonl").read_bytes() == (fresh.output / "rejects.jsonl").read_bytes()
        assert result.stats == fresh.stats
        assert verify_build(new, inputs=[str(images_corpus)]).ok
        monkeypatch.setattr(Encoder, "encode_batch", lambda self, ex: (_ for _ in ()).throw(AssertionError()))
    assert result.stats["rejects_by_reason"] == {"overlong": 1}


def test_repack_beyond_what_the_cache_kept_is_refused(images_corpus, tmp_path):
    build(_image_config(images_corpus, tmp_path / "out"), progress=False)
    with pytest.raises(ConfigError, match=r"keeps examples of up to 1024 tokens; --max-length 2048 needs the longer "
                                          r"ones it never kept: run `packer build` with --max-length 2048"):
        repack(tmp_path / "out", tmp_path / "new", progress=False, max_length=2048)
    with pytest.raises(ConfigError, match="profile decide the encoded examples"):
        repack(tmp_path / "out", tmp_path / "new", progress=False, profile="text")
    # a cache of an older format is refused: rebuild it (1: dense mRoPE positions, no ``format`` in its mark;
    # 2: labels and positions of every example stored)
    mark_path = tmp_path / "out" / ".packer" / "encode" / "fingerprint.json"
    mark = json.loads(mark_path.read_text())
    assert mark["format"] == CACHE_FORMAT == 3
    for older in (None, 2):
        mark_path.write_text(json.dumps({**{k: v for k, v in mark.items() if k != "format"},
                                         **({} if older is None else {"format": older})}))
        with pytest.raises(ConfigError, match=rf"an encode cache of format {older or 1}, this packer reads format 3 "
                                              r".*: rebuild it with its `packer build` command"):
            repack(tmp_path / "out", tmp_path / "new", progress=False, max_length=512)
    assert not (tmp_path / "new").exists()


def test_truncation_makes_max_length_part_of_the_encoding(images_corpus, tmp_path):
    build(_image_config(images_corpus, tmp_path / "out", overlong="truncate"), progress=False)
    with pytest.raises(ConfigError, match="shaped the encoded rows"):
        repack(tmp_path / "out", tmp_path / "new", progress=False, max_length=512)
    with pytest.raises(ConfigError, match="only with overlong: drop"):
        _image_config(images_corpus, tmp_path / "x", overlong="truncate", keep_up_to=2048)


@pytest.fixture(scope="module")
def text_sources(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("text")
    return [_write_jsonl(root / f"{name}.jsonl", [{"text": f"{name} document {i}." + " word" * (7 * i % 300)}
                                                 for i in range(n)]) for name, n in (("web", 700), ("books", 300))]


def _text_config(files: list[Path], out: Path, weights: tuple[float, float] = (1.0, 1.0), **kw) -> BuildConfig:
    sources = [{"name": f.stem, "paths": [str(f)], "weight": w} for f, w in zip(files, weights, strict=True)]
    return BuildConfig.from_dict({"sources": sources, "output": str(out), "profile": "text", "max_length": 256,
                                  "rows_per_shard": 16, **kw})


def test_repack_with_other_weights_on_the_cli_loads_no_tokenizer(text_sources, tmp_path, monkeypatch):
    """Also: the encode mark records what a build needs of the tokenizer and the encode stage keeps every chunk's
    plan columns in one file, so a repack whose tokenizer directory was removed since runs: it calls no
    ``load_tokenizer`` and reads no chunk file's plan columns (only the ids of the rows it rejects)."""
    from packer.pipeline.cache import EncodeCache
    from packer.pipeline.columns import ColumnsFile

    tok = tmp_path / "tok"
    shutil.copytree(ensure_builtin("qwen2-vl"), tok)
    cfg = _text_config(text_sources, tmp_path / "out", tokenizer=str(tok))
    build(cfg, progress=False)
    mark = json.loads((tmp_path / "out" / ".packer" / "encode" / "fingerprint.json").read_text())
    assert mark["columns_bytes"] == (tmp_path / "out" / ".packer" / "encode" / ColumnsFile.NAME).stat().st_size > 0
    assert mark["tokenizer"]["source"] and mark["tokenizer"]["token_ids"] == {"image": None, "video": None,
                                                                              "audio": None}
    fresh = build(_text_config(text_sources, tmp_path / "fresh", (0.5, 2.5), max_length=200, seed=7,
                               tokenizer=str(tok)), progress=False)
    tok.rename(tmp_path / "gone")
    load_tokenizer.cache_clear()
    read, columns = EncodeCache.read, []
    monkeypatch.setattr(EncodeCache, "read", lambda self, i, cols=(): columns.append(cols) or read(self, i, cols))
    monkeypatch.setattr(Encoder, "encode_batch", lambda self, ex: (_ for _ in ()).throw(AssertionError()))
    run = CliRunner().invoke(cli, ["repack", str(tmp_path / "out"), "-o", str(tmp_path / "new"), "--max-length",
                                   "200", "--seed", "7", "--weight", "web=0.5", "--weight", "books=2.5", "-q"])
    assert run.exit_code == 0, run.output
    assert _sums(tmp_path / "new") == _sums(fresh.output) and len(_sums(fresh.output)) > 1
    assert load_tokenizer.cache_info().hits + load_tokenizer.cache_info().misses == 0
    assert set(columns) == {("example_id",)}  # the ids of the rows over --max-length 200, for their rejects
    manifest = json.loads((tmp_path / "new" / "manifest.json").read_text())
    assert manifest["tokenizer"] == fresh.manifest["tokenizer"]
    again = CliRunner().invoke(cli, ["repack", str(tmp_path / "out"), "-o", str(tmp_path / "new"), "-q"])
    assert again.exit_code == 1 and "is not empty; pass --overwrite" in again.stderr
    bad = CliRunner().invoke(cli, ["repack", str(tmp_path / "out"), "-o", str(tmp_path / "b"), "--weight", "x=1"])
    assert bad.exit_code == 1 and "--weight names no source" in bad.stderr
    # a rebuild in place checks the tokenizer's files: gone, it is loaded, and that fails
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        build(cfg.replace(max_length=128, overwrite=True), progress=False)

def test_a_rebuild_in_place_with_other_packing_reuses_the_cache(text_sources, tmp_path, monkeypatch):
    cfg = _text_config(text_sources, tmp_path / "out")
    build(cfg, progress=False)
    chunk = tmp_path / "out" / ".packer" / "encode" / "chunk-000000.arrow"
    before = chunk.stat().st_mtime_ns
    monkeypatch.setattr(Encoder, "encode_batch", lambda self, ex: (_ for _ in ()).throw(AssertionError()))
    with pytest.raises(ConfigError, match="holds a different packer build; pass --overwrite"):
        build(cfg.replace(max_length=128), progress=False)  # as before: --overwrite says the old build may go
    (chunk.parent / "columns.arrow").unlink()  # as a cache made before that file: every chunk's columns read
    load_tokenizer.cache_clear()
    again = build(cfg.replace(max_length=128, algorithm="ffd", overwrite=True), progress=False)
    assert chunk.stat().st_mtime_ns == before
    assert load_tokenizer.cache_info().misses == 0  # its files unchanged: the mark's record serves, none loaded
    monkeypatch.undo()
    fresh = build(cfg.replace(max_length=128, algorithm="ffd", output=str(tmp_path / "fresh")), progress=False)
    assert _sums(tmp_path / "out") == _sums(fresh.output)
    assert again.stats == fresh.stats
    # an encoding option changed: the cache goes, as before
    other = build(cfg.replace(max_length=128, overwrite=True, chat_template="{{ messages }}"), progress=False)
    assert chunk.stat().st_mtime_ns != before and other.stats["examples"] > 0




_FORKED_WRITERS = """
import json, multiprocessing, multiprocessing.pool, sys
from pathlib import Path
from packer.config import BuildConfig
from packer.pipeline import local
from packer.pipeline.build import build
from packer.pipeline.faults import Hooks
from packer.pipeline.repack import repack
from packer.report.verify import verify_build

corpus, tmp = sys.argv[1], Path(sys.argv[2])
opts = dict(profile="qwen2-vl", max_length=1024, max_pixels=64 * 28 * 28, rows_per_shard=4, rows_per_row_group=2)
cfg = lambda out, **kw: BuildConfig.from_inputs([corpus], str(tmp / out), **(opts | kw))
sums = lambda out: [s["sha256"] for s in json.loads((tmp / out / "manifest.json").read_text())["shards"]]

class FailAt(Hooks):  # fails the write of shard n, in whichever process writes it
    def __init__(self, n):
        self.n = n

    def at(self, point, n=0, **state):
        if point == "shard-write" and n == self.n:
            raise OSError(f"injected: shard {n}")

build(cfg("out", keep_up_to=2048), progress=False)
build(cfg("fresh", max_length=512, seed=2, num_proc=2), progress=False)
assert len(sums("fresh")) > 2
started = []  # each pool's initializer
real = multiprocessing.pool.Pool.__init__
multiprocessing.pool.Pool.__init__ = lambda self, *a, **kw: (started.append(a[1]), real(self, *a, **kw))[1]
repack(tmp / "out", tmp / "small", progress=False, max_length=512, seed=2, num_proc=2)
assert started == [local._forked_writer_init] and sums("small") == sums("fresh"), started
repack(tmp / "out", tmp / "one", progress=False, max_length=512, seed=2, num_proc=1)
forkable, local._forkable = local._forkable, lambda **kw: False
repack(tmp / "out", tmp / "here", progress=False, max_length=512, seed=2, num_proc=2)
assert len(started) == 1 and sums("one") == sums("here") == sums("fresh")
local._forkable, min_examples, local.POOL_MIN_EXAMPLES = forkable, local.POOL_MIN_EXAMPLES, 1
repack(tmp / "out", tmp / "large", progress=False, max_length=512, seed=2, num_proc=2)
assert started[1:] == [local._worker_init] and sums("large") == sums("fresh"), started
local.POOL_MIN_EXAMPLES = min_examples
# a shard's error in a forked writer (OUT rebuilt with only packing options changed) fails the build with that
# error and leaves no worker; the rerun keeps what was written and writes the rest
new = cfg("out", keep_up_to=2048).replace(max_length=512, seed=2, num_proc=2, overwrite=True)
try:
    build(new, progress=False, hooks=FailAt(2))
    raise AssertionError("no error")
except OSError as e:
    assert "injected: shard 2" in str(e), e
assert multiprocessing.active_children() == [] and started[2:] == [local._forked_writer_init], started
build(new.replace(overwrite=False), progress=False)
assert sums("out") == sums("fresh") and verify_build(tmp / "out").ok
print("ok")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the writers are forked on Linux only")
def test_a_small_repack_forks_its_writers_and_a_large_one_starts_a_pool(images_corpus, tmp_path):
    """A repack encodes nothing, so no pool is started for it up front: below ``POOL_MIN_EXAMPLES`` per worker
    its write runs on workers forked from this process once it holds what a writer needs (``_write_forked``:
    no worker start), in this process where it cannot fork (or writes with one), above it in a pool started for
    it; every one the bytes of a fresh build. A shard's error in a forked writer fails the build with that
    error and leaves no worker; the rerun resumes to the same bytes. In a fresh process: one with another
    thread (pytest-xdist's) does not fork (``local._forkable``)."""
    run = subprocess.run([sys.executable, "-c", _FORKED_WRITERS, str(images_corpus), str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1:] == ["ok"]


def test_a_repack_process_never_imports_pandas_nor_scipy_linalg(text_sources, tmp_path):
    """pyarrow imports pandas (~0.2 CPU-s, ~40 MiB) at its first conversion only to ask whether an object is a
    pandas one; a repack reads only packer's files, so it tells pyarrow pandas is absent
    (``stages.arrow_without_pandas``): its process (plan and write, below the pool's size) never loads it, and
    pandas stays importable after it. numba's start imports scipy.linalg (~0.25 CPU-s) only for a BLAS choice no
    packer kernel has (``stages.numba_without_scipy``): the repack's process never loads it either, and it
    stays importable. (Its bytes are a fresh build's: the tests above.)"""
    build(_text_config(text_sources, tmp_path / "out"), progress=False)
    new = tmp_path / "new"
    child = ("import sys; from packer.cli import cli\n"
             "try:\n"
             f"    cli(['repack', {str(tmp_path / 'out')!r}, '-o', {str(new)!r}, '--max-length', '200', '-q'])\n"
             "except SystemExit as e:\n"
             "    assert not e.code, e.code\n"
             "print('pandas' in sys.modules, 'numba.np.arraymath' in sys.modules, 'scipy.linalg' in sys.modules)\n"
             "import pyarrow.parquet as pq\n"
             f"print(type(pq.read_table({str(new / 'shard-00000.parquet')!r}).to_pandas()).__name__)\n"
             "import scipy.linalg\n"
             "print(scipy.linalg.norm([3.0, 4.0]))\n")
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True", "False", "DataFrame", "5.0"]
