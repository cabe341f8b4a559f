"""The row's skeleton: list lengths that agree, ``cu_seqlens`` from 0 to T, and a node forest that keeps every
rule of ``packer.core.tree.LAYOUT_RULES``. A row failing these is not checked further (its content would only
repeat the fault)."""

from __future__ import annotations

import numpy as np

from packer.core import tree
from packer.report.verify.decode import Rows
from packer.report.verify.report import RowCheck

CU_SEQLENS_CHECKS = ("cu_seqlens length", "cu_seqlens start", "cu_seqlens end", "cu_seqlens increasing")


def check_list_lengths(d: Rows, check: RowCheck, *, mrope: bool) -> np.ndarray:
    """Labels, positions, cu_seqlens (E+1), sources (E), nodes and mRoPE (3T) sized as the row; returns the
    rows that pass."""
    T, E, N = d.num_tokens, d.num_examples, d.num_nodes
    bad = check(T < 1, "empty row", lambda i: "row has no tokens")
    bad |= check(E < 1, "no examples", lambda i: "row has no example_ids")
    bad |= check(d.labels.lengths != T, "labels length",
                 lambda i: f"labels has {d.labels.lengths[i]} values, input_ids {T[i]}")
    bad |= check(d.position_ids.lengths != T, "position_ids length",
                 lambda i: f"position_ids has {d.position_ids.lengths[i]} values, input_ids {T[i]}")
    stored = d.totals["num_tokens"]
    bad |= check(stored != T, "num_tokens", lambda i: f"num_tokens is {stored[i]}, the row has {T[i]} tokens")
    bad |= check(d.cu_seqlens.lengths != E + 1, "cu_seqlens length",
                 lambda i: f"cu_seqlens has {d.cu_seqlens.lengths[i]} values for {E[i]} examples (want E+1)")
    sources = np.diff(d.source_offsets)
    bad |= check(sources != E, "example_sources length",
                 lambda i: f"example_sources has {sources[i]} values for {E[i]} examples")
    bad |= check((N < 1) | (d.node_parents.lengths != N), "node arrays length",
                 lambda i: f"{N[i]} node_offsets and {d.node_parents.lengths[i]} node_parents (want equal, >= 1)")
    if mrope:
        bad |= check(d.mrope_null, "mrope missing", lambda i: "mrope_position_ids is null but the profile uses mRoPE")
        bad |= check(~d.mrope_null & (d.mrope.lengths != 3 * T), "mrope length",
                     lambda i: f"mrope_position_ids has {d.mrope.lengths[i]} values, want 3*T = {3 * T[i]}")
    else:
        bad |= check(~d.mrope_null, "mrope present",
                     lambda i: "mrope_position_ids is set but the profile has no mRoPE")
    return ~bad


def layout_faults(d: Rows) -> dict[str, np.ndarray]:
    """(R,) bool per rule of ``tree.layout_faults`` (cu_seqlens and node forest), over the whole row group."""
    return tree.layout_faults(d.num_tokens, d.node_offsets.values, d.node_parents.values, d.cu_seqlens.values,
                              node_splits=d.node_offsets.offsets, cu_splits=d.cu_seqlens.offsets)


def check_cu_seqlens(d: Rows, check: RowCheck, faults: dict[str, np.ndarray]) -> np.ndarray:
    """cu_seqlens: at least 2 values, from 0, strictly increasing, to T; returns the rows that pass."""
    cu = d.cu_seqlens
    first, last = cu.values[cu.offsets[:-1]], cu.values[cu.offsets[1:] - 1]  # rows have E+1 >= 2 values
    describe = {
        "cu_seqlens length": lambda i: f"cu_seqlens has {cu.lengths[i]} values (want >= 2)",
        "cu_seqlens start": lambda i: f"cu_seqlens starts at {first[i]}, not 0",
        "cu_seqlens end": lambda i: f"cu_seqlens ends at {last[i]}, the row has {d.num_tokens[i]} tokens",
        "cu_seqlens increasing": lambda i: f"cu_seqlens is not strictly increasing: {cu.of_row(i)[:12].tolist()}",
    }
    bad = np.zeros(d.num_rows, dtype=bool)
    for name in CU_SEQLENS_CHECKS:
        bad |= check(faults[name], name, describe[name])
    return ~bad


def check_node_forest(d: Rows, check: RowCheck, faults: dict[str, np.ndarray]) -> np.ndarray:
    """Node offsets rise from 0, parents are earlier nodes of the same example, roots exactly at the example
    starts; returns the rows that pass."""
    offsets, parents, E = d.node_offsets, d.node_parents, d.num_examples
    describe = {
        "node offsets": lambda i: "node_offsets do not start at 0 and rise strictly inside [0, T): "
        f"{offsets.of_row(i)[:12].tolist()}",
        "node parents": lambda i: f"node_parents must be -1 or an earlier node: {parents.of_row(i)[:12].tolist()}",
        "roots": lambda i: f"{int((parents.of_row(i) == -1).sum())} root nodes (parent -1) for {E[i]} examples",
        "roots at starts": lambda i: "a root node does not start where its example starts (cu_seqlens)",
        "parent example": lambda i: "a node's parent belongs to another example",
    }
    bad = np.zeros(d.num_rows, dtype=bool)
    for name, rows in faults.items():
        if name not in CU_SEQLENS_CHECKS:
            bad |= check(rows, name, describe[name])
    return ~bad
