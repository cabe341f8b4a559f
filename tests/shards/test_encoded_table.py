"""``encoded_table`` (the encode cache's rows), the rows ``take_rows`` gathers from chunk files, and
``assemble_packs``' check of the mRoPE lists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from packer.core.types import Encoded, EncodedVideo
from packer.errors import ShardError
from packer.models import get_profile
from packer.shards import assemble, derived
from packer.shards.assemble import (
    assemble_packs,
    encoded_record,
    encoded_table,
    learn_layouts,
    list_column,
    take_rows,
)
from packer.shards.mrope import dense_row
from packer.shards.schema import EXAMPLE_SCHEMA
from tests.helpers import random_example


def _examples(seed: int, mrope: str) -> list[Encoded]:
    """Random trees with images and a video or two; mRoPE rows: ``none``, or ``mixed``: the profile's text
    rows (a stride-0 view of position_ids), equal rows as a plain copy, rows that differ, one 1-D view of them."""
    rng = np.random.default_rng(seed)
    text_rows = get_profile("qwen2-vl").positions.extra
    out = []
    for i in range(int(rng.integers(1, 12))):
        e = random_example(rng, i, images=True)
        e.source_name = ["", "web", "books"][i % 3]
        if rng.random() < 0.3 and e.num_tokens > 8:
            e.videos = [EncodedVideo(source=f"/v/{i}.mp4", frames=[], video_start=None, video_end=1.5,
                                     frame_indices=[0, 2, 4, 6], video_fps=30.0, grid_thw=(2, 4, 4), height=56,
                                     width=56, utils_height=56, utils_width=56, offset=7, num_tokens=1,
                                     second_per_grid_t=0.5)]
        if mrope == "mixed":
            pos = e.position_ids
            kind = i % 4
            if kind == 0:
                e.mrope_position_ids = text_rows(e.input_ids, pos, e.node_offsets, e.node_parents, [],
                                                 token_ids={"image_token": None})
            elif kind == 1:
                e.mrope_position_ids = np.tile(pos, (3, 1))
            elif kind == 2:
                e.mrope_position_ids = np.stack([pos, pos + 1, pos * 2]).astype(np.int32)
            else:  # a stride-0 view whose row is not position_ids
                e.mrope_position_ids = np.broadcast_to(pos + 1, (3, pos.shape[0]))
        out.append(e)
    return out


def _spans(labels: np.ndarray) -> list[tuple[int, int]]:
    """The loss spans of one example's labels: (start, end) of each stretch of labels other than -100."""
    loss = np.concatenate([[False], labels != -100, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(loss))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


@pytest.mark.parametrize("mrope", ["none", "mixed"])
@pytest.mark.parametrize("seed", range(12))
def test_encoded_table_holds_the_examples(seed, mrope):
    """Every column of ``encoded_table`` is its examples' own values; mRoPE token-major (t, h, w per token)."""
    examples = _examples(seed, mrope)
    table = encoded_table(examples)
    assert table.schema == EXAMPLE_SCHEMA
    off = np.concatenate([[0], np.cumsum([e.num_tokens for e in examples])])
    labels, positions = derived.expand(off, np.concatenate([e.input_ids for e in examples]),
                                       *(list_column(table, c) for c in ("labels", "label_runs", "position_ids")))
    for i, (e, row) in enumerate(zip(examples, table.to_pylist(), strict=True)):
        for name in ("input_ids", "node_offsets", "node_parents"):
            assert row[name] == getattr(e, name).tolist(), name
        # labels and positions stored only where not derivable, given back by the rule
        assert labels[off[i] : off[i + 1]].tolist() == e.labels.tolist()
        assert positions[off[i] : off[i + 1]].tolist() == e.position_ids.tolist()
        assert (row["position_ids"] == []) == (e.position_ids.tolist() == list(range(e.num_tokens)))
        assert row["labels"] == [] and len(row["label_runs"]) == 2 * len(_spans(e.labels))
        if e.mrope_position_ids is None:
            assert row["mrope_runs"] is row["mrope_bases"] is row["mrope_rest"] is None
        else:  # stored as a shard row stores them (example-relative): the rule gives back every value
            got = dense_row(row["mrope_runs"], row["mrope_bases"], row["mrope_rest"])
            assert got.tolist() == np.asarray(e.mrope_position_ids).T.reshape(-1).tolist()
        assert (row["num_tokens"], row["num_loss_tokens"], row["num_vision_tokens"], row["num_video_tokens"]) == (
            e.num_tokens, e.num_loss_tokens, e.num_vision_tokens, e.num_video_tokens)
        assert [im["offset"] for im in row["images"]] == [im.offset for im in e.images]
        assert [v["second_per_grid_t"] for v in row["videos"]] == [v.second_per_grid_t for v in e.videos]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, EXAMPLE_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("seed", range(8))
def test_encoded_table_equals_the_per_record_reference(seed):
    """The column-by-column table equals ``from_pylist`` of each example's ``encoded_record``, down to the
    encode cache's IPC bytes: loss weights on some rows (null on others), mRoPE on some, on all, or on none,
    labels that are not their tokens on some (kept in full), tree positions on some (kept in full)."""
    rng = np.random.default_rng(seed)
    for mrope in ("none", "mixed"):
        examples = _examples(seed, mrope)
        for e in examples:
            if rng.random() < 0.4:
                e.loss_weights = rng.choice(np.array([0, 0.5, 1, 2], np.float32), e.num_tokens)
            if rng.random() < 0.3:  # a label that is not its token: the example keeps every label
                e.labels = e.labels.copy()
                e.labels[int(rng.integers(e.num_tokens))] = e.input_ids.max() + 1
            if mrope == "mixed" and rng.random() < 0.3:
                e.mrope_position_ids = None if seed % 2 else e.mrope_position_ids.astype(np.float32) + 0.5
        want = pa.Table.from_pylist([encoded_record(e) for e in examples], schema=EXAMPLE_SCHEMA)
        got = encoded_table(examples)
        assert got.equals(want)
        assert _ipc(got) == _ipc(want)


def test_encoded_table_refuses_mrope_float32_cannot_hold():
    examples = _examples(2, "mixed")
    examples[-1].mrope_position_ids = np.full((3, examples[-1].num_tokens), 1 << 24, dtype=np.int32)
    with pytest.raises(ShardError, match=repr(examples[-1].example_id)):
        encoded_table(examples)


def test_rows_taken_from_chunk_files_pack_like_the_table(tmp_path):
    """Rows gathered from the encode cache's chunk files (take_rows) pack as the table's own rows do."""
    examples = _examples(3, "mixed")
    table = encoded_table(examples)
    files, starts = [], [0]
    for c, (a, b) in enumerate([(0, len(examples) // 2), (len(examples) // 2, len(examples))]):
        files.append(tmp_path / f"chunk-{c}.arrow")
        with ipc.new_file(str(files[-1]), EXAMPLE_SCHEMA) as writer:
            writer.write_table(table.slice(a, b - a))
        starts.append(b)
    sel = np.random.default_rng(0).permutation(len(examples))
    taken = take_rows(files, np.array(starts), sel)
    want = table.take(pa.array(sel))
    assert assemble_packs(taken, np.array([len(sel)])).equals(assemble_packs(want, np.array([len(sel)])))


@pytest.mark.parametrize("kind", ["text", "weighted", "media", "mrope"])
@pytest.mark.parametrize("seed", range(4))
def test_take_rows_equals_arrow_take_over_many_files(tmp_path, seed, kind):
    """take_rows over a few rows of each of many chunk files is the table's own ``take``, column for column:
    text rows (no media, mRoPE and loss weights null in every row: the numpy path for every column), loss
    weights null in some rows only, rows with images and videos (pyarrow's per-file path for those), mRoPE."""
    rng = np.random.default_rng(seed)
    examples = [random_example(rng, i, images=kind == "media", mrope=kind == "mrope") for i in range(300)]
    for i, e in enumerate(examples):
        e.source_name = ["", "web", "books"][i % 3]
        if kind == "weighted" and i % 4 == 0:
            e.loss_weights = np.full(e.num_tokens, 0.5, np.float32)
    table = encoded_table(examples)
    cuts = np.sort(rng.choice(np.arange(1, 300), size=19, replace=False))
    starts = np.concatenate([[0], cuts, [300]])
    files = []
    for c in range(len(starts) - 1):
        files.append(tmp_path / f"chunk-{c}.arrow")
        with ipc.new_file(str(files[-1]), EXAMPLE_SCHEMA) as writer:
            writer.write_table(table.slice(starts[c], starts[c + 1] - starts[c]))
    for size in (1, 37, 300):
        sel = rng.choice(300, size=size, replace=False)
        for remember in (False, True, True):  # the second remembered take views each file from its layout
            assert take_rows(files, starts, sel, remember=remember).equals(table.take(pa.array(sel))), (size, kind)


def test_encoded_table_of_nothing_is_the_empty_schema():
    assert encoded_table([]).equals(EXAMPLE_SCHEMA.empty_table())


def test_assemble_refuses_mrope_of_another_length():
    """An example whose cached mRoPE columns cover other than its tokens (a damaged chunk) is never packed."""
    examples = _examples(1, "mixed")
    table = encoded_table(examples)
    column = table.column("mrope_rest").chunk(0)
    offsets = column.offsets.to_numpy().copy()
    offsets[1:] += 3  # the first example gets one token's (t, h, w) too many
    bad = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(int(offsets[-1]), np.float32)))
    table = table.set_column(EXAMPLE_SCHEMA.get_field_index("mrope_rest"), EXAMPLE_SCHEMA.field("mrope_rest"), bad)
    for dense_mrope in (False, True):
        with pytest.raises(ShardError, match="example 0 has .*mRoPE"):
            assemble_packs(table, np.array([len(examples)]), dense_mrope=dense_mrope)


def test_take_rows_of_text_files_before_media_files_and_of_a_file_of_many_batches(tmp_path):
    """The media lists taken while each file is open (pass 1): rows of files without any medium that come
    before the first file with one stand as empty lists; a file of several record batches (no single batch
    to view: the Arrow table path) gives the same rows."""
    rng = np.random.default_rng(7)
    text = [random_example(rng, i, images=False, mrope=True) for i in range(40)]
    media = [random_example(rng, 40 + i, images=True, mrope=True) for i in range(40)]
    table = encoded_table(text + media)
    assert table.column("num_images").to_numpy().sum() > 0
    files = [tmp_path / "text.arrow", tmp_path / "media.arrow"]
    with ipc.new_file(str(files[0]), EXAMPLE_SCHEMA) as writer:
        writer.write_table(table.slice(0, 40))
    with ipc.new_file(str(files[1]), EXAMPLE_SCHEMA) as writer:
        writer.write_table(table.slice(40, 40), max_chunksize=7)  # six record batches
    starts = np.array([0, 40, 80])
    for sel in (rng.permutation(80), np.arange(40)[::-1], np.concatenate([np.arange(30, 50), [5]])):
        for remember in (False, True, True):
            assert take_rows(files, starts, sel, remember=remember).equals(table.take(pa.array(sel)))


def test_take_rows_remembers_a_file_by_its_bytes_not_its_name(tmp_path):
    """A remembered layout is keyed by the file's inode, mtime and size: a chunk file written again under the
    same name (another build's cache, a map output of another plan) is read again, never through the old
    file's layout; rows with images and videos (nulls inside their structs) through the remembered media
    specs equal pyarrow's take."""
    rng = np.random.default_rng(3)
    first = encoded_table([e for seed in range(6) for e in _examples(seed, "mixed")])
    second = encoded_table([random_example(rng, 30 + i, images=i % 2 == 0, mrope=True) for i in range(45)])
    assert first.column("num_videos").to_numpy().sum() > 0
    path = tmp_path / "chunk-0.arrow"
    for table in (first, second):
        tmp = tmp_path / "tmp.arrow"
        with ipc.new_file(str(tmp), EXAMPLE_SCHEMA) as writer:
            writer.write_table(table)
        tmp.replace(path)  # a new inode under the old name, as write_atomic does
        sel = rng.permutation(table.num_rows)[: table.num_rows // 2]
        for _ in range(3):
            assert take_rows([path], np.array([0, table.num_rows]), sel, remember=True).equals(
                table.take(pa.array(sel)))


@pytest.mark.parametrize("kind", ["text", "weighted", "media", "mrope"])
def test_learnt_layouts_are_what_a_first_remembered_take_keeps(tmp_path, kind):
    """``learn_layouts`` (a repack's process before it forks its writers) keeps each chunk file's layout exactly
    as a first ``take_rows(remember=True)`` visit would: the same ``_Layout`` per file, none for a file a take
    would not remember either (loss weights null in some rows only) nor for one of several record batches; the
    takes that follow view the files through them and equal pyarrow's take."""
    rng = np.random.default_rng(11)
    examples = [random_example(rng, i, images=kind == "media", mrope=kind == "mrope") for i in range(120)]
    for i, e in enumerate(examples):
        e.source_name = ["", "web"][i % 2]
        if kind == "weighted" and i % 4 == 0:
            e.loss_weights = np.full(e.num_tokens, 0.5, np.float32)
    table = encoded_table(examples)
    starts = np.array([0, 30, 61, 90, 120])
    files = []
    for c in range(len(starts) - 1):
        files.append(str(tmp_path / f"chunk-{c}.arrow"))
        with ipc.new_file(files[-1], EXAMPLE_SCHEMA) as writer:  # the last file of three record batches
            writer.write_table(table.slice(starts[c], starts[c + 1] - starts[c]), max_chunksize=12 if c == 3 else None)
    assemble._LAYOUTS.clear()
    try:
        learnt = learn_layouts(files)
        mine = dict(assemble._LAYOUTS)
        assemble._LAYOUTS.clear()
        sel = starts[:-1]  # a first row of every file
        assert take_rows(files, starts, sel, remember=True).equals(table.take(pa.array(sel)))
        assert mine == assemble._LAYOUTS
        assert learnt == len(mine) == (0 if kind == "weighted" else 3)
        assemble._LAYOUTS.clear()
        assert learn_layouts(files) == learnt and learn_layouts(files) == 0  # known files: nothing to learn
        for _ in range(2):
            sel = rng.permutation(120)[:50]
            assert take_rows(files, starts, sel, remember=True).equals(table.take(pa.array(sel)))
    finally:
        assemble._LAYOUTS.clear()


def test_a_writer_keeps_the_layout_of_every_map_output_past_a_thousand(tmp_path):
    """A 1B-example build's writers visit ~39k map outputs, a row or two from each: every file's layout is kept
    (a remembered visit is ~1/4 of an Arrow one's CPU, ``scripts/bench_visits.py``), here 1,100 files (the old
    limit was 1,024), each layout a small array (``LAYOUTS_MAX`` of them must fit a writer), and the takes that
    view the files through them equal pyarrow's take, images included."""
    rng = np.random.default_rng(5)
    table = encoded_table([random_example(rng, i, images=i % 3 == 0, mrope=True) for i in range(1100)])
    files = []
    for c in range(1100):
        files.append(str(tmp_path / f"map-{c:06d}.arrow"))
        with ipc.new_file(files[-1], EXAMPLE_SCHEMA) as writer:
            writer.write_table(table.slice(c, 1))
    starts = np.arange(1101)
    assemble._LAYOUTS.clear()
    try:
        assert learn_layouts(files) == 1100
        first = files[int(np.flatnonzero(table.column("num_images").to_numpy())[0])]
        with_images = next(v for k, v in assemble._LAYOUTS.items() if k[0] == first)
        name, at, items = with_images.media[0]
        assert (name, at > 0, items > 0) == ("images", True, True)  # the images' spec, in the one array
        assert with_images.spans.nbytes < 1500
        for _ in range(2):
            sel = rng.permutation(1100)[:700]
            assert take_rows(files, starts, sel, remember=True).equals(table.take(pa.array(sel)))
        assert len(assemble._LAYOUTS) == 1100
    finally:
        assemble._LAYOUTS.clear()
