"""Packed == unpacked on the real ``Gemma3ForConditionalGeneration`` (tiny random config, fp32): rows built by
``packer build`` mixing text, one- and two-image examples and a two-level caption tree; a sliding-window layer
(window 16, shorter than the rows) and a global one; each image block's soft tokens bidirectional. Built twice:
as the checkpoints ship (no crops) and with ``do_pan_and_scan`` (the COCO images' 2 crops and a tall image's 3,
beside a square image that stays whole: rows mix cropped and uncropped images).

The reference is scripts/check_equivalence.py's, through the profile's hooks (``image_inputs``,
``reference_inputs``): every root-to-leaf path alone, with the processor's ``token_type_ids``, from which
Gemma 3 builds its own masks; the packed side takes the spans ``collate`` emits from the profile.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import packer.models.registry
from packer.config import BuildConfig
from packer.models import get_profile, register_profile
from packer.models.gemma3 import Gemma3Profile
from packer.pipeline.build import build
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset

_spec = importlib.util.spec_from_file_location(
    "check_equivalence", Path(__file__).resolve().parents[2] / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

SOFT, BOI, EOI = 151650, 151648, 151649  # <image_soft_token>, <start_of_image>, <end_of_image> (stand-in ids)
TINY = Gemma3Profile(name="gemma3-tiny", image_px=56, tokens_per_image=4)
"""56 px images: 4x4 patches pooled 2x2 -> 4 tokens; the same rule as 896 px -> 64x64 -> 256."""
BACKENDS = ["sdpa", "sdpa_varlen", "flex"]


@pytest.fixture(scope="module", params=[False, True], ids=["whole", "pan_and_scan"])
def tiny_rows(request, tmp_path_factory, coco_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models.registry, "_PROFILES", dict(packer.models.registry._PROFILES))
        register_profile(TINY)
        root = tmp_path_factory.mktemp("gemma3")
        rng = np.random.default_rng(0)
        for name, (w, h) in {"square.png": (300, 300), "tall.png": (300, 900)}.items():
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / name)
        names = [str(p) for p in sorted((coco_dir / "val2017").glob("*.jpg"))[:2]]
        img = lambda n: {"type": "image", "image": n}  # noqa: E731
        recs = [
            {"messages": [{"role": "user", "content": "Count to twenty, slowly, one number per word."},
                          {"role": "assistant", "content": " ".join(str(i) for i in range(1, 21))}]},
            {"messages": [{"role": "user", "content": [img(names[0]), {"type": "text", "text": "Describe it."}]},
                          {"role": "assistant", "content": "A photo of something, taken outdoors on a day."}]},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "First"}, img("square.png"),
                                                       {"type": "text", "text": "then"}, img("tall.png")]},
                          {"role": "assistant", "content": "The first is brighter than the second one."}]},
            {"messages": [{"role": "user", "content": [img(names[1]), {"type": "text", "text": "Caption."}]}],
             "branches": [[{"role": "assistant", "content": "A street with cars and people walking by."}],
                          [{"role": "assistant", "content": "A road"},
                           {"role": "user", "content": "More words please, many more."},
                           {"role": "assistant", "content": "A long road with cars, trees and a blue sky."}]]},
        ]
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in recs))
        options = {"do_pan_and_scan": True} if request.param else None
        config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile=TINY.name, max_length=1024,
                                         profile_options=options)
        build(config, progress=False)
        yield request.param, list(PackedDataset(root / "out", shuffle=False))


@pytest.mark.slow
def test_packed_rows_match_unpacked_on_the_real_model(tiny_rows) -> None:
    cropped, rows = tiny_rows
    assert sum(len(r["example_ids"]) for r in rows) == 4 and len(rows) == 1, "examples should share a row"
    profile = get_profile(TINY.name, **rows[0]["profile_options"])
    assert profile.do_pan_and_scan == cropped  # from the manifest
    images = rows[0]["images"]
    blocks = [int(im["grid_t"]) for im in images]  # 1 + crop index
    assert blocks == ([1, 2, 3, 1, 1, 2, 3, 4, 1, 2, 3] if cropped else [1] * 4)
    batch = collate(rows)
    assert batch["pixel_values"].shape[0] == len(images)
    assert batch["bidirectional_spans"].tolist() == [[im["offset"], im["offset"] + 4] for im in images]
    (batch,), ids, vocab = ce.compact_vocab([batch], ce.profile_token_ids(profile, _tokenizer()))
    assert batch["input_ids"].shape[1] > 3 * 16  # several sliding windows long
    model = ce.tiny_model(profile, token_ids=ids, vocab_size=vocab)
    ref = ce.reference(model, batch, profile, ids)
    assert ref["num_paths"] == 5
    report = ce.compare(model, batch, BACKENDS, ref=ref)
    for b in BACKENDS:
        assert report[b]["ok"], (b, report[b])
        if b != "flex":  # no CPU backward for flex in torch 2.13: losses only
            assert report[b]["grad_missing"] == [] and report[b]["grad_params"] > 0
    if cropped:
        return
    # causal image attention is measurably different: the spans are doing the work
    causal = dict(batch)
    del causal["bidirectional_spans"]
    assert not ce.compare(model, causal, ["sdpa"], ref=ref)["sdpa"]["ok"]

    # model(**collate(rows)) as it is, after use_packed_attention: the same logits as model_inputs
    use_packed_attention(model, "sdpa")
    with torch.no_grad():
        direct = model(**batch).logits
        explicit = model(**model_inputs(batch)).logits
    assert torch.equal(direct, explicit)


def _tokenizer():
    from packer.encode.tokenizers import load_tokenizer

    return load_tokenizer("gemma3")
