"""Mixing named sources with weights: exact counts, seeded sampling, unique ids, the mixture inside packs.

Measured on the corpus below (3 sources x 60 chats, capacity 1024, BFD; see also docs/pitfalls.md):
- same length distribution: per-pack share (mean over packs) 49.4% / 11.6% / 39.0% for global 50% / 12.5% /
  37.5%; the spread over packs is +-26% / 14% / 21% (about 8.6 examples per pack).
- sources of different lengths (short / long / medium): 31.0% / 32.4% / 36.6% per pack for the same global
  50% / 12.5% / 37.5%: length-driven packing groups long examples with long ones, so a pack's mixture
  follows lengths; the counts over the epoch stay exact.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.cli import cli
from packer.config import BuildConfig
from packer.errors import ConfigError
from packer.packing.mixing import MARK, Sampled, sample_counts, sample_sources
from packer.pipeline.build import build
from packer.shards.io import open_shards

WEIGHTS = {"a": 2.0, "b": 0.5, "c": 1.5}
PER_SOURCE = 60
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _write_sources(root: Path, words: dict[str, tuple[int, int]], seed: int = 0) -> dict[str, Path]:
    """One JSONL per source: PER_SOURCE chats whose user turn has a random number of words in the range."""
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (lo, hi) in words.items():
        paths[name] = root / f"{name}.jsonl"
        with open(paths[name], "w") as f:
            for _ in range(PER_SOURCE):
                n = rnd.randint(lo, hi)
                f.write(json.dumps({"messages": [
                    {"role": "user", "content": " ".join(rnd.choice(WORDS) for _ in range(n))},
                    {"role": "assistant", "content": " ".join(rnd.choice(WORDS) for _ in range(max(1, n // 3)))},
                ]}) + "\n")
    return paths


def _config(paths: dict[str, Path], out: Path, **kw) -> BuildConfig:
    sources = [{"name": n, "paths": [str(p)], "weight": WEIGHTS[n]} for n, p in paths.items()]
    return BuildConfig.from_dict({"sources": sources, "output": str(out), "profile": "text", "max_length": 1024,
                                  **kw})


def _rows(out: Path) -> list[dict]:
    shards = open_shards(out)
    rows = []
    for i in range(len(shards.shards)):
        rows += pq.read_table(shards.shard_path(i), columns=["example_ids", "example_sources"]).to_pylist()
    return rows


@pytest.fixture(scope="module")
def same_lengths(tmp_path_factory) -> dict[str, Path]:
    return _write_sources(tmp_path_factory.mktemp("mix_same"), {n: (5, 120) for n in WEIGHTS})


@pytest.fixture(scope="module")
def built(same_lengths, tmp_path_factory):
    out = tmp_path_factory.mktemp("mix_out") / "out"
    return out, build(_config(same_lengths, out), progress=False)


def test_sample_sources_counts_copies_and_seed():
    names = np.array(["a"] * PER_SOURCE + ["b"] * PER_SOURCE + ["c"] * PER_SOURCE, dtype=object)
    weights = list(WEIGHTS.items())
    index, copies = sample_sources(names, weights, seed=0)
    per = Counter(names[index].tolist())
    assert per == {"a": 120, "b": 30, "c": 90}
    a = index[names[index] == "a"]
    assert np.array_equal(a, np.repeat(np.arange(60), 2))  # every a twice, copies together
    assert copies[names[index] == "a"].tolist() == [0, 1] * 60
    b = index[names[index] == "b"]
    assert len(set(b.tolist())) == 30 and not copies[names[index] == "b"].any()  # a seeded half, once
    c_copies = copies[names[index] == "c"]
    assert (c_copies == 0).sum() == 60 and (c_copies == 1).sum() == 30  # all of c, plus a seeded half again
    assert np.all(np.diff(index) >= 0)  # input order
    again = sample_sources(names, weights, seed=0)
    assert np.array_equal(again[0], index) and np.array_equal(again[1], copies)
    other, _ = sample_sources(names, weights, seed=1)
    assert set(other[names[other] == "b"].tolist()) != set(b.tolist())


def _sample_sources_before(sources, weights, *, seed):
    """sample_sources as it was (int64 parts per copy, concatenated, lexsorted): the oracle of the compact one."""
    rng = np.random.default_rng([seed, 1])
    index_parts, copy_parts = [], []
    for name, weight in weights:
        idx = np.flatnonzero(sources == name)
        whole, frac = int(np.floor(weight)), weight - np.floor(weight)
        for k in range(whole):
            index_parts.append(idx)
            copy_parts.append(np.full(len(idx), k))
        if frac > 0 and len(idx):
            extra = np.sort(rng.choice(idx, size=int(round(frac * len(idx))), replace=False))
            index_parts.append(extra)
            copy_parts.append(np.full(len(extra), whole))
    index, copies = np.concatenate(index_parts), np.concatenate(copy_parts)
    order = np.lexsort((copies, index))
    return index[order], copies[order]


@pytest.mark.parametrize("seed", range(6))
def test_sample_sources_as_before(seed):
    """The same examples, copies and draws as the int64 sampler it replaced (the build's plans unchanged)."""
    rng = np.random.default_rng(seed)
    sources = rng.integers(0, 4, size=int(rng.integers(1, 40_000))).astype(np.uint8)
    weights = [(0, 1.0), (1, float(rng.choice([0.3, 2.0, 2.5]))), (2, float(rng.choice([0.5, 4.25]))), (3, 0.01)]
    index, copies = sample_sources(sources, weights, seed=seed)
    want_index, want_copies = _sample_sources_before(sources, weights, seed=seed)
    assert index.dtype == np.int32 and copies.dtype == np.uint8
    assert np.array_equal(index, want_index) and np.array_equal(copies, want_copies)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=4 * MARK + 7), st.data())
