"""Pictures of a build: how full the packs are, and what padding would have cost on the same examples.

``plot_stats(directory, path)`` writes one PNG (matplotlib's Agg renderer via ``Figure``, no display needed):

    [pack fill]        [examples / pack]      [vision tokens / pack]     <- every pack of the build
    [audio / pack]     [example length]       [cost: whole build]        <- audio only for builds with clips
    [source mix inside packs]                                            <- only for mixed builds
    [naive padding, batches of 8 ]   one row per sequence the GPU runs, one cell per few tokens:
    [fixed-length padding        ]   coloured by example (lighter = vision tokens), grey = padding,
    [packer                      ]   the same real examples in all three, on one token axis

The cell grids are the picture of the HF "Efficient MultiModal Data Pipeline" post (huggingface.co/blog/mmdp),
drawn from this build's own examples: those of the first few packs (the shards' pack order is already a
seeded shuffle, so these are a random sample of packs). The grey area is the compute each strategy wastes.

Per-example lengths come from each row's ``cu_seqlens`` (never from positions), vision spans from ``images``,
per-pack totals from the ``num_*`` columns; ``stats.json`` gives the whole-build padding numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend, nothing to close
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from packer.core import tree
from packer.core.media import MEDIA
from packer.errors import ConfigError
from packer.report.stats import naive_batches
from packer.shards.assemble import list_column
from packer.shards.io import ShardSet, open_shards
from packer.shards.schema import SCHEMAS, STATS

SAMPLE_EXAMPLES = 32  # examples drawn in the cell grids: enough for a few batches, few enough to see each row
CELLS_PER_ROW = 64  # a pack's width in cells: coarse enough to see cells, fine enough to see short examples
NAIVE_BATCH = 8  # batch size of the naive-padding grid (stats.json also reports 32)
PAD_RGB = (0.86, 0.86, 0.86)
# tab10 without its grey (grey means padding here): strong colours, so the lighter vision tint stays visible;
# neighbours in a row never share a colour because examples are numbered in row order.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
VISION_TINT = 0.55  # vision cells: the example's colour blended this far toward white


@dataclass(frozen=True)
class PackColumns:
    """Per-pack and per-example columns of a whole build (no token data)."""

    num_tokens: np.ndarray  # (P,) tokens per pack
    num_vision: np.ndarray  # (P,) vision tokens per pack (images and videos)
    num_video: np.ndarray  # (P,) video tokens per pack
    num_loss: np.ndarray  # (P,) loss tokens per pack
    num_audio: np.ndarray  # (P,) audio tokens per pack (0 for a build before schema v4)
    cu_offsets: np.ndarray  # (P+1,) pack p's cu_seqlens are cu_values[cu_offsets[p]:cu_offsets[p+1]]
    cu_values: np.ndarray
    sources: np.ndarray  # (E,) source name of every example, pack by pack (object array)
    path_tokens: int  # tokens if every root-to-leaf path of every tree were its own example

    @property
    def examples_per_pack(self) -> np.ndarray:
        return np.diff(self.cu_offsets) - 1  # (P,) a pack with E examples has E+1 boundaries

    @property
    def example_lengths(self) -> np.ndarray:
        """(E,) every example's length: the cu_seqlens differences inside each pack."""
        d = np.diff(self.cu_values.astype(np.int64))
        starts = self.cu_offsets[1:-1] - 1  # the difference that would cross from one pack into the next
        return np.delete(d, starts) if len(starts) else d


def read_pack_columns(shards: ShardSet) -> PackColumns:
    """The small columns of every shard: counts, boundaries and sources (token columns stay on disk)."""
    cols = ["num_tokens", "num_vision_tokens", "num_video_tokens", "num_loss_tokens", "cu_seqlens", "example_sources",
            "node_offsets", "node_parents"]
    if shards.manifest.schema_version >= 4:  # the audio columns
        cols.append("num_audio_tokens")
    tables = [shards.parquet(i).read(columns=cols) for i in range(len(shards.shards))]
    if not tables:
        raise ConfigError(f"{shards.root} has no shards to plot")
    table = pa.concat_tables(tables)
    cu_off, cu_val = list_column(table, "cu_seqlens")
    src = table.column("example_sources").combine_chunks().flatten()
    return PackColumns(
        num_tokens=table.column("num_tokens").to_numpy().astype(np.int64),
        num_vision=table.column("num_vision_tokens").to_numpy().astype(np.int64),
        num_video=table.column("num_video_tokens").to_numpy().astype(np.int64),
        num_loss=table.column("num_loss_tokens").to_numpy().astype(np.int64),
        num_audio=(table.column("num_audio_tokens").to_numpy().astype(np.int64) if "num_audio_tokens" in cols
                   else np.zeros(table.num_rows, dtype=np.int64)),
        cu_offsets=cu_off,
        cu_values=cu_val.astype(np.int64),
        sources=np.asarray(src.to_pylist(), dtype=object),
        path_tokens=path_tokens(table),
    )


