"""Videos through a whole build (qwen2.5-vl): chat clips, a frame list, LLaVA-Video records, a video message
tree (one clip, several QA branches), images and text in one corpus. The build verifies against its input;
each broken video invariant is reported by ``packer verify``; stats count video tokens apart; truncation
never cuts a video; the reader yields the video inputs Qwen2.5-VL's forward takes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.config import BuildConfig
from packer.media.video import probe
from packer.models.shared.qwen_video_plan import VideoRequest, get_video_family, plan_video
from packer.pipeline.build import build
from packer.report.stats import format_stats
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.media.make_videos import write_clip
from tests.report.test_verify import _mutate

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731


def vid(source, text: str = "What happens?", **options) -> list[dict]:
    return [{"type": "video", "video": source, **options}, {"type": "text", "text": text}]


def video_corpus(root: Path, coco_images: list[Path]) -> Path:
    """Clips at 24, 25 and 29.97 fps, odd sizes; COCO frames; the records of every video input form."""
    from fractions import Fraction

    write_clip(root / "a.mp4", fps=24, frames=36, width=90, height=66)
    write_clip(root / "b.mp4", fps=Fraction(30000, 1001), frames=45, width=72, height=50)
    write_clip(root / "c.mp4", fps=25, frames=20, width=64, height=64, options={"movflags": "faststart"})
    for i, im in enumerate(coco_images[:3]):
        shutil.copy(im, root / f"{i}.jpg")
    recs = [
        {"messages": [U(vid("a.mp4")), A("Grey levels.")]},
        {"messages": [U(vid("b.mp4", fps=4, max_pixels=200 * 28 * 28)), A("Faster.")]},
        {"messages": [U(vid("a.mp4", "Ask.", video_start=0.25, video_end=1.0))],
         "branches": [[A("One answer.")], [A("Another answer.")],
                      {"messages": [A("A third,")], "branches": [[U("and?"), A("more.")], [U("or?"), A("less.")]]}]},
        {"conversations": [{"from": "human", "value": "<video>\nDescribe."}, {"from": "gpt", "value": "Flat."}],
         "video": "c.mp4"},
        {"conversations": [{"from": "human", "value": "<image>\nLLaVA-Video marks its clip so."},
                           {"from": "gpt", "value": "Yes."}], "video": "b.mp4"},
        {"messages": [U(vid(["0.jpg", "0.jpg", "0.jpg"], fps=1, max_pixels=128 * 28 * 28)), A("A slideshow.")]},
        {"messages": [U([{"type": "image", "image": "1.jpg"}, *vid("c.mp4", "Both?")]), A("An image, a clip.")]},
        {"messages": [U("Just text."), A("Fine.")]},
        {"text": "A plain document. " * 10},
    ]
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory, coco_images) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("video")
    data = video_corpus(root, coco_images)
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2.5-vl", max_length=1400,
                                     max_pixels=100 * 28 * 28, rows_per_shard=2, rows_per_row_group=1)
    build(config, progress=False)
    return root / "out", data


@pytest.fixture
def copy(built, tmp_path) -> tuple[Path, Path]:
    out, data = built
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "out", data


def test_the_build_verifies_and_counts_video_apart(built):
    out, data = built
    report = verify_build(out, inputs=[str(data)])
    assert report.ok, report.lines()
    assert report.input_records == 9
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rejected"] == 0
    rows = list(PackedDataset(out, shuffle=False, load_images=False))
    videos = [v for r in rows for v in r["videos"]]
    assert len(videos) == 7  # the tree's clip once, not once per branch
    assert stats["video_tokens"] == sum(v["num_tokens"] for v in videos)
    assert stats["image_tokens"] + stats["video_tokens"] == stats["vision_tokens"]
    assert "video tokens / pack" in format_stats(stats) and "videos" in format_stats(stats)
    # the first clip's plan is the header's: 1.5 s at 24 fps -> 4 frames (0, 12, 23, 35), 90x66 -> 392x280
    first = next(v for v in videos if v["source"].endswith("a.mp4") and v["video_start"] is None)
    plan = plan_video(probe(first["source"]), VideoRequest(), get_video_family("qwen2.5-vl"))
    assert first["frame_indices"] == list(plan.frame_indices) == [0, 12, 23, 35]
    assert (first["grid_t"], first["grid_h"], first["grid_w"]) == plan.grid_thw
    assert first["num_tokens"] == plan.num_tokens and first["second_per_grid_t"] == plan.second_per_grid_t
    frames = next(v for v in videos if v["frames"])
    assert frames["source"] == "" and frames["frame_indices"] == [0, 1, 2, 2]  # padded with its last frame


def _with_video(row: dict) -> bool:
    return bool(row["videos"])


def _video(key: str, change):
    def mutate(row: dict) -> None:
        row["videos"][0][key] = change(row["videos"][0][key])
    return mutate


MUTATIONS = {
    "video offset": (_video("offset", lambda x: x + 1), "video tokens (id 151656) disagree"),
    "video grid": (_video("grid_h", lambda x: x + 2), "a video's num_tokens does not match its grid"),
    "video size": (_video("height", lambda x: x + 14), "a video's grid, frame size, frame count"),
    "video frames": (_video("frame_indices", lambda x: x[:-1]), "a video's grid, frame size, frame count"),
    "video seconds": (_video("second_per_grid_t", lambda x: x * 3), "mrope_position_ids differ"),
    "num_video_tokens": (lambda r: r.__setitem__("num_video_tokens", 0), "num_video_tokens is 0"),
    "video label": (lambda r: r["labels"].__setitem__(r["videos"][0]["offset"], 151656), "video token carries a label"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_broken_video_invariant_is_reported(copy, name):
    out, _ = copy
    change, text = MUTATIONS[name]
    _mutate(out, _with_video, change)
    report = verify_build(out)
    assert any(text in v.what for v in report.violations), f"{name}: {report.lines()}"


def test_truncation_never_cuts_a_video(built, tmp_path):
    _, data = built
    config = BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="qwen2.5-vl", max_length=300,
                                     max_pixels=100 * 28 * 28, overlong="truncate")
    build(config, progress=False)
    assert verify_build(tmp_path / "out", inputs=[str(data)]).ok
    for row in PackedDataset(tmp_path / "out", shuffle=False, load_images=False):
        cu = row["cu_seqlens"]
        for v in row["videos"]:
            end = cu[np.searchsorted(cu, v["offset"], side="right")]
            assert v["offset"] + v["num_tokens"] <= end


def test_collate_yields_qwen25_video_inputs(built):
    out, _ = built
    rows = [r for r in PackedDataset(out, shuffle=False) if r["videos"]][:2]
    batch = collate(rows)
    videos = [v for r in rows for v in r["videos"]]
    grids = np.array([[v["grid_t"], v["grid_h"], v["grid_w"]] for v in videos])
    assert batch["video_grid_thw"].tolist() == grids.tolist()
    assert tuple(batch["pixel_values_videos"].shape) == (int(grids.prod(axis=1).sum()), 3 * 2 * 14 * 14)
    assert batch["second_per_grid_ts"].dtype.is_floating_point
    assert batch["second_per_grid_ts"].tolist() == pytest.approx([v["second_per_grid_t"] for v in videos])
    ids = batch["input_ids"][0].numpy()
    for offset, v in zip(batch["video_offsets"].tolist(), videos, strict=True):
        assert (ids[offset : offset + v["num_tokens"]] == 151656).all()


@pytest.mark.slow
def test_inspect_and_plot_show_videos(built, tmp_path):
    from packer.report.plots import plot_stats
    from packer.report.rowview import describe_row, format_row

    out, _ = built
    rows = list(PackedDataset(out, shuffle=False, load_images=False))
    row = next(i for i, r in enumerate(rows) if r["videos"])
    text = format_row(describe_row(out, row, decode=False))
    assert "video 0  [" in text and "frames sampled" in text
    assert plot_stats(out, tmp_path / "stats.png").stat().st_size > 0


def test_families_without_video_refuse_it(tmp_path):
    from packer.encode.encoder import Encoder
    from packer.encode.tokenizers import load_tokenizer
    from packer.errors import RecordError
    from packer.formats import parse_record
    from packer.models import get_profile

    write_clip(tmp_path / "a.mp4", fps=24, frames=24, width=64, height=48)
    example = parse_record({"messages": [U(vid("a.mp4")), A("x")]}, path="in.jsonl", line=1, base_dir=str(tmp_path))
    with pytest.raises(RecordError, match="profile 'llava' takes no videos") as e:
        Encoder(load_tokenizer("qwen2-vl"), get_profile("llava")).encode(example)
    assert e.value.reason == "image_count_mismatch" and e.value.line == 1


def test_video_budget_per_pack(built, tmp_path):
    """``--max-videos``: every pack of a mixed build holds at most that many videos (beside the vision budget),
    stats show videos per pack, the build verifies; ``packer verify`` reports a pack over the manifest's budget."""
    from packer.shards.io import write_json_atomic

    out, data = built
    config = BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="qwen2.5-vl", max_length=1400,
                                     max_pixels=100 * 28 * 28, max_vision_tokens=1000, max_videos=1)
    build(config, progress=False)
    rows = list(PackedDataset(tmp_path / "out", shuffle=False, load_images=False))
    assert max(len(r["videos"]) for r in rows) == 1 and sum(len(r["videos"]) for r in rows) == 7
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["videos"] == 7 and stats["videos_per_pack"]["max"] == 1 and stats["rejected"] == 0
    assert "videos / pack" in format_stats(stats)
    assert verify_build(tmp_path / "out", inputs=[str(data)]).ok
    # the unbudgeted build packs two clips in a row somewhere: a budget of 1 in its manifest is broken there
    assert max(len(r["videos"]) for r in PackedDataset(out, shuffle=False, load_images=False)) >= 2
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["max_videos"] = 1
    write_json_atomic(copy / "manifest.json", manifest)
    assert "videos > max_videos 1" in "\n".join(verify_build(copy).lines())
