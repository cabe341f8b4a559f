"""Packed == unpacked on the real ``Molmo2ForConditionalGeneration`` (tiny random config, fp32).

Shards built from JSONL with the ``molmo2`` profile (stand-in tokenizer, see test_molmo2.py): rows mixing
several examples, one example with two images and text between them, a caption tree with the image in the
prefix, a tree whose branches each hold their own image, text. The reference runs every root-to-leaf path
alone exactly as Molmo2's processor and model would: the processor's pixel inputs for that path's images,
``mm_token_type_ids`` marking the processor's image tokens, the model's own attention (SDPA with
``block_sequence_ids``: all image tokens of the path attend to each other). Per-token losses, total and
every gradient must agree within 1e-5 relative (scripts/check_equivalence.py's ``compare``).

Measured (CPU, this fixture in one batch: 2 rows, 5 examples, 8 paths, 6 images, 2696 tokens): per-token loss
max rel 1.1e-7, total rel 0, gradients 3.8e-6 of each parameter's largest entry over 68 parameters, on both
``sdpa`` and ``sdpa_varlen``.
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
from packer.core.types import IGNORE_INDEX, ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ShardError
from packer.models import get_profile
from packer.models.molmo2.tokenizers import MOLMO2_TOKENS
from packer.pipeline.build import build
from packer.train.attention.backends import packed_attention
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.models import released

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

BACKENDS = ["sdpa", "sdpa_varlen"]  # the dense mask, and the varlen plan + span call (the CUDA kernels' plan)
IMAGE_RUN = ["<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<im_end>"]


@pytest.fixture(scope="module")
def molmo2_rows(tmp_path_factory, coco_images) -> list[dict]:
    root = tmp_path_factory.mktemp("molmo2")
    sizes = [(200, 150), (150, 220), (300, 120)]  # small: one 378-px crop + the low-res view, 424 tokens each
    names = []
    for k, ((w, h), src) in enumerate(zip(sizes, coco_images, strict=False)):
        Image.open(src).convert("RGB").resize((w, h)).save(root / f"im{k}.png")
        names.append(str(root / f"im{k}.png"))
    a, b, c = names
    img = lambda p: {"type": "image", "image": p}  # noqa: E731
    txt = lambda t: {"type": "text", "text": t}  # noqa: E731
    recs = [
        {"messages": [{"role": "user", "content": [img(a), txt("Describe.")]},
                      {"role": "assistant", "content": "A small picture."}]},
        {"messages": [{"role": "user", "content": [txt("Compare "), img(b), txt(" with "), img(c)]},
                      {"role": "assistant", "content": "They differ."},
                      {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes, quite."}]},
        {"messages": [{"role": "user", "content": [img(c), txt("Caption it.")]}],
         "branches": [[{"role": "assistant", "content": "A scene."}],
                      [{"role": "assistant", "content": "Something in a frame, with colours."}],
                      [{"role": "assistant", "content": "Pixels."}]]},
        {"messages": [{"role": "user", "content": "Look at these."}, {"role": "assistant", "content": "Show me."}],
         "branches": [[{"role": "user", "content": [img(a), txt("This?")]}, {"role": "assistant", "content": "One."}],
                      [{"role": "user", "content": [img(b), txt("And that?")]}, {"role": "assistant", "content": "Two."}]]},
        {"text": "A text example between the images, long enough to matter for the packing."},
    ]
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="molmo2", max_length=1400)
    build(config, progress=False)
    return list(PackedDataset(root / "out", shuffle=False))


def _compact(batches: list[dict], tokenizer) -> tuple[list[dict], dict[str, int], int]:
    """Renumber the ids the batches use (and Molmo2's tokens) as 0..K-1: a tiny vocabulary."""
    special = tokenizer.convert_tokens_to_ids(MOLMO2_TOKENS)
    used = sorted(set(special) | {int(i) for b in batches for i in b["input_ids"].unique()})
    table = torch.full((max(used) + 1,), -1, dtype=torch.long)
    table[torch.tensor(used)] = torch.arange(len(used))
    out = []
    for b in batches:
        b = dict(b)
        b["input_ids"] = table[b["input_ids"]]
        for key in ("labels", "shift_labels"):
            if key in b:
                b[key] = torch.where(b[key] == IGNORE_INDEX, b[key], table[b[key].clamp(min=0)])
        out.append(b)
    return out, {t: int(table[i]) for t, i in zip(MOLMO2_TOKENS, special, strict=True)}, len(used)


def _reference(model, batch: dict, refs: list[ImageRef], token_ids: dict[str, int]) -> dict[str, Any]:
    """Every root-to-leaf path run alone as Molmo2's processor + model would (see the module docstring)."""
    profile = get_profile("molmo2")
    run_ids = [token_ids[t] for t in IMAGE_RUN]
    per_image = profile.proof().image_inputs(batch, num_tokens=[0] * len(refs)) if refs else []
    ids = batch["input_ids"][0]
    starts = batch["image_offsets"].tolist() if "image_offsets" in batch else []

    def path_kwargs(tokens: torch.Tensor) -> dict[str, Any]:
        path_ids = ids[tokens][None]
        kwargs: dict[str, Any] = {"input_ids": path_ids, "use_cache": False,
                                  "mm_token_type_ids": torch.isin(path_ids, torch.tensor(run_ids)).long()}
        inside = [k for k, s in enumerate(starts) if bool((tokens == s).any())]
        if inside:
            kwargs.update(profile.reader().pixel_values([refs[k] for k in inside]))
        # the profile's check hooks (scripts/check_equivalence.py) cut the batch to the same inputs
        hooks = profile.proof().reference_inputs(path_ids, [per_image[k] for k in inside], token_ids=token_ids)
        assert hooks.keys() == kwargs.keys() and all(torch.equal(hooks[k], kwargs[k]) for k in kwargs if k != "use_cache")
        return kwargs

    return ce.path_reference(model, batch, path_kwargs)


@pytest.mark.slow
def test_packed_equals_unpacked(molmo2_rows) -> None:
    rows = molmo2_rows
    assert len(rows) >= 2 and any(len(r["images"]) >= 2 for r in rows)
    assert any((r["node_parents"] >= 0).any() for r in rows)  # a tree is packed
    tokenizer = load_tokenizer("molmo2")
    with released.released_reader(get_profile("molmo2")):  # the released image processor, not the profile's
        rows_batch = collate(rows)
    (batch,), token_ids, vocab = _compact([rows_batch], tokenizer)  # every row in one batch
    torch.manual_seed(0)
    model = get_profile("molmo2").proof().tiny_model(token_ids=token_ids, vocab_size=vocab)
    run_ids = [token_ids[t] for t in IMAGE_RUN]
    refs = [ImageRef(path=im["source"]) for r in rows for im in r["images"]]
    assert batch["mm_token_type_ids"][0].tolist() == torch.isin(batch["input_ids"][0], torch.tensor(run_ids)).long().tolist()
    report = ce.compare(model, batch, BACKENDS, ref=_reference(model, batch, refs, token_ids))
    for b in BACKENDS:
        assert report[b]["ok"], (b, report[b])
        assert report[b]["loss_max_rel"] <= 1e-5 and report[b]["total_rel"] <= 1e-5
    assert report["sdpa"]["grad_missing"] == [] and report["sdpa"]["grad_params"] > 0


def test_model_takes_the_collated_batch(molmo2_rows) -> None:
    """``model(**collate(rows))`` after ``use_packed_attention``: the same logits as ``model_inputs``, and
    the bidirectional block changes them (the spans reach the attention)."""
    tokenizer = load_tokenizer("molmo2")
    (batch,), token_ids, vocab = _compact([collate([next(r for r in molmo2_rows if len(r["images"]) >= 2)])], tokenizer)
    torch.manual_seed(0)
    model = get_profile("molmo2").proof().tiny_model(token_ids=token_ids, vocab_size=vocab)
    use_packed_attention(model, "sdpa")
    model.train()
    with torch.no_grad():
        raw = model(**batch).logits
        explicit = model(**model_inputs(batch)).logits
        causal_only = model(**model_inputs({k: v for k, v in batch.items() if k != "bidirectional_spans"})).logits
    assert torch.equal(raw, explicit)
    assert not torch.allclose(raw, causal_only)
    assert np.isfinite(raw.numpy()).all()


def _grouped_layout(spans) -> PackedLayout:
    """Example 0: node 0 [0, 6) -> its one child node 1 [6, 12) -> branches node 2 [12, 16), node 3 [16, 20);
    example 1: node 4 [20, 26)."""
    return PackedLayout.from_tensors(26, [0, 20, 26], [0, 6, 12, 16, 20], [-1, 0, 1, 1, -1],
                                     bidirectional_spans=spans)


def test_grouped_spans_on_every_cpu_backend() -> None:
    """Groups as Molmo2's collate gives them (a chain of image nodes is one group; each branch's own image
    its own): the dense mask (sdpa), the varlen plan + group span call (sdpa_varlen) and flex's mask_mod agree,
    values and gradients."""
    spans = [(1, 3, 0), (7, 9, 0), (13, 15, 2), (17, 20, 3), (21, 23, 4), (24, 26, 4)]
    layout = _grouped_layout(spans)
    dense = layout.dense_mask("cpu")
    assert dense[1, 8] and dense[7, 2] and not dense[13, 18] and not dense[2, 14]  # chain yes, branches no
    assert dense[21, 25] and not dense[21, 8]  # one example's images see each other, never another's
    q, kv = torch.meshgrid(torch.arange(26), torch.arange(26), indexing="ij")
    assert torch.equal(layout.mask_mod("cpu")(0, 0, q, kv), dense)
    plan = layout.span_plan()
    assert plan.q_index.tolist() == [1, 2, 7, 13, 17, 18, 21, 22, 24]  # each group's tokens but its last
    assert plan.k_index.tolist() == [2, 7, 8, 14, 18, 19, 22, 24, 25]  # each group's tokens but its first
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(26, h, 8, generator=g, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    w = torch.randn(26, 4, 8, generator=g, dtype=torch.float64)
    outs = {}
    for backend in ("sdpa", "sdpa_varlen"):
        out = packed_attention(q, k, v, layout, backend=backend)
        outs[backend] = (out, torch.autograd.grad((out * w).sum(), (q, k, v)))
    assert torch.allclose(outs["sdpa"][0], outs["sdpa_varlen"][0], atol=1e-12)
    for a, b in zip(outs["sdpa"][1], outs["sdpa_varlen"][1], strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_a_group_across_branches_is_refused() -> None:
    with pytest.raises(ShardError, match="share a group but not a root-to-leaf path"):
        _grouped_layout([(13, 15, 2), (17, 20, 2)])
