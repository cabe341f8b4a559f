"""OnlinePackedDataset: PackedDataset's rows from raw JSONL, every example once over ranks and workers, exact
resume, the build's rejects. The reference is a real ``packer build`` of the same file read by PackedDataset."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.packing import plan
from packer.pipeline.build import build
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from packer.train.data.online import OnlinePackedDataset
from packer.train.data.resume import ResumableLoader

OPTS = dict(profile="qwen2-vl", max_length=512, max_pixels=64 * 28 * 28, max_vision_tokens=200)


def _records(names: list[str]) -> list:
    rng = np.random.default_rng(0)
    recs: list = []
    for i in range(60):
        q = f"Question {i}: what is {i} + {i}?" + " more" * int(rng.integers(0, 120))
        content = q if i % 5 else [{"type": "image", "image": f"images/{names[i % len(names)]}"},
                                   {"type": "text", "text": q}]
        recs.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": f"It is {2 * i}." + " yes" * int(rng.integers(0, 60))}]})
    recs.append({"messages": [{"role": "user", "content": "Pick one."}],
                 "branches": [[{"role": "assistant", "content": "A first answer."}],
                              [{"role": "assistant", "content": "A second, longer answer."}]]})
    recs.append({"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"},
                                   {"from": "gpt", "value": "Something."}], "image": f"images/{names[1]}"})
    recs.append({"text": "Plain text pretraining data. " * 20})
    recs.append("")  # blank: not a record
    recs.append("{not json")
    recs.append({"messages": [{"role": "user", "content": [{"type": "image", "image": "images/missing.jpg"}]},
                              {"role": "assistant", "content": "x"}]})
    recs.append({"messages": [{"role": "user", "content": "long " * 600}, {"role": "assistant", "content": "ok"}]})
    recs.append({"messages": [{"role": "user", "content": [{"type": "image", "image": f"images/{n}"} for n in names]
                               + [{"type": "text", "text": "All of them."}]},
                              {"role": "assistant", "content": "Four images."}]})  # over the vision budget
    return recs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, coco_images) -> Path:
    root = tmp_path_factory.mktemp("online")
    (root / "images").mkdir()
    for im in coco_images[:4]:
        shutil.copy(im, root / "images" / im.name)
    path = root / "data.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in _records([im.name for im in coco_images[:4]])))
    plan(np.array([1]), 1)  # load the planner's kernels here, so DataLoader workers fork with them (~3 s each)
    return path


@pytest.fixture(scope="module")
def offline(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("offline") / "out"
    build(BuildConfig.from_inputs([str(corpus)], str(out), rows_per_shard=4, rows_per_row_group=2, **OPTS),
          progress=False)
    return out


@pytest.fixture(scope="module")
def offline_examples(offline) -> dict[str, dict]:
    """Each example of the offline build, cut out of its row: id -> arrays, images relative to the example."""
    return {eid: ex for row in PackedDataset(offline, shuffle=False) for eid, ex in _examples(row).items()}


def _examples(row: dict) -> dict[str, dict]:
    cu, out = row["cu_seqlens"], {}
    nodes = np.searchsorted(row["node_offsets"], cu)  # first node of each example
    for k, eid in enumerate(row["example_ids"]):
        a, b = int(cu[k]), int(cu[k + 1])
        ex = {name: row[name][a:b] for name in ("input_ids", "labels", "position_ids")}
        ex["mrope_position_ids"] = row["mrope_position_ids"][:, a:b]
        ex["node_offsets"] = row["node_offsets"][nodes[k] : nodes[k + 1]] - a
        ex["images"] = [{**im, "offset": im["offset"] - a} for im in row["images"] if a <= im["offset"] < b]
        out[eid] = ex
    return out


def _same_example(got: dict, want: dict) -> None:
    for name in ("input_ids", "labels", "position_ids", "mrope_position_ids", "node_offsets"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["images"] == want["images"]


@pytest.mark.slow
def test_one_round_gives_the_offline_build_row_for_row(corpus, offline):
    """A pool holding the whole file plans it once, as the build does: the same rows, in the same order,
    with the same keys and arrays as PackedDataset reads from the build (so collate gives the same batch)."""
    online = list(OnlinePackedDataset(str(corpus), pool_size=1000, shuffle=False, **OPTS))
    rows = list(PackedDataset(offline, shuffle=False))
    assert len(online) == len(rows) > 3
    for got, want in zip(online, rows, strict=True):
        assert set(got) - {"_state"} == set(want) - {"_state"}
        for key in want:
            if key == "_state":
                continue
            if isinstance(want[key], np.ndarray):
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            else:
                assert got[key] == want[key], key
    a, b = collate(online[:2]), collate(rows[:2])
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "pixel_values", "image_grid_thw"):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (2, 2), (3, 1)])
def test_every_example_once_over_ranks_and_workers(corpus, offline_examples, world_size, num_workers):
    seen: list[str] = []
    for rank in range(world_size):
        ds = OnlinePackedDataset(str(corpus), rank=rank, world_size=world_size, pool_size=8, seed=1, **OPTS)
        loader = DataLoader(ds, batch_size=2, num_workers=num_workers, collate_fn=lambda rows: rows)
        for batch in loader:
            for row in batch:
                assert row["cu_seqlens"][-1] == len(row["input_ids"]) <= OPTS["max_length"]
                assert sum(im["num_tokens"] for im in row["images"]) <= OPTS["max_vision_tokens"]
                for eid, ex in _examples(row).items():
                    _same_example(ex, offline_examples[eid])
                    seen.append(eid)
    assert Counter(seen) == Counter(list(offline_examples))


def test_rejects_are_the_builds(corpus, offline, tmp_path):
    path = tmp_path / "rejects.jsonl"
    ds = OnlinePackedDataset(str(corpus), pool_size=8, rejects_path=path, **OPTS)
    list(ds)
    got = sorted((r["path"], r["line"], r["reason"]) for r in map(json.loads, path.read_text().splitlines()))
    want = sorted((r["path"], r["line"], r["reason"]) for r in map(json.loads, (offline / "rejects.jsonl").read_text().splitlines()))
    assert got == want and len(got) == 4
    assert ds.rejects == dict(Counter(r for _, _, r in want))


def test_epochs_reshuffle_and_cover_everything(corpus, offline_examples):
    ds = OnlinePackedDataset(str(corpus), pool_size=8, seed=3, **OPTS)
    ids0 = [e for row in ds for e in row["example_ids"]]
    ds.set_epoch(1)
    ids1 = [e for row in ds for e in row["example_ids"]]
    assert ids0 != ids1
    assert Counter(ids0) == Counter(ids1) == Counter(list(offline_examples))
    ds.set_epoch(0)
    assert [e for row in ds for e in row["example_ids"]] == ids0


def _row_key(row: dict) -> tuple:
    return tuple(row["example_ids"])


@pytest.mark.parametrize("stop", [0, 1, 4, 9])
def test_resume_in_process_gives_the_uninterrupted_rows(corpus, stop):
    kw = dict(pool_size=6, seed=2, **OPTS)
    full = [_row_key(r) for r in OnlinePackedDataset(str(corpus), **kw)]
    ds = OnlinePackedDataset(str(corpus), **kw)
    it = iter(ds)
    first = [_row_key(next(it)) for _ in range(stop)]
    state = json.loads(json.dumps(ds.state_dict()))  # a checkpoint survives JSON
    resumed = OnlinePackedDataset(str(corpus), **kw)
    resumed.load_state_dict(state)
    assert first + [_row_key(r) for r in resumed] == full


def _plain(ds):
    return ResumableLoader(DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate, prefetch_factor=4))


def _stateful(ds):
    return StatefulDataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate, prefetch_factor=4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("loader,stop", [(_plain, 1), (_plain, 3), (_stateful, 2)])
def test_resume_with_workers(corpus, stop, loader):
    """Two workers, batches of 2, checkpoint after ``stop`` batches (ResumableLoader over a DataLoader, or
    torchdata's StatefulDataLoader): the rows before plus the rows after are the uninterrupted run's, none
    twice (prefetched batches the loop never saw are not counted)."""
    kw = dict(rank=1, world_size=2, pool_size=5, seed=4, load_images=False, **OPTS)  # no pixels: fast workers
    full = [tuple(b["example_ids"]) for b in loader(OnlinePackedDataset(str(corpus), **kw))]
    ds = OnlinePackedDataset(str(corpus), **kw)
    first, it = [], iter(wrapped := loader(ds))
    for _ in range(stop):
        first.append(tuple(next(it)["example_ids"]))
    state = json.loads(json.dumps(wrapped.state_dict()))
    del it
    resumed = OnlinePackedDataset(str(corpus), **kw)
    again = loader(resumed)
    again.load_state_dict(state)
    rest = [tuple(b["example_ids"]) for b in again]
    assert sorted(first + rest) == sorted(full)
    flat = [e for b in first + rest for e in b]
    assert len(flat) == len(set(flat))


def test_state_of_another_dataset_is_refused(corpus):
    state = OnlinePackedDataset(str(corpus), pool_size=6, **OPTS).state_dict()
    with pytest.raises(ValueError, match="pool_size=6"):
        OnlinePackedDataset(str(corpus), pool_size=7, **OPTS).load_state_dict(state)


def test_weighted_sources_are_refused(corpus):
    config = BuildConfig.from_dict({"sources": [{"name": "a", "paths": [str(corpus)], "weight": 2.0}], "output": ""})
    with pytest.raises(ConfigError, match="weight other than 1"):
        OnlinePackedDataset(config)


@pytest.fixture(scope="module")
def long_docs(tmp_path_factory) -> Path:
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("longdocs") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(f"w{int(w)}" for w in rng.integers(0, 999, size=n))}) + "\n"
                            for n in rng.integers(20, 900, size=30)))
    return path


@pytest.mark.slow
def test_split_long_documents_match_the_build_and_resume(long_docs, tmp_path):
    """``long_docs: split`` makes several examples of one line (ids path:line@k): the online rows are the
    build's, and a resume keys the pool by (line, chunk)."""
    opts = dict(profile="text", max_length=256, long_docs="split")
    out = tmp_path / "out"
    build(BuildConfig.from_inputs([str(long_docs)], str(out), **opts), progress=False)
    rows = list(PackedDataset(out, shuffle=False))
    online = list(OnlinePackedDataset(str(long_docs), pool_size=10_000, shuffle=False, **opts))
    assert [r["example_ids"] for r in online] == [r["example_ids"] for r in rows]
    assert any("@" in e for r in rows for e in r["example_ids"])
    for got, want in zip(online, rows, strict=True):
        np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    kw = dict(pool_size=7, seed=1, **opts)
    full = [_row_key(r) for r in OnlinePackedDataset(str(long_docs), **kw)]
    for stop in (3, 11):
        ds = OnlinePackedDataset(str(long_docs), **kw)
        it = iter(ds)
        first = [_row_key(next(it)) for _ in range(stop)]
        resumed = OnlinePackedDataset(str(long_docs), **kw)
        resumed.load_state_dict(json.loads(json.dumps(ds.state_dict())))
        assert first + [_row_key(r) for r in resumed] == full


# ------------------------------------------------------------------ audio budgets on real clips (Qwen2.5-Omni)
AUDIO_OPTS = dict(profile="qwen2.5-omni", max_length=2048, max_audio_tokens=120, max_audios=2, max_videos=1)


def _audio_records() -> list[dict]:
    audio = lambda name: {"type": "audio", "audio": name}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    clips = ["speech.wav", "tone.mp3", "noise.flac", "short.m4a"]
    recs = []
    for i in range(24):
        a, b = clips[i % 4], clips[(i + 1) % 4]
        kind = i % 6
        if kind == 0:
            content = [audio(a), text(f"What is heard {i}?")]
        elif kind == 1:
            content = [audio(a), audio(b), text(f"Same {i}?")]
        elif kind == 2:  # a video's own sound track is a clip too: with one more clip, two in all
            recs.append({"messages": [{"role": "user", "content": [{"type": "video", "video": "movie.mp4"},
                                                                   audio(a), text(f"Both {i}?")]},
                                      {"role": "assistant", "content": "Yes."}], "use_audio_in_video": True})
            continue
        elif kind == 3:
            content = f"No audio here, {i}." + " more" * i
        elif kind == 4:
            content = [text(f"Listen {i}: "), audio(b)]
        else:
            content = [audio(a), audio(b), audio(clips[(i + 2) % 4]), text("Three?")]  # over max_audios
        recs.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": f"Answer {i}." + " yes" * (i % 7)}]})
    recs.append({"messages": [{"role": "user", "content": [audio("long.wav"), text("Long?")]},
                              {"role": "assistant", "content": "Very."}]})  # over max_audio_tokens alone
    recs.append({"messages": [{"role": "user", "content": [{"type": "video", "video": "movie.mp4"}] * 2},
                              {"role": "assistant", "content": "Twice."}]})  # over max_videos
    return recs


@pytest.fixture(scope="module")
def audio_corpus(tmp_path_factory) -> Path:
    from tests.media.audio_clips import signal, write_clip, write_four_clips, write_video

    root = tmp_path_factory.mktemp("online-audio")
    write_four_clips(root)
    write_clip(root / "long.wav", signal("speech", 16000, 6.0), 16000)
    write_video(root / "movie.mp4", seconds=1.5, fps=4, size=(56, 56))
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _audio_records()))
    return path


