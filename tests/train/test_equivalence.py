"""Packing changes the cost, never the maths: real shards, tiny real HF models, every CPU backend.

Shards are built from JSONL with ``packer.pipeline.build`` (COCO images, caption trees, nested branches, text, a row
filled exactly to capacity) and read back with ``PackedDataset`` + ``collate``. For each batch, per-token
losses, the total and ALL parameter gradients of the packed forward (packer attention backend +
``packed_cross_entropy``) must equal every root-to-leaf path run alone with the model's default attention,
each distinct target counted once, within 1e-5 relative (fp32). Edge cases the build cannot produce (a
one-token example) use a hand-made batch of real token ids. The comparison lives in
scripts/check_equivalence.py, which the CLI test runs end to end.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.models import get_profile
from packer.pipeline.build import build
from packer.train.attention.hf import model_inputs, use_packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from packer.train.trainers.loss import packed_cross_entropy
from tests.models import released

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

CPU_BACKENDS = ["sdpa", "sdpa_varlen", "flex"]
RAW_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"  # a branch starts on content




def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _coco_captions(coco_dir: Path, n: int) -> list[tuple[str, list[str]]]:
    """(image file name, captions) of the first n val2017 images that are present, with >= 5 captions."""
    data = json.loads((coco_dir / "annotations" / "captions_val2017.json").read_text())
    names = {im["id"]: im["file_name"] for im in data["images"]}
    caps: dict[int, list[str]] = {}
    for a in data["annotations"]:
        caps.setdefault(a["image_id"], []).append(a["caption"].strip())
    out = [(names[i], c) for i, c in sorted(caps.items()) if len(c) >= 5 and (coco_dir / "val2017" / names[i]).exists()]
    return out[:n]


def _vl_records(coco_dir: Path, img_dir: Path) -> list[dict]:
    img_dir.mkdir(parents=True, exist_ok=True)
    picked = _coco_captions(coco_dir, 3)
    for name, _ in picked:
        (img_dir / name).write_bytes((coco_dir / "val2017" / name).read_bytes())
    (a, caps_a), (b, caps_b), (c, caps_c) = picked
    img = lambda name, text: [{"type": "image", "image": f"images/{name}"}, {"type": "text", "text": text}]  # noqa: E731
    recs: list[dict] = []
    for i in range(4):  # skewed text lengths
        recs.append({"messages": [{"role": "user", "content": f"Count to {i}." + " and on" * (3 * i * i)},
                                  {"role": "assistant", "content": " ".join(str(k) for k in range(i + 1))}]})
    recs.append({"messages": [{"role": "user", "content": img(a, "Describe the image.")},
                              {"role": "assistant", "content": caps_a[0]}]})
    # a caption tree: one image, five branches
    recs.append({"messages": [{"role": "user", "content": img(b, "Write a caption.")}],
                 "branches": [[{"role": "assistant", "content": cap}] for cap in caps_b[:5]]})
    # nested branches, the image inside the prefix; a deeper level under the third branch
    recs.append({"messages": [{"role": "user", "content": img(c, "Caption it.")}],
                 "branches": [[{"role": "assistant", "content": caps_c[0]}],
                              [{"role": "assistant", "content": caps_c[1]}],
                              {"messages": [{"role": "assistant", "content": caps_c[2]}],
                               "branches": [[{"role": "user", "content": "Shorter?"},
                                             {"role": "assistant", "content": caps_c[3][:20]}],
                                            [{"role": "user", "content": "Longer?"},
                                             {"role": "assistant", "content": caps_c[4]}]]}]})
    recs.append({"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"},
                                   {"from": "gpt", "value": caps_a[1]}], "image": f"images/{a}"})
    return recs


def _text_length(tokenizer, text: str) -> int:
    """Tokens of a `text` record: its tokens plus the end-of-text token (Qwen2 has no BOS)."""
    return len(tokenizer(text).input_ids) + 1


def _rows(out: Path) -> list[dict]:
    return list(PackedDataset(out, shuffle=False))


@pytest.fixture(autouse=True)
def _released_processors():
    """Every batch here read through the released Qwen2-VL processors (``released.released_reader``), not ones
    made from the profile; the build's max_pixels given to them as users pass it."""
    with released.released_reader(get_profile("qwen2-vl"), max_pixels=56 * 56 * 4, min_pixels=56 * 56):
        yield


