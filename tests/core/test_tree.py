"""packer.core.tree: every tree op against a token-by-token reference, and the layout rules."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from packer.core import tree
from packer.core.tree import (
    LAYOUT_RULES,
    ancestor_matrix,
    check_layout,
    drop_empty_nodes,
    layout_faults,
    node_depths,
    node_examples,
    predecessor_index,
    token_nodes,
    tree_position_ids,
)
from packer.errors import ShardError
from tests.helpers import GOLDEN_LAYOUT, random_layout


def _nodes(layout: dict) -> dict:
    """The node arrays of a layout (what the per-row tree ops take)."""
    return {k: layout[k] for k in ("num_tokens", "node_offsets", "node_parents")}


def test_golden_row_of_the_docstring():
    T, off, par = GOLDEN_LAYOUT["num_tokens"], GOLDEN_LAYOUT["node_offsets"], GOLDEN_LAYOUT["node_parents"]
    assert token_nodes(T, off).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert tree_position_ids(T, off, par).tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 0, 1]
    assert ancestor_matrix(par).tolist() == [[True, False, False, False], [True, True, False, False],
                                             [True, False, True, False], [False, False, False, True]]
    assert node_depths(par).tolist() == [0, 1, 1, 0]
    assert node_examples(par).tolist() == [0, 0, 0, 1]
    check_layout(T, off, par, GOLDEN_LAYOUT["cu_seqlens"])


@pytest.mark.parametrize(
    ("length", "offsets", "parents", "expected"),
    [
        (1, [0], [-1], [0]),
        (4, [0], [-1], [0, 1, 2, 3]),
        # root, two branches from the root
        (7, [0, 3, 5], [-1, 0, 0], [0, 1, 2, 3, 4, 3, 4]),
        # nested: 0 -> 1 -> 2, 0 -> 3; single-token nodes
        (8, [0, 3, 5, 6], [-1, 0, 1, 0], [0, 1, 2, 3, 4, 5, 3, 4]),
        # a chain of single-token nodes and siblings of one token
        (5, [0, 1, 2, 3, 4], [-1, 0, 1, 1, 0], [0, 1, 2, 2, 1]),
        # deep and wide: 0 -> 1 -> 2 -> 3, 2 -> 4, 1 -> 5, 0 -> 6
        (
            14,
            [0, 2, 4, 5, 7, 9, 12],
            [-1, 0, 1, 2, 2, 1, 0],
            [0, 1, 2, 3, 4, 5, 6, 5, 6, 4, 5, 6, 2, 3],
        ),
        # an empty node is transparent: its child continues from the grandparent
        (5, [0, 2, 2, 4], [-1, 0, 1, 0], [0, 1, 2, 3, 2]),
        # a packed row: two roots, each example restarts at 0
        (7, [0, 2, 4, 5], [-1, 0, -1, 2], [0, 1, 2, 3, 0, 1, 2]),
    ],
)
def test_tree_position_ids(length, offsets, parents, expected) -> None:
    got = tree_position_ids(length, np.array(offsets, np.int32), np.array(parents, np.int32))
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_tree_position_ids_deep_chain_matches_loop() -> None:
    # 1000 nested single-token nodes (pointer jumping over 10 levels) and a random tree vs a plain loop.
    n = 1000
    assert tree_position_ids(n, np.arange(n), np.arange(n) - 1).tolist() == list(range(n))
    rng = np.random.default_rng(0)
    for _ in range(20):
        nodes = int(rng.integers(1, 60))
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, nodes)])
        lengths = rng.integers(0, 5, nodes)
        lengths[0] = max(1, lengths[0])
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        expected, end = [], {}
        for i in range(nodes):
            start = 0 if parents[i] < 0 else end[parents[i]]
            expected += list(range(start, start + lengths[i]))
            end[i] = start + lengths[i]
        assert tree_position_ids(int(lengths.sum()), offsets, parents).tolist() == expected


def test_tree_position_ids_rejects_bad_layout() -> None:
    with pytest.raises(ShardError, match="start at 0"):
        tree_position_ids(4, np.array([1]), np.array([-1]))
    with pytest.raises(ShardError, match="not decrease"):
        tree_position_ids(4, np.array([0, 3, 2]), np.array([-1, 0, 0]))
    with pytest.raises(ShardError, match="earlier node"):
        tree_position_ids(4, np.array([0, 2]), np.array([-1, 1]))


def brute_force_predecessors(num_tokens, cu_seqlens, node_offsets, node_parents) -> list[int]:
    """Straight from the definition: t-1 inside a node, the parent's last token at a node start."""
    ends = list(node_offsets[1:]) + [num_tokens]
    pred = []
    for t in range(num_tokens):
        n = max(i for i, o in enumerate(node_offsets) if o <= t)
        if t > node_offsets[n]:
            pred.append(t - 1)
        elif node_parents[n] >= 0:
            pred.append(ends[node_parents[n]] - 1)
        else:
            pred.append(-1)
    return pred


