"""This machine's ceiling for a text build: on bench_build's corpus, the CPU time of the three things a build
cannot avoid, each alone on one core: parsing the JSONL lines (orjson), the fastest exact tokenizer
(fastokens, packer/encode/fastokens_bpe.py) on the rendered texts, and writing the resulting tokens as shards
(Parquet, the shard format's per-token columns and writer options, packer/shards/io.py; schema v6: an mRoPE
family's positions sparse, packer/shards/mrope.py). Their sum per core,
times the cores, is the text tokens/s no build on this machine can beat ("% of this machine's ceiling" in
bench_build). Also: the HF tokenizer alone on the same texts (bench_build's "x HF tokenizer alone"), json
against orjson, and the write floor: what each writer option and each derivable column costs.

    python scripts/bench_ceiling.py --records 50000
    python scripts/bench_ceiling.py --records 50000 --write-floor    # + the writer options' table

Rendering is packer's (the Python ChatML of the build's fast path) and not counted: a ceiling of the work
every tool must do. CPU seconds, best of ``--repeats``; the cores are ``--num-proc`` (what a build uses).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

CHUNK = 512  # lines per encode chunk, as the build's (stages.CHUNK_LINES)


def _best(fn, repeats: int) -> float:
    """Least CPU seconds of ``repeats`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def rendered_texts(lines: list[bytes], profile: str, tmp: str) -> tuple[list[list[str]], object]:
    """Each chunk's rendered texts (every root-to-node path, as the build renders them) and the encoder."""
    import bench_build  # the profiles that take --max-pixels (a text profile takes none)

    from packer.config import BuildConfig
    from packer.encode.render import stage
    from packer.formats.read import parse_line
    from packer.pipeline import stages

    pixels = {"max_pixels": 256 * 28 * 28} if profile in bench_build.PIXEL_PROFILES else {}
    config = BuildConfig.from_inputs([os.path.join(tmp, "c.jsonl")], os.path.join(tmp, "out"), profile=profile,
                                     max_length=8192, **pixels)
    encoder = stages.make_encoder(config)
    chunks = []
    for i in range(0, len(lines), CHUNK):
        texts: list[str] = []
        for n, raw in enumerate(lines[i : i + CHUNK]):
            example = parse_line(raw, path="c.jsonl", line=i + n + 1, base_dir=str(SHARED / "data" / "coco-mini"))
            texts.extend(stage(example, encoder._chat, encoder.profile).texts)
        chunks.append(texts)
    return chunks, encoder


def _list_array(offsets: np.ndarray, values: np.ndarray):
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))


def token_table(ids: np.ndarray, starts: np.ndarray, max_length: int, *, mrope: bool):
    """Rows of <= ``max_length`` tokens from the examples back to back (first-fit in order: the shape of a
    packed shard, not its plan): input_ids, labels, position_ids (and mrope as 3*T float32, qwen2-vl's), with
    the cu_seqlens / node columns and counts a shard carries."""
    import pyarrow as pa

    lengths = np.diff(starts)
    row_of = np.zeros(len(lengths), dtype=np.int64)
    fill, row = 0, 0
    for k, n in enumerate(lengths.tolist()):  # a row per ~max_length tokens; one pass over examples
        if fill + n > max_length and fill:
            row, fill = row + 1, 0
        row_of[k], fill = row, fill + n
    row_tokens = np.bincount(row_of, weights=lengths, minlength=row + 1).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(row_tokens)))
    positions = np.arange(ids.shape[0], dtype=np.int32) - np.repeat(starts[:-1], lengths).astype(np.int32)
    labels = ids.copy()
    labels[starts[:-1]] = -100
    examples = np.concatenate(([0], np.cumsum(np.bincount(row_of, minlength=row + 1))))
    ex_offsets = np.concatenate(([0], np.cumsum(np.bincount(row_of, minlength=row + 1) + 1)))
    cu = np.concatenate([np.concatenate(([0], np.cumsum(lengths[a:b]))) for a, b in zip(examples[:-1], examples[1:],
                                                                                         strict=True)]).astype(np.int32)
    cols = {
        "input_ids": _list_array(offsets, ids),
        "labels": _list_array(offsets, labels),
        "position_ids": _list_array(offsets, positions),
        "cu_seqlens": _list_array(ex_offsets, cu),
        "num_tokens": pa.array(row_tokens.astype(np.int32)),
    }
    if mrope:
        cols["mrope_position_ids"] = _list_array(offsets * 3, np.repeat(positions, 3).astype(np.float32))
    return pa.table(cols)


def _required(table):
    """``table`` with its list columns and their elements declared non-nullable (Parquet's REQUIRED: fewer
    definition levels to write); the values are the same."""
    import pyarrow as pa

    fields = [pa.field(f.name, pa.list_(pa.field("element", f.type.value_type, nullable=False)), nullable=False)
              if pa.types.is_list(f.type) else f.with_nullable(False) for f in table.schema]
    return table.cast(pa.schema(fields))


def write_seconds(table, tmp: str, repeats: int, *, sparse: bool = False, **options) -> tuple[float, int]:
    """Best CPU seconds of writing ``table`` as shards of 2,048 rows (row groups of 64; packer's options unless
    overridden), and the bytes written. ``sparse``: schema v6, each shard's dense mRoPE column made into its sparse
    columns (``packer.shards.mrope``, the same numpy pass as the build's ``assemble_packs``) inside the time."""
    import pyarrow.parquet as pq

    from packer.shards.mrope import to_sparse

    opts = dict(compression="zstd", row_group_size=64, use_dictionary=False,
                write_statistics=["num_tokens"]) | options
    path = os.path.join(tmp, "floor.parquet")

    def run():
        for a in range(0, table.num_rows, 2048):
            shard = table.slice(a, 2048)
            pq.write_table(to_sparse(shard) if sparse else shard, path, **opts)

    seconds = _best(run, repeats)
    return seconds, os.path.getsize(path) * max(1, -(-table.num_rows // 2048))


def ceiling(corpus: Path, *, profile: str = "qwen2-vl", repeats: int = 3, num_proc: int = 2,
            write_floor: bool = False) -> dict:
    """The figures above for ``corpus`` (bench_build's JSONL): CPU seconds of each stage alone, text tokens,
    and the ceiling in text tokens/s for ``num_proc`` cores."""
    import orjson

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    lines = corpus.read_bytes().splitlines()
    out: dict = {"lines": len(lines), "mb": corpus.stat().st_size / 1e6}
    out["parse_orjson"] = _best(lambda: [orjson.loads(x) for x in lines], repeats)
    out["parse_json"] = _best(lambda: [json.loads(x) for x in lines], repeats)
    with tempfile.TemporaryDirectory() as tmp:
        chunks, encoder = rendered_texts(lines, profile, tmp)
        view = encoder.context.tokens
        from packer.encode.fastokens_bpe import FastokensBPE

        engine = FastokensBPE.of(view.backend)
        assert engine is not None, "no exact fastokens engine for this tokenizer"
        engine.native()  # its one-off start (~1.5 CPU-s, per process) is no part of the per-token ceiling
        out["tokenize_fastokens"] = _best(lambda: [engine.encode(c) for c in chunks], repeats)
        out["tokenize_hf"] = _best(lambda: [view.backend.encode_batch_fast(c, add_special_tokens=False)
                                            for c in chunks], repeats)
        flats = [engine.encode(c)[0] for c in chunks]
        ids = np.concatenate([f.ids for f in flats])
        lengths = np.concatenate([np.diff(f.starts) for f in flats])
        starts = np.concatenate(([0], np.cumsum(lengths)))
        out["tokens"] = int(ids.shape[0])
        mrope = encoder.profile.name.startswith("qwen")  # an mRoPE family writes 3*T positions too
        table = token_table(ids, starts, 8192, mrope=mrope)
        out["write"], out["bytes"] = write_seconds(table, tmp, repeats, sparse=mrope)  # the shards' format (v6)
        if write_floor:
            floor = {}
            base = table.drop_columns(["mrope_position_ids"]) if mrope else table
            # Parquet names a list's values by their leaf path; a column given an encoding takes no dictionary
            delta = {f"{c}.list.element": "DELTA_BINARY_PACKED" for c in ("labels", "position_ids")}
            for name, t, opts in (
                ("shard options (zstd, default level, no dictionary), v5 dense mRoPE", table, {}),
                ("  v6: mRoPE sparse (runs + bases + rest), made inside the time", table, {"sparse": mrope}),
                ("  without mrope_position_ids", base, {}),
                ("  ... zstd level 1", base, {"compression_level": 1}),
                ("  ... uncompressed", base, {"compression": "none"}),
                ("  ... dictionary on every column", base, {"use_dictionary": True}),
                ("  ... data pages of 8 MiB", base, {"data_page_size": 8 << 20}),
                ("  ... zstd level -3 (a faster level, more bytes)", base, {"compression_level": -3}),
                ("  ... lz4", base, {"compression": "lz4"}),
                ("  ... labels, positions DELTA_BINARY_PACKED", base, {"column_encoding": delta}),
                ("  ... token lists and their elements not nullable", _required(base), {}),
                ("  ... input_ids only (labels, positions derivable)", base.select(["input_ids", "num_tokens"]), {}),
            ):
                floor[name] = write_seconds(t, tmp, repeats, **opts)
            out["write_floor"] = floor
    per_core = out["parse_orjson"] + out["tokenize_fastokens"] + out["write"]
    out["ceiling_tokens_per_s"] = out["tokens"] / per_core * num_proc
    out["hf_alone_tokens_per_s"] = out["tokens"] / out["tokenize_hf"] * num_proc
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--num-proc", type=int, default=2, help="cores the ceiling counts (a build's --num-proc)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write-floor", action="store_true", help="also time each writer option and derivable column")
    args = ap.parse_args()
    import bench_build

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        bench_build.make_corpus(corpus, SHARED / "data" / "coco-mini", args.records)
        c = ceiling(corpus, repeats=args.repeats, num_proc=args.num_proc, write_floor=args.write_floor)
    tok = c["tokens"]
    print(f"{args.records:,} records, {c['mb']:.1f} MB JSONL, {tok:,} text tokens; CPU-s on one core, best of "
          f"{args.repeats}:")
    print(f"  parse (orjson)        {c['parse_orjson']:.3f} s  ({c['mb'] / c['parse_orjson']:.0f} MB/s; json "
          f"{c['parse_json']:.3f} s, {c['parse_json'] / c['parse_orjson']:.2f}x)")
    print(f"  tokenize (fastokens)  {c['tokenize_fastokens']:.3f} s  ({tok / c['tokenize_fastokens'] / 1e6:.1f} Mtok/s; "
          f"HF tokenizers {c['tokenize_hf']:.3f} s, {c['tokenize_hf'] / c['tokenize_fastokens']:.1f}x)")
    print(f"  write (Parquet)       {c['write']:.3f} s  ({tok / c['write'] / 1e6:.1f} Mtok/s, "
          f"{c['bytes'] / 2**20:.0f} MiB)")
    per_core = c["parse_orjson"] + c["tokenize_fastokens"] + c["write"]
    print(f"  ceiling: {tok / per_core / 1e6:.2f} Mtok/s per core, {c['ceiling_tokens_per_s'] / 1e6:.2f} Mtok/s on "
          f"{args.num_proc} cores; HF tokenizer alone {c['hf_alone_tokens_per_s'] / 1e6:.2f} Mtok/s on "
          f"{args.num_proc} cores")
    for name, (s, size) in c.get("write_floor", {}).items():
        print(f"  write floor: {name:68s} {s:.3f} s  {tok / s / 1e6:6.1f} Mtok/s  {size / 2**20:6.0f} MiB")


if __name__ == "__main__":
    main()
