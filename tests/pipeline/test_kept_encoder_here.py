"""The kept encoder (pipeline/kept.py, ``encoder_entry``) where a build makes its encoder in its own process:
one process (``--num-proc 1``, the default), a spawned pool, Ray's driver (``Executor.load_encoder``). The same
entries, key and refusals as a forked pool's build (test_kept_encoder.py): a build finds its entry and imports no
transformers; any change of what the encoder is made from (a touched tokenizer file, another chat template, a
profile option) makes it again and keeps a new entry; a damaged entry is made again; the kept profile must be the
build's own (a profile registered at run time is defined outside packer's files); a process that holds the
tokenizer loaded makes its encoder from it. The shards are the same whichever way the encoder came."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packer.config import BuildConfig
from packer.encode.tokenizers import ensure_builtin, load_tokenizer, loaded_tokenizer
from packer.pipeline import kept as kept_store
from packer.pipeline.local import LocalExecutor


def _tokenizer_copy(tmp_path: Path) -> Path:
    """qwen2-vl's builtin tokenizer as a user's own directory (its files' mtimes this test's to change)."""
    tok = tmp_path / "tok"
    shutil.copytree(ensure_builtin("qwen2-vl"), tok)
    return tok


def _corpus(path: Path, n: int = 300) -> Path:
    lines = [{"messages": [{"role": "user", "content": f"Count to {i}, caf\u00e9."},
                           {"role": "assistant", "content": " ".join(map(str, range(i % 40 + 1)))}]}
             for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


_BUILD = """
import json, sys
import packer.pipeline.kept as kept_store
from packer.config import BuildConfig
from packer.pipeline.build import build

corpus, out, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
taken = []
kept_encoder = kept_store.kept_encoder
def spy(*args):
    got = kept_encoder(*args)
    taken.append("kept" if got.encoder is not None else "made")
    return got
kept_store.kept_encoder = spy
result = build(BuildConfig.from_inputs([corpus], out, **opts), progress=False)
print(json.dumps({"shards": [s["sha256"] for s in result.manifest["shards"]], "taken": taken,
                  "fingerprint": result.manifest["tokenizer"]["fingerprint"],
                  "transformers": "transformers" in sys.modules}))
"""


@pytest.mark.slow
def test_a_one_process_build_takes_the_kept_encoder_and_every_change_makes_it(tmp_path):
    """Each build in a fresh process, as a user's `packer build` runs: the first makes the encoder and keeps it,
    the second takes it (no transformers import) and writes the same shards; an entry others may write, another
    chat template and a profile option each make it again (another template's is kept: the next build with it
    takes it); the shards and the tokenizer fingerprint never change. A damaged entry and a touched tokenizer
    file are the forked pool's test (test_kept_encoder.py): the refusals are ``kept_encoder``'s, whichever
    process takes the entry, and each run here is a fresh process's import, encoder and native build."""
    tok = _tokenizer_copy(tmp_path)
    corpus = _corpus(tmp_path / "count.jsonl")
    cache = tmp_path / "cache"
    engines = cache / "engines"
    template = tmp_path / "same.jinja"  # the tokenizer's own template and a comment: other bytes, the same text
    template.write_text(json.loads((tok / "tokenizer_config.json").read_text()).get("chat_template")
                        or (tok / "chat_template.jinja").read_text())
    template.write_text(template.read_text() + "{# the same template #}")
    runs: list[dict] = []
    (tmp_path / "builds").mkdir()

    def run(**more):
        opts = {"profile": "qwen2-vl", "tokenizer": str(tok), "max_length": 512, "rows_per_shard": 8, **more}
        got = subprocess.run([sys.executable, "-c", _BUILD, str(corpus), str(tmp_path / "builds" / str(len(runs))),
                              json.dumps(opts)], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "PACKER_CACHE": str(cache)})
        assert got.returncode == 0, got.stderr[-3000:]
        runs.append(json.loads(got.stdout.strip().splitlines()[-1]))
        return runs[-1]

    first = run()
    assert first["taken"] == ["made"] and first["transformers"]
    (entry,) = engines.glob("*.encoder")
    second = run()
    assert second["taken"] == ["kept"] and not second["transformers"]  # no transformers import, no tokenizer load
    os.chmod(entry, 0o644 | 0o020)  # a file others may write is never loaded: made, and kept again as its own
    assert run()["taken"] == ["made"] and entry.stat().st_mode & 0o022 == 0
    assert run(chat_template=str(template))["taken"] == ["made"]  # another template's text: its own entry
    assert run(chat_template=str(template))["taken"] == ["kept"]
    template.write_text(template.read_text() + "{# edited #}")
    assert run(chat_template=str(template))["taken"] == ["made"]
    assert run(profile_options={"max_pixels": 200_704})["taken"] == ["made"]  # a profile option: its own entry
    assert len(list(engines.glob("*.encoder"))) == 4  # each key its own entry, none taking another's place
    last = run()
    assert last["taken"] == ["kept"] and not last["transformers"]
    assert all(r["shards"] == first["shards"] for r in runs) and first["shards"]
    assert len({r["fingerprint"] for r in runs}) == 1
    assert not list((tmp_path / "builds").rglob("*.encoder"))  # nothing kept in the outputs


