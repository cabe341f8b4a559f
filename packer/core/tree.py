"""Tree ops on the node layout of a packed row or of one example, written once (numpy).

A row is a forest: examples laid end to end, each a tree of nodes laid out depth-first, parents first.
Node n spans ``[node_offsets[n], node_offsets[n+1] or T)``; ``node_parents[n]`` is an earlier node of the
same example, or -1 for an example's root (tests start from this row: ``tests.helpers.GOLDEN_LAYOUT``):

    row:     | P P P | a a | b b b | Q Q |     example 0 = node 0 (prefix P) with branches 1 (a) and 2 (b)
    node:      0 0 0   1 1   2 2 2   3 3      example 1 = node 3 (a plain sequence Q)

    cu_seqlens        = [0, 8, 10]             example boundaries
    node_offsets      = [0, 3, 5, 8]
    node_parents      = [-1, 0, 0, -1]
    token_nodes       = [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    tree_position_ids = [0, 1, 2, 3, 4, 3, 4, 5, 0, 1]    a branch continues from its parent's end
    predecessor_index = [-1, 0, 1, 2, 3, 2, 5, 6, -1, 8]  whose logit predicts each token (-1: none)
    ancestor_matrix[2] = [True, False, True, False]        node 2 sees node 0 and itself

Everything is vectorized: loops run over tree depth (pointer jumping), never over tokens or nodes, and
``layout_faults`` checks a whole row group at once (``packer verify``). torch callers (``packer.train``)
wrap the results with ``torch.from_numpy``. A broken layout raises ``ShardError``: it is the shard
contract of docs/format.md that breaks, whoever built the arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packer.errors import ShardError

ArrayLike = Any  # numpy arrays, lists, or CPU tensors (np.asarray reads them without a copy)

LAYOUT_RULES: dict[str, str] = {
    # name (as ``packer verify`` reports it) -> the rule
    "cu_seqlens length": "'cu_seqlens' needs at least two values, 0 and T",
    "cu_seqlens start": "'cu_seqlens' must start at 0",
    "cu_seqlens end": "'cu_seqlens' must end at T",
    "cu_seqlens increasing": "'cu_seqlens' must rise strictly",
    "node offsets": "'node_offsets' must start at 0 and rise strictly inside [0, T)",
    "node parents": "'node_parents' must be -1 or point to an earlier node (node 0 is a root)",
    "roots": "every example must start with a root node (parent -1), and only there",
    "roots at starts": "a root node (parent -1) must start where its example starts (cu_seqlens)",
    "parent example": "a node's parent must belong to the same example",
}
_EMPTY_NODES_RULE = "'node_offsets' must start at 0 and not decrease, staying <= T"


def _ints(x: ArrayLike) -> np.ndarray:
    if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == 1:
        return x  # already converted by the caller: these helpers call each other on small arrays
    return np.asarray(x, dtype=np.int64).reshape(-1)


def _rows_with(flags: np.ndarray, row_of: np.ndarray, num_rows: int) -> np.ndarray:
    """(R,) bool: does any element of the row have ``flags`` set."""
    return np.bincount(row_of[flags], minlength=num_rows) > 0


def layout_faults(
    num_tokens: int | ArrayLike,
    node_offsets: ArrayLike,
    node_parents: ArrayLike,
    cu_seqlens: ArrayLike | None = None,
    *,
    node_splits: ArrayLike | None = None,
    cu_splits: ArrayLike | None = None,
    empty_nodes: bool = False,
) -> dict[str, np.ndarray]:
    """Which rows break which rule of ``LAYOUT_RULES``: rule name -> (R,) bool, in the order of the rules.

    One row: ``num_tokens`` an int and the three arrays. R rows at once (a row group): ``num_tokens`` (R,)
    and each array flat, row after row, split by ``node_splits`` / ``cu_splits`` ((R+1,) offsets, as
    Arrow lists store them); node offsets and parents stay row-local. ``node_offsets`` and
    ``node_parents`` must have equal lengths and >= 1 node per row (``check_layout`` says so for one row).

    Without ``cu_seqlens`` every root starts an example (an example alone, or a forest). ``empty_nodes``
    allows zero-token nodes (offsets only need not decrease, up to T). A rule is judged only on rows that
    keep the rules it relies on (roots are compared with starts where both are sound), so every flag is real.
    """
    lengths = _ints(num_tokens)
    off, par = _ints(node_offsets), _ints(node_parents)
    num_rows, n = len(lengths), len(off)
    n_split = np.array([0, n]) if node_splits is None else _ints(node_splits)
    row_of_node = np.repeat(np.arange(num_rows), np.diff(n_split))  # (N,)
    n_base = n_split[:-1][row_of_node]  # (N,) flat index of each node's row's node 0
    local = np.arange(n) - n_base  # (N,) node index inside its row
    faults: dict[str, np.ndarray] = {}
    good = np.ones(num_rows, dtype=bool)
    if cu_seqlens is not None:
        cu = _ints(cu_seqlens)
        c_split = np.array([0, len(cu)]) if cu_splits is None else _ints(cu_splits)
        row_of_cu = np.repeat(np.arange(num_rows), np.diff(c_split))
        short = np.diff(c_split) < 2
        c_first = cu[np.minimum(c_split[:-1], max(len(cu) - 1, 0))] if len(cu) else np.zeros(num_rows, np.int64)
        c_last = cu[np.maximum(c_split[1:] - 1, 0)] if len(cu) else np.zeros(num_rows, np.int64)
        steps = np.zeros(len(cu), dtype=bool)
        steps[1:] = (np.diff(cu) <= 0) & (np.diff(row_of_cu) == 0)
        faults["cu_seqlens length"] = short
        faults["cu_seqlens start"] = ~short & (c_first != 0)
        faults["cu_seqlens end"] = ~short & (c_last != lengths)
        faults["cu_seqlens increasing"] = _rows_with(steps, row_of_cu, num_rows)
        good = ~(short | faults["cu_seqlens start"] | faults["cu_seqlens end"] | faults["cu_seqlens increasing"])

    first = local == 0
    bad_off = (off < 0) | (first & (off != 0))
    if empty_nodes:
        bad_off[1:] |= ~first[1:] & (off[1:] < off[:-1])
        bad_off |= off > lengths[row_of_node]
    else:
        bad_off[1:] |= ~first[1:] & (off[1:] <= off[:-1])
        bad_off |= off >= lengths[row_of_node]
    faults["node offsets"] = _rows_with(bad_off, row_of_node, num_rows)
    faults["node parents"] = _rows_with((par < -1) | (par >= local), row_of_node, num_rows)
    nodes_ok = ~(faults["node offsets"] | faults["node parents"])
    is_root = par == -1
    if cu_seqlens is not None:
        faults["roots"] = ~short & (np.bincount(row_of_node[is_root], minlength=num_rows) != np.diff(c_split) - 1)
        sel = good & nodes_ok & ~faults["roots"]  # both lists line up element by element
        starts = np.ones(len(cu), dtype=bool)
        starts[c_split[1:][~short] - 1] = False  # the final T starts nothing
        pick_root, pick_start = is_root & sel[row_of_node], starts & sel[row_of_cu]
        faults["roots at starts"] = _rows_with(off[pick_root] != cu[pick_start], row_of_node[pick_root], num_rows)
        good &= nodes_ok & ~faults["roots"] & ~faults["roots at starts"]
    else:
        good &= nodes_ok
    # Sound rows so far have their roots exactly at the example starts: a node's example is the number of
    # roots up to it, and a parent in another example has another count.
    example = np.cumsum(is_root)  # (N,) over the whole flat forest
    g_par = np.clip(par + n_base, 0, max(n - 1, 0))
    cross = ~is_root & good[row_of_node] & (example[g_par] != example)
    faults["parent example"] = _rows_with(cross, row_of_node, num_rows)
    return faults


def _example_fault(num_tokens: int, off: np.ndarray, par: np.ndarray, *, empty_nodes: bool) -> str | None:
    """The first rule one example (or forest, no cu_seqlens) breaks, or None: ``layout_faults`` of one row
    with scalar checks first, for the encoder's per-example hot path (a test holds the two equal; its measured
    gain: docs/benchmarks.md, "Fast paths")."""
    if len(off) == 1:  # a linear example, most of them: three scalar rules, no array ops
        bad_offsets = off[0] != 0 or off[0] > num_tokens - (not empty_nodes)
        return "node offsets" if bad_offsets else "node parents" if par[0] != -1 else None
    step = off[1:] - off[:-1]
    if off[0] != 0 or (step < 0 if empty_nodes else step <= 0).any() or off[-1] > num_tokens - (not empty_nodes):
        return "node offsets"
    if par[0] != -1 or par.min() < -1 or (par >= np.arange(len(par))).any():
        return "node parents"
    roots = par == -1
    if np.count_nonzero(roots) > 1:  # one example (the usual case) cannot cross into another
        example = np.cumsum(roots)
        if (~roots & (example[np.maximum(par, 0)] != example)).any():
            return "parent example"
    return None


def check_layout(
    num_tokens: int,
    node_offsets: ArrayLike,
    node_parents: ArrayLike,
    cu_seqlens: ArrayLike | None = None,
    *,
    empty_nodes: bool = False,
) -> None:
    """Raise ``ShardError`` naming the first rule of ``LAYOUT_RULES`` one row (or example) breaks."""
    off, par = _ints(node_offsets), _ints(node_parents)
    if len(off) == 0 or len(off) != len(par):
        raise ShardError(f"'node_offsets' ({len(off)}) and 'node_parents' ({len(par)}) differ in length "
                         "or are empty: a row has >= 1 node and one parent per node")
    if cu_seqlens is None:
        name = _example_fault(num_tokens, off, par, empty_nodes=empty_nodes)
    else:
        name = next((k for k, bad in layout_faults(num_tokens, off, par, cu_seqlens).items() if bad[0]), None)
    if name is None:
        return
    rule = _EMPTY_NODES_RULE if name == "node offsets" and empty_nodes else LAYOUT_RULES[name]
    shown = {"node offsets": ("node_offsets", off), "node parents": ("node_parents", par)}.get(name)
    if name.startswith("cu_seqlens"):
        shown = ("cu_seqlens", _ints(cu_seqlens))
    got = f", got {shown[0]}={shown[1][:16].tolist()}" if shown else ""
    raise ShardError(f"{rule} (T={num_tokens}){got}")


def node_lengths(num_tokens: int, node_offsets: ArrayLike) -> np.ndarray:
    """(N,) int64 tokens in each node."""
    off = _ints(node_offsets)
    out = np.empty_like(off)
    out[:-1] = off[1:] - off[:-1]
    out[-1:] = num_tokens - off[-1:]
    return out


def node_examples(node_parents: ArrayLike) -> np.ndarray:
    """(N,) int64 example of each node: every root starts the next example."""
    return np.cumsum(_ints(node_parents) == -1) - 1


def token_nodes(num_tokens: int, node_offsets: ArrayLike) -> np.ndarray:
    """(T,) int64 node of each token (an empty node holds none)."""
    lengths = node_lengths(num_tokens, node_offsets)
    return np.repeat(np.arange(len(lengths)), lengths)


def ancestor_matrix(node_parents: ArrayLike) -> np.ndarray:
    """(N, N) bool: ``anc[n, m]`` iff node m is node n or one of its ancestors. One step per tree level."""
    parents = _ints(node_parents)
    n = len(parents)
    anc = np.eye(n, dtype=bool)
    rows = np.arange(n)
    up = parents.copy()  # the current ancestor of each node, -1 once past the root
    while (has := up >= 0).any():
        anc[rows[has], up[has]] = True
        up = np.where(has, parents[np.maximum(up, 0)], -1)
    return anc


def path_maxima(node_parents: ArrayLike, nodes: ArrayLike, values: ArrayLike) -> list[set[int]]:
    """For item i (at node ``nodes[i]``, worth ``values[i]``), the largest value among the items on each
    root-to-leaf path through its node: one number where every such path agrees (a clip padded to the longest
    clip of each path it is on, Qwen3-Omni's audio)."""
    parents = _ints(node_parents)
    nodes, values = _ints(nodes), _ints(values)
    is_leaf = np.ones(len(parents), dtype=bool)
    is_leaf[parents[parents >= 0]] = False
    on = ancestor_matrix(parents)[is_leaf][:, nodes]  # (leaves, items): item i lies on leaf l's path
    longest = np.where(on, values[None, :], np.iinfo(np.int64).min).max(axis=1, initial=np.iinfo(np.int64).min)
    return [{int(v) for v in longest[on[:, i]]} for i in range(len(nodes))]


def node_start_positions(node_parents: ArrayLike, lengths: ArrayLike) -> np.ndarray:
    """(N,) int64 first 1-D position of each node: the summed ``lengths`` of its strict ancestors.

    Any per-node weight works as ``lengths`` (all ones give each node's depth). Pointer jumping: each step
    adds the partial sum held by a node's current ancestor pointer and doubles the pointer's reach, so
    depth D takes log2(D) vectorized steps.
    """
    parents = _ints(node_parents)
    lengths = _ints(lengths)
    start = np.where(parents >= 0, lengths[np.maximum(parents, 0)], 0)  # the parent's length alone
    ptr = parents.copy()
    while (live := ptr >= 0).any():
        start = start + np.where(live, start[np.maximum(ptr, 0)], 0)
        ptr = np.where(live, ptr[np.maximum(ptr, 0)], -1)
    return start


def node_depths(node_parents: ArrayLike) -> np.ndarray:
    """(N,) int64 number of ancestors of each node (0 for a root)."""
    parents = _ints(node_parents)
    return node_start_positions(parents, np.ones(len(parents), dtype=np.int64))


def tree_position_ids(num_tokens: int, node_offsets: ArrayLike, node_parents: ArrayLike) -> np.ndarray:
    """(T,) int32 1-D positions: 0 at a root, a child's first position is its parent's last + 1.

    A token's position is the one it would have if its root-to-leaf path ran alone, so positions go
    backwards at each branch start. Empty nodes are allowed and transparent (their children continue from
    their parent). Takes one example or a whole row (each root restarts at 0).
    """
    offsets, parents = _ints(node_offsets), _ints(node_parents)
    if len(offsets) == 1 and len(parents) == 1 and offsets[0] == 0 and parents[0] == -1:
        return np.arange(num_tokens, dtype=np.int32)  # one node (a linear example): nothing else to check
    check_layout(num_tokens, offsets, parents, empty_nodes=True)
    lengths = node_lengths(num_tokens, offsets)
    shift = np.repeat(offsets - node_start_positions(parents, lengths), lengths)  # (T,) row offset - position
    return (np.arange(num_tokens, dtype=np.int64) - shift).astype(np.int32)


def predecessor_index(num_tokens: int, node_offsets: ArrayLike, node_parents: ArrayLike) -> np.ndarray:
    """(T,) int64 position whose logit predicts each token: t-1 inside a node, the parent's last token at a
    node start, -1 at a root (an example start). Labels stay unshifted; the loss gathers by this index."""
    offsets, parents = drop_empty_nodes(num_tokens, node_offsets, node_parents)
    ends = np.append(offsets[1:], num_tokens)
    pred = np.arange(num_tokens, dtype=np.int64) - 1
    pred[offsets] = np.where(parents >= 0, ends[np.maximum(parents, 0)] - 1, -1)
    return pred


def drop_empty_nodes(num_tokens: int, node_offsets: ArrayLike, node_parents: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, parents) int64 without zero-token nodes: their children hang off their nearest non-empty
    ancestor (or become roots). The layout is unchanged for attention, positions and loss; returns the
    inputs as int64 when no node is empty."""
    offsets, parents = _ints(node_offsets), _ints(node_parents)
    if len(offsets) != len(parents):
        check_layout(num_tokens, offsets, parents)  # raises: the lengths differ
    lengths = node_lengths(num_tokens, offsets)
    if (lengths < 0).any() or (len(offsets) and offsets[0] < 0):
        raise ShardError(f"{_EMPTY_NODES_RULE} (T={num_tokens}), got node_offsets={offsets[:16].tolist()}")
    empty = lengths == 0
    if not empty.any():
        return offsets, parents
    if ((parents < -1) | (parents >= np.arange(len(parents)))).any():
        raise ShardError(f"{LAYOUT_RULES['node parents']}, got node_parents={parents[:16].tolist()}")
    par = parents.copy()
    while (hop := (par >= 0) & empty[np.maximum(par, 0)]).any():  # past empty ancestors, one level a step
        par = np.where(hop, parents[np.maximum(par, 0)], par)
    keep = ~empty
    new_index = np.cumsum(keep) - 1  # (N,) index among the kept nodes
    return offsets[keep], np.where(par >= 0, new_index[np.maximum(par, 0)], -1)[keep]
