"""Packed == unpacked on the real ``LlavaOnevisionForConditionalGeneration`` (tiny random config, fp32): rows
built by ``packer build`` that mix text, a tiled image, two untiled images, a two-level caption tree and trees
whose images sit in different branches (tiled where a path holds one, untiled where it holds several); every
CPU backend, against scripts/check_equivalence.py's reference (each path alone with the profile's
``reference_inputs``: the model decides the tiling itself); ``model(**collate(rows))`` after
``use_packed_attention``; and ``scripts/check_equivalence.py --model llava-onevision``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import packer.models.registry
from packer.config import BuildConfig
from packer.models import register_profile
from packer.models.llava_onevision import LlavaOnevisionProfile, anyres_pinpoints
from packer.pipeline.build import build
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset

_spec = importlib.util.spec_from_file_location(
    "check_equivalence", Path(__file__).resolve().parents[2] / "scripts" / "check_equivalence.py"
)
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

TOKENS = {"<image>": 151646, "<video>": 151647}  # the builtin llava-onevision tokenizer's ids
BACKENDS = ["sdpa", "sdpa_varlen", "flex"]

TINY = LlavaOnevisionProfile(name="llava-onevision-tiny", crop_px=28, pinpoints=anyres_pinpoints(28))
"""28 px crops of 2x2 patches: 4 base features, up to 36 tiles; the same rule at 1/200 of the pixels."""


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory, coco_dir):
    """Rows mixing text, one-image (tiled), two-image (untiled) and tree examples (images in the root, in
    different branches, or both), built by packer build."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models.registry, "_PROFILES", dict(packer.models.registry._PROFILES))
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
            # images in different branches: one per path (tiled) beside two (untiled) and none
            {"messages": [_user("Look."), _assistant("Sure.")],
             "branches": [[_user(img(names[0]), "One?"), _assistant("One.")],
                          [_user(img(names[1]), img(names[2]), "Two?"), _assistant("Two.")],
                          [_user("None?"), _assistant("No image.")]]},
            # a root image and one more in each branch: two on every path, all untiled
            {"messages": [_user(img(names[1]), "Caption."), _assistant("A scene.")],
             "branches": [[_user(img(names[0]), "And this?"), _assistant("Another.")],
                          [_user(img(names[2]), "This?"), _assistant("A third.")]]},
        ]
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in recs))
        config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile=TINY.name, max_length=512)
        build(config, progress=False)
        rows = list(PackedDataset(root / "out", shuffle=False))
        yield rows


def _user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


@pytest.mark.slow
def test_packed_rows_match_unpacked_on_the_real_model(tiny_rows) -> None:
    rows = tiny_rows
    assert sum(len(r["example_ids"]) for r in rows) == 6 and len(rows) <= 2, "examples should share rows"
    assert any(im["grid_t"] == 1 for r in rows for im in r["images"]) and any(
        im["grid_t"] > 2 for r in rows for im in r["images"])
    (batch,), ids, vocab = ce.compact_vocab([collate(rows)], TOKENS)
    model = ce.tiny_model(TINY, token_ids=ids, vocab_size=vocab)
    ref = ce.reference(model, batch, TINY, ids)
    assert ref["num_paths"] == 11
    report = ce.compare(model, batch, BACKENDS, ref=ref)
    for b in BACKENDS:
        assert report[b]["ok"], (b, report[b])
        if b != "flex":  # no CPU backward for flex in torch 2.13: losses only
            assert report[b]["grad_missing"] == [] and report[b]["grad_params"] > 0
    assert "batch_num_images" in model_inputs(batch)

    # model(**collate(rows)) as it is, after use_packed_attention: the same logits as model_inputs
    use_packed_attention(model, "sdpa")
    with torch.no_grad():
        direct = model(**batch).logits
        explicit = model(**model_inputs(batch)).logits
    assert torch.equal(direct, explicit)


@pytest.mark.slow
def test_check_equivalence_cli_llava_onevision(tmp_path, coco_dir, capsys) -> None:
    """The script on the real profile (384 px crops): a tree whose branches each hold one image (tiled)."""
    names = sorted(p.name for p in (coco_dir / "val2017").glob("*.jpg"))[3:5]
    img = lambda n: {"type": "image", "image": str(coco_dir / "val2017" / n)}  # noqa: E731
    rec = {"messages": [_user("Two photos, one per answer."), _assistant("Go on.")],
           "branches": [[_user(img(names[0]), "This?"), _assistant("A photo.")],
                        [_user(img(names[1]), "And this?"), _assistant("Another.")]]}
    data = tmp_path / "tree.jsonl"
    data.write_text(json.dumps(rec) + "\n")
    code = ce.main(["--data", str(data), "--model", "llava-onevision", "--max-length", "8192",
                    "--backend", "sdpa_varlen"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["ok"] and report["model_class"] == "LlavaOnevisionForConditionalGeneration", report
