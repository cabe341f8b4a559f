"""Packed == unpacked on the real ``InternVLForConditionalGeneration`` (tiny random config, fp32): rows that mix
text and image examples, several images, layouts of 1 tile and of 2 tiles + thumbnail, and message trees, against every root-to-leaf path run alone with the model's own defaults (scripts/check_equivalence.py).
The tokenizer is the builtin ``internvl3`` (tests/models/test_internvl.py checks it against the processor).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from packer.pipeline.build import build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.hf import model_inputs, use_packed_attention
from tests.models.test_internvl import _png

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


def _records(tmp_path: Path) -> list[dict]:
    for i, (w, h) in enumerate([(900, 450), (448, 448), (450, 900)]):
        (tmp_path / f"im{i}.png").write_bytes(_png(w, h, seed=i))
    img = lambda name, text: [{"type": "image", "image": str(name)}, {"type": "text", "text": text}]  # noqa: E731
    return [
        {"messages": [{"role": "user", "content": "Count to 3."}, {"role": "assistant", "content": "1 2 3"}]},
        {"messages": [{"role": "user", "content": img("im0.png", "Describe.")},
                      {"role": "assistant", "content": "Coloured noise."}]},
        # a tree: one image, three branches, one nested with a second image in a follow-up turn
        {"messages": [{"role": "user", "content": img("im1.png", "Caption it.")}],
         "branches": [[{"role": "assistant", "content": "Noise."}],
                      [{"role": "assistant", "content": "Random pixels, square."}],
                      {"messages": [{"role": "assistant", "content": "Static"}],
                       "branches": [[{"role": "user", "content": img("im2.png", "And this?")},
                                     {"role": "assistant", "content": "Taller static."}],
                                    [{"role": "user", "content": "Shorter?"},
                                     {"role": "assistant", "content": "Static."}]]}]},
        {"text": "A plain document with no chat template at all, long enough to matter."},
    ]


@pytest.fixture(scope="module")
def ivl_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("internvl")
    records = _records(root)
    data, small = root / "data.jsonl", root / "small.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    small.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))  # for the CLI: text + one image
    build(BuildConfig.from_inputs([str(data)], str(root / "out"), profile="internvl", max_length=4096),
          progress=False)
    return {"rows": list(PackedDataset(root / "out", shuffle=False)), "small": small}


@pytest.fixture(scope="module")
def tiny(ivl_build):
    profile = get_profile("internvl")
    token_ids = ce.profile_token_ids(profile, load_tokenizer("internvl3"))
    batches, ids, vocab = ce.compact_vocab([collate(ivl_build["rows"])], token_ids)
    model = ce.tiny_model(profile, token_ids=ids, vocab_size=vocab)
    return batches[0], model, {"profile": profile, "token_ids": ids}


def test_packed_equals_unpacked_on_internvl(tiny) -> None:
    batch, model, ctx = tiny
    assert type(model).__name__ == "InternVLForConditionalGeneration"
    parents = batch["node_parents"].tolist()
    assert len(batch["example_ids"]) == 4 and len(batch["image_offsets"]) == 3  # examples and images mixed
    assert any(parents.count(p) >= 3 for p in set(parents) if p >= 0)  # a tree
    backends = ["sdpa", "sdpa_varlen"]  # flex is family-agnostic and slow on CPU: tests/train/test_equivalence.py
    ref = ce.reference(model, batch, **ctx)
    assert any("vision_tower" in n for n in ref["grads"])  # the vision tower's gradients are compared too
    report = ce.compare(model, batch, backends, ref=ref, **ctx)
    for b in backends:
        assert report[b]["ok"], (b, report[b])
    assert report["sdpa"]["grad_missing"] == [] and report["sdpa"]["grad_params"] > 0


def test_raw_collated_batch_runs_internvl(tiny) -> None:
    """model(**collate(rows)) after use_packed_attention: equal to the explicit model_inputs, bit for bit."""
    batch, model, _ = tiny
    use_packed_attention(model, "sdpa_varlen")
    with torch.no_grad():
        raw = model(**batch).logits
        explicit = model(**model_inputs(batch)).logits
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(raw, explicit, rtol=0, atol=0)
    assert int((batch["labels"] != IGNORE_INDEX).sum()) > 0


def test_check_equivalence_cli_internvl(ivl_build, capsys) -> None:
    code = ce.main(["--data", str(ivl_build["small"]), "--model", "internvl", "--max-length", "4096",
                    "--backend", "sdpa_varlen"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["ok"] and report["model_class"] == "InternVLForConditionalGeneration", report
