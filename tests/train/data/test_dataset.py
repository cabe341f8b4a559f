"""PackedDataset: every row exactly once across ranks and workers, rows round-trip, images that moved."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

from packer.config import BuildConfig
from packer.errors import ShardError
from packer.pipeline.build import build
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.helpers import random_example, write_shardset


@pytest.fixture(scope="module")
def shardset(tmp_path_factory):
    rng = np.random.default_rng(7)
    examples = [random_example(rng, i) for i in range(60)]
    cuts = np.sort(rng.choice(np.arange(1, 60), size=24, replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [60]])).tolist()  # 25 packs of 1+ examples
    return write_shardset(tmp_path_factory.mktemp("ds") / "out", examples, sizes, rows_per_shard=7,
                          rows_per_row_group=3), examples


def _ids(batch_iter):
    """The real examples of the batches (a filler row repeats a real row so that ranks stay equal)."""
    return [e for b in batch_iter for e, f in zip(b["example_ids"], b["filler_examples"].tolist(), strict=True)
            if not f]


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, False])
def test_two_ranks_two_workers_cover_every_row_once(shardset, shuffle):
    root, examples = shardset
    seen = []
    for rank in range(2):
        ds = PackedDataset(root, rank=rank, world_size=2, shuffle=shuffle, seed=3)
        loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate)
        seen += _ids(loader)
    counts = Counter(seen)
    assert set(counts) == {e.example_id for e in examples}
    assert max(counts.values()) == 1


def test_epochs_reshuffle_deterministically(shardset):
    root, _ = shardset
    a = PackedDataset(root, seed=1)
    b = PackedDataset(root, seed=1)
    order0 = a.epoch_order(0)
    np.testing.assert_array_equal(order0, b.epoch_order(0))
    assert not np.array_equal(order0, a.epoch_order(1))
    assert sorted(order0.tolist()) == list(range(a.num_rows))


def test_rows_roundtrip_exactly(shardset):
    root, examples = shardset
    by_id = {e.example_id: e for e in examples}
    for row in PackedDataset(root, shuffle=False):
        cu = row["cu_seqlens"]
        for k, ex_id in enumerate(row["example_ids"]):
            e = by_id[ex_id]
            sl = slice(cu[k], cu[k + 1])
            np.testing.assert_array_equal(row["input_ids"][sl], e.input_ids)
            np.testing.assert_array_equal(row["labels"][sl], e.labels)
            np.testing.assert_array_equal(row["position_ids"][sl], e.position_ids)


def test_unfinished_build_is_refused(tmp_path):
    (tmp_path / "shard-00000.parquet").write_bytes(b"PAR1")
    with pytest.raises(ShardError, match="no manifest.json"):
        PackedDataset(tmp_path)


@pytest.mark.slow
def test_image_root_keeps_each_image_apart(tmp_path, coco_images):
    """Two images named 1.jpg in two folders, then the folders move: ``image_root`` finds each by its path
    relative to the build's image directory (re-rooting by file name made both the same file)."""
    data_dir = tmp_path / "data"
    by_shape = {}
    for p in coco_images:  # a landscape and a portrait picture: their grids tell which file was read
        with Image.open(p) as im:
            by_shape.setdefault(im.width > im.height, p)
    for folder, image in (("a", by_shape[True]), ("b", by_shape[False])):
        (data_dir / folder).mkdir(parents=True)
        shutil.copy(image, data_dir / folder / "1.jpg")
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "image": f"{f}/1.jpg"},
                                                           {"type": "text", "text": "Caption it."}]},
                             {"role": "assistant", "content": f"Image {f}."}]} for f in ("a", "b")]
    (data_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    build(BuildConfig.from_inputs([str(data_dir / "train.jsonl")], str(out), max_length=1024,
                                  max_pixels=64 * 28 * 28), progress=False)
    moved = tmp_path / "moved"
    shutil.move(data_dir, moved)  # the images are only at their new place now

    rows = list(PackedDataset(out, shuffle=False, image_root=moved))
    sources = sorted(im["source"] for r in rows for im in r["images"])
    assert sources == [str(moved / "a" / "1.jpg"), str(moved / "b" / "1.jpg")]
    batch = collate(rows)  # decodes the pixels from the new place
    grids = [(im["grid_t"], im["grid_h"], im["grid_w"]) for r in rows for im in r["images"]]
    assert batch["image_grid_thw"].tolist() == [list(g) for g in grids]
    assert len({g for g in grids}) == 2  # two different pictures, not one file twice


@pytest.mark.slow
def test_image_root_moves_videos_and_audio_too(tmp_path):
    """A build's images, clips (with their sound track) and audio files all move: each is found under
    ``image_root`` at its path relative to the build's directory, and collate decodes them from there."""
    from tests.media.audio_clips import signal, write_clip, write_video

    data_dir = tmp_path / "data"
    for folder in ("a", "b"):
        (data_dir / folder).mkdir(parents=True)
        write_clip(data_dir / folder / "1.wav", signal("speech", 16000, 0.6 if folder == "a" else 1.1), 16000)
    write_video(data_dir / "a" / "1.mp4", seconds=2.0, fps=4, size=(56, 56))
    Image.fromarray(np.full((56, 84, 3), 120, dtype=np.uint8)).save(data_dir / "b" / "1.png")
    records = [
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "a/1.mp4"},
                                                   {"type": "audio", "audio": "a/1.wav"},
                                                   {"type": "text", "text": "Same sound?"}]},
                      {"role": "assistant", "content": "No."}], "use_audio_in_video": True},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "b/1.png"},
                                                   {"type": "audio", "audio": "b/1.wav"},
                                                   {"type": "text", "text": "What is heard?"}]},
                      {"role": "assistant", "content": "Speech."}]},
    ]
    (data_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    build(BuildConfig.from_inputs([str(data_dir / "train.jsonl")], str(out), profile="qwen2.5-omni",
                                  max_length=4096), progress=False)
    before = list(PackedDataset(out, shuffle=False))
    moved = tmp_path / "moved"
    shutil.move(data_dir, moved)

    rows = list(PackedDataset(out, shuffle=False, image_root=moved))
    media = sorted(m["source"] for r in rows for key in ("images", "videos", "audios") for m in r[key])
    assert media == sorted([str(moved / "a" / "1.mp4")] * 2 + [str(moved / "a" / "1.wav"),
                                                              str(moved / "b" / "1.png"), str(moved / "b" / "1.wav")])
    assert all(m["source"].startswith(str(data_dir)) for r in before for k in ("images", "videos", "audios")
               for m in r[k])
    batch = collate(rows)  # decodes pixels, frames and clips from the new place
    assert batch["input_features"].shape[0] == 3 and batch["pixel_values_videos"].shape[0] > 0
