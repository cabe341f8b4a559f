"""Packed == unpacked on the real ``LlavaOnevisionForConditionalGeneration`` (tiny random config, fp32): rows
built by ``packer build`` that mix text, a tiled image, two untiled images and a two-level caption tree; every
CPU backend; and ``model(**collate(rows))`` after ``use_packed_attention`` (tests/train/family_reference.py)."""

from __future__ import annotations

import json

import pytest
import torch

import packer.models
from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.models import register_profile
from packer.models.llava_onevision import LlavaOnevisionProfile, anyres_pinpoints
from packer.pipeline.build import build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.hf import model_inputs, use_packed_attention
from tests.train import family_reference as fr

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py
IMAGE = 151646  # <image> in the builtin llava-onevision tokenizer

TINY = LlavaOnevisionProfile(name="llava-onevision-tiny", crop_px=28, pinpoints=anyres_pinpoints(28))
"""28 px crops of 2x2 patches: 4 base features, up to 36 tiles; the same rule at 1/200 of the pixels."""


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory, coco_dir):
    """Rows mixing text, one-image (tiled), two-image (untiled) and tree examples, built by packer build."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models, "_PROFILES", dict(packer.models._PROFILES))
        register_profile(TINY)
        root = tmp_path_factory.mktemp("ov")
        names = sorted(p.name for p in (coco_dir / "val2017").glob("*.jpg"))[:3]
        img = lambda n: {"type": "image", "image": str(coco_dir / "val2017" / n)}  # noqa: E731
        recs = [
            {"messages": [{"role": "user", "content": "Count to three."},
                          {"role": "assistant", "content": "One, two, three."}]},
            {"messages": [{"role": "user", "content": [img(names[0]), {"type": "text", "text": "Describe it."}]},
                          {"role": "assistant", "content": "A photo of something."}]},
            {"messages": [{"role": "user", "content": [img(names[1]), img(names[2]),
                                                       {"type": "text", "text": "Compare."}]},
                          {"role": "assistant", "content": "The first is brighter."}]},
            {"messages": [{"role": "user", "content": [img(names[2]), {"type": "text", "text": "Caption."}]}],
             "branches": [[{"role": "assistant", "content": "A street."}],
                          {"messages": [{"role": "assistant", "content": "A road"}],
                           "branches": [[{"role": "user", "content": "More?"},
                                         {"role": "assistant", "content": "With cars."}],
                                        [{"role": "user", "content": "Less?"},
                                         {"role": "assistant", "content": "Road."}]]}]},
        ]
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in recs))
        config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile=TINY.name, max_length=512)
        build(config, progress=False)
        rows = list(PackedDataset(root / "out", shuffle=False))
        yield rows


def _path_inputs(profile: LlavaOnevisionProfile):
    def inputs(ids: torch.Tensor, images: list[dict]) -> dict:
        if not images:
            return {}
        refs = [ImageRef(path=im["source"]) for im in images]
        return profile.pixel_inputs(refs, [(im["grid_t"], im["grid_h"], im["grid_w"]) for im in images])

    return inputs


def test_packed_rows_match_unpacked_on_the_real_model(tiny_rows) -> None:
    rows = tiny_rows
    assert sum(len(r["example_ids"]) for r in rows) == 4 and len(rows) <= 2, "examples should share rows"
    assert any(im["grid_t"] == 1 for r in rows for im in r["images"]) and any(
        im["grid_t"] > 2 for r in rows for im in r["images"])
    batches, ids, vocab = fr.compact([collate(rows)], [IMAGE])
    (batch,) = batches
    model = TINY.tiny_model(token_ids={"image_token": ids[IMAGE]}, vocab_size=vocab)
    fr.freeze_key_biases(model)
    ref = fr.reference(model, batch, fr.batch_images(rows), _path_inputs(TINY))
    assert ref["num_paths"] == 6
    report = fr.ce.compare(model, batch, fr.CPU_BACKENDS, ref=ref)
    fr.check(report, fr.CPU_BACKENDS)
    assert "batch_num_images" in model_inputs(batch)

    # model(**collate(rows)) as it is, after use_packed_attention: the same logits as model_inputs
    use_packed_attention(model, "sdpa")
    with torch.no_grad():
        direct = model(**batch).logits
        explicit = model(**model_inputs(batch)).logits
    assert torch.equal(direct, explicit)
