"""The encoder a forked-pool build keeps between builds (pipeline/kept.py, ``encoder_entry``): the helper's pickled
encoder and tokenizer record under ``$PACKER_CACHE/engines``, used by the next build of the same tokenizer files,
options, packer source and installed versions instead of loading the tokenizer again. Any change of what the
encoder is made from misses (and keeps a new entry); a damaged entry is today's path; the shards are the same
with and without it; the entry is never in OUT."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packer.config import BuildConfig
from packer.encode.tokenizers import ensure_builtin
from packer.pipeline import kept as kept_store
from packer.pipeline.stages import CHUNK_LINES


def _tokenizer_copy(tmp_path: Path) -> Path:
    """qwen2-vl's builtin tokenizer as a user's own directory (its files' mtimes this test's to change)."""
    tok = tmp_path / "tok"
    shutil.copytree(ensure_builtin("qwen2-vl"), tok)
    return tok


def test_the_key_follows_everything_the_encoder_is_made_from(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    tok = _tokenizer_copy(tmp_path)
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    def entry(**opts):
        config = BuildConfig.from_inputs(["x.jsonl"], str(tmp_path / "out"), **{
            "profile": "qwen2-vl", "tokenizer": str(tok), "max_length": 512, **opts})
        return kept_store.encoder_entry(config, opts.get("max_length", 512))

    path, key = entry()
    assert path.parent == tmp_path / "cache" / "engines" and path.suffix == ".encoder"
    assert entry() == (path, key)
    assert entry(num_proc=2, rows_per_shard=8, seed=3) == (path, key)  # options the encoder never reads
    # a new version of the same files (a touched tokenizer file, an edited packer module): the same entry's file,
    # another key (the build replaces the entry)
    stat = (tok / "tokenizer_config.json").stat()
    os.utime(tok / "tokenizer_config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    touched = entry()
    assert touched[0] == path and touched[1] != key
    # another environment sharing this cache (another venv, another checkout): its own entry's file, so that two
    # installs building by turns do not replace each other's entry at every build
    monkeypatch.setattr(kept_store.sys, "prefix", str(tmp_path / "other-venv"))
    assert entry()[0] != path
    monkeypatch.undo()
    monkeypatch.setenv("PACKER_CACHE", str(tmp_path / "cache"))
    # what the encoder is made from: its own entry each
    others = [entry(chat_template=str(template)), entry(max_length=256), entry(overlong="truncate"),
              entry(profile_options={"max_pixels": 200_000}), entry(long_docs="split")]
    template.write_text(template.read_text() + "{# a comment #}")
    others.append(entry(chat_template=str(template)))
    assert len({p for p, _ in others} | {path}) == len(others) + 1
    assert len({k for _, k in others} | {key, touched[1]}) == len(others) + 2
    # a hub name: nothing kept
    assert kept_store.encoder_entry(BuildConfig.from_inputs(["x.jsonl"], str(tmp_path / "o"), profile="qwen2-vl",
                                                        tokenizer="Org/not-a-dir"), None) is None


def test_an_entry_is_read_only_whole_and_under_its_key(tmp_path):
    path = tmp_path / "e.encoder"
    record = {"fingerprint": "f", "source": [["a", 1, 2]]}
    kept_store.keep_entry(path, "key", b"\x80pickle bytes", record)
    assert kept_store.read_entry(path, "key") == (b"\x80pickle bytes", record)
    assert kept_store.read_entry(path, "another key") is None
    raw = path.read_bytes()
    for damaged in (raw[:-1], raw[:-1] + b"?", raw[:10], b"", raw.replace(kept_store.ENTRY_MAGIC, b"packer-encoder-entry 0\n")):
        path.write_bytes(damaged)
        assert kept_store.read_entry(path, "key") is None
    assert kept_store.read_entry(tmp_path / "none.encoder", "key") is None
    path.write_bytes(raw)
    assert kept_store.read_entry(path, "key") is not None
    path.chmod(0o666)  # a pickle that others may write is never loaded
    assert kept_store.read_entry(path, "key") is None
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temp file, renamed


_KEPT = """
import json, os, sys
from pathlib import Path
import multiprocessing, tempfile, threading
import packer.pipeline.build as build_module
import packer.pipeline.kept as kept_store
import packer.pipeline.local as local
from packer.config import BuildConfig, SourceConfig
from packer.errors import ConfigError
from packer.pipeline.build import build

