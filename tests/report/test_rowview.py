"""``packer inspect``: one row's examples, tree, roles (read from the tokens), loss text, images and mask."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import cli
from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.models import get_profile
from packer.pipeline.build import build
from packer.report.rowview import coarse_mask, describe_row, draw_mask, find_example, format_row, read_row
from packer.shards.io import open_shards
from packer.train.layout import build_attention_mask
from tests.helpers import random_tree

REPO = Path(__file__).resolve().parents[2]
MAX_PIXELS = 64 * 28 * 28  # at most 64 vision tokens per image: a small, fast build

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."}]}
TREE = {
    "messages": [{"role": "user", "content": [{"type": "image", "image": "img.jpg"}, {"type": "text", "text": "Caption it."}]}],
    "branches": [
        [{"role": "assistant", "content": "A red bus."}],
        {"messages": [{"role": "assistant", "content": "Third."}],
         "branches": [[{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}],
                      [{"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}]]},
    ],
}
TEXT = {"text": "Plain text pretraining data, loss on every token."}


def _build(root: Path, image: Path, *, max_examples: int | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(image, root / "img.jpg")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (CHAT, TREE, TEXT)))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), max_length=512, max_pixels=MAX_PIXELS,
                                     max_examples_per_pack=max_examples)
    build(config, progress=False)
    return root / "out"


@pytest.fixture(scope="module")
def one_per_row(tmp_path_factory, coco_images) -> Path:
    """Every example alone in its row, so example spans start at 0 (rows are shuffled: find them by id)."""
    return _build(tmp_path_factory.mktemp("inspect1"), coco_images[0], max_examples=1)


@pytest.fixture(scope="module")
def packed(tmp_path_factory, coco_images) -> Path:
    """All three examples in one row."""
    return _build(tmp_path_factory.mktemp("inspect3"), coco_images[0], max_examples=None)


def _row_of(out: Path, line: int) -> int:
    return find_example(open_shards(out), f"{out.parent / 'data.jsonl'}:{line}")


def test_tree_nodes_roles_loss_and_image(one_per_row, coco_images):
    info = describe_row(one_per_row, _row_of(one_per_row, 2))
    (ex,) = info.examples
    assert [n.parent for n in ex.nodes] == [-1, 0, 0, 2, 2]  # depth-first: root, bus, third, why, sure
    assert [n.depth for n in ex.nodes] == [0, 1, 1, 2, 2]
    assert [n.roles for n in ex.nodes] == [["system", "user"], ["assistant"], ["assistant"],
                                           ["user", "assistant"], ["user", "assistant"]]
    assert [n.loss_text for n in ex.nodes] == ["", "A red bus.<|im_end|>", "Third.<|im_end|>",
                                               "Because.<|im_end|>", "Yes.<|im_end|>"]
    assert sum(n.loss_tokens for n in ex.nodes) == ex.loss_tokens == info.num_loss_tokens
    assert [(n.start, n.end) for n in ex.nodes][0][0] == 0 and ex.nodes[-1].end == info.num_tokens
    (im,) = ex.images
    with Image.open(coco_images[0]) as pil:
        grid = get_profile("qwen2-vl", max_pixels=MAX_PIXELS).image.grid_thw(*pil.size)
    assert im.grid == grid and im.num_tokens == grid[0] * grid[1] * grid[2] // 4
    assert im.source == str(one_per_row.parent / "img.jpg")
    row = read_row(open_shards(one_per_row), info.row)
    assert set(row["input_ids"][im.start : im.end].tolist()) == {151655}  # <|image_pad|>
    assert ex.nodes[0].text.count(f"<|image_pad|>x{im.num_tokens}") == 1  # the run is shown once, counted


def test_format_row_golden(one_per_row):
    rows = {line: _row_of(one_per_row, line) for line in (1, 2, 3)}
    data = str(one_per_row.parent / "data.jsonl")
    text = "\n".join(format_row(describe_row(one_per_row, rows[line])) for line in (1, 2, 3))
    text = text.replace(data, "DATA").replace(str(one_per_row), "OUT").replace(str(one_per_row.parent), "ROOT")
    for line, r in rows.items():
        text = text.replace(f"row {r} of 3  (shard-00000.parquet, row {r})", f"row R{line}")
    assert text.splitlines() == [
        "OUT  row R1",
        "34 tokens (6.6% of 512), 1 example, 1 node, 0 images, 6 loss tokens, 0 vision tokens",
        "",
        "example 0  DATA:1  [0, 34)  34 tokens, 1 node, 0 images, 6 loss tokens",
        "  node  span     parent  role                   loss  text",
        '  0     [0, 34)  -       system,user,assistant     6  "<|im_start|>system\\nYou are a helpful assistant.'
        '<|im_end|>\\n<|im_start|>user\\nWhat is 2 + 2?<|im_end|>\\n<|im_start|>assistant\\nIt is 4.<|im_end|>\\n"',
        '                                                loss: "It is 4.<|im_end|>"',
        "OUT  row R2",
        "119 tokens (23.2% of 512), 1 example, 5 nodes, 1 image, 14 loss tokens, 54 vision tokens",
        "",
        "example 0  DATA:2  [0, 119)  119 tokens, 5 nodes, 1 image, 14 loss tokens",
        "  node  span        parent  role                loss  text",
        '  0     [0, 75)     -       system,user            0  "<|im_start|>system\\nYou are a helpful assistant.'
        '<|im_end|>\\n<|im_start|>user\\n<|vision_start|><|image_pad|>x54<|vision_end|>Caption it.<|im_end|>\\n"',
        '  1     [75, 84)    0       └ assistant            5  "<|im_start|>assistant\\nA red bus.<|im_end|>\\n"',
        '                                                loss: "A red bus.<|im_end|>"',
        '  2     [84, 91)    0       └ assistant            3  "<|im_start|>assistant\\nThird.<|im_end|>\\n"',
        '                                                loss: "Third.<|im_end|>"',
        '  3     [91, 105)   2         └ user,assistant     3  "<|im_start|>user\\nWhy?<|im_end|>\\n'
        '<|im_start|>assistant\\nBecause.<|im_end|>\\n"',
        '                                                loss: "Because.<|im_end|>"',
        '  4     [105, 119)  2         └ user,assistant     3  "<|im_start|>user\\nSure?<|im_end|>\\n'
        '<|im_start|>assistant\\nYes.<|im_end|>\\n"',
        '                                                loss: "Yes.<|im_end|>"',
        "  image 0  [15, 69)  54 tokens, grid 1x12x18  ROOT/img.jpg",
        "OUT  row R3",
        "12 tokens (2.3% of 512), 1 example, 1 node, 0 images, 11 loss tokens, 0 vision tokens",
        "",
        "example 0  DATA:3  [0, 12)  12 tokens, 1 node, 0 images, 11 loss tokens",
        "  node  span     parent  role  loss  text",
        '  0     [0, 12)  -       -       11  "Plain text pretraining data, loss on every token.<|im_end|>"',
        # the first token of an example never carries loss: nothing predicts it
        '                               loss: " text pretraining data, loss on every token.<|im_end|>"',
    ]


def test_snippets_elide_the_middle_and_ids_mode_loads_no_tokenizer(one_per_row):
    info = describe_row(one_per_row, _row_of(one_per_row, 1))
    short = format_row(info, width=30).splitlines()[5]
    assert short.endswith('  "<|im_start|>system\\n[…]end|>\\n"')  # 20 + 3 + 7 characters
    ids = describe_row(one_per_row, _row_of(one_per_row, 1), decode=False)
    assert ids.tokenizer is None and ids.examples[0].nodes[0].roles == []
    assert ids.examples[0].nodes[0].text.startswith("151644 8948 198 ")  # <|im_start|> system \n
    assert format_row(ids).splitlines()[2] == "(token ids shown, not text)"


def test_packed_row_spans_add_up(packed):
    info = describe_row(packed, 0)
    assert info.num_rows == 1 and len(info.examples) == 3
    starts = [e.start for e in info.examples] + [info.num_tokens]
    assert all(e.end == s for e, s in zip(info.examples, starts[1:], strict=True))
    nodes = [n for e in info.examples for n in e.nodes]
    assert [n.index for n in nodes] == list(range(7))
    assert all(e.start <= n.start < n.end <= e.end for e in info.examples for n in e.nodes)
    assert sum(e.loss_tokens for e in info.examples) == info.num_loss_tokens
    assert json.loads(json.dumps(info.to_dict()))["examples"][0]["nodes"][0]["index"] == 0


def test_mask_of_a_real_row_is_packer_attention_mask(packed):
    data = read_row(open_shards(packed), 0)
    T = len(data["input_ids"])
    visible, centre, f = coarse_mask(data, cells=T)
    expected = build_attention_mask(T, data["cu_seqlens"], data["node_offsets"], data["node_parents"]).numpy()
    assert f == 1 and np.array_equal(visible, expected) and np.array_equal(centre, np.arange(T))


@pytest.mark.parametrize("seed", range(40))
def test_coarse_mask_is_the_block_or_of_the_dense_mask(seed):
    """Random packs of random trees (and bidirectional image spans): exact at factor 1, OR-pooled above."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 90))
    E = int(rng.integers(1, min(T, 4) + 1))
    cu = np.concatenate([[0], np.sort(rng.choice(np.arange(1, T), E - 1, replace=False)) if E > 1 else [], [T]])
    offsets, parents = [], []
    for k in range(E):
        o, p = random_tree(rng, int(cu[k + 1] - cu[k])) if cu[k + 1] - cu[k] > 1 else (np.zeros(1, int), [-1])
        parents += [x if x < 0 else x + len(offsets) for x in p]
        offsets += (np.asarray(o) + cu[k]).tolist()
    images = []
    ends = [*offsets[1:], T]
    n = int(np.argmax(np.diff([*offsets, T])))  # an image inside the longest node (images never straddle nodes)
    if ends[n] - offsets[n] >= 2:
        s = int(rng.integers(offsets[n], ends[n] - 1))
        images = [{"offset": s, "num_tokens": int(rng.integers(1, min(5, ends[n] - s) + 1))}]
    profile = get_profile("qwen2-vl", bidirectional_images=bool(seed % 2))
    data = {"input_ids": np.zeros(T, np.int64), "cu_seqlens": cu.astype(np.int64), "images": images,
            "node_offsets": np.array(offsets), "node_parents": np.array(parents)}
    spans = profile.image.bidirectional_spans({"images": images})  # what collate emits for training
    dense = build_attention_mask(T, cu, np.array(offsets), np.array(parents), bidirectional_spans=spans).numpy()
    exact, _, f = coarse_mask(data, cells=T, spans=spans)
    assert f == 1 and np.array_equal(exact, dense)
    cells = int(rng.integers(1, T + 1))
    pooled, _, f = coarse_mask(data, cells=cells, spans=spans)
    nb = -(-T // f)
    padded = np.zeros((nb * f, nb * f), bool)
    padded[:T, :T] = dense
    assert np.array_equal(pooled, padded.reshape(nb, f, nb, f).any(axis=(1, 3)))


def test_long_row_mask_stays_small():
    T = 32768  # a (T, T) mask would be 1 GB of booleans
    data = {"input_ids": np.zeros(T), "cu_seqlens": np.array([0, 5000, 20000, T]), "images": [],
            "node_offsets": np.array([0, 3000, 4000, 5000, 20000]), "node_parents": np.array([-1, 0, 0, -1, -1])}
    visible, centre, f = coarse_mask(data)
    assert f == 32 and visible.shape == (1024, 1024)
    # blocks of 32 tokens: 130 = tokens 4160.. (branch 2), 98 = tokens 3136.. (branch 1), 10 = the prefix
    assert not visible[130, 98]  # sibling branches do not see each other
    assert visible[130, 10] and visible[98, 10]  # both see the shared prefix
    assert not visible[20000 // 32, 19999 // 32]  # nor another example


def test_draw_mask_pictures(one_per_row, packed, tmp_path):
    with Image.open(draw_mask(packed, 0, tmp_path / "packed.png")) as im:
        assert im.size == (16 * 110, 9 * 110)  # the row, and its tree alone beside it
    with Image.open(draw_mask(one_per_row, _row_of(one_per_row, 1), tmp_path / "chat.png")) as im:
        assert im.size == (9 * 110, 9 * 110)  # a single linear example: no zoom panel
    with pytest.raises(ConfigError, match=r"name the picture \.png, \.svg or \.pdf"):
        draw_mask(packed, 0, tmp_path / "mask.bmp")


@pytest.mark.slow
def test_cli_inspect(packed, one_per_row, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(cli, ["inspect", str(packed), "--mask", str(tmp_path / "m.png")])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith(f"{packed}  row 0 of 1  (shard-00000.parquet, row 0)\n")
    assert ok.stderr == f"wrote {tmp_path / 'm.png'}\n" and (tmp_path / "m.png").exists()

    as_json = runner.invoke(cli, ["inspect", str(packed), "--json", "--ids"])
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["tokenizer"] is None

    line2 = f"{one_per_row.parent / 'data.jsonl'}:2"
    by_id = runner.invoke(cli, ["inspect", str(one_per_row), "--example", line2])
    assert by_id.exit_code == 0 and f"example 0  {line2}  [0, 119)" in by_id.stdout

    out_of_range = runner.invoke(cli, ["inspect", str(packed), "--row", "1"])
    assert out_of_range.exit_code == 2
    assert out_of_range.stderr.endswith(f"Error: Invalid value for --row: 1 is out of range: {packed} has 1 row(s), 0..0\n")

    both = runner.invoke(cli, ["inspect", str(packed), "--row", "0", "--example", line2])
    assert both.exit_code == 2 and both.stderr.endswith("Error: give --row or --example, not both\n")

    missing = runner.invoke(cli, ["inspect", str(packed), "--example", "nope.jsonl:1"])
    assert missing.exit_code == 1
    assert missing.stderr == (f"error: no example 'nope.jsonl:1' in {packed}; "
                              "ids look like 'path/to/file.jsonl:LINE'\n")

    not_built = runner.invoke(cli, ["inspect", str(tmp_path)])
    assert not_built.exit_code == 1
    assert not_built.stderr == (f"error: {tmp_path} has no manifest.json: the build did not finish (or this is not "
                                "a packer output). Rerun the same `packer build` command to complete it.\n")


@pytest.mark.slow
def test_report_commands_do_not_import_torch_or_click(packed, tmp_path):
    """report/ is numpy + pyarrow (+ matplotlib): importing it, `packer stats --plot` and `packer inspect --row 0
    --mask` leave torch unimported; only packer.cli imports click."""
    script = f"""
import sys
import packer.report.plots, packer.report.rowview, packer.report.stats, packer.report.verify
assert "torch" not in sys.modules and "click" not in sys.modules, "importing packer.report"
from packer.cli import main
for argv in (["stats", {str(packed)!r}, "--plot", {str(tmp_path / "s.png")!r}],
             ["inspect", {str(packed)!r}, "--row", "0", "--mask", {str(tmp_path / "m.png")!r}]):
    sys.argv = ["packer", *argv]
    try:
        main()
    except SystemExit as e:
        assert not e.code, (argv, e.code)
    assert "torch" not in sys.modules, argv
print("no torch")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("no torch\n")
    assert (tmp_path / "s.png").exists() and (tmp_path / "m.png").exists()


def test_weighted_losses_are_shown(tmp_path):
    """A message's ``"loss"`` weight shows as the summed weight of the node's, the example's and the row's loss
    tokens; an unweighted row shows none (and its golden text above is unchanged)."""
    data = tmp_path / "data.jsonl"
    records = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Half.", "loss": 0.5},
                             {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Full."}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    build(BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="text", tokenizer="qwen2.5",
                                  max_length=512), progress=False)
    info = describe_row(tmp_path / "out", 0)
    ex = info.examples[0]
    raw = read_row(open_shards(tmp_path / "out"), 0)
    assert raw["loss_weights"].dtype == np.float32
    want = float(raw["loss_weights"].sum())
    assert info.loss_weight == ex.loss_weight == pytest.approx(want) and ex.loss_tokens > want > ex.loss_tokens / 2
    text = format_row(info)
    assert f"{ex.loss_tokens} loss tokens, weighted {want:.6g}" in text
    assert f"{ex.nodes[0].loss_tokens} w{want:.6g}" in text
