"""Look inside one packed row: its examples, their message trees, images, loss tokens, and attention mask.

``describe_row`` reads one row and returns plain data; ``format_row`` prints it the way ``packer inspect``
does; ``draw_mask`` draws the row's attention mask. Roles are derived from the tokens themselves, decoded
with the build's own tokenizer (named in the manifest): the word after ``<|im_start|>`` (ChatML) or between
``<|start_header_id|>`` and ``<|end_header_id|>`` (Llama-3). What was rendered is what is shown.

    example 0  coco.jsonl:74  [0, 348)  348 tokens, 6 nodes, 1 image, 72 loss tokens
      node  span        parent  role         loss  text
      0     [0, 256)    -       system,user     0  "<|im_start|>system\\n[…]<|image_pad|>x234<|vision_end|>Describe this image.<|im_end|>\\n"
      1     [256, 271)  0       └ assistant    11  "<|im_start|>assistant\\nA laptop computer on a desk.<|im_end|>\\n"
                                             loss: "A laptop computer on a desk.<|im_end|>"
      image 0  [15, 249)  234 tokens, grid 1x26x36  /data/coco/000000000790.jpg

Long texts are elided in the middle (``[…]``); separate runs of loss tokens are joined by `` … ``.

The mask picture (after the Molmo2 paper's figure): token i (row) sees token j (column). Each example is a
block on the diagonal in its own colour; the darker columns of a block are the ancestor nodes a branch sees
(a shared image + prompt prefix); sibling branches leave white holes because they never see each other;
lighter columns are vision tokens. Rows longer than ``MASK_CELLS`` tokens are drawn at block resolution
(a cell is drawn visible if any of its token pairs is).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.core import tree
from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError
from packer.shards.io import ShardSet, open_shards

if TYPE_CHECKING:
    from packer.models.base import ModelProfile

MASK_CELLS = 1024  # the drawn mask is at most this many cells a side: ~1 px per cell at the saved size
SNIPPET_CHARS = 160  # decoded text shown per node (the middle is elided)
RUN_COLLAPSE = 4  # a token repeated this many times or more prints once with a count (<|image_pad|>x216)
ANCESTOR_SHADE = 0.6  # keys in an ancestor node: the example's colour darkened this much
IMAGE_EDGE = "#4b0082"  # image span outlines: indigo, apart from every example colour
HEADER_PATTERNS = (
    re.compile(r"<\|im_start\|>([^\n<]+)\n"),  # ChatML (Qwen, many others)
    re.compile(r"<\|start_header_id\|>([^<]+)<\|end_header_id\|>"),  # Llama-3
)


@dataclass
class ImageInfo:
    index: int
    example: int
    source: str  # resolved path, or "<inline N bytes>"
    grid: tuple[int, int, int]  # (t, h, w) patches before merging
    start: int  # first vision token in the row
    end: int  # one past the last
    num_tokens: int


@dataclass
class NodeInfo:
    index: int
    example: int
    start: int
    end: int
    parent: int  # row node index, -1 for an example's root
    depth: int
    roles: list[str]  # the message headers found in the node, in order ([] for plain text)
    loss_tokens: int
    text: str  # the decoded node (runs collapsed), or token ids without a tokenizer
    loss_text: str  # the decoded loss tokens, gaps shown as " … "
    loss_weight: float | None = None  # the loss tokens' summed weight (schema v4's loss_weights); None: unweighted


@dataclass
class ExampleInfo:
    index: int
    example_id: str
    source: str
    start: int
    end: int
    loss_tokens: int
    loss_weight: float | None = None  # as NodeInfo's
    nodes: list[NodeInfo] = field(default_factory=list)
    images: list[ImageInfo] = field(default_factory=list)
    videos: list[ImageInfo] = field(default_factory=list)  # source: the clip, or "N frames from <first>"
    audios: list[ImageInfo] = field(default_factory=list)  # grid: (1, 1, feature frames); source: path, seconds


@dataclass
class RowInfo:
    directory: str
    row: int
    num_rows: int
    shard: str
    shard_row: int
    capacity: int | None
    num_tokens: int
    num_loss_tokens: int
    num_vision_tokens: int
    tokenizer: str | None  # the tokenizer that decoded the text, None when ids are shown
    examples: list[ExampleInfo]
    loss_weight: float | None = None  # as NodeInfo's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def locate_row(shards: ShardSet, row: int) -> tuple[int, int]:
    """(shard index, row inside that shard) of global row ``row``; ConfigError when out of range."""
    total = shards.num_rows
    if not 0 <= row < total:
        raise ConfigError(f"row {row} is out of range: {shards.root} has {total} row(s), 0..{total - 1}")
    for i, s in enumerate(shards.shards):
        if row < s.rows:
            return i, row
        row -= s.rows
    raise AssertionError("unreachable: the manifest's row counts add up to num_rows")


def find_example(shards: ShardSet, example_id: str) -> int:
    """The global row holding the example ``example_id`` (``path:line`` or ``path:line#k``)."""
    base = 0
    for i, s in enumerate(shards.shards):
        ids = shards.parquet(i).read(columns=["example_ids"]).column("example_ids")
        for r, row_ids in enumerate(ids.to_pylist()):
            if example_id in row_ids:
                return base + r
        base += s.rows
    raise ConfigError(f"no example {example_id!r} in {shards.root}; ids look like 'path/to/file.jsonl:LINE'")


def read_row(shards: ShardSet, row: int) -> dict[str, Any]:
    """One row as a dict: list columns as numpy arrays (int64; float32 for ``loss_weights`` and the mRoPE
    positions, which may be fractional), ``images`` as dicts, the rest as Python values."""
    shard, r = locate_row(shards, row)
    with shards.parquet(shard) as pf:
        for g in range(pf.metadata.num_row_groups):  # decode only the row group that holds the row
            n = pf.metadata.row_group(g).num_rows
            if r < n:
                data = pf.read_row_group(g).slice(r, 1).to_pylist()[0]
                break
            r -= n
    out: dict[str, Any] = {}
    for k, v in data.items():
        if k in ("images", "videos", "audios", "example_ids", "example_sources") or not isinstance(v, list):
            out[k] = v
        else:
            out[k] = np.asarray(v, dtype=np.float32 if k in ("loss_weights", "mrope_position_ids") else np.int64)
    return out


def _decode(tokenizer, ids: np.ndarray) -> str:
    """Decode with special tokens kept, a long run of one token shown once with its count."""
    if len(ids) == 0:
        return ""
    if tokenizer is None:
        return " ".join(map(str, ids.tolist()))
    change = np.flatnonzero(np.diff(ids)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(ids)]])
    parts, pending = [], []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        if e - s >= RUN_COLLAPSE:
            if pending:
                parts.append(tokenizer.decode(pending, skip_special_tokens=False))
                pending = []
            parts.append(f"{tokenizer.convert_ids_to_tokens(int(ids[s]))}x{e - s}")
        else:
            pending.extend(ids[s:e].tolist())
    if pending:
        parts.append(tokenizer.decode(pending, skip_special_tokens=False))
    return "".join(parts)


