"""Adding a model family is one package: a toy family (tests/models/toy_family/: 9 tokens per image, its own
placeholder, its own reader) plus one ``register_family`` line builds, verifies, reads and collates.

The placeholder is honestly the toy's own token in the shards: the builtin tokenizer is Qwen2's, so the toy
takes ``<|vision_pad|>``, a special token of that tokenizer that no builtin family uses, and the build's
``chat_template`` (a config option) is a small ChatML template that renders each image part as that token.
Any code that still assumed Qwen's ``<|image_pad|>``, its grids, its mRoPE or its batch keys would fail here.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import packer.models.registry
from packer.config import BuildConfig
from packer.core.media import MEDIA
from packer.encode.tokenizers import load_tokenizer
from packer.models import forward_keys, get_profile, profile_names, register_family
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.hf import model_inputs
from tests.models import toy_family
from tests.models.toy_family import ToyProfile

TOY_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_pad|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _records(names: list[str]) -> list[dict]:
    image = lambda n: {"type": "image", "image": f"images/{n}"}  # noqa: E731
    return [
        {"messages": [{"role": "user", "content": [image(names[0]), {"type": "text", "text": "Describe."}]},
                      {"role": "assistant", "content": "A picture."}]},
        {"messages": [{"role": "user", "content": [image(names[1]), {"type": "text", "text": "and"}, image(names[2])]},
                      {"role": "assistant", "content": "Two pictures."}]},
        {"messages": [{"role": "user", "content": [image(names[2]), {"type": "text", "text": "Caption it."}]}],
         "branches": [[{"role": "assistant", "content": "A first caption."}],
                      [{"role": "assistant", "content": "A second, longer caption."}]]},
        {"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"}, {"from": "gpt", "value": "Things."}],
         "image": f"images/{names[0]}"},
        {"messages": [{"role": "user", "content": "No image here."}, {"role": "assistant", "content": "Fine."}]},
        {"text": "Plain text pretraining data. " * 5},
    ]


@pytest.fixture(scope="module")
def toy(tmp_path_factory, coco_images):
    """The one registry line, undone after the module so other tests see the builtin families only."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models.registry, "_PROFILES", dict(packer.models.registry._PROFILES))
        register_family(toy_family)

        root = tmp_path_factory.mktemp("toy")
        (root / "images").mkdir()
        for p in coco_images[:3]:
            shutil.copy(p, root / "images" / p.name)
        records = _records([p.name for p in coco_images[:3]])
        files = [root / "a.jsonl", root / "b.jsonl"]  # one encode chunk each: two workers get work
        for path, part in zip(files, (records[:3], records[3:]), strict=True):
            path.write_text("".join(json.dumps(r) + "\n" for r in part))
        (root / "toy.jinja").write_text(TOY_TEMPLATE)
        config = BuildConfig.from_inputs([str(f) for f in files], str(root / "out"), profile="toy", max_length=256,
                                         chat_template=str(root / "toy.jinja"), rows_per_shard=2, rows_per_row_group=1)
        yield build(config, progress=False), root / "out"


@pytest.mark.slow
def test_workers_build_the_same_bytes(toy, tmp_path):
    """Spawned encode workers get the toy profile inside the pickled encoder; the shards are identical."""
    result, out = toy
    config = BuildConfig.from_dict({**result.manifest["config"], "output": str(tmp_path / "out"), "num_proc": 2})
    again = build(config, progress=False)
    assert [s["sha256"] for s in again.manifest["shards"]] == [s["sha256"] for s in result.manifest["shards"]]


@pytest.mark.slow
def test_the_toy_is_registered(toy):
    assert profile_names()[-1] == "toy" and isinstance(get_profile("toy"), ToyProfile)
    assert "toy_pixel_values" in forward_keys()


def test_build_uses_the_toys_placeholder_and_counts(toy):
    result, out = toy
    toy_id = load_tokenizer("qwen2-vl").convert_tokens_to_ids("<|vision_pad|>")
    assert result.manifest["profile"] == "toy"
    assert result.manifest["image_token_id"] == toy_id != 151655  # not Qwen's <|image_pad|>
    totals = result.manifest["totals"]
    assert (totals["examples"], totals["rejected"]) == (6, 0)
    assert totals["vision_tokens"] == 5 * 9  # five images named, nine tokens each
    assert verify_build(out).ok, verify_build(out).lines()


def test_rows_read_and_collate(toy):
    _, out = toy
    toy_id = load_tokenizer("qwen2-vl").convert_tokens_to_ids("<|vision_pad|>")
    rows = list(PackedDataset(out, shuffle=False))  # finds the family by the manifest's profile name
    images = [im for r in rows for im in r["images"]]
    assert len(images) == 5
    for r in rows:
        assert "mrope_position_ids" not in r  # 1-D positions only
        assert not (r["input_ids"] == 151655).any()
        want = np.zeros(len(r["input_ids"]), dtype=bool)
        for im in r["images"]:
            assert (im["num_tokens"], im["grid_t"], im["grid_h"], im["grid_w"]) == (9, 1, 3, 3)
            want[im["offset"] : im["offset"] + 9] = True
        np.testing.assert_array_equal(r["input_ids"] == toy_id, want)

    batch = collate(rows)
    assert tuple(batch["toy_pixel_values"].shape) == (5, 3, 48, 48)
    assert "pixel_values" not in batch and "image_grid_thw" not in batch
    assert batch["position_ids"].shape == batch["input_ids"].shape  # (1, T)
    starts = batch["image_offsets"].tolist()
    assert all((batch["input_ids"][0, s : s + 9] == toy_id).all() for s in starts)
    inputs = model_inputs(batch)
    assert {"input_ids", "position_ids", "toy_pixel_values"} <= set(inputs)


def test_the_toys_media_are_rows_of_the_media_table(toy, tmp_path):
    """A family takes a medium by setting the placeholder its row names (``Medium.placeholder``): the toy has
    images and audio, no video. Budgets, budget rejects and verify's budget check loop over the rows, so the
    toy's images are budgeted with no code of its own: a pack of at most one image rejects the example with two
    (the table's words), and verify flags a shard whose manifest promises fewer images than a row holds."""
    result, out = toy
    profile = get_profile("toy")
    assert [m.name for m in MEDIA if getattr(profile, m.placeholder)] == ["image", "audio"]
    config = BuildConfig.from_dict({**result.manifest["config"], "output": str(tmp_path / "one"), "max_images": 1})
    one = build(config, progress=False)
    rejects = [json.loads(x) for x in (tmp_path / "one" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["reason"], r["message"]) for r in rejects] == [
        ("overlong", "18 vision tokens / 2 images exceed --max-vision-tokens / --max-images")]
    assert one.manifest["totals"]["examples"] == 5 and verify_build(tmp_path / "one").ok

    copy = tmp_path / "tight"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["max_images"] = 1  # a promise the rows (two images in one) do not keep
    (copy / "manifest.json").write_text(json.dumps(manifest))
    report = verify_build(copy)
    assert {check for _, check in report.counts} == {"images budget"}, report.lines()
    assert all("images > max_images 1" in v.what for v in report.violations)