def test_sampled_is_the_index_and_copies_it_replaces(counts, data):
    """``Sampled`` (a repeat count per row) gives what the (n,) ``index`` / ``copies`` of ``sample_sources``
    held: the planned values, each planned example's row and copy number (any order), each row's first
    planned example, the rows of a slice of rows; runs of empty rows across marks included."""
    counts = np.array(counts, dtype=np.uint8)
    sampled = Sampled.of(counts)
    index = np.repeat(np.arange(len(counts)), counts)
    copies = np.arange(len(index)) - np.repeat(np.cumsum(counts) - counts, counts)
    assert sampled.num_planned == len(index)
    assert np.array_equal(sampled.index(), index) and sampled.index().dtype == np.int32
    values = np.arange(len(counts), dtype=np.uint16) * 3 + 1
    assert np.array_equal(sampled.planned(values), values[index]) and sampled.planned(values).dtype == np.uint16
    picked = np.array(data.draw(st.lists(st.integers(0, max(len(index) - 1, 0)), max_size=50 if len(index) else 0)),
                      dtype=np.int32)
    rows, numbers = sampled.locate(picked)
    assert np.array_equal(rows, index[picked]) and np.array_equal(numbers, copies[picked])
    r0 = data.draw(st.integers(0, len(counts)))
    r1 = data.draw(st.integers(r0, len(counts)))
    assert sampled.first(r0) == int(np.searchsorted(index, r0))
    assert np.array_equal(r0 + sampled.index_part(r0, r1), index[sampled.first(r0):sampled.first(r1)])


def test_sample_counts_are_sample_sources_index():
    sources = np.random.default_rng(3).integers(0, 3, size=5000)
    weights = [(0, 2.5), (1, 0.3), (2, 1.0)]
    index, copies = sample_sources(sources, weights, seed=3)
    sampled = Sampled.of(sample_counts(sources, weights, seed=3))
    assert np.array_equal(sampled.index(), index)
    assert np.array_equal(sampled.locate(np.arange(len(index)))[1], copies)


def test_weights_give_the_counts_in_stats_and_shards(built):
    out, result = built
    assert {n: s["examples"] for n, s in result.stats["sources"].items()} == {"a": 120, "b": 30, "c": 90}
    assert {n: s["share"] for n, s in result.stats["sources"].items()} == {"a": 0.5, "b": 0.125, "c": 0.375}
    assert result.manifest["totals"]["examples"] == 240 and result.manifest["totals"]["input_records"] == 180
    assert Counter(s for r in _rows(out) for s in r["example_sources"]) == {"a": 120, "b": 30, "c": 90}
    assert [(s["name"], s["weight"]) for s in result.manifest["config"]["sources"]] == list(WEIGHTS.items())


