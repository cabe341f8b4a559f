"""Packed == unpacked on the real ``Molmo2ForConditionalGeneration`` (tiny random config, fp32) for videos.

Shards built from JSONL with the ``molmo2`` profile (stand-in tokenizer, see tests/models/test_molmo2_video.py):
a video QA tree (the clip in the shared prefix, three answers), a clip asked twice in one conversation, a text
example and an image example, packed and collated into one batch (videos and an image in one forward). The reference runs every root-to-leaf path alone as Molmo2's processor and model
would: the path's ``pixel_values_videos`` / ``video_token_pooling`` / ``video_grids``, ``mm_token_type_ids``
1 on the processor's image token ids (frame runs, not the timestamps), the model's own attention (SDPA with
``block_sequence_ids``: every frame token of the path sees every other). Per-token losses, total and every
gradient agree within 1e-5 relative (scripts/check_equivalence.py's ``compare``) on ``sdpa`` and
``sdpa_varlen``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from packer.pipeline.build import build
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.media.make_videos import write_clip
from tests.models import released
from tests.train.test_molmo2_equivalence import BACKENDS, _compact

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

# Molmo2Processor.image_token_ids present in the stand-in: mm_token_type_ids 1 on these
RUN = ["<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>", "<frame_end>"]


@pytest.fixture(scope="module")
def video_rows(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("molmo2_video")
    # noise, not flat frames: over 9 equal patches the pooling attention is uniform, its q/k gradients 0 + round-off
    noise = lambda n, w, h: [np.random.default_rng(i).integers(0, 256, (h, w, 3), np.uint8) for i in range(n)]  # noqa: E731
    a = write_clip(root / "a.mp4", fps=4, frames=6, width=64, height=48, images=noise(6, 64, 48))  # 3 frames at 2 fps
    b = write_clip(root / "b.mp4", fps=25, frames=30, width=99, height=57, pix_fmt="yuv444p",
                   images=noise(30, 99, 57))  # 1.2 s: 2 frames
    im = root / "im.png"
    Image.fromarray(np.random.default_rng(9).integers(0, 256, (150, 200, 3), np.uint8)).save(im)
    vid = lambda p: {"type": "video", "video": str(p)}  # noqa: E731
    txt = lambda t: {"type": "text", "text": t}  # noqa: E731
    recs = [
        {"messages": [{"role": "user", "content": [vid(a), txt("What changes?")]}],
         "branches": [[{"role": "assistant", "content": "The grey level."}],
                      [{"role": "assistant", "content": "Brightness, frame by frame."}],
                      [{"role": "assistant", "content": "Nothing moves."}]]},
        {"messages": [{"role": "user", "content": [vid(b), txt("Describe it.")]},
                      {"role": "assistant", "content": "Flat frames."},
                      {"role": "user", "content": "How long?"}, {"role": "assistant", "content": "About a second."}]},
        {"text": "A text example packed beside the videos."},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": str(im)}, txt("And this?")]},
                      {"role": "assistant", "content": "A still picture."}]},
    ]
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="molmo2", max_length=1400)
    build(config, progress=False)
    return list(PackedDataset(root / "out", shuffle=False))


def _reference(model, batch: dict, videos: list[dict], images: list[ImageRef], token_ids: dict[str, int]) -> dict[str, Any]:
    """Every root-to-leaf path alone with its video's (or image's) inputs, Molmo2's token types and own
    attention."""
    profile = get_profile("molmo2")
    run_ids = torch.tensor([token_ids[t] for t in RUN])
    ids = batch["input_ids"][0]
    starts = batch["video_offsets"].tolist()
    image_starts = [o for o in batch["image_offsets"].tolist() if o not in starts]  # join_vision lists videos too

    def path_kwargs(tokens: torch.Tensor) -> dict[str, Any]:
        path_ids = ids[tokens][None]
        kwargs: dict[str, Any] = {"input_ids": path_ids, "use_cache": False,
                                  "mm_token_type_ids": torch.isin(path_ids, run_ids).long()}
        inside = [k for k, s in enumerate(starts) if bool((tokens == s).any())]
        if inside:
            kwargs.update(profile.reader().video_pixel_values([videos[k] for k in inside]))
        pictures = [k for k, s in enumerate(image_starts) if bool((tokens == s).any())]
        if pictures:
            kwargs.update(profile.reader().pixel_values([images[k] for k in pictures]))
        return kwargs

    return ce.path_reference(model, batch, path_kwargs)


@pytest.mark.slow
def test_packed_equals_unpacked(video_rows) -> None:
    rows = video_rows
    assert sum(len(r["videos"]) for r in rows) == 2 and any((r["node_parents"] >= 0).any() for r in rows)
    tokenizer = load_tokenizer("molmo2")
    with released.released_reader(get_profile("molmo2")):  # the released image and video processors
        collated = collate(rows)
    (batch,), token_ids, vocab = _compact([collated], tokenizer)
    # the token types and spans collate derives: exactly the frame runs, all of one example in one group
    run_ids = torch.tensor([token_ids[t] for t in RUN])
    assert batch["mm_token_type_ids"][0].tolist() == torch.isin(batch["input_ids"][0], run_ids).long().tolist()
    spans = batch["bidirectional_spans"].tolist()
    frames = [(a, b, g) for a, b, g in spans if b - a == 83]
    assert len(frames) == 3 + 2 and len(spans) == 3 + 2 + 1 and len({g for *_, g in spans}) == 3
    torch.manual_seed(0)
    model = get_profile("molmo2").proof().tiny_model(token_ids=token_ids, vocab_size=vocab)
    videos = [v for r in rows for v in r["videos"]]
    images = [ImageRef(path=im["source"]) for r in rows for im in r["images"]]
    # the image example shares a row with a video: the videos ride in the image inputs (the model takes one kind)
    assert "pixel_values_videos" not in batch and batch["image_grids"].shape[0] == 3
    report = ce.compare(model, batch, BACKENDS, ref=_reference(model, batch, videos, images, token_ids))
    for b in BACKENDS:
        assert report[b]["ok"], (b, report[b]["grad_max_rel"], report[b]["grad_missing"])
        assert report[b]["loss_max_rel"] <= 1e-5 and report[b]["total_rel"] <= 1e-5
    assert report["sdpa"]["grad_missing"] == [] and report["sdpa"]["grad_params"] > 0


@pytest.mark.slow
def test_check_equivalence_runs_videos(video_rows) -> None:
    """scripts/check_equivalence.py's generic reference (the profile's image_inputs / reference_inputs hooks,
    videos as crops) agrees with the packed batch too: ``--model molmo2`` checks videos."""
    tokenizer = load_tokenizer("molmo2")
    (batch,), token_ids, vocab = _compact([collate(video_rows)], tokenizer)
    torch.manual_seed(0)
    profile = get_profile("molmo2")
    model = profile.proof().tiny_model(token_ids=token_ids, vocab_size=vocab)
    report = ce.compare(model, batch, ["sdpa"], profile=profile, token_ids=token_ids)
    assert report["sdpa"]["ok"], report["sdpa"]
