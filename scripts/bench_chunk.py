"""One build worker's per-chunk work against the tokenizer-alone baseline's, in one process, interleaved.

On bench_build's corpus (4,096 records = 8 encode chunks of 512 lines): the build's phases (parse the JSONL
lines, render every root-to-node path, the tokenizer call, labels = the loss rule over the batch's tokens,
finish = nodes, images, positions, table = the chunk's Arrow table, then commit = that table's Arrow IPC file
written into an encode cache), once with the
encoder's fast paths (``build``: the tokenizer call by fastokens, packer/encode/fastokens_bpe.py) and once with the
HF tokenizer doing the tokenizer call (``build-hf``: every fast path but ``fastokens``), and the baseline's (``apply_chat_template`` + one tokenizer call per chunk, as bench_build's ``tokenizer alone``). CPU time, best of ``--repeats`` rounds, the contenders alternating
inside each round so that load on the shared cores hits both alike. Where the build's encode stage goes,
without the noise of a whole build (docs/benchmarks.md, "Build throughput").

    python scripts/bench_chunk.py               # ~1 min
    python scripts/bench_chunk.py --repeats 9
    python scripts/bench_chunk.py --by-kind     # the build's finish per record kind (text-only, image, tree)
    python scripts/bench_chunk.py --profile qwen3-vl   # another family (its default tokenizer and template)
    python scripts/bench_chunk.py --profile text --shape text-chat   # text chats (no images)
    python scripts/bench_chunk.py --profile text --shape text-chat --records 8192 --repeats 5 --build-only
    python scripts/bench_chunk.py --parse       # the parse phase split: orjson alone, the Example objects alone
    python scripts/bench_chunk.py --profile text --shape text-chat --records 8192 --whole
    python scripts/bench_chunk.py --profile text --shape text-chat --records 8192 --whole --parts   # OpenAI's part lists
    python scripts/bench_chunk.py --profile text --shape text-chat --records 8192 --whole --not-plain   # none plain

The phases follow the general path (an Example per record through ``Encoder.encode_batch``). A build takes
the ``plain-columns`` path for its chats of one-text messages and its text records (``Encoder.encode_chats``,
``encode_texts``: straight from the lines' columns): ``--whole`` times the build's ``stages.encode_chunk`` as it
runs, with that path and without it (``Encoder(fast=...)`` less ``plain-columns``), alternated, the chunk files
compared byte for byte.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import bench_build  # noqa: E402

from packer.config import BuildConfig  # noqa: E402
from packer.encode.draft import batch_tokens  # noqa: E402
from packer.encode.encoder import FAST_PATHS  # noqa: E402
from packer.encode.render import stage_batch  # noqa: E402
from packer.pipeline import stages  # noqa: E402
from packer.pipeline.cache import EncodeCache  # noqa: E402
from packer.pipeline.faults import Hooks  # noqa: E402
from packer.shards.assemble import encoded_table  # noqa: E402


def staged_texts(parsed, encoder) -> tuple[list, list[str]]:
    """The encoder's render phase over a chunk's records (``Encoder.encode_batch``'s): each record staged, and
    every text to tokenize."""
    staged, texts = stage_batch(parsed, encoder._chat, encoder.profile), []
    for one in staged:
        one.first = len(texts)
        texts.extend(one.texts)
    return staged, texts


def build_phases(chunks, config, encoder, cache: EncodeCache, base_dir: str) -> dict[str, float]:
    """CPU seconds of each phase of ``stages.encode_chunk`` over ``chunks``, its cache commit included."""
    t = dict.fromkeys(("parse", "render", "tokenizer", "labels", "finish", "table", "commit"), 0.0)
    for chunk in chunks:
        with stages.collector_paused():  # as ``stages.encode_chunk`` runs a chunk
            chunk_phases(chunk, config, encoder, cache, base_dir, t)
    return t


def chunk_phases(chunk, config, encoder, cache: EncodeCache, base_dir: str, t: dict[str, float]) -> None:
    """``build_phases`` of one chunk, its CPU seconds added to ``t``."""
    t0 = time.process_time()
    parsed = list(stages._chunk_records(chunk, config, base_dir))
    t1 = time.process_time()
    staged, texts = staged_texts(parsed, encoder)
    t2 = time.process_time()
    encodings = encoder._tokenize(texts)
    t3 = time.process_time()
    tokens = batch_tokens(encoder.context, staged, texts, encodings)
    t4 = time.process_time()
    done = encoder.finish_batch(parsed, staged, tokens, rows=True)
    for one in done:
        one.source_name = chunk.source
    t5 = time.process_time()
    table = encoded_table(done)
    t6 = time.process_time()
    cache.commit(chunk.index, table, [], hooks=Hooks())
    t7 = time.process_time()
    marks = (t0, t1, t2, t3, t4, t5, t6, t7)
    for k, a, b in zip(t, marks, marks[1:], strict=False):
        t[k] += b - a


def whole_chunks(chunks, config, encoders: dict, tmp: str, repeats: int) -> dict[str, float]:
    """CPU seconds of ``stages.encode_chunk`` over ``chunks`` per encoder (each round a fresh cache, the encoders
    alternating), best of ``repeats`` after a warm-up round; the encoders' chunk files must be the same bytes."""
    best: dict[str, float] = {}
    for r in range(repeats + 1):
        files = {}
        for name, encoder in encoders.items():
            cache = EncodeCache(Path(tmp) / f"whole-{name}-{r}", len(chunks))
            cache.root.mkdir()
            t = time.process_time()
            for chunk in chunks:
                stages.encode_chunk(chunk, encoder=encoder, cache=cache, config=config, hooks=Hooks())
            cpu = time.process_time() - t
            if r:
                best[name] = min(cpu, best.get(name, cpu))
            files[name] = [cache.arrow(i).read_bytes() for i in range(len(chunks))]
        assert len({tuple(f) for f in files.values()}) == 1, "the encoders' chunk files differ"
    return best


def finish_by_kind(chunks, config, encoder, base_dir: str) -> dict[str, tuple[float, int]]:
    """CPU seconds of ``Encoder._finish`` (the general path, one record at a time: ``batch-finish`` does the
    common kinds by batch) per record kind (a linear text-only conversation, one with media, a
    tree) and the records of each: where the finish phase goes (docs/benchmarks-log.md, "Issue 33, session 4")."""
    out = {"text-only": [0.0, 0], "media": [0.0, 0], "tree": [0.0, 0]}
    for chunk in chunks:
        parsed = list(stages._chunk_records(chunk, config, base_dir))
        staged, texts = staged_texts(parsed, encoder)
        tokens = batch_tokens(encoder.context, staged, texts, encoder._tokenize(texts))
        for example, one in zip(parsed, staged, strict=True):
            kind = "tree" if len(one.nodes) > 1 else "media" if any(
                not isinstance(p, str) for m in example.root.messages for p in m.parts) else "text-only"
            t = time.process_time()
            encoder._finish(example, one, tokens)
            out[kind][0] += time.process_time() - t
            out[kind][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def parse_split(chunks, config, base_dir: str, lines: list[bytes], repeats: int) -> None:
    """The parse phase (``stages._chunk_records``) beside what it is made of: ``orjson.loads`` of every line
    alone, and ``formats.plain.parse_plain`` alone on the loaded records (the Example objects); best of
    ``repeats``, CPU seconds. What the rest of the parse could still give (docs/benchmarks.md, "Inside the chunk")."""
    import orjson

    from packer.formats.plain import parse_plain
    from packer.formats.read import _root_dir

    objs = [orjson.loads(line) for line in lines]
    root = _root_dir(None, base_dir)
    runs = {
        "parse phase": lambda: [list(stages._chunk_records(c, config, base_dir)) for c in chunks],
        "orjson alone": lambda: [orjson.loads(line) for line in lines],
        "parse_plain alone": lambda: [parse_plain(o, path="p", line=i, root_dir=root) for i, o in enumerate(objs)],
    }
    best = dict.fromkeys(runs, float("inf"))
    for r in range(repeats + 1):  # round 0 warms the caches (image stats)
        for name, run in runs.items():
            t = time.process_time()
            run()
            if r:
                best[name] = min(best[name], time.process_time() - t)
    messages = sum(len(o.get("messages", ())) + sum(len(b) for b in o.get("branches") or ()) for o in objs)
    for name, cpu in best.items():
        print(f"{name}: {cpu:.3f} s CPU per {len(lines):,} records ({messages:,} messages; best of {repeats})")


def timed_mrope():
    """Wrap ``shared.mrope.mrope_position_ids`` (what the finish phase calls for an example with images or videos):
    returns the timings list, one CPU-time per call, and the function that undoes the wrap."""
    import packer.models.shared.mrope as mrope

    real, times = mrope.mrope_position_ids, []

    def timed(*args, **kwargs):
        t = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            times.append(time.process_time() - t)

    mrope.mrope_position_ids = timed
    return times, lambda: setattr(mrope, "mrope_position_ids", real)


def baseline_phases(lines: list[str]) -> dict[str, float]:
    """CPU seconds of bench_build's baseline, split into render (template) and tokenizer."""
    import json

    t = {"render": 0.0, "tokenizer": 0.0}
    tok = bench_build._TOK
    for i in range(0, len(lines), stages.CHUNK_LINES):
        t0 = time.process_time()
        texts = []
        for line in lines[i : i + stages.CHUNK_LINES]:
            rec = json.loads(line)
            msgs = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
                    if isinstance(m["content"], list) else m for m in rec["messages"]]
            for branch in rec.get("branches", [[]]):
                texts.append(tok.apply_chat_template(msgs + branch, tokenize=False))
        t1 = time.process_time()
        sum(len(ids) for ids in tok(texts).input_ids)
        t["render"] += t1 - t0
        t["tokenizer"] += time.process_time() - t1
    return t


def rewrite(corpus: Path, *, parts: bool, meta: bool) -> None:
    """Rewrite ``corpus`` with every string content as a part list of that one text (``--parts``), every record
    with a ``meta`` key (``--not-plain``)."""
    def as_parts(messages: list) -> list:
        return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
                for m in messages]

    out = []
    for line in corpus.read_text().splitlines():
        rec = json.loads(line)
        if parts and "messages" in rec:
            rec["messages"] = as_parts(rec["messages"])
            if "branches" in rec:
                rec["branches"] = [as_parts(b) for b in rec["branches"]]
        if meta:
            rec["meta"] = {"origin": "bench"}
        out.append(json.dumps(rec, ensure_ascii=False))
    corpus.write_text("\n".join(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--by-kind", action="store_true", help="only the finish per record kind, best of --repeats")
    ap.add_argument("--profile", default="qwen2-vl", help="the build's profile (its default tokenizer)")
    ap.add_argument("--parse", action="store_true", help="only the parse phase split, best of --repeats")
    ap.add_argument("--shape", choices=("chat", "text-chat", "text"), default="chat",
                    help="bench_build's chats, the same without images (a text chat build: --profile text), or tiny text records")
    ap.add_argument("--parts", action="store_true",
                    help="every text message's content as OpenAI's part list of one text ([{\"type\": \"text\", ...}])")
    ap.add_argument("--not-plain", action="store_true",
                    help="every record with one key more (\"meta\"): none is plain, every line the general path's")
    ap.add_argument("--whole", action="store_true",
                    help="only the build's stages.encode_chunk as it runs, with the plain-columns path and without it")
    ap.add_argument("--build-only", action="store_true",
                    help="only the build's phases (no build-hf, no baseline): a before/after of the encode, run in "
                         "each tree")
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        bench_build.make_corpus(corpus, SHARED / "data" / "coco-mini", args.records, shape=args.shape)
        if args.parts or args.not_plain:
            rewrite(corpus, parts=args.parts, meta=args.not_plain)
        pixels = {"max_pixels": 256 * 28 * 28} if args.profile in bench_build.PIXEL_PROFILES else {}  # as bench_build
        config = BuildConfig.from_inputs([str(corpus)], str(Path(tmp) / "out"), profile=args.profile,
                                         max_length=8192, **pixels)
        made = stages.make_encoder(config)
        encoder = pickle.loads(pickle.dumps(made))  # what a worker holds
        hf = pickle.loads(pickle.dumps(made.replace(fast=set(FAST_PATHS) - {"fastokens"})))
        # frozen, as a build worker freezes what it holds (pipeline/local.py ``_encoder``): else a full collection
        # walks the encoder and the imported modules once per ~4k records, ~10% of a chunk, landing in one phase
        gc.freeze()
        chunks = stages.scan_chunks(config)
        cache = EncodeCache(Path(tmp) / "cache", len(chunks))
        cache.root.mkdir()
        lines = corpus.read_text().splitlines()
        if args.parse:
            parse_split(chunks, config, tmp, corpus.read_bytes().splitlines(), args.repeats)
            return
        if args.whole:
            general = pickle.loads(pickle.dumps(made.replace(fast=set(FAST_PATHS) - {"plain-columns"})))
            got = whole_chunks(chunks, config, {"plain-columns": encoder, "general": general}, tmp, args.repeats)
            for name, cpu in got.items():
                print(f"encode_chunk, {name}: {cpu:.3f} s CPU per {args.records:,} records (best of {args.repeats})")
            print(f"  plain-columns / general: {got['plain-columns'] / got['general']:.3f}; chunk files identical")
            return
        if args.by_kind:
            finish_by_kind(chunks, config, encoder, tmp)  # warms the caches (image sizes, BPE)
            rounds = [finish_by_kind(chunks, config, encoder, tmp) for _ in range(args.repeats)]
            for kind in rounds[0]:
                cpu, n = min(r[kind] for r in rounds)
                print(f"finish, {kind}: {cpu:.3f} s CPU for {n:,} records ({1e6 * cpu / max(n, 1):.1f} us each, best of "
                      f"{args.repeats})")
            return
        bench_build._init(args.profile)
        best: dict[str, dict[str, float]] = {}
        mrope, unwrap = timed_mrope()
        mrope_best = None  # (seconds, calls) of the round with the least mRoPE time
        for r in range(args.repeats + 1):  # round 0 warms the caches (image sizes, BPE)
            contenders = (("build", lambda: build_phases(chunks, config, encoder, cache, tmp)),
                          ("build-hf", lambda: build_phases(chunks, config, hf, cache, tmp)),
                          ("baseline", lambda: baseline_phases(lines)))
            for name, run in contenders[:1] if args.build_only else contenders:
                mrope.clear()
                t = run()
                if r and name != "baseline" and mrope and (mrope_best is None or sum(mrope) < mrope_best[0]):
                    mrope_best = (sum(mrope), len(mrope))
                if r:
                    prev = best.get(name)
                    best[name] = t if prev is None or sum(t.values()) < sum(prev.values()) else prev
        unwrap()
        assert encoder.path_counts()["tokens:fastokens"] > 0 and hf.path_counts()["tokens:fastokens"] == 0
    for name, t in best.items():
        split = ", ".join(f"{k} {v:.3f}" for k, v in t.items())
        print(f"{name}: {sum(t.values()):.3f} s CPU per {args.records:,} records ({split})")
    if mrope_best:
        print(f"mrope_position_ids: {1e6 * mrope_best[0] / mrope_best[1]:.0f} us CPU per image example "
              f"({mrope_best[1]:,} calls, best round)")


if __name__ == "__main__":
    main()