def path_tokens(table: pa.Table) -> int:
    """Sum over every tree of the lengths of its root-to-leaf paths: a leaf's path is its start position
    plus its own length (``packer.core.tree.node_start_positions`` over all rows' nodes as one forest)."""
    off, starts = list_column(table, "node_offsets")
    _, parents = list_column(table, "node_parents")
    nodes_per_row = np.diff(off)
    base = np.repeat(off[:-1], nodes_per_row)  # (N,) global index of each row's node 0
    parent = np.where(parents < 0, -1, parents + base)  # (N,) global parent index
    row_len = table.column("num_tokens").to_numpy().astype(np.int64)
    ends = np.append(starts[1:], 0)  # (N,) next node's start, fixed up at each row's last node below
    last = off[1:] - 1
    ends[last[nodes_per_row > 0]] = row_len[nodes_per_row > 0]
    length = ends - starts  # (N,)
    leaf = np.bincount(parent[parent >= 0], minlength=len(parent)) == 0  # (N,) nodes without children
    return int((tree.node_start_positions(parent, length) + length)[leaf].sum())


@dataclass(frozen=True)
class SampleExample:
    """One example of the grid sample: its length and which of its tokens are media (vision, audio) tokens."""

    length: int
    vision: np.ndarray  # (length,) bool: an image's, video's or audio clip's token
    colour: int  # palette index, the same in every panel


def _leading_rows(shards: ShardSet, columns: list[str]):
    """Rows of the build in shard order, decoded 16 at a time (files closed as soon as they are done)."""
    for i in range(len(shards.shards)):
        with shards.parquet(i) as pf:
            for batch in pf.iter_batches(batch_size=16, columns=columns):
                yield from batch.to_pylist()


def sample_examples(shards: ShardSet, max_examples: int = SAMPLE_EXAMPLES) -> list[list[SampleExample]]:
    """The examples of the first packs of the build, pack by pack: as many whole packs as fit in
    ``max_examples`` (at least one pack)."""
    packs: list[list[SampleExample]] = []
    taken = 0
    colour = 0
    columns = SCHEMAS[shards.manifest.schema_version].names  # a build older than a medium lacks its column
    media = [m.plural for m in MEDIA if m.plural in columns]
    rows = _leading_rows(shards, ["cu_seqlens", *media])
    for row in rows:
        cu = np.asarray(row["cu_seqlens"], dtype=np.int64)
        if packs and taken + len(cu) - 1 > max_examples:
            break
        vision = np.zeros(int(cu[-1]), dtype=bool)  # (T,)
        for im in (item for plural in media for item in row[plural]):
            vision[im["offset"] : im["offset"] + im["num_tokens"]] = True
        pack = []
        for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            pack.append(SampleExample(length=hi - lo, vision=vision[lo:hi], colour=colour))
            colour += 1
        packs.append(pack)
        taken += len(pack)
        if taken >= max_examples:
            break
    rows.close()  # closes the open shard now, not at garbage collection
    return packs