def test_golden_predecessors():
    # row: | P0 P1 P2 | a0 a1 | b0 b1 b2 | Q0 Q1 |: a0 and b0 are both predicted from P2
    assert predecessor_index(**_nodes(GOLDEN_LAYOUT)).tolist() == [-1, 0, 1, 2, 3, 2, 5, 6, -1, 8]
    assert predecessor_index(5, [0, 2], [-1, -1]).tolist() == [-1, 0, -1, 2, 3]  # linear: the plain shift


@pytest.mark.parametrize("seed", range(10))
def test_predecessors_match_brute_force(seed):
    layout = random_layout(random.Random(seed), examples=5)
    assert predecessor_index(**_nodes(layout)).tolist() == brute_force_predecessors(**layout)


def brute_force_ancestors(parents: list[int]) -> list[list[bool]]:
    out = []
    for n in range(len(parents)):
        chain, m = {n}, parents[n]
        while m >= 0:
            chain.add(m)
            m = parents[m]
        out.append([m in chain for m in range(len(parents))])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_ancestors_and_depths_match_brute_force(seed):
    layout = random_layout(random.Random(seed), examples=6, max_nodes=8)
    parents = layout["node_parents"]
    anc = brute_force_ancestors(parents)
    assert ancestor_matrix(parents).tolist() == anc
    assert node_depths(parents).tolist() == [sum(row) - 1 for row in anc]
    assert token_nodes(layout["num_tokens"], layout["node_offsets"]).tolist() == [
        max(n for n, o in enumerate(layout["node_offsets"]) if o <= t) for t in range(layout["num_tokens"])]


def test_empty_nodes_are_dropped_and_transparent():
    # node 1 is empty: its child (node 2) hangs off node 0; positions and predecessors do not change
    off, par = drop_empty_nodes(6, [0, 3, 3, 5], [-1, 0, 1, 0])
    assert off.tolist() == [0, 3, 5] and par.tolist() == [-1, 0, 0]
    assert tree_position_ids(6, [0, 3, 3, 5], [-1, 0, 1, 0]).tolist() == tree_position_ids(6, off, par).tolist()
    assert predecessor_index(6, [0, 3, 3, 5], [-1, 0, 1, 0]).tolist() == [-1, 0, 1, 2, 3, 2]
    # an empty last node, and an empty root whose child becomes the root
    assert [a.tolist() for a in drop_empty_nodes(4, [0, 4], [-1, 0])] == [[0], [-1]]
    assert [a.tolist() for a in drop_empty_nodes(4, [0, 0], [-1, 0])] == [[0], [-1]]
    with pytest.raises(ShardError, match="not decrease"):
        drop_empty_nodes(4, [0, 3, 2], [-1, 0, 0])


@pytest.mark.parametrize(
    ("layout", "rule"),
    [
        (dict(num_tokens=5, cu_seqlens=[0]), "cu_seqlens length"),
        (dict(num_tokens=5, cu_seqlens=[1, 5]), "cu_seqlens start"),
        (dict(num_tokens=5, cu_seqlens=[0, 4]), "cu_seqlens end"),
        (dict(num_tokens=5, cu_seqlens=[0, 3, 3, 5], node_offsets=[0, 2, 3], node_parents=[-1, -1, -1]),
         "cu_seqlens increasing"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 3, 3], node_parents=[-1, 0, 0]), "node offsets"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 5], node_parents=[-1, 0]), "node offsets"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 2], node_parents=[-1, 1]), "node parents"),
        (dict(num_tokens=5, cu_seqlens=[0, 5], node_offsets=[0, 2], node_parents=[0, -1]), "node parents"),
        (dict(num_tokens=5, cu_seqlens=[0, 2, 5], node_offsets=[0, 3], node_parents=[-1, -1]), "roots at starts"),
        (dict(num_tokens=5, cu_seqlens=[0, 2, 5], node_offsets=[0, 1], node_parents=[-1, 0]), "roots"),
        (dict(num_tokens=5, cu_seqlens=[0, 2, 5], node_offsets=[0, 2, 3], node_parents=[-1, -1, 0]), "parent example"),
    ],
)
def test_each_rule_is_named(layout, rule):
    T, cu = layout["num_tokens"], layout["cu_seqlens"]
    off = layout.get("node_offsets", [0])
    par = layout.get("node_parents", [-1] * len(off))
    faults = layout_faults(T, off, par, cu)
    assert [name for name, bad in faults.items() if bad[0]] == [rule]
    with pytest.raises(ShardError, match=re.escape(LAYOUT_RULES[rule])):
        check_layout(T, off, par, cu)