@pytest.mark.slow
def test_audio_budgets_online_match_the_build(audio_corpus, tmp_path):
    """max_audio_tokens, max_audios and max_videos on Qwen2.5-Omni clips and a video with sound: a pool holding
    the whole file gives the build's rows, row for row; a small shuffled pool gives other packs of the same
    examples, every row within every budget (a video's sound track counted as a clip), and resumes exactly;
    the over-budget lines are the build's rejects, with the build's messages."""
    out = tmp_path / "out"
    build(BuildConfig.from_inputs([str(audio_corpus)], str(out), **AUDIO_OPTS), progress=False)
    want = list(PackedDataset(out, shuffle=False, load_images=False))
    rejects = tmp_path / "rejects.jsonl"
    online = list(OnlinePackedDataset(str(audio_corpus), pool_size=1000, shuffle=False, rejects_path=rejects,
                                      load_images=False, **AUDIO_OPTS))
    assert len(online) == len(want) > 3
    for got, row in zip(online, want, strict=True):
        assert set(got) - {"_state"} == set(row) - {"_state"}
        for key in set(row) - {"_state"}:
            if isinstance(row[key], np.ndarray):
                np.testing.assert_array_equal(got[key], row[key], err_msg=key)
            else:
                assert got[key] == row[key], key
    key = lambda r: (r["path"], r["line"], r["reason"], r["message"])  # noqa: E731
    got_rejects = sorted(map(key, map(json.loads, rejects.read_text().splitlines())))
    assert got_rejects == sorted(map(key, map(json.loads, (out / "rejects.jsonl").read_text().splitlines())))
    assert [m.split(" exceed ", 1)[1] for *_, m in got_rejects] == ["--max-audio-tokens / --max-audios"] * 5 + [
        "--max-vision-tokens / --max-images (or 2 videos exceed --max-videos)"]  # 4 x 3 clips, 150 tokens; 2 videos

    examples = Counter(e for r in want for e in r["example_ids"])
    small = list(OnlinePackedDataset(str(audio_corpus), pool_size=4, seed=3, load_images=False, **AUDIO_OPTS))
    assert Counter(e for r in small for e in r["example_ids"]) == examples and max(examples.values()) == 1
    assert len(small) >= len(want)
    for row in small + online:
        assert len(row["audios"]) <= AUDIO_OPTS["max_audios"] and len(row["videos"]) <= AUDIO_OPTS["max_videos"]
        assert sum(a["num_tokens"] for a in row["audios"]) <= AUDIO_OPTS["max_audio_tokens"]
        assert row["cu_seqlens"][-1] == len(row["input_ids"]) <= AUDIO_OPTS["max_length"]
    assert any(a["video"] for r in online for a in r["audios"])  # the video's track was a clip of its row
    # the budgets bind: without them the whole file fits fewer rows
    assert sum(1 for _ in OnlinePackedDataset(str(audio_corpus), pool_size=1000, shuffle=False, load_images=False,
                                              profile="qwen2.5-omni", max_length=2048)) < len(online)
    # a resume re-encodes the pool and recounts its clips: the rows are the uninterrupted run's
    kw = dict(pool_size=4, seed=3, load_images=False, **AUDIO_OPTS)
    ds = OnlinePackedDataset(str(audio_corpus), **kw)
    it = iter(ds)
    first = [_row_key(next(it)) for _ in range(3)]
    resumed = OnlinePackedDataset(str(audio_corpus), **kw)
    resumed.load_state_dict(json.loads(json.dumps(ds.state_dict())))
    assert first + [_row_key(r) for r in resumed] == [_row_key(r) for r in small]