@pytest.fixture(scope="module")
def vl_build(tmp_path_factory, coco_dir, qwen_tokenizer):
    """Qwen2-VL shards: mixed text/image rows, trees, and one row filled exactly to max_length."""
    root = tmp_path_factory.mktemp("vl")
    recs = _vl_records(coco_dir, root / "images")
    filler = "The quick brown fox jumps over the lazy dog. " * 30
    capacity = _text_length(qwen_tokenizer, filler)  # the longest example: its row is exactly full
    recs.append({"text": filler})
    data = _write_jsonl(root / "data.jsonl", recs)
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2-vl", max_length=capacity,
                                     max_pixels=56 * 56 * 4)
    build(config, progress=False)
    rows = _rows(root / "out")
    return {"rows": rows, "capacity": capacity, "data": data}


@pytest.fixture(scope="module")
def text_build(tmp_path_factory):
    """Text shards rendered with a raw template, so a branch's first token is a loss token."""
    root = tmp_path_factory.mktemp("text")
    recs = [
        {"text": "Hello"},
        {"text": "one two three four five six seven eight nine ten"},
        {"messages": [{"role": "user", "content": "Question: what colour is the sky?\n"}],
         "branches": [[{"role": "assistant", "content": "Blue."}],
                      [{"role": "assistant", "content": "It is blue, mostly."}],
                      {"messages": [{"role": "assistant", "content": "Grey"}],
                       "branches": [[{"role": "assistant", "content": " today."}],
                                    [{"role": "assistant", "content": " at night, and dark."}]]}]},
        {"messages": [{"role": "user", "content": "Say something long.\n"},
                      {"role": "assistant", "content": "Something long " * 12}]},
    ]
    data = _write_jsonl(root / "data.jsonl", recs)
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="text", max_length=64,
                                     chat_template=RAW_TEMPLATE)
    build(config, progress=False)
    return {"rows": _rows(root / "out"), "data": data}


def _tiny(name: str, batches: list[dict], tokenizer, *, seed: int = 0, **kw) -> tuple[list[dict], object, dict]:
    """Renumbered batches, the profile's tiny model and ``compare``'s profile/token_ids kwargs."""
    profile = get_profile(name)
    batches, ids, vocab = ce.compact_vocab(batches, ce.profile_token_ids(profile, tokenizer))
    model = ce.tiny_model(profile, token_ids=ids, vocab_size=vocab, seed=seed, **kw)
    return batches, model, {"profile": profile, "token_ids": ids}


def _check(report: dict, backends: list[str]) -> None:
    for b in backends:
        assert report[b]["ok"], (b, json.dumps(report[b]))
        assert report[b]["loss_max_rel"] <= 1e-5 and report[b]["total_rel"] <= 1e-5
        if b != "flex":  # no CPU backward for flex in torch 2.13: losses only
            assert report[b]["grad_missing"] == [] and report[b]["grad_params"] > 0


def _has_tree(batch: dict, min_children: int) -> bool:
    parents = batch["node_parents"].tolist()
    return any(parents.count(p) >= min_children for p in set(parents) if p >= 0)


def _depth2(batch: dict) -> bool:
    parents = batch["node_parents"].tolist()
    return any(p >= 0 and parents[p] >= 0 for p in parents)


def test_build_covers_the_cases(vl_build, text_build):
    rows = vl_build["rows"]
    assert any(len(r["input_ids"]) == vl_build["capacity"] for r in rows), "no row filled exactly to capacity"
    batches = [collate([r]) for r in rows]
    mixed = [b for b in batches if "pixel_values" in b and len(b["example_ids"]) > len(b["image_grid_thw"])]
    assert mixed, "no row mixes image and text-only examples"
    assert any(_has_tree(b, 5) for b in batches) and any(_depth2(b) for b in batches)
    text = collate(text_build["rows"])
    starts = text["node_offsets"][text["node_parents"] >= 0].long()
    assert bool((text["labels"][0, starts] != IGNORE_INDEX).any()), "no branch starts on a loss token"


@pytest.mark.slow
def test_qwen2_vl_rows_match_unpacked(vl_build, qwen_tokenizer):
    batches, model, ctx = _tiny("qwen2-vl", [collate([r]) for r in vl_build["rows"]], qwen_tokenizer)
    for batch in batches:
        report = ce.compare(model, batch, CPU_BACKENDS, **ctx)
        _check(report, CPU_BACKENDS)


