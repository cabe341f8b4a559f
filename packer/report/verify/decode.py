"""Schema versions, decoded once: a row group of any version (v2-v6) becomes the same ``Rows`` of flat numpy
arrays, so no check asks which version it reads.

    v2   the videos and num_video_tokens columns (the oldest version verify reads)
    v3   + seq_lengths                 before: ``Rows.seq_lengths`` is None (nothing to check)
    v4   + loss_weights, audios, num_audio_tokens
                                       before: no loss weights (None), no audio (empty clip lists, 0 tokens)
    v5   + audios.padded_samples, mrope float32
                                       before: padded_samples -1 (the clip's alone), mRoPE read as stored
    v6   mrope stored sparse (mrope_runs, mrope_bases, mrope_rest)
                                       the shard file (``packer.shards.io.ShardFile``) reads it back dense, so
                                       the row group decoded here has v5's column; a damaged encoding is that
                                       row group's "unreadable" violation, naming the row
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from packer.core.media import MEDIA
from packer.shards.schema import SCHEMAS

# The fields of each medium's struct that the checks read (int64); a video's second_per_grid_t and frame
# count and an audio clip's ``video`` flag and padded_samples are added by ``_media``.
MEDIA_FIELDS = {
    "image": ("offset", "num_tokens", "grid_t", "grid_h", "grid_w"),
    "video": ("offset", "num_tokens", "grid_t", "grid_h", "grid_w", "height", "width"),
    "audio": ("offset", "num_tokens", "num_samples", "feature_length", "sample_rate"),
}
AUDIO_FIELDS = MEDIA_FIELDS["audio"]
TOKEN_COLUMNS = tuple(dict.fromkeys(c for m in MEDIA for c in (m.token_column, m.own_tokens_column) if c))
"""Each row's media token totals: ``num_vision_tokens``, ``num_video_tokens``, ``num_audio_tokens``."""


@dataclass(frozen=True)
class Lists:
    """A list column of some rows as flat values: row r's values are ``values[offsets[r]:offsets[r + 1]]``."""

    offsets: np.ndarray  # (R+1,) int64, from 0
    values: np.ndarray  # (total,)

    @property
    def lengths(self) -> np.ndarray:
        """(R,) values per row."""
        return np.diff(self.offsets)

    @property
    def row_of(self) -> np.ndarray:
        """(total,) the row of every flat value."""
        return row_of(self.offsets)

    def of_row(self, r: int) -> np.ndarray:
        return self.values[self.offsets[r]:self.offsets[r + 1]]


@dataclass(frozen=True)
class Items:
    """One medium's items (images, videos or audio clips) of some rows: per row ``offsets``, per item each field."""

    offsets: np.ndarray  # (R+1,) int64
    fields: dict[str, np.ndarray]  # field -> (items,)

    @property
    def per_row(self) -> np.ndarray:
        """(R,) items per row."""
        return np.diff(self.offsets)


@dataclass(frozen=True)
class Rows:
    """The decoded columns of some rows of one row group, whatever the schema version."""

    table: pa.Table
    rows: np.ndarray  # (R,) row numbers in the shard file
    input_ids: Lists
    labels: Lists
    position_ids: Lists
    mrope: Lists  # 3*T per row, token-major; float32 (v5) or int32 as stored: a cast would hide a fraction
    mrope_null: np.ndarray  # (R,) bool
    cu_seqlens: Lists
    node_offsets: Lists
    node_parents: Lists
    example_ids: pa.Array  # flat, with ``example_offsets``
    example_offsets: np.ndarray  # (R+1,)
    source_offsets: np.ndarray  # (R+1,) of example_sources
    media: dict[str, Items]  # medium name (core.media.MEDIA) -> its items
    totals: dict[str, np.ndarray]  # (R,) each num_* column: num_tokens, num_loss_tokens, num_vision_tokens, ...
    loss_weights: Lists | None  # None where no row has weights (and before v4)
    loss_weights_null: np.ndarray | None  # (R,) rows without weights (every weight 1)
    seq_lengths: Lists | None  # None before v3
    seq_lengths_null: np.ndarray | None  # (R,)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> np.ndarray:
        """(R,) tokens per row, counted (not the num_tokens column)."""
        return self.input_ids.lengths

    @property
    def num_examples(self) -> np.ndarray:
        """(R,) examples per row, counted."""
        return np.diff(self.example_offsets)

    @property
    def num_nodes(self) -> np.ndarray:
        return self.node_offsets.lengths

    @property
    def row_starts(self) -> np.ndarray:
        """(R,) each row's first token in the flat token stream."""
        return self.input_ids.offsets[:-1]

    @cached_property
    def examples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, rows), each (total E,): every example's token range in the flat token stream and its row."""
        cu = self.cu_seqlens
        is_start = np.ones(len(cu.values), dtype=bool)
        is_start[cu.offsets[1:] - 1] = False  # a row's last value ends its last example
        at = np.flatnonzero(is_start)
        rows = cu.row_of[at]
        base = self.row_starts[rows]
        return base + cu.values[at], base + cu.values[at + 1], rows

    @cached_property
    def forest(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, parents), each (total nodes,): every row's nodes as one forest over the flat token stream."""
        rows = self.node_offsets.row_of
        offsets = self.row_starts[rows] + self.node_offsets.values
        parents = np.where(self.node_parents.values < 0, -1, self.node_parents.values + self.node_offsets.offsets[:-1][rows])
        return offsets, parents

    def keep(self, good: np.ndarray) -> Rows:
        """The rows where ``good``, decoded again (the checks after a structural one see only sound rows)."""
        return self if good.all() else decode(self.table.filter(pa.array(good)), self.rows[good])


