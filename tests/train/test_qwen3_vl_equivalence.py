"""Packing changes the cost, never the maths, on the real ``Qwen3VLForConditionalGeneration`` (tiny, fp32).

qwen3-vl shards (COCO images, caption trees, nested branches, text, a LLaVA record) are read back with
``PackedDataset`` + ``collate``; per-token losses, the total and every gradient of the packed forward equal
each root-to-leaf path run alone with the model's own positions (``get_rope_index``), as in
tests/train/test_equivalence.py (same comparison: scripts/check_equivalence.py). DeepStack and the
interleaved mRoPE run as in the released model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packer.config import BuildConfig
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from packer.pipeline.build import build
from packer.train.collate import collate
from packer.train.hf import model_inputs, use_packed_attention
from tests.train.test_equivalence import (
    CPU_BACKENDS,
    _check,
    _rows,
    _text_length,
    _vl_records,
    _write_jsonl,
    ce,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


@pytest.fixture(scope="module")
def qwen3_build(tmp_path_factory, coco_dir):
    root = tmp_path_factory.mktemp("qwen3vl")
    recs = _vl_records(coco_dir, root / "images")
    profile = get_profile("qwen3-vl")
    filler = "The quick brown fox jumps over the lazy dog. " * 30
    recs.append({"text": filler})
    data = _write_jsonl(root / "data.jsonl", recs)
    capacity = _text_length(load_tokenizer(profile.default_tokenizer), filler)  # its row is exactly full
    # 4..16 tokens per image keeps the vision tower cheap; the build uses Qwen3-VL's own tokenizer
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen3-vl", max_length=capacity,
                                     min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16)
    build(config, progress=False)
    return _rows(root / "out")


def _model(ids: dict[str, int], seed: int = 0) -> torch.nn.Module:
    token_ids = {k: v for k, v in ids.items() if k != "vocab_size"}
    return get_profile("qwen3-vl").tiny_model(token_ids=token_ids, vocab_size=ids["vocab_size"], seed=seed)


def test_build_has_images_trees_and_mixed_rows(qwen3_build):
    batches = [collate([r]) for r in qwen3_build]
    assert any("pixel_values" in b and len(b["example_ids"]) > len(b["image_grid_thw"]) for b in batches)
    assert any((b["node_parents"] >= 0).sum() >= 5 for b in batches)
    assert all(b["pixel_values"].shape[1] == 3 * 2 * 16 * 16 for b in batches if "pixel_values" in b)


def test_rows_match_unpacked(qwen3_build):
    batches, ids = ce.compact_vocab([collate([r]) for r in qwen3_build])
    model = _model(ids)
    assert model.config.vision_config.deepstack_visual_indexes == [0, 1]
    for batch in batches:
        _check(ce.compare(model, batch, CPU_BACKENDS), CPU_BACKENDS)


def test_multi_row_batch_matches_unpacked(qwen3_build):
    (batch,), ids = ce.compact_vocab([collate(qwen3_build)])
    _check(ce.compare(_model(ids, seed=1), batch, ["sdpa_varlen"]), ["sdpa_varlen"])


def test_raw_collated_batch(qwen3_build):
    """model(**collate(rows)) after use_packed_attention: the same logits as the explicit model_inputs."""
    tree = next(r for r in qwen3_build if (np.asarray(r["node_parents"]) >= 0).any())
    (batch,), ids = ce.compact_vocab([collate([tree])])
    assert "pixel_values" in batch
    model = _model(ids)
    use_packed_attention(model, "sdpa_varlen")
    with torch.no_grad():
        raw = model(**batch)
        explicit = model(**model_inputs(batch))
    torch.testing.assert_close(raw.logits, explicit.logits, rtol=0, atol=0)
