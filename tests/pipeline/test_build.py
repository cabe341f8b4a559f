"""End to end: JSONL -> packer build -> shards; every example comes back exactly, nothing is lost."""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError
from packer.formats.read import read_jsonl
from packer.models import get_profile
from packer.pipeline.build import build
from packer.pipeline.executor import Executor
from packer.pipeline.faults import Hooks
from packer.pipeline.stages import CHUNK_LINES, encode_chunk, write_shard_range
from packer.shards.io import open_shards
from packer.train.dataset import PackedDataset


def _write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def _mixed_records(img_dir: Path, images: list[Path]) -> list:
    for im in images:
        shutil.copy(im, img_dir / im.name)
    names = [im.name for im in images]
    recs: list = []
    for i in range(12):
        recs.append({"messages": [
            {"role": "user", "content": f"Question {i}: what is {i} + {i}?" + " more" * (i * 7)},
            {"role": "assistant", "content": f"It is {2 * i}."}]})
    for i, n in enumerate(names):
        recs.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"images/{n}"}, {"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": f"Image number {i}."}]})
    recs.append({"messages": [{"role": "user", "content": [{"type": "image", "image": f"images/{names[0]}"},
                                                           {"type": "text", "text": "Caption it."}]}],
                 "branches": [[{"role": "assistant", "content": "A first caption."}],
                              [{"role": "assistant", "content": "A second, longer caption."}],
                              {"messages": [{"role": "assistant", "content": "Third."}],
                               "branches": [[{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}],
                                            [{"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}]]}]})
    recs.append({"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"},
                                   {"from": "gpt", "value": "Something."}], "image": f"images/{names[1]}"})
    recs.append({"text": "Plain text pretraining data. " * 5})
    # bad lines: each must be rejected with its reason, never crash the build
    recs.append("{not json")
    recs.append({"messages": [{"role": "user", "content": [{"type": "image", "image": "images/missing.jpg"}]},
                              {"role": "assistant", "content": "x"}]})
    recs.append({"messages": [{"role": "user", "content": "only a question"}]})  # no loss tokens
    recs.append({"unknown": 1})
    recs.append({"messages": [{"role": "user", "content": "long " * 3000}, {"role": "assistant", "content": "ok"}]})
    return recs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, coco_images):
    root = tmp_path_factory.mktemp("corpus")
    (root / "images").mkdir()
    path = _write_jsonl(root / "data.jsonl", _mixed_records(root / "images", coco_images[:4]))
    return path


def _config(corpus: Path, out: Path, **kw) -> BuildConfig:
    opts = dict(profile="qwen2-vl", max_length=1024, max_pixels=128 * 28 * 28, rows_per_shard=3, rows_per_row_group=2)
    opts.update(kw)
    return BuildConfig.from_inputs([str(corpus)], str(out), **opts)


def _shard_sums(result) -> list[str]:
    return [s["sha256"] for s in result.manifest["shards"]]


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "out"
    result = build(_config(corpus, out), progress=False)
    return corpus, out, result


def test_every_example_roundtrips_exactly(built):
    corpus, out, result = built
    cfg = result.manifest["config"]
    profile = get_profile("qwen2-vl", max_pixels=cfg["max_pixels"])
    encoder = Encoder(load_tokenizer("qwen2-vl"), profile, max_length=1024)
    expected = {}
    for _, ex in read_jsonl(str(corpus)):
        if not isinstance(ex, Exception):
            try:
                enc = encoder.encode(ex)
            except Exception:
                continue
            expected[enc.example_id] = enc
    got = {}
    for row in PackedDataset(out, shuffle=False, load_images=False):
        cu = row["cu_seqlens"]
        nodes, parents = row["node_offsets"], row["node_parents"]
        mrope = row["mrope_position_ids"]
        for k, ex_id in enumerate(row["example_ids"]):
            lo, hi = int(cu[k]), int(cu[k + 1])
            sel = (nodes >= lo) & (nodes < hi)
            first = int(np.flatnonzero(sel)[0])
            got[ex_id] = {
                "input_ids": row["input_ids"][lo:hi], "labels": row["labels"][lo:hi],
                "position_ids": row["position_ids"][lo:hi], "mrope": mrope[:, lo:hi],
                "node_offsets": nodes[sel] - lo, "node_parents": np.where(parents[sel] < 0, -1, parents[sel] - first),
            }
    assert set(got) == set(expected)
    for ex_id, enc in expected.items():
        g = got[ex_id]
        np.testing.assert_array_equal(g["input_ids"], enc.input_ids)
        np.testing.assert_array_equal(g["labels"], enc.labels)
        np.testing.assert_array_equal(g["position_ids"], enc.position_ids)
        np.testing.assert_array_equal(g["mrope"], enc.mrope_position_ids)
        np.testing.assert_array_equal(g["node_offsets"], enc.node_offsets)
        np.testing.assert_array_equal(g["node_parents"], enc.node_parents)


def test_inputs_equal_packed_plus_rejects(built):
    corpus, out, result = built
    lines = sum(1 for line in open(corpus) if line.strip())
    totals = result.manifest["totals"]
    assert totals["input_records"] == lines
    assert totals["examples"] + totals["rejected"] == lines
    rejects = [json.loads(line) for line in open(out / "rejects.jsonl")]
    assert len(rejects) == totals["rejected"] == 5
    assert Counter(r["reason"] for r in rejects) == Counter(
        {"malformed_json": 1, "missing_image": 1, "no_loss_tokens": 1, "unknown_format": 1, "overlong": 1})
    assert all(r["path"] == str(corpus) and r["line"] > 0 for r in rejects)
    assert result.stats["rejects_by_reason"]["overlong"] == 1


def test_packs_respect_capacity_and_manifest(built):
    _, out, result = built
    shards = open_shards(out)
    assert shards.num_rows == result.stats["packs"]
    rows = list(PackedDataset(out, shuffle=False, load_images=False))
    assert all(len(r["input_ids"]) <= 1024 for r in rows)
    assert sum(len(r["example_ids"]) for r in rows) == result.stats["examples"]
    assert result.stats["packs"] >= result.stats["lower_bound_packs"]
    assert 0 < result.stats["efficiency"] <= 1


@pytest.mark.slow
def test_rebuild_is_byte_identical_and_parallel_matches(built, corpus, tmp_path):
    _, out, result = built
    again = build(_config(corpus, tmp_path / "again", num_proc=2), progress=False)
    assert _shard_sums(again) == _shard_sums(result)


class _ReversedExecutor(Executor):
    """Runs each stage's tasks last to first, in this process, and yields the results in task order: an
    executor that finishes tasks in another order and defines only ``encode`` and ``write`` (the optional
    steps are ``Executor``'s no-ops, packer/pipeline/executor.py)."""

    def encode(self, chunks, *, encoder, cache, config, hooks):
        done = {c.index: encode_chunk(c, encoder=encoder, cache=cache, config=config, hooks=hooks)
                for c in reversed(chunks)}
        yield from (done[c.index] for c in chunks)

    def write(self, ranges, *, cache, config, hooks):
        done = [write_shard_range(r, cache=cache, config=config, hooks=hooks) for r in reversed(ranges)]
        yield from reversed(done)


@pytest.mark.slow
def test_another_executor_writes_the_same_bytes(corpus, tmp_path):
    local = build(_config(corpus, tmp_path / "local", rows_per_shard=1), progress=False)
    other = build(_config(corpus, tmp_path / "reversed", rows_per_shard=1), progress=False,
                  executor=_ReversedExecutor())
    assert len(local.manifest["shards"]) > 1
    assert _shard_sums(other) == _shard_sums(local)


class _CollectorSeen(Hooks):
    """Records whether Python's cyclic collector was on when each chunk's rejects were written."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def at(self, point: str, n: int = 0, **state) -> None:
        if point == "encode-partial":
            self.seen.append(gc.isenabled())


def test_chunks_encode_with_the_collector_paused(corpus, tmp_path):
    """``stages.encode_chunk`` runs a chunk with the cyclic collector off and turns it back on after (on where it
    was on: this in-process build's), the same bytes either way (the golden builds)."""
    hooks = _CollectorSeen()
    assert gc.isenabled()
    build(_config(corpus, tmp_path / "out"), progress=False, hooks=hooks)
    assert hooks.seen and not any(hooks.seen)
    assert gc.isenabled()


def test_existing_other_build_is_not_overwritten(built, corpus):
    _, out, _ = built
    with pytest.raises(ConfigError, match="--overwrite"):
        build(_config(corpus, out, max_length=2048), progress=False)


def test_image_token_option_for_llava_style_templates(tmp_path, coco_images):
    """A tokenizer whose template writes another placeholder (LLaVA's `<image>`): --image-token names it."""
    template = ("{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}"
                "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_pad|>"
                "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}")
    shutil.copy(coco_images[0], tmp_path / "a.jpg")
    data = _write_jsonl(tmp_path / "d.jsonl", [{"conversations": [
        {"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A photo."}], "image": "a.jpg"}])
    cfg = BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="llava", tokenizer="qwen2-vl",
                                  image_token="<|vision_pad|>", chat_template=template, max_length=1024)
    result = build(cfg, progress=False)
    assert result.stats["examples"] == 1 and result.stats["vision_tokens"] == 576
    (row,) = list(PackedDataset(tmp_path / "out", shuffle=False, load_images=False))
    pad = load_tokenizer("qwen2-vl").convert_tokens_to_ids("<|vision_pad|>")
    assert int((row["input_ids"] == pad).sum()) == 576
    assert row["images"][0]["num_tokens"] == 576


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OTHER = CHATML.replace("<|im_start|>{{ m['role'] }}\n", "<|im_start|>{{ m['role'] }}: ")


def _template_build(tmp_path: Path, template: str) -> BuildConfig:
    """A text-profile build of two chats with ``--chat-template FILE`` holding ``template``."""
    data = _write_jsonl(tmp_path / "d.jsonl", [
        {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Fine."}]}])
    path = tmp_path / "template.jinja"
    path.write_text(template)
    return BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="text", chat_template=str(path),
                                   max_length=256)


@pytest.mark.slow
def test_editing_the_chat_template_file_is_another_build(tmp_path):
    """The template FILE's contents are part of the build: after an edit the rerun does not resume from the
    encode cache of the old template (it refuses, like any other build), and --overwrite rebuilds with the
    new one, byte for byte a fresh build."""
    cfg = _template_build(tmp_path, CHATML)
    first = build(cfg, progress=False)
    Path(cfg.chat_template).write_text(OTHER)
    with pytest.raises(ConfigError, match="holds a different packer build; pass --overwrite"):
        build(cfg, progress=False)
    again = build(cfg.replace(overwrite=True), progress=False)
    fresh = build(cfg.replace(output=str(tmp_path / "fresh")), progress=False)
    assert _shard_sums(again) == _shard_sums(fresh) != _shard_sums(first)


def test_manifest_hashes_the_chat_template_used(tmp_path):
    """``chat_template_sha256`` is the template the build rendered with: the --chat-template file's, not the
    tokenizer's own."""
    result = build(_template_build(tmp_path, OTHER), progress=False)
    assert result.manifest["chat_template_sha256"] == hashlib.sha256(OTHER.encode()).hexdigest()
    default = build(BuildConfig.from_inputs([str(tmp_path / "d.jsonl")], str(tmp_path / "default"), profile="text",
                                            max_length=256), progress=False)
    own = load_tokenizer("qwen2-vl").chat_template
    assert default.manifest["chat_template_sha256"] == hashlib.sha256(own.encode()).hexdigest()


class _RecordPids(Hooks):
    """Touches ``POINT-N-PID`` in ``root`` at each encoded chunk and each written shard."""

    def __init__(self, root: Path):
        self.root = str(root)

    def at(self, point: str, n: int = 0, **state) -> None:
        if point in ("encode-partial", "shard"):
            Path(self.root, f"{point}-{n}-{os.getpid()}").touch()


@pytest.mark.slow
def test_one_pool_encodes_and_writes(tmp_path):
    """``--num-proc 2``: the write stage runs in the encode stage's workers (no second pool), which are gone
    when the build returns; the bytes equal a one-process build's."""
    lines = [{"messages": [{"role": "user", "content": f"Count to {i}."},
                           {"role": "assistant", "content": " ".join(map(str, range(i % 40 + 1)))}]}
             for i in range(CHUNK_LINES + 100)]  # two encode chunks
    corpus = _write_jsonl(tmp_path / "count.jsonl", lines)
    pids = tmp_path / "pids"
    pids.mkdir()
    opts = dict(profile="qwen2-vl", max_length=512, rows_per_shard=8)
    one = build(BuildConfig.from_inputs([str(corpus)], str(tmp_path / "one"), **opts), progress=False)
    two = build(BuildConfig.from_inputs([str(corpus)], str(tmp_path / "two"), num_proc=2, **opts), progress=False,
                hooks=_RecordPids(pids))
    assert _shard_sums(two) == _shard_sums(one) and len(one.manifest["shards"]) > 1
    by_point: dict[str, set[int]] = {}
    for f in pids.iterdir():
        point, _, pid = f.name.rsplit("-", 2)
        by_point.setdefault(point, set()).add(int(pid))
    assert by_point["shard"] <= by_point["encode-partial"] and os.getpid() not in by_point["shard"]
    assert not multiprocessing.active_children()
    assert not list((tmp_path / "two" / ".packer").rglob("encoder.pkl*"))
    assert not list(Path(tempfile.gettempdir()).glob(f"encoder.pkl.tmp-{os.getpid()}-*"))  # preload's file



def test_a_plan_that_waits_on_its_kernels_says_so(monkeypatch, capsys):
    """Past ``WARM_NOTICE_S`` of waiting on the warm-planner thread (numba compiling the kernels on a first build:
    ~1 min, docs/benchmarks.md) the plan shows a bar naming the wait; a thread done in time shows none, and
    ``--quiet`` (no progress) never does. A thread sleeping stands in for the compile, which takes a minute."""
    import threading
    import time

    from packer.pipeline import build as build_module

    monkeypatch.setattr(build_module, "WARM_NOTICE_S", 0.05)
    notice = "kernels (numba compiles them once per install)"
    for progress, seconds, shown in ((True, 0.5, True), (False, 0.5, False), (True, 0.0, False)):
        warm = threading.Thread(target=time.sleep, args=(seconds,))
        warm.start()
        if not seconds:
            warm.join()
        build_module._join_warm(warm, progress=progress)
        assert not warm.is_alive()
        assert (notice in capsys.readouterr().err) is shown, (progress, seconds)