def _roles(text: str) -> list[str]:
    for pattern in HEADER_PATTERNS:
        found = pattern.findall(text)
        if found:
            return [r.strip() for r in found]
    return []


def _loss_text(tokenizer, ids: np.ndarray, labels: np.ndarray) -> str:
    """The loss tokens of a span, decoded; a gap between loss runs shows as ' … '."""
    on = labels != IGNORE_INDEX
    if not on.any():
        return ""
    idx = np.flatnonzero(on)
    breaks = np.flatnonzero(np.diff(idx) > 1) + 1
    return " … ".join(_decode(tokenizer, ids[run]) for run in np.split(idx, breaks))


def describe_row(directory: str | Path, row: int, *, tokenizer: Any = None, decode: bool = True) -> RowInfo:
    """Everything ``packer inspect`` shows about global row ``row`` of a finished build.

    ``tokenizer`` defaults to the build's own (``manifest.tokenizer.name``); ``decode=False`` shows
    token ids instead of text (no tokenizer is loaded).
    """
    shards = open_shards(directory)
    data = read_row(shards, row)
    tok_name = None
    if decode and tokenizer is None:
        if shards.manifest.tokenizer is None:
            raise ConfigError(f"{shards.root}/manifest.json names no tokenizer; pass --tokenizer or --ids")
        tok_name = shards.manifest.tokenizer.name
        from packer.encode.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(tok_name)
    elif decode:
        tok_name = getattr(tokenizer, "name_or_path", "given")
    if not decode:
        tokenizer = None

    ids, labels = data["input_ids"], data["labels"]
    weights = data.get("loss_weights")  # null on a row where every loss token weighs 1

    def weight(lo: int, hi: int) -> float | None:
        return None if weights is None else round(float(weights[lo:hi].sum(dtype=np.float64)), 6)

    T = len(ids)
    cu = data["cu_seqlens"]
    offsets, parents = data["node_offsets"], data["node_parents"]
    node_ends = np.concatenate([offsets[1:], [T]])
    node_example = np.searchsorted(cu, offsets, side="right") - 1  # (N,) by cu_seqlens: a broken row still shows
    depth = tree.node_depths(parents)  # (N,)
    sources = data.get("example_sources") or [""] * (len(cu) - 1)

    examples = []
    for k in range(len(cu) - 1):
        lo, hi = int(cu[k]), int(cu[k + 1])
        examples.append(ExampleInfo(index=k, example_id=data["example_ids"][k], source=sources[k], start=lo, end=hi,
                                    loss_tokens=int((labels[lo:hi] != IGNORE_INDEX).sum()), loss_weight=weight(lo, hi)))
    for n in range(len(offsets)):
        lo, hi = int(offsets[n]), int(node_ends[n])
        text = _decode(tokenizer, ids[lo:hi])
        examples[int(node_example[n])].nodes.append(NodeInfo(
            index=n, example=int(node_example[n]), start=lo, end=hi, parent=int(parents[n]), depth=int(depth[n]),
            roles=_roles(text) if tokenizer is not None else [],
            loss_tokens=int((labels[lo:hi] != IGNORE_INDEX).sum()), text=text,
            loss_text=_loss_text(tokenizer, ids[lo:hi], labels[lo:hi]), loss_weight=weight(lo, hi),
        ))
    for i, im in enumerate(data["images"]):
        ex = int(np.searchsorted(cu, im["offset"], side="right") - 1)
        source = im["source"] or f"<inline {len(im['data'] or b'')} bytes>"
        examples[ex].images.append(ImageInfo(
            index=i, example=ex, source=source, grid=(im["grid_t"], im["grid_h"], im["grid_w"]),
            start=im["offset"], end=im["offset"] + im["num_tokens"], num_tokens=im["num_tokens"],
        ))
    for i, v in enumerate(data.get("videos") or []):
        ex = int(np.searchsorted(cu, v["offset"], side="right") - 1)
        source = v["source"] or f"{len(v['frames'])} frames from {v['frames'][0]}"
        examples[ex].videos.append(ImageInfo(
            index=i, example=ex, source=f"{source}, {len(v['frame_indices'])} frames sampled",
            grid=(v["grid_t"], v["grid_h"], v["grid_w"]), start=v["offset"], end=v["offset"] + v["num_tokens"],
            num_tokens=v["num_tokens"],
        ))
    for i, a in enumerate(data.get("audios") or []):
        ex = int(np.searchsorted(cu, a["offset"], side="right") - 1)
        source = a["source"] or f"<inline {len(a['data'] or b'')} bytes>"
        track = ", the video's sound track" if a["video"] else ""
        examples[ex].audios.append(ImageInfo(
            index=i, example=ex, source=f"{source}, {a['num_samples'] / a['sample_rate']:.2f} s{track}",
            grid=(1, 1, a["feature_length"]), start=a["offset"], end=a["offset"] + a["num_tokens"],
            num_tokens=a["num_tokens"],
        ))
    shard, shard_row = locate_row(shards, row)
    return RowInfo(
        directory=str(shards.root), row=row, num_rows=shards.num_rows, shard=shards.shards[shard].file,
        shard_row=shard_row, capacity=shards.config.max_length, num_tokens=T,
        num_loss_tokens=int((labels != IGNORE_INDEX).sum()), num_vision_tokens=int(data["num_vision_tokens"]),
        tokenizer=tok_name if tokenizer is not None else None, examples=examples, loss_weight=weight(0, T),
    )