def test_qwen2_vl_multi_row_batch_matches_unpacked(vl_build, qwen_tokenizer):
    """collate() of several rows: node indices and image offsets shift across rows."""
    (batch,), model, ctx = _tiny("qwen2-vl", [collate(vl_build["rows"])], qwen_tokenizer, seed=1)
    _check(ce.compare(model, batch, ["sdpa_varlen"], **ctx), ["sdpa_varlen"])


@pytest.mark.parametrize("model_class", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_text_tree_rows_match_unpacked(text_build, qwen_tokenizer, model_class):
    batches, model, ctx = _tiny("text", [collate(text_build["rows"])], qwen_tokenizer, model_class=model_class)
    assert type(model).__name__ == model_class
    for batch in batches:
        _check(ce.compare(model, batch, CPU_BACKENDS, **ctx), CPU_BACKENDS)


def _hand_batch(tokenizer) -> dict:
    """Real token ids laid out by hand: a one-token example, a linear one, and a nested tree whose branches
    start on loss tokens. Positions from an independent walk of the paths."""
    enc = lambda s: tokenizer(s).input_ids  # noqa: E731
    one = [enc("Hi")[0]]
    linear = enc("The cat sat on the mat.")
    prefix, b1, b2, b21, b22 = enc("Q: sky?\n"), enc("Blue."), enc("Grey"), enc(" now."), enc(" at dusk.")
    tree_nodes = [prefix, b1, b2, b21, b22]
    tree_parents = [-1, 0, 0, 2, 2]
    ids, labels, pos, offsets, parents, cu = [], [], [], [], [], [0]

    def add_example(nodes: list[list[int]], node_parents: list[int], loss_from_node: int) -> None:
        base = len(offsets)
        depth_end: list[int] = []  # last position of each node of this example
        for n, (toks, par) in enumerate(zip(nodes, node_parents, strict=True)):
            offsets.append(len(ids))
            parents.append(-1 if par < 0 else base + par)
            start = 0 if par < 0 else depth_end[par] + 1
            pos.extend(range(start, start + len(toks)))
            depth_end.append(start + len(toks) - 1)
            for k, t in enumerate(toks):
                first = par < 0 and k == 0
                labels.append(IGNORE_INDEX if first or n < loss_from_node else t)
            ids.extend(toks)
        cu.append(len(ids))

    add_example([one], [-1], loss_from_node=1)  # a single token: no loss, attends to itself only
    add_example([linear], [-1], loss_from_node=0)
    add_example(tree_nodes, tree_parents, loss_from_node=1)  # every branch's first token is a loss token
    add_example([one], [-1], loss_from_node=1)  # another single-token example at the row's end
    t = lambda x, dt=torch.int64: torch.tensor(x, dtype=dt)  # noqa: E731
    batch = {
        "input_ids": t(ids)[None],
        "labels": t(labels)[None],
        "position_ids": t(pos)[None],
        "cu_seqlens": t(cu, torch.int32),
        "node_offsets": t(offsets, torch.int32),
        "node_parents": t(parents, torch.int32),
    }
    return batch


def test_hand_built_edge_cases_match_unpacked(qwen_tokenizer):
    (batch,), model, ctx = _tiny("text", [_hand_batch(qwen_tokenizer)], qwen_tokenizer, model_class="LlamaForCausalLM")
    layout = PackedLayout.from_batch(batch)
    assert (layout.cu_seqlens.diff() == 1).sum() == 2  # two one-token examples
    _check(ce.compare(model, batch, CPU_BACKENDS, **ctx), CPU_BACKENDS)


def test_hf_own_loss_is_exact_on_linear_packs(vl_build, qwen_tokenizer):
    """For a linear row the collate's shift_labels make the model's own loss equal packed_cross_entropy."""
    linear = [collate([r]) for r in vl_build["rows"] if not (np.asarray(r["node_parents"]) >= 0).any()]
    assert linear, "the build has no linear row"
    (batch,), model, _ = _tiny("qwen2-vl", [linear[0]], qwen_tokenizer)
    use_packed_attention(model, "sdpa_varlen")
    out = model(**model_inputs(batch, with_labels=True))
    ours = packed_cross_entropy(out.logits, batch["labels"], batch, reduction="mean")
    torch.testing.assert_close(out.loss, ours.loss, rtol=1e-6, atol=1e-6)


def test_raw_collated_batch_works_for_text_models(text_build, qwen_tokenizer):
    """model(**batch) straight from collate: the hook turns it into model_inputs(batch), bit for bit."""
    (batch,), model, _ = _tiny("text", [collate(text_build["rows"])], qwen_tokenizer, model_class="LlamaForCausalLM")
    use_packed_attention(model, "sdpa")
    with torch.no_grad():
        a = model(**batch).logits
        b = model(**model_inputs(batch)).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_raw_collated_batch_works_for_qwen2_vl(vl_build, qwen_tokenizer):
    """The raw batch's cu_seqlens / max_seqlen must not reach the vision tower as its own boundaries, and a
    tree row's labels must not feed HF's shifted loss: model(**batch) equals the explicit path exactly."""
    rows = vl_build["rows"]
    tree = next(r for r in rows if (np.asarray(r["node_parents"]) >= 0).any())
    (batch,), model, _ = _tiny("qwen2-vl", [collate([tree])], qwen_tokenizer)
    assert "pixel_values" in batch and "cu_seqlens" in batch
    use_packed_attention(model, "sdpa_varlen")
    with torch.no_grad():
        raw = model(**batch)
        explicit = model(**model_inputs(batch))
    assert raw.loss is None  # tree row: the exact loss is packed_cross_entropy's, not HF's shift
    torch.testing.assert_close(raw.logits, explicit.logits, rtol=0, atol=0)


def test_raw_collated_linear_batch_gives_hf_loss(vl_build, qwen_tokenizer):
    """A linear row straight from collate: HF's own loss (via shift_labels) equals packed_cross_entropy."""
    linear = [collate([r]) for r in vl_build["rows"] if not (np.asarray(r["node_parents"]) >= 0).any()]
    (batch,), model, _ = _tiny("qwen2-vl", [linear[0]], qwen_tokenizer)
    use_packed_attention(model, "sdpa_varlen")
    out = model(**batch)
    ours = packed_cross_entropy(out.logits, batch["labels"], batch, reduction="mean")
    torch.testing.assert_close(out.loss, ours.loss, rtol=1e-6, atol=1e-6)


def test_check_equivalence_cli(text_build, capsys):
    code = ce.main(["--data", str(text_build["data"]), "--model", "text", "--model-class", "LlamaForCausalLM",
                    "--max-length", "64", "--backend", "sdpa_varlen"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    report = json.loads(line)
    assert code == 0 and report["ok"] and report["sdpa_varlen"]["ok"] and report["rows"] >= 1
    assert report["model"] == "text" and report["model_class"] == "LlamaForCausalLM"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["varlen", "flash", "flex"])
def test_gpu_backends_match_sdpa(vl_build, qwen_tokenizer, backend):
    """On CUDA the kernels run in bf16: losses within 2e-2, gradients aligned (cosine > 0.999) vs fp32 sdpa."""
    from packer.train.attention.backends import flash_available, varlen_available

    if backend == "flash" and not flash_available():
        pytest.skip("flash-attn is not installed")
    if backend == "varlen" and not varlen_available():
        pytest.skip("torch varlen_attn needs PyTorch's flash kernels (sm80+)")
    batches, model, _ = _tiny("qwen2-vl", [collate([r]) for r in vl_build["rows"]], qwen_tokenizer)
    model = model.cuda()
    for batch in batches:
        batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        ref = ce.packed(model, batch, "sdpa")
        got = ce.packed(model, batch, backend)
        mask = batch["labels"][0].cpu() != IGNORE_INDEX
        torch.testing.assert_close(got["per_token"].cpu()[mask], ref["per_token"].cpu()[mask], rtol=2e-2, atol=2e-2)
        for name, g in ref["grads"].items():
            cos = torch.nn.functional.cosine_similarity(got["grads"][name].flatten(), g.flatten(), dim=0)
            assert cos > 0.999 or g.abs().max() < 1e-8, (name, float(cos))


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "max_length"), [("qwen2.5-vl", 512), ("llava", 2048), ("qwen3.5", 512)])
def test_check_equivalence_cli_for_vision_families(vl_build, capsys, profile, max_length):
    """The script is family-agnostic: the family's file builds its tiny model and runs each path alone."""
    code = ce.main(["--data", str(vl_build["data"]), "--model", profile, "--max-length", str(max_length),
                    "--tokenizer", "qwen2-vl", "--backend", "sdpa_varlen", "--max-batches", "8"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["ok"], report
    assert report["model_class"] == get_profile(profile).proof().model_class
