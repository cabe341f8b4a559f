"""Tree positions and mRoPE positions against transformers' own Qwen2-VL / Qwen2.5-VL get_rope_index."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel

from packer.core.tree import mrope_position_deltas, mrope_position_ids, tree_position_ids
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError

IMAGE_PAD, VISION_START, VISION_END = 151655, 151652, 151653

_TINY_TEXT = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=151936,
    rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
)
_TINY_VISION = dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=1, out_hidden_size=16)


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    """Tiny randomly initialised real models; get_rope_index only reads their configs."""
    torch.manual_seed(0)
    qwen2 = Qwen2VLModel(Qwen2VLConfig(text_config=_TINY_TEXT, vision_config=_TINY_VISION))
    qwen25 = Qwen2_5_VLModel(
        Qwen2_5_VLConfig(text_config=_TINY_TEXT, vision_config={**_TINY_VISION, "intermediate_size": 16})
    )
    for m in (qwen2, qwen25):
        assert (m.config.image_token_id, m.config.vision_start_token_id) == (IMAGE_PAD, VISION_START)
        assert m.config.vision_config.spatial_merge_size == 2
    return {"qwen2-vl": qwen2, "qwen2.5-vl": qwen25}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2-vl")


def hf_rope(model, ids: list[int], grids: list[tuple[int, int, int]]) -> tuple[np.ndarray, int]:
    """transformers' get_rope_index for one unpadded sequence: ((3, L) positions, delta)."""
    input_ids = torch.tensor([ids])  # (1, L)
    mm = (input_ids == IMAGE_PAD).int()  # what the processor's create_mm_token_type_ids gives
    grid = torch.tensor(grids, dtype=torch.long) if grids else None
    pos, delta = model.get_rope_index(input_ids, mm, image_grid_thw=grid)  # (3, 1, L), (1, 1)
    return pos[:, 0].numpy(), int(delta[0, 0])


def text(tok, s: str) -> list[int]:
    return tok(s, add_special_tokens=False)["input_ids"]


def image(grid: tuple[int, int, int]) -> list[int]:
    t, h, w = grid
    return [VISION_START] + [IMAGE_PAD] * (t * h * w // 4) + [VISION_END]


# ---- mRoPE against get_rope_index -----------------------------------------------------------------


def linear_cases(tok) -> dict[str, tuple[list[int], list[tuple[int, int, int]]]]:
    g1, g2, g3 = (1, 34, 46), (1, 4, 6), (1, 12, 2)  # 640x480 COCO at defaults; tall; narrow
    user = text(tok, "<|im_start|>user\n")
    ask = text(tok, "What is in these pictures?<|im_end|>\n<|im_start|>assistant\n")
    answer = text(tok, "Two cats on a sofa.<|im_end|>\n")
    return {
        "text only": (text(tok, "Hello world! A plain sentence."), []),
        "one image": (user + image(g1) + ask + answer, [g1]),
        "two images, text between and after": (user + image(g2) + ask + image(g3) + answer, [g2, g3]),
        "image first": (image(g2) + ask, [g2]),
        "bare image tokens first": (image(g2)[1:] + ask, [g2]),
        "image last": (ask + image(g3), [g3]),
        "three images": (image(g1) + image(g2) + ask + image(g3) + answer, [g1, g2, g3]),
    }


@pytest.mark.parametrize("model_name", ["qwen2-vl", "qwen2.5-vl"])
def test_mrope_linear_matches_get_rope_index(models, tok, model_name) -> None:
    for name, (ids, grids) in linear_cases(tok).items():
        expected, delta = hf_rope(models[model_name], ids, grids)
        one = np.array([0], np.int32)
        got = mrope_position_ids(
            np.array(ids),
            one,
            np.array([-1]),
            grids,
            image_token_id=IMAGE_PAD,
            vision_start_token_id=VISION_START,
        )
        assert got.dtype == np.int32 and got.shape == (3, len(ids)), name
        np.testing.assert_array_equal(got, expected, err_msg=name)
        assert mrope_position_deltas(got, one, np.array([-1])).tolist() == [delta], name
        if not grids:
            assert (got == tree_position_ids(len(ids), one, np.array([-1]))).all()


def test_mrope_golden_one_image() -> None:
    # 2 text tokens, an image of grid (1, 4, 6) -> 2x3 merged tokens, then 2 text tokens.
    ids = np.array([7, VISION_START] + [IMAGE_PAD] * 6 + [VISION_END, 8])
    got = mrope_position_ids(ids, np.array([0]), np.array([-1]), [(1, 4, 6)], image_token_id=IMAGE_PAD)
    assert got.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],  # t; after the image: 2 + max(4, 6) // 2 = 5
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],  # h
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],  # w
    ]


def build_tree(nodes: list[tuple[int, list[int], list[tuple[int, int, int]]]]):
    """[(parent, ids, grids)] in depth-first order -> (ids, offsets, parents, grids) of the whole tree."""
    ids, offsets, parents, grids = [], [], [], []
    for parent, node_ids, node_grids in nodes:
        offsets.append(len(ids))
        parents.append(parent)
        ids += node_ids
        grids += node_grids
    return np.array(ids), np.array(offsets, np.int32), np.array(parents, np.int32), grids


def paths(parents: np.ndarray) -> list[list[int]]:
    """Root-to-leaf node paths."""
    children = {i: [j for j in range(len(parents)) if parents[j] == i] for i in range(len(parents))}
    out = []
    for leaf in (i for i in range(len(parents)) if not children[i]):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(int(parents[path[-1]]))
        out.append(path[::-1])
    return out