def test_node_arrays_must_pair_up():
    with pytest.raises(ShardError, match="differ in length"):
        check_layout(5, [0, 2], [-1])
    with pytest.raises(ShardError, match="differ in length"):
        check_layout(5, [], [])


def _break(rng: random.Random, layout: dict) -> dict:
    """The layout with one random value moved (often, not always, breaking a rule)."""
    out = {k: list(v) if isinstance(v, list) else v for k, v in layout.items()}
    key = rng.choice(["cu_seqlens", "node_offsets", "node_parents"])
    i = rng.randrange(len(out[key]))
    out[key][i] += rng.choice([-2, -1, 1, 2])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_row_group_is_judged_like_each_row_alone(seed):
    """``packer verify`` checks a whole row group at once: each row's faults equal that row's alone."""
    rng = random.Random(seed)
    rows = [random_layout(rng, examples=rng.randint(1, 4)) for _ in range(40)]
    rows = [_break(rng, r) if rng.random() < 0.6 else r for r in rows]
    alone = [layout_faults(r["num_tokens"], r["node_offsets"], r["node_parents"], r["cu_seqlens"]) for r in rows]
    splits = {k: np.cumsum([0] + [len(r[k]) for r in rows]) for k in ("cu_seqlens", "node_offsets")}
    together = layout_faults(
        [r["num_tokens"] for r in rows],
        np.concatenate([r["node_offsets"] for r in rows]),
        np.concatenate([r["node_parents"] for r in rows]),
        np.concatenate([r["cu_seqlens"] for r in rows]),
        node_splits=splits["node_offsets"], cu_splits=splits["cu_seqlens"],
    )
    for name in LAYOUT_RULES:
        assert together[name].tolist() == [bool(a[name][0]) for a in alone], name
    assert any(together[name].any() for name in LAYOUT_RULES)  # some rows did break


def test_examples_without_cu_seqlens_are_the_roots():
    # an example alone, or a forest: every root starts an example; a parent across one is refused
    check_layout(7, [0, 2, 4, 5], [-1, 0, -1, 2])
    assert layout_faults(7, [0, 2, 4, 5], [-1, 0, -1, 0])["parent example"].tolist() == [True]
    assert tree.node_start_positions([-1, 0, 1, 0], [3, 2, 1, 4]).tolist() == [0, 3, 5, 3]


@pytest.mark.parametrize("empty_nodes", [False, True])
def test_one_example_is_judged_like_a_row(empty_nodes):
    """check_layout's per-example path (no cu_seqlens, the encoder's) names the rule layout_faults does."""
    rng = random.Random(int(empty_nodes))
    for _ in range(300):
        layout = random_layout(rng, examples=rng.randint(1, 3))
        if rng.random() < 0.7:
            layout = _break(rng, layout)
        T, off, par = layout["num_tokens"], layout["node_offsets"], layout["node_parents"]
        faults = layout_faults(T, off, par, empty_nodes=empty_nodes)
        want = next((name for name, bad in faults.items() if bad[0]), None)
        if want is None:
            check_layout(T, off, par, empty_nodes=empty_nodes)
        else:
            with pytest.raises(ShardError) as e:
                check_layout(T, off, par, empty_nodes=empty_nodes)
            rule = "not decrease" if want == "node offsets" and empty_nodes else LAYOUT_RULES[want]
            assert rule in str(e.value), (layout, want)


@pytest.mark.parametrize("seed", range(40))
def test_path_maxima_equals_a_walk_of_every_path(seed):
    """``path_maxima``: for each item, the largest value on every root-to-leaf path through its node, against
    walking each leaf's ancestor chain."""
    from tests.helpers import random_tree

    rng = np.random.default_rng(seed)
    _, parents = random_tree(rng, 60, max_nodes=8)
    nodes = rng.integers(0, len(parents), int(rng.integers(0, 7)))
    values = rng.integers(1, 50, len(nodes))
    leaves = [n for n in range(len(parents)) if n not in set(parents.tolist())]
    chains = []
    for leaf in leaves:
        chain, n = set(), leaf
        while n >= 0:
            chain.add(n)
            n = int(parents[n])
        chains.append(chain)
    want = [{max(int(v) for v, m in zip(values, nodes, strict=True) if m in c) for c in chains if node in c}
            for node in nodes.tolist()]
    assert tree.path_maxima(parents, nodes, values) == want
