"""Packed == unpacked on the real ``Gemma3ForConditionalGeneration`` (tiny random config, fp32): rows built by
``packer build`` mixing text, one- and two-image examples and a two-level caption tree; a sliding-window layer
(window 16, shorter than the rows) and a global one; each image's soft tokens bidirectional. The reference runs
every root-to-leaf path alone with the processor's ``token_type_ids``, from which Gemma 3 builds its own
masks (``create_masks_for_vision_model``); the packed side takes the spans ``collate`` emits from the profile
(each image's soft tokens) (tests/train/family_reference.py).
"""

from __future__ import annotations

import json

import pytest
import torch

import packer.models
from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.models import register_profile
from packer.models.gemma3 import Gemma3Profile
from packer.pipeline.build import build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.hf import model_inputs, use_packed_attention
from tests.train import family_reference as fr

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py
SOFT, BOI, EOI = 151650, 151648, 151649  # <image_soft_token>, <start_of_image>, <end_of_image> (stand-in ids)
TINY = Gemma3Profile(name="gemma3-tiny", image_px=56, tokens_per_image=4)
"""56 px images: 4x4 patches pooled 2x2 -> 4 tokens; the same rule as 896 px -> 64x64 -> 256."""
BACKENDS = ["sdpa", "sdpa_varlen", "flex"]


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory, coco_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models, "_PROFILES", dict(packer.models._PROFILES))
        register_profile(TINY)
        root = tmp_path_factory.mktemp("gemma3")
        names = sorted(p.name for p in (coco_dir / "val2017").glob("*.jpg"))[:3]
        img = lambda n: {"type": "image", "image": str(coco_dir / "val2017" / n)}  # noqa: E731
        recs = [
            {"messages": [{"role": "user", "content": "Count to twenty, slowly, one number per word."},
                          {"role": "assistant", "content": " ".join(str(i) for i in range(1, 21))}]},
            {"messages": [{"role": "user", "content": [img(names[0]), {"type": "text", "text": "Describe it."}]},
                          {"role": "assistant", "content": "A photo of something, taken outdoors on a day."}]},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "First"}, img(names[1]),
                                                       {"type": "text", "text": "then"}, img(names[2])]},
                          {"role": "assistant", "content": "The first is brighter than the second one."}]},
            {"messages": [{"role": "user", "content": [img(names[2]), {"type": "text", "text": "Caption."}]}],
             "branches": [[{"role": "assistant", "content": "A street with cars and people walking by."}],
                          [{"role": "assistant", "content": "A road"},
                           {"role": "user", "content": "More words please, many more."},
                           {"role": "assistant", "content": "A long road with cars, trees and a blue sky."}]]},
        ]
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in recs))
        config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile=TINY.name, max_length=512)
        build(config, progress=False)
        yield list(PackedDataset(root / "out", shuffle=False))


def _path_inputs(soft_id: int):
    """A path's pixels and the processor's token_type_ids (1 on soft tokens), from which Gemma 3 masks."""

    def inputs(ids: torch.Tensor, images: list[dict]) -> dict:
        if not images:
            return {}
        refs = [ImageRef(path=im["source"]) for im in images]
        return {**TINY.pixel_values(refs), "token_type_ids": (ids == soft_id).long()[None]}

    return inputs


def test_packed_rows_match_unpacked_on_the_real_model(tiny_rows) -> None:
    rows = tiny_rows
    assert sum(len(r["example_ids"]) for r in rows) == 4 and len(rows) == 1, "examples should share a row"
    images = fr.batch_images(rows)
    assert [im["num_tokens"] for im in images] == [4] * 4
    batches, ids, vocab = fr.compact([collate(rows)], [SOFT, BOI, EOI])
    (batch,) = batches
    assert batch["input_ids"].shape[1] > 3 * 16  # several sliding windows long
    assert batch["bidirectional_spans"].tolist() == [[im["at"], im["at"] + im["num_tokens"]] for im in images]
    model = TINY.tiny_model(token_ids={"image_token": ids[SOFT], "vision_start": ids[BOI], "vision_end": ids[EOI]},
                            vocab_size=vocab)
    fr.freeze_key_biases(model)
    ref = fr.reference(model, batch, images, _path_inputs(ids[SOFT]))
    assert ref["num_paths"] == 5
    report = fr.ce.compare(model, batch, BACKENDS, ref=ref)
    fr.check(report, BACKENDS)

    # causal image attention is measurably different: the spans are doing the work
    causal = dict(batch)
    del causal["bidirectional_spans"]
    assert not fr.ce.compare(model, causal, ["sdpa"], ref=ref)["sdpa"]["ok"]

    # model(**collate(rows)) as it is, after use_packed_attention: the same logits as model_inputs
    use_packed_attention(model, "sdpa")
    with torch.no_grad():
        direct = model(**batch).logits
        explicit = model(**model_inputs(batch)).logits
    assert torch.equal(direct, explicit)