def test_upsampled_copies_have_unique_ids(built, same_lengths):
    out, _ = built
    ids = [i for r in _rows(out) for i in r["example_ids"]]
    assert len(ids) == len(set(ids)) == 240
    a_ids = sorted(i for i in ids if i.startswith(str(same_lengths["a"])))
    assert a_ids == sorted(f"{same_lengths['a']}:{line}{k}" for line in range(1, 61) for k in ("", "#1"))
    c_extra = [i for i in ids if i.startswith(str(same_lengths["c"])) and "#" in i]
    assert len(c_extra) == 30 and all(i.endswith("#1") for i in c_extra)
    assert not [i for i in ids if i.startswith(str(same_lengths["b"])) and "#" in i]


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_sample(built, same_lengths, tmp_path):
    out, result = built
    again = build(_config(same_lengths, tmp_path / "again"), progress=False)
    assert [s["sha256"] for s in again.manifest["shards"]] == [s["sha256"] for s in result.manifest["shards"]]
    other = build(_config(same_lengths, tmp_path / "seed1", seed=1), progress=False)
    b_ids = {i for r in _rows(out) for i, s in zip(r["example_ids"], r["example_sources"], strict=True) if s == "b"}
    b_other = {i for r in _rows(tmp_path / "seed1") for i, s in zip(r["example_ids"], r["example_sources"],
                                                                   strict=True) if s == "b"}
    assert len(b_other) == 30 and b_other != b_ids
    assert other.stats["sources"]["b"]["examples"] == 30


def test_mixture_inside_packs_is_close_to_global(built):
    """Same length distribution: each source's mean share of a pack is within 3 points of its global share,
    and stats.json's per-pack numbers are what the shards hold."""
    out, result = built
    rows = _rows(out)
    for name, s in result.stats["sources"].items():
        shares = np.array([r["example_sources"].count(name) / len(r["example_sources"]) for r in rows])
        assert s["pack_share_mean"] == pytest.approx(shares.mean())
        assert s["pack_share_std"] == pytest.approx(shares.std())
        assert abs(s["pack_share_mean"] - s["share"]) < 0.03, (name, s)


def test_upsampled_copies_do_not_share_a_pack_with_their_original(built):
    """Best-fit stacks an example's copies (equal lengths) into one pack; mixing.separate_copies swaps them
    apart without changing the pack count (it was 74 of 90 copies together before)."""
    out, _ = built
    together = sum(c - 1 for r in _rows(out) for c in Counter(i.split("#")[0] for i in r["example_ids"]).values())
    assert together == 0


@pytest.mark.slow
def test_cli_source_option_and_yaml_sources_build_the_same_bytes(same_lengths, tmp_path):
    runner = CliRunner()
    d = same_lengths["a"].parent
    # globs and a default weight: b*.jsonl matches b.jsonl only
    args = ["build", "-o", str(tmp_path / "cli"), "--profile", "text", "--max-length", "1024", "-q",
            "--source", f"a={d}/a.jsonl@2", "--source", f"b={d}/b*.jsonl@0.5", "--source", f"c={d}/c.jsonl@1.5"]
    res = runner.invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert res.stdout == ""  # --quiet
    config = {"profile": "text", "max_length": 1024,
              "sources": [{"name": "a", "paths": [f"{d}/a.jsonl"], "weight": 2},
                          {"name": "b", "paths": [f"{d}/b*.jsonl"], "weight": 0.5},
                          {"name": "c", "paths": f"{d}/c.jsonl", "weight": 1.5}]}  # a single path may be a string
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(config))
    res = runner.invoke(cli, ["build", "--config", str(tmp_path / "mix.yaml"), "-o", str(tmp_path / "yaml"), "-q"])
    assert res.exit_code == 0, res.output
    cli_manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    yaml_manifest = json.loads((tmp_path / "yaml" / "manifest.json").read_text())
    assert [s["sha256"] for s in cli_manifest["shards"]] == [s["sha256"] for s in yaml_manifest["shards"]]
    assert Counter(s for r in _rows(tmp_path / "yaml") for s in r["example_sources"]) == {"a": 120, "b": 30, "c": 90}
    stats = runner.invoke(cli, ["stats", str(tmp_path / "cli")])
    assert "source b                 30 examples" in stats.stdout
    assert "12.50% of examples, per pack" in stats.stdout


