"""The encode cache's compact labels and positions (``packer.shards.derived``): what ``compact`` stores gives back
every example's labels and positions through ``expand``, nothing is stored where the rule derives it, and a
damaged chunk's columns are refused, never read as other labels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import IGNORE_INDEX
from packer.errors import ShardError
from packer.shards import derived


@st.composite
def _examples(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Examples back to back: (ids, labels, positions, offsets). Each example's labels mix -100, its own ids and
    (sometimes) other ids; its positions count from 0, or not (a tree's branch restarts)."""
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=8))
    ids, labels, positions = [], [], []
    for n in lengths:
        tok = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
        kinds = draw(st.lists(st.sampled_from("lli-"), min_size=n, max_size=n))  # loss, loss, ignore, other
        foreign = draw(st.booleans())
        lab = [t if k == "l" else IGNORE_INDEX if k == "i" or not foreign else t + 100
               for t, k in zip(tok, kinds, strict=True)]
        pos = list(range(n)) if draw(st.booleans()) else draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
        ids += tok
        labels += lab
        positions += pos
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return (np.array(ids, np.int32), np.array(labels, np.int32), np.array(positions, np.int32), offsets)


@settings(max_examples=300, deadline=None)
@given(_examples())
def test_compact_then_expand_gives_back_every_value(case):
    ids, labels, positions, offsets = case
    lab, runs, pos = derived.compact(ids, labels, positions, offsets)
    got_labels, got_positions = derived.expand(offsets, ids, lab, runs, pos)
    assert got_labels.tolist() == labels.tolist()
    assert got_positions.tolist() == positions.tolist()
    for i in range(len(offsets) - 1):
        a, b = offsets[i], offsets[i + 1]
        derivable = bool(np.all((labels[a:b] == IGNORE_INDEX) | (labels[a:b] == ids[a:b])))
        assert (lab[0][i + 1] == lab[0][i]) == derivable or a == b  # stored only where the rule cannot give it
        assert (runs[0][i + 1] > runs[0][i]) == (derivable and bool((labels[a:b] != IGNORE_INDEX).any()))
        assert (pos[0][i + 1] == pos[0][i]) == (positions[a:b].tolist() == list(range(b - a))) or a == b


def test_a_text_chat_stores_only_its_loss_spans():
    """Two turns of loss in a linear example: no labels and no positions stored, two spans."""
    ids = np.arange(10, 20, dtype=np.int32)
    labels = np.full(10, IGNORE_INDEX, np.int32)
    labels[2:5], labels[7:10] = ids[2:5], ids[7:10]
    lab, runs, pos = derived.compact(ids, labels, np.arange(10, dtype=np.int32), np.array([0, 10]))
    assert lab[1].size == 0 and pos[1].size == 0
    assert runs[1].tolist() == [2, 3, 7, 3]


@pytest.mark.parametrize("damage", ["run past the end", "runs out of order", "odd run values",
                                    "positions short", "labels short"])
def test_expand_refuses_columns_that_do_not_describe_the_tokens(damage):
    ids = np.arange(20, dtype=np.int32)
    offsets = np.array([0, 8, 20])
    labels = np.full(20, IGNORE_INDEX, np.int32)
    labels[[1, 2, 10, 11, 15]] = ids[[1, 2, 10, 11, 15]]
    lab, runs, pos = derived.compact(ids, labels, np.arange(20, dtype=np.int32) % 8, offsets)
    r_off, r = runs[0].copy(), runs[1].copy()
    p_off, p = pos[0].copy(), pos[1].copy()
    l_off, lv = lab[0].copy(), lab[1].copy()
    if damage == "run past the end":
        r[-1] = 9
    elif damage == "runs out of order":
        r[2], r[4] = r[4], r[2]
    elif damage == "odd run values":
        r_off[-1] -= 1
        r = r[:-1]
    elif damage == "positions short":
        p_off[-1] -= 1
        p = p[:-1]
    else:
        l_off[-1] = 5
        lv = labels[8:13]
    with pytest.raises(ShardError, match="example 1 has labels, label runs or positions"):
        derived.expand(offsets, ids, (l_off, lv), (r_off, r), (p_off, p))