def check_tree_against_hf(model, ids, offsets, parents, grids) -> None:
    """Every root-to-leaf path, run alone through get_rope_index, equals the tree's positions there."""
    got = mrope_position_ids(
        ids, offsets, parents, grids, image_token_id=IMAGE_PAD, vision_start_token_id=VISION_START
    )
    ends = np.append(offsets[1:], len(ids))
    node_grids, k = [], 0
    for n in range(len(offsets)):  # images of each node, in token order
        runs = int(
            (
                (np.diff(np.concatenate([[0], ids[offsets[n] : ends[n]] == IMAGE_PAD, [0]]).astype(int))) == 1
            ).sum()
        )
        node_grids.append(grids[k : k + runs])
        k += runs
    deltas = mrope_position_deltas(got, offsets, parents)
    one_d = tree_position_ids(len(ids), offsets, parents)
    for path in paths(parents):
        index = np.concatenate([np.arange(offsets[n], ends[n]) for n in path])
        path_grids = [g for n in path for g in node_grids[n]]
        expected, delta = hf_rope(model, ids[index].tolist(), path_grids)
        np.testing.assert_array_equal(got[:, index], expected, err_msg=f"path {path}")
        assert deltas[path[-1]] == delta, path
        np.testing.assert_array_equal(one_d[index], np.arange(len(index)))  # 1-D: the path alone


@pytest.mark.parametrize("model_name", ["qwen2-vl", "qwen2.5-vl"])
def test_mrope_tree_matches_each_path_alone(models, tok, model_name) -> None:
    g1, g2, g3 = (1, 8, 10), (1, 6, 4), (1, 2, 2)
    nodes = [
        (
            -1,
            text(tok, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n") + image(g1),
            [g1],
        ),
        (0, text(tok, "Caption it.<|im_end|>\n<|im_start|>assistant\nA dog.<|im_end|>\n"), []),
        (1, text(tok, "<|im_start|>user\nAnd this?") + image(g2) + text(tok, "<|im_end|>\n"), [g2]),  # nested
        (2, text(tok, "<|im_start|>assistant\nA cat."), []),
        (2, image(g3), [g3]),  # a node that is only an image
        (1, text(tok, "!"), []),  # single-token node
        (
            0,
            image(g2) + text(tok, "Count.<|im_end|>\n<|im_start|>assistant\nTwo."),
            [g2],
        ),  # image first in node
    ]
    ids, offsets, parents, grids = build_tree(nodes)
    check_tree_against_hf(models[model_name], ids, offsets, parents, grids)


def test_mrope_random_trees_match_hf(models, tok) -> None:
    rng = np.random.default_rng(1)
    words = [text(tok, w) for w in ("Hi.", " the dog", "<|im_end|>\n", "<|im_start|>assistant\n", "?", " 42")]
    for _ in range(12):
        nodes = []
        for i in range(int(rng.integers(1, 8))):
            parent = -1 if i == 0 else int(rng.integers(0, i))
            node_ids, node_grids = [], []
            for _ in range(int(rng.integers(1, 4))):
                if rng.random() < 0.4:
                    g = (1, 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6)))
                    node_ids += image(g)
                    node_grids.append(g)
                else:
                    node_ids += words[int(rng.integers(len(words)))]
            nodes.append((parent, node_ids, node_grids))
        # depth-first order: parents before children and each subtree contiguous
        order = _depth_first(nodes)
        remap = {old: new for new, old in enumerate(order)}
        nodes = [(remap[nodes[o][0]] if nodes[o][0] >= 0 else -1, nodes[o][1], nodes[o][2]) for o in order]
        check_tree_against_hf(models["qwen2-vl"], *build_tree(nodes))


def _depth_first(nodes) -> list[int]:
    children: dict[int, list[int]] = {}
    for i, (p, _, _) in enumerate(nodes):
        children.setdefault(p, []).append(i)
    order, stack = [], [0]
    while stack:
        n = stack.pop()
        order.append(n)
        stack += reversed(children.get(n, []))
    return order


def test_mrope_packed_row_is_concatenation(tok) -> None:
    # Two examples in one row (two roots) = each example's positions concatenated.
    a_ids, a_grids = image((1, 4, 4)) + text(tok, "Hi."), [(1, 4, 4)]
    b_ids, b_grids = text(tok, "Yes") + image((1, 2, 6)), [(1, 2, 6)]
    one = np.array([0], np.int32)
    root = np.array([-1], np.int32)
    a = mrope_position_ids(np.array(a_ids), one, root, a_grids, image_token_id=IMAGE_PAD)
    b = mrope_position_ids(np.array(b_ids), one, root, b_grids, image_token_id=IMAGE_PAD)
    row = mrope_position_ids(
        np.array(a_ids + b_ids),
        np.array([0, len(a_ids)]),
        np.array([-1, -1]),
        a_grids + b_grids,
        image_token_id=IMAGE_PAD,
    )
    np.testing.assert_array_equal(row, np.concatenate([a, b], axis=1))


def test_mrope_rejects_mismatched_images() -> None:
    ids = np.array([1, VISION_START] + [IMAGE_PAD] * 4 + [VISION_END, 2])
    one, root = np.array([0]), np.array([-1])
    with pytest.raises(RecordError, match="do not match") as e:
        mrope_position_ids(ids, one, root, [], image_token_id=IMAGE_PAD)
    assert e.value.reason == "image_count_mismatch"
    with pytest.raises(RecordError, match="do not match"):
        mrope_position_ids(ids, one, root, [(1, 4, 6)], image_token_id=IMAGE_PAD)
    with pytest.raises(RecordError, match="split across"):
        mrope_position_ids(ids, np.array([0, 4]), np.array([-1, 0]), [(1, 4, 4)], image_token_id=IMAGE_PAD)
