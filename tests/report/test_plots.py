"""The stats picture: the numbers it draws come from the shards, checked against independent helpers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from packer.errors import ConfigError
from packer.report.plots import (
    PAD_RGB,
    PALETTE,
    VISION_TINT,
    SampleExample,
    _rows_to_image,
    _strategy_rows,
    plot_stats,
    read_pack_columns,
    sample_examples,
)
from packer.report.stats import compute_stats, padded_tokens_per_batch
from packer.shards.io import open_shards
from tests.helpers import random_example, write_shardset


def _build(root: Path, *, n: int, capacity: int, seed: int = 0, images: bool = False,
           sources: tuple[str, ...] = ()) -> tuple[Path, list, list[int]]:
    """A finished shard set of random trees, first-fit packed in input order, with a real stats.json."""
    rng = np.random.default_rng(seed)
    examples = [random_example(rng, i, max_len=min(40, capacity), images=images) for i in range(n)]
    for i, e in enumerate(examples):
        e.source_name = sources[i % len(sources)] if sources else ""
    sizes, used = [], capacity
    for e in examples:  # next fit: a new pack when the example does not fit the current one
        if used + e.num_tokens > capacity:
            sizes.append(0)
            used = 0
        sizes[-1] += 1
        used += e.num_tokens
    write_shardset(root, examples, sizes, rows_per_shard=16, rows_per_row_group=4, profile="qwen2-vl")
    pack_ids = np.repeat(np.arange(len(sizes)), sizes)
    stats = compute_stats(
        lengths=np.array([e.num_tokens for e in examples]), vision=np.array([e.num_vision_tokens for e in examples]),
        pack_ids=pack_ids, capacity=capacity, loss_tokens=np.array([e.num_loss_tokens for e in examples]),
        sources=np.array([e.source_name for e in examples], dtype=object), input_records=n,
    )
    (root / "stats.json").write_text(json.dumps(stats))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["config"]["max_length"] = capacity
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root, examples, sizes


def _paths_alone(offsets: np.ndarray, parents: np.ndarray, length: int) -> int:
    """Independent: walk from every leaf to the root and add up node lengths."""
    ends = np.append(offsets[1:], length)
    total = 0
    for leaf in set(range(len(parents))) - set(parents.tolist()):
        n = leaf
        while n >= 0:
            total += int(ends[n] - offsets[n])
            n = int(parents[n])
    return total


def test_columns_give_lengths_sources_and_tree_paths(tmp_path):
    root, examples, sizes = _build(tmp_path / "b", n=60, capacity=64, sources=("a", "b", "c"))
    cols = read_pack_columns(open_shards(root))
    np.testing.assert_array_equal(cols.example_lengths, [e.num_tokens for e in examples])
    np.testing.assert_array_equal(cols.examples_per_pack, sizes)
    assert cols.sources.tolist() == [e.source_name for e in examples]
    assert cols.num_tokens.sum() == sum(e.num_tokens for e in examples)
    assert cols.path_tokens == sum(_paths_alone(e.node_offsets, e.node_parents, e.num_tokens) for e in examples)
    assert cols.path_tokens > cols.num_tokens.sum()  # random trees have branches: flattening repeats prefixes


def test_sample_is_whole_leading_packs_with_vision_spans(tmp_path):
    root, examples, sizes = _build(tmp_path / "b", n=40, capacity=64, images=True)
    packs = sample_examples(open_shards(root), max_examples=10)
    assert [len(p) for p in packs] == sizes[: len(packs)]
    assert sum(sizes[: len(packs)]) <= 10 < sum(sizes[: len(packs) + 1])
    flat = [ex for p in packs for ex in p]
    for ex, e in zip(flat, examples, strict=False):
        assert ex.length == e.num_tokens
        expected = np.zeros(e.num_tokens, dtype=bool)
        for im in e.images:
            expected[im.offset : im.offset + im.num_tokens] = True
        np.testing.assert_array_equal(ex.vision, expected)
    assert [ex.colour for ex in flat] == list(range(len(flat)))  # one colour per example, in row order


def test_sample_takes_one_pack_even_if_it_is_larger_than_asked(tmp_path):
    root, _, sizes = _build(tmp_path / "b", n=20, capacity=64)
    assert [len(p) for p in sample_examples(open_shards(root), max_examples=1)] == sizes[:1]


def test_strategy_slots_match_the_stats_formulas():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 50, size=21)
    packs = [[SampleExample(int(n), np.zeros(int(n), bool), i) for i, n in enumerate(lengths[:9])],
             [SampleExample(int(n), np.zeros(int(n), bool), 9 + i) for i, n in enumerate(lengths[9:])]]
    naive, fixed, packed = _strategy_rows(packs, capacity=512, batch=8, seed=0)
    shuffled = np.array([row[0].length for row in naive[1]])
    assert sorted(shuffled.tolist()) == sorted(lengths.tolist())
    assert sum(naive[2]) == padded_tokens_per_batch(shuffled, 8)
    assert naive[3] == [0, 8, 16]  # batch boundaries
    assert sum(fixed[2]) == 21 * 512 and len(fixed[1]) == 21
    assert packed[1] is packs and sum(packed[2]) == 2 * 512


def test_cells_colour_examples_tint_vision_and_grey_padding():
    row = [SampleExample(3, np.zeros(3, bool), 0), SampleExample(2, np.ones(2, bool), 1)]
    img = _rows_to_image([row], width=10, cell=1)  # (1, 10, 3)
    c0, c1 = np.array(to_rgb(PALETTE[0])), np.array(to_rgb(PALETTE[1]))
    expected = [c0] * 3 + [c1 + (1 - c1) * VISION_TINT] * 2 + [np.array(PAD_RGB)] * 5
    np.testing.assert_allclose(img[0], np.stack(expected))
    coarse = _rows_to_image([row], width=10, cell=4)  # cells sample their centre token: 2, 6, 9
    np.testing.assert_allclose(coarse[0], np.stack([c0, PAD_RGB, PAD_RGB]))


@pytest.mark.parametrize(
    "kind, n, capacity",
    [("text, a few packs", 12, 64), ("vision + 3 sources, many packs", 600, 96), ("one pack", 2, 256)],
)
@pytest.mark.slow
def test_plot_stats_writes_a_picture(tmp_path, kind, n, capacity):
    root, _, _ = _build(tmp_path / "b", n=n, capacity=capacity, images="vision" in kind,
                        sources=("chat", "captions", "docs") if "sources" in kind else ())
    out = plot_stats(root, tmp_path / "pics" / "stats.png")
    with Image.open(out) as im:
        assert im.format == "PNG"
        assert im.width == 14 * 110 and 600 < im.height < 3500  # 14 in at 110 dpi; height follows the rows


def test_plot_stats_errors_name_the_fix(tmp_path):
    root, _, _ = _build(tmp_path / "b", n=5, capacity=64)
    with pytest.raises(ConfigError, match=r"name the picture \.png, \.svg or \.pdf"):
        plot_stats(root, tmp_path / "stats.jpeg")
    (root / "stats.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"stats.json lacks \['capacity', 'packs', 'tokens', 'efficiency', "
                                          r"'padding'\]; rerun `packer build` to write it"):
        plot_stats(root, tmp_path / "stats.png")
    (root / "stats.json").unlink()
    with pytest.raises(ConfigError, match="cannot read .*stats.json"):
        plot_stats(root, tmp_path / "stats.png")