def test_a_kept_encoder_serves_only_its_own_key_and_profile(tmp_path, monkeypatch):
    """``kept_encoder`` in this process: none before a build keeps one; the encoder an earlier ``load_encoder``
    kept, under its key (the tokenizer files, the options); an entry whose pickled profile is not the build's
    (a profile registered at run time changed meanwhile) or whose pickle does not load is made again."""
    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    tok = _tokenizer_copy(tmp_path)
    config = BuildConfig.from_inputs(["x.jsonl"], str(tmp_path / "out"), profile="qwen2-vl", tokenizer=str(tok),
                                     max_length=512)
    assert kept_store.kept_encoder(config, 512).encoder is None
    executor = LocalExecutor(1)
    made, record = executor.load_encoder(config, max_length=512)  # made (loads the tokenizer), and kept
    assert made.tokenizer is not None and loaded_tokenizer(str(tok)) is made.tokenizer
    kept = kept_store.kept_encoder(config, 512)
    assert kept.encoder is not None and kept.record == record and kept.encoder.tokenizer is None
    assert kept.encoder.engine_json() == made.engine_json() and kept.encoder.max_length == 512
    assert kept_store.kept_encoder(config, 256).encoder is None  # another max_length: another key
    # a process holding the tokenizer makes its encoder from it and reads no entry
    again, again_record = executor.load_encoder(config, max_length=512)
    assert again.tokenizer is made.tokenizer and again_record == record
    # the same key, another profile inside (as a run-time profile edited since): refused, and made again
    other = BuildConfig.from_inputs(["x.jsonl"], str(tmp_path / "out"), profile="qwen2-vl", tokenizer=str(tok),
                                    max_length=512, profile_options={"max_pixels": 200_704})
    path, key = kept_store.encoder_entry(config, 512)
    kept_store.keep_encoder(kept_store.Kept((path, key)), executor.load_encoder(other, max_length=512)[0], record)
    assert kept_store.read_entry(path, key) is not None and kept_store.kept_encoder(config, 512).encoder is None
    kept_store.keep_entry(path, key, b"not a pickle", record)
    assert kept_store.kept_encoder(config, 512).encoder is None
    # a process that no longer holds it: the entry again (kept by a build that made it)
    del made, again
    load_tokenizer.cache_clear()
    gc.collect()
    assert loaded_tokenizer(str(tok)) is None
    remade, _ = LocalExecutor(1).load_encoder(config, max_length=512)  # the pickle did not load: made, kept
    del remade
    load_tokenizer.cache_clear()
    gc.collect()
    taken, taken_record = LocalExecutor(1).load_encoder(config, max_length=512)
    assert taken.tokenizer is None and taken_record == record  # from the entry


_TWICE = """
import json, sys
from packer.encode import fastokens_bpe
from packer.config import BuildConfig
from packer.pipeline.build import build

corpus, out, tok = sys.argv[1], sys.argv[2], sys.argv[3]
built = []
build_native = fastokens_bpe.build_native
fastokens_bpe.build_native = lambda json: built.append(1) or build_native(json)
runs = [build(BuildConfig.from_inputs([corpus], out + str(k), profile="qwen2-vl", tokenizer=tok, max_length=512),
              progress=False) for k in range(2)]
print(json.dumps({"built": len(built), "transformers": "transformers" in sys.modules,
                  "shards": [[s["sha256"] for s in r.manifest["shards"]] for r in runs]}))
"""


@pytest.mark.slow
def test_builds_in_one_process_build_the_native_tokenizer_once(tmp_path):
    """Two one-process builds in one process (a notebook's) that each take the kept encoder: each encoder is a new
    object (a new weak key for fastokens), yet the native tokenizer is built once (``FastokensBPE.prepare_here``),
    as for a process that keeps the tokenizer loaded; the first process's builds keep the entry."""
    tok = _tokenizer_copy(tmp_path)
    corpus = _corpus(tmp_path / "count.jsonl", 50)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PACKER_CACHE": str(tmp_path / "cache")}
    got = []
    for name in ("made", "kept"):
        run = subprocess.run([sys.executable, "-c", _TWICE, str(corpus), str(tmp_path / name), str(tok)],
                             capture_output=True, text=True, timeout=600, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        got.append(json.loads(run.stdout.strip().splitlines()[-1]))
    made, kept = got
    assert made["built"] == 1 and made["transformers"]  # the second build: the tokenizer loaded, made from it
    assert kept["built"] == 1 and not kept["transformers"]  # both from the entry, the native tokenizer built once
    assert made["shards"][0] == made["shards"][1] == kept["shards"][0] == kept["shards"][1]