@pytest.mark.parametrize(
    "source, code, message",
    [
        ("chat", 2, "Error: Invalid value for --source: 'chat': expected NAME=PATH_OR_GLOB[@WEIGHT]\n"),
        ("chat=", 2, "Error: Invalid value for --source: 'chat=': expected NAME=PATH_OR_GLOB[@WEIGHT]\n"),
        ("chat=x.jsonl@lots", 2, "Error: Invalid value for --source: 'chat=x.jsonl@lots': weight 'lots' is not a number\n"),
        ("chat={a}@0", 1, "error: source 'chat': 'weight' must be > 0, got 0.0\n"),
        ("chat={d}/nothing*.jsonl@1", 1, "error: input '{d}/nothing*.jsonl' matches no file; give JSONL files, "
                                         "directories or glob patterns\n"),
    ],
)
def test_cli_source_errors(same_lengths, tmp_path, source, code, message):
    d, a = same_lengths["a"].parent, same_lengths["a"]
    res = CliRunner().invoke(cli, ["build", "-o", str(tmp_path / "o"), "--source", source.format(a=a, d=d)])
    assert res.exit_code == code
    assert res.stderr.endswith(message.format(a=a, d=d))


def test_a_file_may_belong_to_one_source_only(same_lengths, tmp_path):
    a = str(same_lengths["a"])
    config = BuildConfig.from_dict({"sources": [{"name": "x", "paths": [a]}, {"name": "y", "paths": [a]}],
                                    "output": str(tmp_path / "o"), "profile": "text"})
    with pytest.raises(ConfigError, match="is named by two sources; each file may belong to one source only"):
        build(config, progress=False)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(1, 120), reps=st.integers(2, 4))
def test_separate_copies_keeps_every_budget_and_the_pack_count(seed, n, reps):
    from packer.packing import plan
    from packer.packing.mixing import separate_copies

    rng = np.random.default_rng(seed)
    base_len = rng.integers(1, 300, size=n)
    base_vis = np.minimum(base_len, rng.integers(0, 100, size=n))
    index = np.repeat(np.arange(n), reps)  # every example `reps` times, copies together, as sample_sources does
    lengths, vision, images = base_len[index], base_vis[index], (base_vis[index] > 0).astype(np.int64)
    costs, limits = np.stack([vision, images], axis=1), [400, 6]
    ids = plan(lengths, 1024, costs=costs, limits=limits, seed=seed)
    out = separate_copies(index, ids, lengths, costs=costs, limits=limits, capacity=1024, seed=seed)
    assert out.max() == ids.max() and np.array_equal(np.bincount(out), np.bincount(ids))
    for values, cap in ((lengths, 1024), (vision, 400), (images, 6)):
        assert np.bincount(out, weights=values).max() <= cap
    before = len(index) - len(set(zip(index.tolist(), ids.tolist(), strict=True)))
    after = len(index) - len(set(zip(index.tolist(), out.tolist(), strict=True)))
    assert after <= before


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(1, 120), reps=st.integers(2, 4))
def test_separate_copies_keeps_the_audio_budgets(seed, n, reps):
    from packer.packing import plan
    from packer.packing.mixing import separate_copies

    rng = np.random.default_rng(seed)
    base_len = rng.integers(1, 300, size=n)
    base_audio = np.minimum(base_len, rng.integers(0, 150, size=n))
    index = np.repeat(np.arange(n), reps)
    lengths, audio = base_len[index], base_audio[index]
    audios, zeros = (audio > 0).astype(np.int64), np.zeros(len(index), dtype=np.int64)
    costs, limits = np.stack([zeros, audio, audios], axis=1), [None, 300, 3]  # an unbounded column is ignored
    ids = plan(lengths, 1024, costs=costs, limits=limits, seed=seed)
    out = separate_copies(index, ids, lengths, costs=costs, limits=limits, capacity=1024, seed=seed)
    assert np.array_equal(np.bincount(out), np.bincount(ids))
    for values, cap in ((lengths, 1024), (audio, 300), (audios, 3)):
        assert np.bincount(out, weights=values).max() <= cap
    after = len(index) - len(set(zip(index.tolist(), out.tolist(), strict=True)))
    assert after <= len(index) - len(set(zip(index.tolist(), ids.tolist(), strict=True)))
