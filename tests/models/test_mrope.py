"""Qwen2-VL mRoPE positions of trees and packed rows against transformers' own Qwen2-VL / Qwen2.5-VL
get_rope_index, and verify's loop-free recomputation against both."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel

from packer.core.tree import tree_position_ids
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError
from packer.models import get_profile
from packer.models.shared.mrope import expected_mrope, mrope_position_deltas, mrope_position_ids
from tests.helpers import random_tree

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


@pytest.mark.slow
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
    got = mrope_position_ids(ids, offsets, parents, grids, image_token_id=IMAGE_PAD)
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


def random_image_tree(rng: np.random.Generator, words: list[list[int]]) -> list[tuple[int, list[int], list]]:
    """A random tree of 1 to 7 nodes, each 1 to 3 pieces (an image of a random grid, or one of ``words``), as
    ``build_tree``'s (parent, ids, grids) nodes in depth-first order (parents first, each subtree contiguous)."""
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
    order = _depth_first(nodes)
    remap = {old: new for new, old in enumerate(order)}
    return [(remap[nodes[o][0]] if nodes[o][0] >= 0 else -1, nodes[o][1], nodes[o][2]) for o in order]


def test_mrope_random_trees_match_hf(models, tok) -> None:
    rng = np.random.default_rng(1)
    words = [text(tok, w) for w in ("Hi.", " the dog", "<|im_end|>\n", "<|im_start|>assistant\n", "?", " 42")]
    for _ in range(12):
        check_tree_against_hf(models["qwen2-vl"], *build_tree(random_image_tree(rng, words)))


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


def test_vectorized_mrope_matches_the_reference_on_random_forests():
    """verify's loop-free recomputation (expected_mrope) equals mrope_position_ids, example by example."""
    rng = np.random.default_rng(0)
    image_id, merge = 99, 2
    for _ in range(40):
        parts, offs, pars, starts, all_grids = [], [], [], [], []
        base, node_base = 0, 0
        want = []
        for _ in range(int(rng.integers(1, 4))):  # examples of one row
            length = int(rng.integers(20, 60))
            off, par = random_tree(rng, length)
            ids = rng.integers(0, 90, size=length)
            grids = []
            node_ends = np.append(off[1:], length)
            for n in range(len(off)):  # at most one image per node, strictly inside it
                span = int(node_ends[n] - off[n])
                h, w = 2 * int(rng.integers(1, 3)), 2 * int(rng.integers(1, 3))
                k = h * w // merge**2
                if span >= k + 2 and rng.random() < 0.6:
                    s = int(off[n]) + 1
                    ids[s : s + k] = image_id
                    grids.append((1, h, w))
                    starts.append(base + s)
                    all_grids.append((1, h, w))
            want.append(mrope_position_ids(ids, off, par, grids, image_token_id=image_id, spatial_merge_size=merge))
            parts.append(ids)
            offs.append(off + base)
            pars.append(np.where(par < 0, -1, par + node_base))
            base += length
            node_base += len(off)
        got = expected_mrope(base, np.concatenate(offs).astype(np.int64), np.concatenate(pars).astype(np.int64),
                             np.array(starts, np.int64), np.array(all_grids, np.int64).reshape(-1, 3),
                             spatial_merge_size=merge)
        np.testing.assert_array_equal(got, np.concatenate(want, axis=1))


def mrope_reference(ids, offsets, parents, grids, image_token_id, merge) -> np.ndarray:
    """get_rope_index's rules token by token: text +1 on all rows; an image's (t, h, w) grid from current_pos,
    then current_pos += max(h, w) // merge; a node continues from its parent's final current_pos."""
    length = len(ids)
    ends = [*offsets[1:], length]
    out = np.zeros((3, length), dtype=np.int64)
    after: dict[int, int] = {}
    k = 0
    for n in range(len(offsets)):
        cur = 0 if parents[n] < 0 else after[parents[n]]
        i = offsets[n]
        while i < ends[n]:
            if ids[i] == image_token_id:
                t, h, w = grids[k]
                k += 1
                for ti in range(t):
                    for hi in range(h // merge):
                        for wi in range(w // merge):
                            out[:, i] = (cur + ti, cur + hi, cur + wi)
                            i += 1
                cur += max(h, w) // merge
            else:
                out[:, i] = cur
                cur += 1
                i += 1
        after[n] = cur
    return out


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(data=st.data(), merge=st.sampled_from([1, 2]))
def test_mrope_equals_per_token_reference(data, merge):
    n_nodes = data.draw(st.integers(1, 6))
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n_nodes)]
    ids: list[int] = []
    offsets: list[int] = []
    grids: list[tuple[int, int, int]] = []
    for _ in range(n_nodes):
        offsets.append(len(ids))
        for _ in range(data.draw(st.integers(0, 3))):
            if data.draw(st.booleans()):
                t, h, w = data.draw(st.integers(1, 2)), merge * data.draw(st.integers(1, 4)), merge * data.draw(st.integers(1, 4))
                grids.append((t, h, w))
                ids += [IMAGE_PAD] * (t * h * w // merge**2)
                ids.append(7)  # an image run ends at a text token
            else:
                ids += data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=5))
    got = mrope_position_ids(np.array(ids, dtype=np.int32), np.array(offsets), np.array(parents), grids,
                             image_token_id=IMAGE_PAD, spatial_merge_size=merge)
    want = mrope_reference(ids, offsets, parents, grids, IMAGE_PAD, merge)
    assert got.dtype == np.int32 and got.shape == (3, len(ids))
    np.testing.assert_array_equal(got, want)