corpus, out, tok = sys.argv[1], sys.argv[2], sys.argv[3]
opts = dict(profile="qwen2-vl", tokenizer=tok, max_length=512, rows_per_shard=8)
loads = []  # what each load_encoder of a forked pool took: "kept" (the entry), "made" (the helper or serial way)
load_kept = local.LocalExecutor._load_kept
def spy(self, *args):
    got = load_kept(self, *args)
    loads.append("kept" if got is not None else "bad entry")
    return got
local.LocalExecutor._load_kept = spy
here = []  # the scans run in this process (a kept encoder's, while fastokens builds), not on a pool worker
scan_chunks = build_module.scan_chunks
def scan_here(*args, **kwargs):
    here.append(os.getpid())
    return scan_chunks(*args, **kwargs)
build_module.scan_chunks = scan_here

def run(name, **more):
    n, m = len(loads), len(here)
    result = build(BuildConfig.from_inputs([corpus], out + "-" + name, num_proc=2, **opts, **more), progress=False)
    taken = loads[n:] or ["made"]
    taken += ["scanned here"] if here[m:] == [os.getpid()] else []
    return [s["sha256"] for s in result.manifest["shards"]], taken, result.manifest["tokenizer"]["fingerprint"]

engines = Path(os.environ["PACKER_CACHE"]) / "engines"
first = run("first")  # nothing kept: the serial way, keeping fastokens' string and the entry
(entry,) = engines.glob("*.encoder")
second = run("second")  # the entry: no helper, no tokenizer load
raw = entry.read_bytes()
entry.write_bytes(raw[:-100] + bytes(100))  # damaged: its sha256 fails, so the helper's way, which replaces it
damaged = run("damaged")
assert entry.read_bytes() == raw
config = BuildConfig.from_inputs([corpus], out + "-x", **opts)
path, key = kept_store.encoder_entry(config, 512)
_, record = kept_store.read_entry(path, key)
kept_store.keep_entry(path, key, b"not a pickle", record)  # whole, but its pickle does not load
bad = run("bad")
assert entry.read_bytes() == raw
template = Path(tok) / "chat_template.jinja"
os.utime(template, ns=(template.stat().st_atime_ns, template.stat().st_mtime_ns + 1_000_000))
touched = run("touched")  # the tokenizer's files changed: its entry's key no longer holds; made and kept again
assert entry.read_bytes() != raw and kept_store.read_entry(path, key) is None
again = run("again")
# the scan's error on a kept encoder (run here, while fastokens builds): raised as the pool's would be, and the
# build leaves no thread, process or encoder file behind
twice = BuildConfig(sources=(SourceConfig(name="a", paths=(corpus,)), SourceConfig(name="b", paths=(corpus,))),
                    output=out + "-twice", num_proc=2, **opts)
n = len(loads)
try:
    build(twice, progress=False)
    raise AssertionError("no error")
except ConfigError as e:
    assert "named by two sources" in str(e), e
assert loads[n:] == ["kept"], loads[n:]
assert threading.active_count() == 1 and not multiprocessing.active_children()
assert not list(Path(tempfile.gettempdir()).glob(f"encoder.pkl.tmp-{os.getpid()}-*"))
# the same on the helper's way (fastokens' string kept, no entry): scanned here too, beside the native build
for e in engines.glob("*.encoder"):
    e.unlink()
n, m = len(loads), len(here)
try:
    build(twice, progress=False)
    raise AssertionError("no error")
except ConfigError as e:
    assert "named by two sources" in str(e), e