def decode(table: pa.Table, rows: np.ndarray) -> Rows:
    """``table``'s columns (any schema version) as ``Rows``; ``rows``: their row numbers in the shard file."""
    names = table.column_names
    mrope_column = table.column("mrope_position_ids")
    mrope_offsets, mrope_values = _lists(mrope_column)
    example_offsets, example_ids = _lists(table.column("example_ids"))
    weights, weights_null = None, None
    if "loss_weights" in names and table.column("loss_weights").null_count < table.num_rows:  # v4
        weights = _values(table.column("loss_weights"))
        weights_null = table.column("loss_weights").is_null().to_numpy(zero_copy_only=False)
    seq_lengths, seq_null = None, None
    if "seq_lengths" in names:  # v3
        seq_lengths = _values(table.column("seq_lengths"), np.int64)
        seq_null = table.column("seq_lengths").is_null().to_numpy(zero_copy_only=False)
    # each num_* column; one older than its medium (num_audio_tokens before v4) is 0 in every row
    totals = {c: table.column(c).to_numpy().astype(np.int64) if c in names else np.zeros(table.num_rows, np.int64)
              for c in ("num_tokens", "num_loss_tokens", *TOKEN_COLUMNS)}
    return Rows(
        table=table, rows=rows,
        input_ids=_values(table.column("input_ids"), np.int64),
        labels=_values(table.column("labels"), np.int64),
        position_ids=_values(table.column("position_ids"), np.int64),
        mrope=Lists(mrope_offsets, mrope_values.to_numpy(zero_copy_only=False)),
        mrope_null=mrope_column.is_null().to_numpy(zero_copy_only=False),
        cu_seqlens=_values(table.column("cu_seqlens"), np.int64),
        node_offsets=_values(table.column("node_offsets"), np.int64),
        node_parents=_values(table.column("node_parents"), np.int64),
        example_ids=example_ids, example_offsets=example_offsets,
        source_offsets=_lists(table.column("example_sources"))[0],
        media={m.name: _media(table, m.name, m.plural) for m in MEDIA},
        totals=totals,
        loss_weights=weights, loss_weights_null=weights_null,
        seq_lengths=seq_lengths, seq_lengths_null=seq_null,
    )


def _media(table: pa.Table, name: str, column: str) -> Items:
    """One medium's list-of-struct column as items; a column older than its medium (audios before v4) as
    rows without items."""
    if column in table.column_names:
        offsets, structs = _lists(table.column(column))
    else:
        offsets = np.zeros(table.num_rows + 1, dtype=np.int64)
        structs = pa.array([], pa.struct([(f, pa.int32()) for f in MEDIA_FIELDS[name]] + [("video", pa.bool_())]))
    fields = {f: structs.field(f).to_numpy(zero_copy_only=False).astype(np.int64) for f in MEDIA_FIELDS[name]}
    if name == "video":
        fields["second_per_grid_t"] = structs.field("second_per_grid_t").to_numpy(zero_copy_only=False)
        fields["num_frames"] = np.diff(structs.field("frame_indices").offsets.to_numpy()).astype(np.int64)
    if name == "audio":
        fields["video"] = structs.field("video").to_numpy(zero_copy_only=False).astype(bool)
        # v5: the samples a clip was padded to beside its example's others (-1: null, the clip's alone)
        padded = structs.field("padded_samples") if structs.type.get_field_index("padded_samples") >= 0 else None
        fields["padded_samples"] = (np.full(len(structs), -1, dtype=np.int64) if padded is None
                                    else padded.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
    return Items(offsets, fields)


def schema_problem(schema: pa.Schema, version: int) -> str | None:
    """The file's schema against the manifest's schema version (``SCHEMAS``: a v2 build is checked as v2)."""
    want = SCHEMAS[version]
    if not schema.remove_metadata().equals(want.remove_metadata()):
        return f"schema differs from packer.shards.schema (v{version}): {schema.remove_metadata()}"
    found = (schema.metadata or {}).get(b"packer.schema_version")
    if found != str(version).encode():
        return f"schema metadata packer.schema_version is {found!r}, want {version}"
    return None


# ---------------------------------------------------------------------------------------- arrow helpers
def _lists(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(int64 offsets starting at 0, flat values) of a list column, whatever its chunking and slicing."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    off = arr.offsets.to_numpy().astype(np.int64)
    return off - off[0], arr.values.slice(int(off[0]), int(off[-1] - off[0]))


def _values(column: pa.ChunkedArray, dtype: type | None = None) -> Lists:
    offsets, values = _lists(column)
    flat = values.to_numpy(zero_copy_only=False)
    return Lists(offsets, flat if dtype is None else flat.astype(dtype))


def row_of(offsets: np.ndarray) -> np.ndarray:
    """Row index of every flat element of a list column with these offsets."""
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def rows_with(flags: np.ndarray, rows_of_flags: np.ndarray, num_rows: int) -> np.ndarray:
    """(R,) bool: does any flat element of that row have ``flags`` set."""
    return np.bincount(rows_of_flags[flags], minlength=num_rows) > 0


def within_row_pairs(offsets: np.ndarray) -> np.ndarray:
    """Mask over ``np.diff(flat)``: True where both elements belong to the same row."""
    n = int(offsets[-1])
    same = np.ones(max(n - 1, 0), dtype=bool)
    cross = offsets[1:-1] - 1  # the pair (last of row r, first of row r+1)
    cross = cross[(cross >= 0) & (cross < n - 1)]
    same[cross] = False
    return same