def _rows_to_image(rows: list[list[SampleExample]], width: int, cell: int) -> np.ndarray:
    """RGB cells of a grid: row r holds rows[r]'s examples side by side, then padding up to ``width`` tokens.

    A cell shows the token at its centre, so an example shorter than a cell may vanish; CELLS_PER_ROW keeps
    cells small next to typical examples.
    """
    palette = np.array([to_rgb(c) for c in PALETTE])  # (C, 3)
    ncells = -(-width // cell)
    centres = np.minimum(np.arange(ncells) * cell + cell // 2, width - 1)  # (ncells,) token sampled per cell
    img = np.empty((len(rows), ncells, 3))
    for r, row in enumerate(rows):
        owner = np.full(width, -1, dtype=np.int64)  # (width,) palette index per token, -1 = padding
        is_vision = np.zeros(width, dtype=bool)
        pos = 0
        for ex in row:
            owner[pos : pos + ex.length] = ex.colour % len(palette)
            is_vision[pos : pos + ex.length] = ex.vision
            pos += ex.length
        o, v = owner[centres], is_vision[centres]
        rgb = np.where(o[:, None] >= 0, palette[np.maximum(o, 0)], PAD_RGB)  # (ncells, 3)
        rgb = np.where(v[:, None], rgb + (1 - rgb) * VISION_TINT, rgb)
        img[r] = rgb
    return img


def _strategy_rows(packs: list[list[SampleExample]], capacity: int, batch: int, seed: int):
    """The three layouts of one sample: (title stem, rows, row width in tokens per row, batch boundaries)."""
    examples = [ex for pack in packs for ex in pack]
    order = np.random.default_rng(seed).permutation(len(examples))  # a shuffled loader's order
    shuffled = [examples[i] for i in order]
    naive_rows, naive_width, batch_starts = [], [], []
    for b in range(0, len(shuffled), batch):
        group = shuffled[b : b + batch]
        longest = max(ex.length for ex in group)
        batch_starts.append(len(naive_rows))
        naive_rows += [[ex] for ex in group]
        naive_width += [longest] * len(group)
    return [
        (f"naive padding, batches of {batch}: each row padded to its batch's longest", naive_rows, naive_width,
         batch_starts),
        (f"fixed-length padding: each example padded to {capacity:,} tokens", [[ex] for ex in examples],
         [capacity] * len(examples), []),
        (f"packer: the same examples in {_plural(len(packs), 'pack')} of {capacity:,} tokens", packs,
         [capacity] * len(packs), []),
    ]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _grid_panel(ax, title: str, rows, widths, batch_starts, capacity: int, cell: int, build_padding: float | None):
    """Draw one strategy's cell grid; padding beyond a row's own width (a naive batch) is drawn as padding too."""
    img = _rows_to_image(rows, capacity, cell)
    real = sum(ex.length for row in rows for ex in row)
    slots = sum(widths)
    ncells = img.shape[1]
    # Cells past a naive row's batch width are not computed at all: blank them (white), not grey.
    for r, w in enumerate(widths):
        img[r, -(-w // cell) :] = 1.0
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, ncells * cell, len(rows), 0))
    if ncells <= 128 and len(rows) <= 80:  # cell borders, only where they stay visible
        ax.vlines(np.arange(1, ncells) * cell, 0, len(rows), colors="white", linewidth=0.4)
        ax.hlines(np.arange(1, len(rows)), 0, ncells * cell, colors="white", linewidth=0.4)
    for b in batch_starts[1:]:
        ax.axhline(b, color="black", linewidth=1.2)
    here = 1 - real / slots if slots else 0.0
    whole = f"; whole build {_pct(build_padding)}" if build_padding is not None else ""
    ax.set_title(f"{title}\n{_plural(len(rows), 'row')}, {slots:,} token slots, {_pct(here)} padding here{whole}",
                 fontsize=9, loc="left")
    ax.set_xlim(0, capacity)
    ax.set_yticks([])
    ax.set_ylabel("rows", fontsize=8)
    ax.tick_params(labelsize=8)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _hist_panel(ax, values: np.ndarray, *, bins, title: str, xlabel: str, color: str, vline: float | None = None,
                vlabel: str = "") -> None:
    ax.hist(values, bins=bins, color=color, edgecolor="white", linewidth=0.5)
    if vline is not None:
        ax.axvline(vline, color="black", linestyle="--", linewidth=1, label=vlabel)
        ax.legend(fontsize=7, loc="best", frameon=True, framealpha=0.9)
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("packs" if "pack" in xlabel else "examples", fontsize=8)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 0.2 of a pack
    ax.tick_params(labelsize=8)


def _cost_panel(ax, stats: dict[str, Any], path_tokens: int) -> None:
    """Whole-build compute per strategy, in token slots relative to the real tokens (1.0 = no waste).

    With message trees, a trainer without tree support would repeat each shared prefix once per branch:
    ``path_tokens`` (every root-to-leaf path as its own example) is drawn too, as if packed perfectly.
    """
    tokens = stats["tokens"]
    pad = stats["padding"]
    items = [(f"naive, batch {b}", pad[k]) for k, b in naive_batches(pad)]
    items += [("fixed length", pad["fixed_length_slots"]), ("packer", pad["packed_slots"])]
    if path_tokens > tokens:  # trees: what flattening every root-to-leaf path would cost, even packed perfectly
        items.append(("packed, trees\nflattened to paths", path_tokens))
    labels = [n for n, _ in items]
    ratios = np.array([s / tokens if tokens else 0.0 for _, s in items])
    y = np.arange(len(items))
    ax.barh(y, np.minimum(ratios, 1.0), color="#1f77b4")
    ax.barh(y, np.maximum(ratios - 1.0, 0.0), left=1.0, color=PAD_RGB, edgecolor="#999999", linewidth=0.5)
    for yi, (r, (_, s)) in enumerate(zip(ratios, items, strict=True)):
        what = "repeated prefixes" if "paths" in labels[yi] else "pad"
        ax.text(r, yi, f" {r:.2f}x  ({_pct(1 - tokens / s) if s else '-'} {what})", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.0, float(ratios.max(initial=1.0))) * 1.6)  # room for the labels right of the bars
    ax.set_xlabel("token slots computed / real tokens", fontsize=8)
    ax.set_title("compute cost, whole build\n(blue: real tokens, grey: waste)", fontsize=9, loc="left")
    ax.tick_params(labelsize=8)


def _mixture_panel(ax, cols: PackColumns, stats: dict[str, Any]) -> None:
    """Per source: the distribution over packs of its share of a pack's examples, against its global share."""
    names = sorted(stats["sources"])
    pack_of = np.repeat(np.arange(len(cols.num_tokens)), cols.examples_per_pack)  # (E,)
    per_pack = cols.examples_per_pack
    shares, globals_ = [], []
    for name in names:
        hit = np.bincount(pack_of, weights=(cols.sources == name), minlength=len(per_pack))
        shares.append(hit / np.maximum(per_pack, 1))
        globals_.append(float((cols.sources == name).mean()) if len(cols.sources) else 0.0)
    ax.boxplot(shares, showfliers=False, widths=0.5, medianprops={"color": "black"})
    ax.scatter(np.arange(1, len(names) + 1), globals_, marker="D", color="#d62728", zorder=3, s=18)
    ax.set_xticks(np.arange(1, len(names) + 1),
                  [f"{n or '(unnamed)'}\n{stats['sources'][n]['examples']:,} ex" for n in names], fontsize=7)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("share of a pack's examples", fontsize=8)
    ax.set_title("source mix inside packs\n(boxes: spread over packs; red: whole build)", fontsize=9, loc="left")
    ax.tick_params(labelsize=8)


PICTURE_FORMATS = ("png", "svg", "pdf")


def check_picture_path(path: str | Path) -> Path:
    """The output path of a picture; ConfigError for a format matplotlib would not write as intended."""
    out = Path(path)
    if out.suffix.lower().lstrip(".") not in PICTURE_FORMATS:
        raise ConfigError(f"cannot draw {out}: name the picture .png, .svg or .pdf")
    return out


def plot_stats(directory: str | Path, path: str | Path, *, max_examples: int = SAMPLE_EXAMPLES,
               batch_size: int = NAIVE_BATCH, seed: int = 0, dpi: int = 110) -> Path:
    """Draw the stats picture of a finished build into ``path`` (PNG) and return the path."""
    out = check_picture_path(path)
    shards = open_shards(directory)
    stats_path = shards.root / STATS
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {stats_path}: {e}; rerun `packer build` to write it") from e
    missing = [k for k in ("capacity", "packs", "tokens", "efficiency", "padding") if k not in stats]
    if missing:
        raise ConfigError(f"{stats_path} lacks {missing}; rerun `packer build` to write it")
    if not stats["packs"]:
        raise ConfigError(f"{shards.root} has no packs to plot (every input record was rejected?)")
    capacity = int(stats["capacity"])
    cols = read_pack_columns(shards)
    packs = sample_examples(shards, max_examples)
    strategies = _strategy_rows(packs, capacity, batch_size, seed)
    cell = max(1, -(-capacity // CELLS_PER_ROW))

    has_vision = bool(cols.num_vision.sum())
    has_audio = bool(cols.num_audio.sum())
    has_sources = bool(stats.get("sources")) and len(stats["sources"]) > 1
    panels = ["fill", "examples", *(["vision"] if has_vision else []), *(["audio"] if has_audio else []), "length",
              "cost", *(["mixture"] if has_sources else [])]
    ncols = 4 if len(panels) == 4 else 3  # 4 panels fit one row; 5 or 6 fill two rows of 3
    top_rows = -(-len(panels) // ncols)
    grid_rows = [len(s[1]) for s in strategies]
    heights = [3.0] * top_rows + [0.9 + 0.13 * min(n, 60) for n in grid_rows]  # inches: title + rows
    fig = Figure(figsize=(14, sum(heights) + 1.2), dpi=dpi, layout="constrained")
    widths = [1, 1, 1, 1.5] if ncols == 4 else [1] * ncols  # the cost panel's labels need room
    gs = fig.add_gridspec(top_rows + 3, ncols, height_ratios=heights, width_ratios=widths)

    budget = shards.config.max_vision_tokens
    for k, name in enumerate(panels):
        r, c = divmod(k, ncols)
        last_in_row = k == len(panels) - 1
        ax = fig.add_subplot(gs[r, c:] if last_in_row else gs[r, c])
        if name == "fill":
            fill = cols.num_tokens / capacity
            _hist_panel(ax, 100 * fill, bins=np.linspace(0, 100, 21), title="how full the packs are",
                        xlabel="pack fill (% of capacity)", color="#1f77b4", vline=100 * float(fill.mean()),
                        vlabel=f"mean {_pct(float(fill.mean()))}")
        elif name == "examples":
            epp = cols.examples_per_pack
            top = int(epp.max())
            bins = np.arange(0.5, top + 1.5) if top <= 40 else 40
            _hist_panel(ax, epp, bins=bins, title="examples per pack", xlabel="examples in a pack",
                        color="#2ca02c", vline=float(epp.mean()), vlabel=f"mean {epp.mean():.2f}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        elif name == "vision":
            hi = max(int(cols.num_vision.max()), budget or 0, 1)
            if cols.num_video.any():  # image and video tokens per pack: two distributions, side by side
                ax.hist([cols.num_vision - cols.num_video, cols.num_video], bins=np.linspace(0, hi, 21),
                        color=["#9467bd", "#17becf"], label=["image tokens", "video tokens"], edgecolor="white",
                        linewidth=0.5)
            _hist_panel(ax, cols.num_vision if not cols.num_video.any() else np.zeros(0), bins=np.linspace(0, hi, 21),
                        title="vision tokens per pack" + (" (images, videos)" if cols.num_video.any() else ""),
                        xlabel="vision tokens in a pack", color="#9467bd",
                        vline=budget, vlabel=f"budget {budget:,}" if budget else "")
            if cols.num_video.any():
                ax.legend(fontsize=7, loc="best", frameon=True, framealpha=0.9)
        elif name == "audio":
            audio_budget = shards.config.max_audio_tokens
            hi = max(int(cols.num_audio.max()), audio_budget or 0, 1)
            seconds = stats.get("audio_seconds")
            _hist_panel(ax, cols.num_audio, bins=np.linspace(0, hi, 21),
                        title="audio tokens per pack" + (f" ({seconds:,.0f} s of audio in all)" if seconds else ""),
                        xlabel="audio tokens in a pack", color="#e377c2",
                        vline=audio_budget, vlabel=f"budget {audio_budget:,}" if audio_budget else "")
        elif name == "length":
            _hist_panel(ax, cols.example_lengths, bins=np.linspace(0, capacity, 33),
                        title="example lengths", xlabel="tokens in an example", color="#ff7f0e",
                        vline=capacity, vlabel=f"capacity {capacity:,}")
        elif name == "cost":
            _cost_panel(ax, stats, cols.path_tokens)
        else:
            _mixture_panel(ax, cols, stats)

    build_padding = {
        0: 1 - stats["tokens"] / stats["padding"][f"naive_batch{batch_size}_slots"]
        if stats["padding"].get(f"naive_batch{batch_size}_slots") else None,
        1: 1 - stats["tokens"] / stats["padding"]["fixed_length_slots"] if stats["padding"]["fixed_length_slots"] else None,
        2: 1 - stats["efficiency"],
    }
    first = None
    for i, (title, rows, widths, starts) in enumerate(strategies):
        ax = fig.add_subplot(gs[top_rows + i, :], sharex=first)
        first = first or ax
        _grid_panel(ax, title, rows, widths, starts, capacity, cell, build_padding[i])
    ax.set_xlabel(f"tokens (one cell = {cell:,} token{'s' if cell > 1 else ''})", fontsize=8)
    handles = [Patch(color=PALETTE[0], label="text tokens (one colour per example)"),
               *([Patch(color=np.array(to_rgb(PALETTE[0])) * (1 - VISION_TINT) + VISION_TINT,
                        label=("vision and audio" if has_vision and has_audio else "audio" if has_audio else "vision")
                        + " tokens (lighter)")] if has_vision or has_audio else []),
               Patch(facecolor=PAD_RGB, label="padding (computed, wasted)"),
               Patch(facecolor="white", edgecolor="#999999", label="not computed")]
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8, frameon=False)

    fig.suptitle(
        f"{shards.root.name}: {_plural(stats['examples'], 'example')} in {_plural(stats['packs'], 'pack')} of {capacity:,} tokens "
        f"({shards.manifest.profile}), packing efficiency {_pct(stats['efficiency'])}, "
        f"lower bound {_plural(stats['lower_bound_packs'], 'pack')} (+{stats['packs_over_lower_bound']:,})",
        fontsize=11,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)  # Figure.savefig renders with the Agg canvas for .png
    return out