assert loads[n:] == [] and here[m:] == [os.getpid()], (loads[n:], here[m:])
assert threading.active_count() == 1 and not multiprocessing.active_children()
assert not list(Path(tempfile.gettempdir()).glob(f"encoder.pkl.tmp-{os.getpid()}-*"))
print(json.dumps({"runs": [first, second, damaged, bad, touched, again],
                  "in_out": [str(p) for p in Path(out).parent.rglob("*.encoder") if engines not in p.parents]}))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the pool is forked on Linux only")
def test_a_kept_encoder_writes_what_a_made_one_writes(tmp_path):
    """A build that finds the entry forks its pool from the kept encoder and writes the same shards as one that
    loads the tokenizer; a damaged entry (bytes, or a pickle that does not load) and a touched tokenizer file
    take the helper's way and keep a new entry. A kept encoder's build, and the helper's way, scan in this process
    while fastokens builds (``LocalExecutor.load_encoder``), and the scan's error reaches the caller with nothing
    left running."""
    tok = _tokenizer_copy(tmp_path)
    lines = [{"messages": [{"role": "user", "content": f"Count to {i}."},
                           {"role": "assistant", "content": " ".join(map(str, range(i % 40 + 1)))}]}
             for i in range(CHUNK_LINES + 100)]  # two encode chunks: the pool encodes
    corpus = tmp_path / "count.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "builds").mkdir()
    run = subprocess.run([sys.executable, "-c", _KEPT, str(corpus), str(tmp_path / "builds" / "out"), str(tok)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "PACKER_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    shards, taken, fingerprints = zip(*got["runs"], strict=True)
    assert list(taken) == [["made"], ["kept", "scanned here"], ["made", "scanned here"],
                           ["bad entry", "scanned here"], ["made", "scanned here"], ["kept", "scanned here"]]
    assert all(s == shards[0] for s in shards) and len(shards[0]) > 1
    assert len(set(fingerprints)) == 1
    assert got["in_out"] == []


def test_entries_past_the_cap_go_least_recently_used_first(tmp_path):
    t = 1_700_000_000 * 10**9
    for i in range(kept_store.ENTRIES_KEPT + 2):
        kept_store.keep_entry(tmp_path / f"{i}.encoder", "key", b"x", {})
        os.utime(tmp_path / f"{i}.encoder", ns=(t + i, t + i))
    assert sorted(int(p.stem) for p in tmp_path.glob("*.encoder")) == list(range(2, kept_store.ENTRIES_KEPT + 2))
    os.utime(tmp_path / "2.encoder", ns=(t + 100, t + 100))  # used (load_encoder touches the entry it takes)
    kept_store.keep_entry(tmp_path / "new.encoder", "key", b"x", {})
    assert not (tmp_path / "3.encoder").exists() and (tmp_path / "2.encoder").exists()
    assert len(list(tmp_path.glob("*.encoder"))) == kept_store.ENTRIES_KEPT


def test_the_key_covers_every_field_make_encoder_reads():
    """The key names the options ``make_encoder`` reads by hand (``kept.encoder_entry``): a field read there and missing
    from the key would hand a later build an encoder made with another value. Any new read fails here first."""
    import ast
    import inspect
    import textwrap

    from packer import config as config_module

    tree = ast.parse(textwrap.dedent(inspect.getsource(config_module.make_encoder)))
    reads = {n.attr for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config"}
    passed = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and any(isinstance(a, ast.Name) and a.id == "config" for a in n.args)}
    keyed = {"tokenizer_name", "profile", "profile_overrides", "max_length", "overlong", "long_docs",
             "long_docs_overlap"}
    assert reads == keyed, f"make_encoder reads {sorted(reads - keyed)}: add them to kept_store.encoder_entry's key"
    assert passed == {"chat_template_source"}, f"make_encoder passes the config to {sorted(passed)}: key what they read"
    key_source = inspect.getsource(kept_store.encoder_entry)
    for name in keyed - {"tokenizer_name"}:
        assert f"config.{name}" in key_source, name
    assert "chat_template_source(config)" in key_source and "tokenizer_source(name)" in key_source