def test_positions_extra_is_mrope_and_text_is_three_equal_rows(tok) -> None:
    """What the encoder calls: the text-only fast path and the image path give get_rope_index's rows."""
    profile = get_profile("qwen2-vl")
    token_ids = {"image_token": IMAGE_PAD, "vision_start": VISION_START, "vision_end": VISION_END}
    offsets, parents = np.array([0, 5], np.int32), np.array([-1, 0], np.int32)
    ids = np.array(text(tok, "Hello world! A plain sentence, longer."), np.int32)
    pos = tree_position_ids(len(ids), offsets, parents)
    got = profile.positions.extra(ids, pos, offsets, parents, [], token_ids=token_ids)
    assert got.dtype == np.int32 and (got == pos).all() and got.shape == (3, len(ids))
    ids = np.array(text(tok, "Look") + image((1, 4, 6)) + text(tok, "at it, a branch."), np.int32)
    offsets = np.array([0, len(ids) - 3], np.int32)  # the image in the root, a branch after it
    pos = tree_position_ids(len(ids), offsets, parents)
    got = profile.positions.extra(ids, pos, offsets, parents, [(1, 4, 6)], token_ids=token_ids)
    np.testing.assert_array_equal(got, mrope_position_ids(ids, offsets, parents, [(1, 4, 6)], image_token_id=IMAGE_PAD))
    assert get_profile("llava").positions.extra(ids, pos, offsets, parents, [], token_ids=token_ids) is None


def _runs_rule(ids, token_id, grids, merge=2):
    """The rule ``_vision_runs`` checks with scalars, the plain way: the maximal runs of the token, one per grid
    in order, each of its grid's t * (h // m) * (w // m) tokens; (start, end) of each, or None."""
    hits = np.concatenate([[False], ids == token_id, [False]]).astype(np.int8)
    edges = np.diff(hits)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    counts = [t * (h // merge) * (w // merge) for t, h, w in grids]
    if len(starts) != len(grids) or (ends - starts).tolist() != counts:
        return None
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def test_vision_runs_match_the_plain_rule_on_random_runs():
    """``_vision_runs`` (the k-th grid's tokens are the next hits: consecutive, the next hit not adjacent) finds
    or refuses exactly what the maximal-run rule does: adjacent images, short and long runs, stray tokens."""
    from packer.models.shared.mrope import _vision_runs

    rng = np.random.default_rng(0)
    for _ in range(400):
        ids, grids = [], []
        for _ in range(int(rng.integers(0, 4))):
            ids += rng.integers(0, 5, int(rng.integers(0, 3))).tolist()  # 0-2 text tokens (9 = image) between
            grid = (int(rng.integers(1, 3)), 2 * int(rng.integers(0, 3)), 2 * int(rng.integers(1, 3)))
            grids.append(grid)
            n = grid[0] * (grid[1] // 2) * (grid[2] // 2) + int(rng.choice([0, 0, 0, -1, 1]))
            ids += [9] * max(n, 0)
        if rng.random() < 0.1:
            ids.insert(int(rng.integers(0, len(ids) + 1)), 9)  # a stray image token
        ids = np.array(ids, dtype=np.int32)
        want = _runs_rule(ids, 9, grids)
        if want is None:
            with pytest.raises(RecordError, match="do not match"):
                _vision_runs(ids, 9, grids, None, 2, "image")
        else:
            got = _vision_runs(ids, 9, grids, None, 2, "image")
            assert [(a, b) for a, b, _, _ in got] == want
            assert [g for _, _, g, _ in got] == grids


def test_text_mrope_rows_are_a_read_only_view_of_the_positions():
    pos = tree_position_ids(7, np.array([0, 3]), np.array([-1, 0]))
    rows = get_profile("qwen2-vl").positions.extra(np.zeros(7, np.int32), pos, np.array([0, 3]), np.array([-1, 0]),
                                                   [], token_ids={"image_token": IMAGE_PAD})
    np.testing.assert_array_equal(rows, np.tile(pos, (3, 1)))
    assert rows.dtype == np.int32 and rows.strides[0] == 0
    with pytest.raises(ValueError, match="read-only"):
        rows[0, 0] = 5
