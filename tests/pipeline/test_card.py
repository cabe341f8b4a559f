"""``datasets.load_dataset(OUT)`` is always exactly OUT's shards (packer/pipeline/card.py).

``datasets`` caches what it generates from a local directory under ``<cache>/<directory name>/<config>/<version>/
<hash>``, where the hash covers the card's YAML (features, data-file *patterns*), not the files. Every packer card
used to be the same YAML, so a second output named ``out`` (or one rebuilt with ``--overwrite``) was served the
first one's cached rows. These tests run the sequences that broke (two outputs with one directory name, a rebuild
with other data, a resumed build) against one shared ``datasets`` cache and compare what ``load_dataset`` returns
with what the shards hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from packer.config import BuildConfig
from packer.pipeline.build import build
from packer.pipeline.card import CARD, card_text, shards_digest
from packer.pipeline.faults import Hooks


def _records(n: int, tag: str) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{tag} question {i}: " + "word " * (3 + i % 29)},
                          {"role": "assistant", "content": f"{tag} answer " + "ok " * (1 + i % 13)}]}
            for i in range(n)]


def _build(root: Path, out: Path, n: int, tag: str, *, overwrite: bool = False, hooks: Hooks | None = None) -> None:
    data = root / f"{tag}.jsonl"
    if not data.exists():  # a resumed build must see the same file (its mtime is in the fingerprint)
        data.write_text("".join(json.dumps(r) + "\n" for r in _records(n, tag)))
    config = BuildConfig.from_inputs([str(data)], str(out), profile="text", max_length=256, overwrite=overwrite,
                                     num_proc=1, rows_per_shard=4)
    build(config, progress=False, hooks=hooks)


def _on_disk(out: Path) -> list[list[str]]:
    """Each row's example ids, as the shards hold them."""
    return [ids for f in sorted(out.glob("shard-*.parquet")) for ids in pq.read_table(f).column("example_ids").to_pylist()]


def _loaded(out: Path, cache: Path) -> list[list[str]]:
    import datasets

    return datasets.load_dataset(str(out), cache_dir=str(cache))["train"]["example_ids"]


class _CrashAtManifest(Hooks):
    def at(self, point: str, n: int = 0, **state) -> None:
        if point == "manifest":
            raise RuntimeError("killed before the manifest")


@pytest.mark.slow
def test_load_dataset_is_always_this_outputs_shards(tmp_path):
    cache = tmp_path / "hf-cache"  # one cache for every load, as a user's ~/.cache/huggingface is
    a, b = tmp_path / "a" / "out", tmp_path / "b" / "out"  # two outputs with one directory name
    _build(tmp_path, a, 40, "first")
    assert _loaded(a, cache) == _on_disk(a)
    _build(tmp_path, b, 150, "second")
    assert len(_on_disk(b)) > len(_on_disk(a))
    assert _loaded(b, cache) == _on_disk(b)  # was a's rows: same name, same card
    _build(tmp_path, b, 70, "third", overwrite=True)  # rebuilt in place from other data
    assert _loaded(b, cache) == _on_disk(b)
    assert _loaded(a, cache) == _on_disk(a)  # the first output still reads as itself
    with pytest.raises(RuntimeError, match="killed before the manifest"):
        _build(tmp_path, a, 90, "fourth", overwrite=True, hooks=_CrashAtManifest())
    _build(tmp_path, a, 90, "fourth")  # the same build resumed (same fingerprint: no --overwrite)
    assert _loaded(a, cache) == _on_disk(a) and all("fourth" in ids[0] for ids in _on_disk(a))


def test_card_config_names_the_shards_digest():
    """The config (which ``datasets`` hashes into its cache key) carries the digest of the shard checksums; the
    Hub's reader still sees one ``default`` config naming the shards as the train split."""
    import yaml

    shards = [{"file": "shard-00000.parquet", "sha256": "a" * 64}, {"file": "shard-00001.parquet", "sha256": "b" * 64}]
    text = card_text(title="out", packer_version="0", profile="text", tokenizer="qwen2-vl", max_length=256,
                     stats_table="-", num_rows=7, shards=shards)
    meta = yaml.safe_load(text.split("---\n")[1])
    (config,) = meta["configs"]
    assert config["config_name"] == "default"
    assert config["data_files"] == [{"split": "train", "path": "shard-*.parquet"}]
    assert shards_digest(shards) in config["description"]
    other = [shards[0], {**shards[1], "sha256": "c" * 64}]
    assert shards_digest(other) != shards_digest(shards) and shards_digest(shards) == shards_digest(list(shards))
    assert CARD == "README.md"


def test_datasets_cache_key_follows_the_shards(tmp_path):
    """What ``datasets`` 5.x keys its cache on (``load_dataset_builder(...).cache_dir``): two outputs of one name
    with other shards get two keys; the same shards, one key."""
    import datasets
    import pyarrow as pa

    from packer.shards.schema import SCHEMA

    def output(where: Path, digest: str) -> Path:
        out = where / "out"
        out.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([], schema=SCHEMA), out / "shard-00000.parquet")
        (out / CARD).write_text(card_text(title="out", packer_version="0", profile="text", tokenizer="t",
                                          max_length=8, stats_table="-", num_rows=0,
                                          shards=[{"file": "shard-00000.parquet", "sha256": digest}]))
        return out

    cache = str(tmp_path / "cache")
    keys = [datasets.load_dataset_builder(str(output(tmp_path / w, d)), cache_dir=cache).cache_dir
            for w, d in (("x", "1" * 64), ("y", "2" * 64), ("z", "1" * 64))]
    assert keys[0] != keys[1] and keys[0] == keys[2]