def _snippet(text: str, width: int) -> str:
    """repr-like one-line text (newlines as \\n), the middle elided past ``width`` characters."""
    s = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    if len(s) > width:
        head = (width * 2) // 3
        s = s[:head] + "[…]" + s[len(s) - max(0, width - head - 3):]
    return f'"{s}"'


def _weighted(w: float | None) -> str:
    return "" if w is None else f", weighted {w:,.6g}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def format_row(info: RowInfo, *, width: int = SNIPPET_CHARS) -> str:
    """The text ``packer inspect`` prints for one row (``width`` 0: whole texts, no eliding)."""
    width = width or 10**9
    n_nodes = sum(len(e.nodes) for e in info.examples)
    n_images = sum(len(e.images) for e in info.examples)
    full = f" ({100 * info.num_tokens / info.capacity:.1f}% of {info.capacity:,})" if info.capacity else ""
    lines = [
        f"{info.directory}  row {info.row} of {info.num_rows}  ({info.shard}, row {info.shard_row})",
        f"{_plural(info.num_tokens, 'token')}{full}, {_plural(len(info.examples), 'example')}, "
        f"{_plural(n_nodes, 'node')}, {_plural(n_images, 'image')}, {info.num_loss_tokens:,} loss tokens"
        f"{_weighted(info.loss_weight)}, {info.num_vision_tokens:,} vision tokens",
    ]
    if info.tokenizer is None:
        lines.append("(token ids shown, not text)")
    for ex in info.examples:
        src = f"  source {ex.source}" if ex.source else ""
        lines += ["", f"example {ex.index}  {ex.example_id}{src}  [{ex.start}, {ex.end})  "
                      f"{_plural(ex.end - ex.start, 'token')}, {_plural(len(ex.nodes), 'node')}, "
                      f"{_plural(len(ex.images), 'image')}, {ex.loss_tokens:,} loss tokens{_weighted(ex.loss_weight)}"]
        rows = []
        for n in ex.nodes:  # the tree is drawn in the role column: a child indented under its parent
            tree = "  " * (n.depth - 1) + "└ " if n.depth else ""
            rows.append((str(n.index), f"[{n.start}, {n.end})", "-" if n.parent < 0 else str(n.parent),
                         tree + (",".join(n.roles) or "-"),
                         str(n.loss_tokens) if n.loss_weight is None else f"{n.loss_tokens} w{n.loss_weight:.6g}"))
        head = ("node", "span", "parent", "role", "loss")
        w = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
        fmt = f"  {{:<{w[0]}}}  {{:<{w[1]}}}  {{:<{w[2]}}}  {{:<{w[3]}}}  {{:>{w[4]}}}  {{}}"
        lines.append(fmt.format(*head, "text").rstrip())
        pad = " " * (2 + sum(w) + 2 * 5 - len("loss: "))  # "loss: " ends where the text column starts
        for n, r in zip(ex.nodes, rows, strict=True):
            lines.append(fmt.format(*r, _snippet(n.text, width)))
            if n.loss_text:
                lines.append(f"{pad}loss: {_snippet(n.loss_text, width)}")
        for kind, items in (("image", ex.images), ("video", ex.videos)):
            for im in items:
                t, h, w_ = im.grid
                lines.append(f"  {kind} {im.index}  [{im.start}, {im.end})  {_plural(im.num_tokens, 'token')}, "
                             f"grid {t}x{h}x{w_}  {im.source}")
        for a in ex.audios:
            lines.append(f"  audio {a.index}  [{a.start}, {a.end})  {_plural(a.num_tokens, 'token')}, "
                         f"{a.grid[2]:,} feature frames  {a.source}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the mask
def coarse_mask(data: dict[str, Any], *, cells: int = MASK_CELLS, spans: Sequence[tuple[int, int]] = ()):
    """The row's attention mask at block resolution: (visible, centre, factor).

    ``visible[I, J]`` is True iff some token of query block I sees some token of key block J, with blocks of
    ``factor = ceil(T / cells)`` tokens (factor 1 is the exact mask); ``centre[I]`` is the token that stands
    for block I when colouring. Node membership and ancestry come from ``packer.core.tree`` (what the
    attention backends use). The token axis is cut into pieces at every block, node and image-span boundary;
    inside a piece all tokens share a node, so piece p sees piece q iff q's node is an ancestor-or-self of
    p's and q starts no later than p ends (causal), or both lie in one bidirectional span (``spans``: the
    profile's ``bidirectional_spans`` of the row, as ``collate`` emits them for training). A
    (pieces x pieces) matrix, OR-reduced to blocks, replaces the (T, T) one: a 32k-token row costs about a
    (1024 + nodes)^2 matrix, not 10^9 booleans.
    """
    T = len(data["input_ids"])
    offsets, parents = tree.drop_empty_nodes(T, data["node_offsets"], data["node_parents"])
    tree.check_layout(T, offsets, parents, data["cu_seqlens"])
    node = tree.token_nodes(T, offsets)  # (T,)
    anc = tree.ancestor_matrix(parents)  # (N, N)
    span = np.full(T, -1, dtype=np.int64)  # (T,) bidirectional span of each token, -1 outside
    spans = np.array(spans, dtype=np.int64).reshape(len(spans), -1) if len(spans) else None
    if spans is not None:  # (S, 2), or (S, 3) rows (start, end, group): a group's spans see each other
        for k, (a, b, *group) in enumerate(spans.tolist()):
            span[a:b] = group[0] if group else k
    f = max(1, -(-T // cells))
    nb = -(-T // f)
    cuts = [np.arange(nb) * f, offsets, np.array([T])]
    if spans is not None:
        cuts.append(spans[:, :2].reshape(-1))
    bounds = np.unique(np.concatenate(cuts).astype(np.int64))
    bounds = bounds[(bounds >= 0) & (bounds <= T)]
    start, end = bounds[:-1], bounds[1:]  # (P,) pieces [start, end)
    pn, ps = node[start], span[start]  # (P,) node and span of each piece
    vis = anc[pn[:, None], pn[None, :]] & (start[None, :] <= end[:, None] - 1)  # (P, P) query piece x key piece
    if spans is not None:
        vis |= (ps[:, None] == ps[None, :]) & (ps[:, None] >= 0)
    first = np.searchsorted(start, np.arange(nb) * f)  # (nb,) first piece of each block
    visible = np.logical_or.reduceat(np.logical_or.reduceat(vis, first, axis=0), first, axis=1)  # (nb, nb)
    centre = np.minimum(np.arange(nb) * f + f // 2, T - 1)  # (nb,)
    return visible, centre, f


def _sub_row(data: dict[str, Any], k: int) -> dict[str, Any]:
    """Example ``k`` of a row as a row of its own (offsets shifted to start at 0)."""
    cu = data["cu_seqlens"]
    lo, hi = int(cu[k]), int(cu[k + 1])
    offsets, parents = data["node_offsets"], data["node_parents"]
    sel = (offsets >= lo) & (offsets < hi)
    first = int(np.flatnonzero(sel)[0])
    return {
        "input_ids": data["input_ids"][lo:hi],
        "labels": data["labels"][lo:hi],
        "cu_seqlens": np.array([0, hi - lo]),
        "node_offsets": offsets[sel] - lo,
        "node_parents": np.where(parents[sel] < 0, -1, parents[sel] - first),
        "images": [{**im, "offset": im["offset"] - lo} for im in data["images"] if lo <= im["offset"] < hi],
        "first_node": first,  # the row index of the sub-row's node 0 (labels)
        "first_token": lo,
        "first_example": k,
    }


def _draw_mask_panel(ax, data: dict[str, Any], *, cells: int, profile: ModelProfile | None, node_labels: bool) -> int:
    """Draw one (sub-)row's mask into ``ax`` (bidirectional spans from ``profile``, none without one); return the
    cell factor used."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    from packer.models.base import bidirectional_spans
    from packer.report.plots import PALETTE, VISION_TINT

    T = len(data["input_ids"])
    lo = data.get("first_token", 0)
    spans = bidirectional_spans(profile, data) if profile is not None else []
    visible, centre, f = coarse_mask(data, cells=cells, spans=spans)
    nb = len(centre)
    cu, offsets = data["cu_seqlens"], data["node_offsets"]
    example_of = np.searchsorted(cu, centre, side="right") - 1 + data.get("first_example", 0)  # (nb,)
    node_of = np.searchsorted(offsets, centre, side="right") - 1  # (nb,)
    is_vision = np.zeros(T, dtype=bool)
    for im in data["images"]:
        is_vision[im["offset"] : im["offset"] + im["num_tokens"]] = True

    palette = np.array([to_rgb(c) for c in PALETTE])  # (C, 3)
    base = palette[example_of % len(palette)][:, None, :]  # (nb, 1, 3) the query's example colour
    own = node_of[:, None] == node_of[None, :]  # (nb, nb) key in the query's own node
    rgb = np.where(own[..., None], base, base * ANCESTOR_SHADE)  # ancestor nodes (shared prefix) darker
    rgb = np.where(is_vision[centre][None, :, None], rgb + (1 - rgb) * VISION_TINT, rgb)  # vision keys lighter
    img = np.where(visible[..., None], rgb, 1.0)  # (nb, nb, 3), white = masked
    ax.imshow(img, interpolation="nearest", extent=(lo, lo + nb * f, lo + nb * f, lo))
    for b in cu[1:-1].tolist():  # example boundaries
        ax.axhline(lo + b, color="black", linewidth=0.6)
        ax.axvline(lo + b, color="black", linewidth=0.6)
    for im in data["images"]:  # image spans: query x key squares on the diagonal
        s, n = lo + im["offset"], im["num_tokens"]
        ax.add_patch(Rectangle((s, s), n, n, fill=False, edgecolor=IMAGE_EDGE, linewidth=1.2))
    if node_labels and len(offsets) <= 60:  # node numbers (the row's), while they stay readable
        ends = np.concatenate([offsets[1:], [T]])
        for n, (s, e) in enumerate(zip(offsets.tolist(), ends.tolist(), strict=True)):
            ax.text(lo + (s + e) / 2, lo + (s + e) / 2, str(n + data.get("first_node", 0)), fontsize=6,
                    ha="center", va="center", color="black")
    ax.set_xlim(lo, lo + T)
    ax.set_ylim(lo + T, lo)
    ax.set_xlabel("key token j (attended to)", fontsize=9)
    ax.set_ylabel("query token i", fontsize=9)
    ax.tick_params(labelsize=8)
    return f


def draw_mask(directory: str | Path, row: int, path: str | Path, *, cells: int = MASK_CELLS, dpi: int = 110) -> Path:
    """Draw row ``row``'s attention mask into ``path`` (PNG): the whole row, and beside it the example with the
    most nodes (the tree) at full resolution. Returns the path."""
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from packer.models import get_profile
    from packer.report.plots import PALETTE, VISION_TINT, check_picture_path

    out = check_picture_path(path)
    shards = open_shards(directory)
    data = read_row(shards, row)
    T = len(data["input_ids"])
    try:
        profile = get_profile(shards.manifest.profile, **shards.manifest.config.profile_overrides())
    except ConfigError:  # a profile this packer does not know: draw the causal tree mask
        profile = None
    cu, offsets = data["cu_seqlens"], data["node_offsets"]
    nodes_per_example = np.bincount(np.searchsorted(cu, offsets, side="right") - 1, minlength=len(cu) - 1)
    zoom = int(np.argmax(nodes_per_example))  # the first example with the most nodes
    show_zoom = len(cu) > 2 and nodes_per_example.max() > 1  # only a tree needs a closer look

    fig = Figure(figsize=(16 if show_zoom else 9, 9), dpi=dpi, layout="constrained")
    axes = fig.subplots(1, 2 if show_zoom else 1, squeeze=False)[0]
    f = _draw_mask_panel(axes[0], data, cells=cells, profile=profile, node_labels=True)
    res = "exact" if f == 1 else f"one cell = {f}x{f} tokens, drawn if any pair in it is visible"
    axes[0].set_title(f"the whole row ({res})", fontsize=9, loc="left")
    if show_zoom:
        sub = _sub_row(data, zoom)
        fz = _draw_mask_panel(axes[1], sub, cells=cells, profile=profile, node_labels=True)
        axes[1].set_title(f"example {zoom} alone: {data['example_ids'][zoom]}, {_plural(len(sub['node_offsets']), 'node')}"
                          f" ({'exact' if fz == 1 else f'cells of {fz}x{fz} tokens'})", fontsize=9, loc="left")
    fig.suptitle(f"{shards.root.name} row {row}: {_plural(T, 'token')}, {_plural(len(cu) - 1, 'example')}, "
                 f"{_plural(len(offsets), 'node')}, {_plural(len(data['images']), 'image')}."
                 f"{' ' if show_zoom else chr(10)}Query token i (row) sees key token j (column) where coloured",
                 fontsize=10)
    c0 = np.array(to_rgb(PALETTE[0]))
    handles = [Patch(color=c0, label="sees its own node"),
               Patch(color=c0 * ANCESTOR_SHADE, label="sees an ancestor node (shared prefix)"),
               Patch(color=c0 + (1 - c0) * VISION_TINT, label="sees a vision token"),
               Patch(facecolor="white", edgecolor="#999999", label="masked (other example or sibling branch)"),
               Patch(facecolor="none", edgecolor=IMAGE_EDGE, label="image span"),
               Patch(facecolor="none", edgecolor="black", label="example boundary")]
    fig.legend(handles=handles, loc="outside lower center", ncols=6 if show_zoom else 3, fontsize=8, frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    return out
