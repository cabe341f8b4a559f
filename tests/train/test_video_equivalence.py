"""Packing with videos changes the cost, never the maths: real Qwen2_5_VLForConditionalGeneration (tiny, fp32,
windowed vision attention, tokens_per_second 2) on shards mixing clips, a frame-list video, images, text and a
video message tree (one clip, several QA branches, a nested follow-up). Per-token losses, the total and every
parameter gradient of the packed forward equal every root-to-leaf path run alone with the model's own
positions (get_rope_index with ``second_per_grid_ts``) and its own video inputs (scripts/check_equivalence.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from packer.config import BuildConfig
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from packer.pipeline.build import build
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.models import released
from tests.pipeline.test_video_build import video_corpus

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

BACKENDS = ["sdpa", "sdpa_varlen"]



@pytest.fixture(scope="module")
def video_rows(tmp_path_factory, coco_images) -> list[dict]:
    root = tmp_path_factory.mktemp("video-eq")
    data = video_corpus(root, coco_images)
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2.5-vl", max_length=1400,
                                     max_pixels=56 * 56 * 4)
    build(config, progress=False)
    return list(PackedDataset(root / "out", shuffle=False))


def _tiny(batches: list[dict], *, seed: int = 0) -> tuple[list[dict], object, dict]:
    """Renumbered batches, a tiny Qwen2.5-VL and ``compare``'s profile/token_ids kwargs."""
    profile = get_profile("qwen2.5-vl")
    batches, ids, vocab = ce.compact_vocab(batches, ce.profile_token_ids(profile, load_tokenizer("qwen2-vl")))
    model = ce.tiny_model(profile, token_ids=ids, vocab_size=vocab, seed=seed)
    return batches, model, {"profile": profile, "token_ids": ids}


def _collate(rows: list[dict]) -> dict:
    """The batch as the released processors make it (``released.released_reader``), the build's max_pixels given."""
    with released.released_reader(get_profile("qwen2.5-vl"), max_pixels=56 * 56 * 4, min_pixels=56 * 56):
        return collate(rows)


@pytest.mark.slow
def test_qwen25_vl_video_rows_match_unpacked(video_rows):
    batches, model, ctx = _tiny([_collate([r]) for r in video_rows])
    assert any(len(b.get("video_grid_thw", ())) >= 2 for b in batches), "no row packs two videos"
    assert any("pixel_values" in b and "pixel_values_videos" in b for b in batches), "no row mixes images and videos"
    tree = [b for b in batches if "pixel_values_videos" in b and (b["node_parents"] >= 0).sum() >= 4]
    assert tree, "no row holds the video message tree"
    reports = [ce.compare(model, batch, BACKENDS, **ctx) for batch in batches]
    for report in reports:
        for b in BACKENDS:
            assert report[b]["ok"], (b, report[b])
            assert report[b]["grad_missing"] == [] and report[b]["grad_params"] > 0
    # the numbers docs/training.md quotes
    print({b: {k: max(r[b][k] for r in reports) for k in ("loss_max_rel", "total_rel", "grad_max_rel")}
           for b in BACKENDS}, sum(r["paths"] for r in reports), "paths")


@pytest.mark.slow
def test_qwen25_vl_multi_row_batch_matches_unpacked(video_rows):
    """collate() of several video rows: video offsets and pixel rows shift across rows."""
    (batch,), model, ctx = _tiny([_collate(video_rows[:3])], seed=1)
    report = ce.compare(model, batch, ["sdpa_varlen"], **ctx)
    assert report["sdpa_varlen"]["ok"], report
