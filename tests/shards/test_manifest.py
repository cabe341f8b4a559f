"""packer.shards.schema.Manifest: manifest.json as a typed, frozen object; the round trip is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packer.config import BuildConfig
from packer.errors import ShardError
from packer.pipeline.build import build
from packer.shards.io import open_shards
from packer.shards.schema import MANIFEST, Manifest

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."}]}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    data = root / "data.jsonl"
    data.write_text(json.dumps(CHAT) + "\n" + json.dumps({"text": "Plain text."}) + "\n{broken\n")
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2-vl", max_length=256)
    build(config, progress=False)
    return root / "out"


def _raw(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def test_round_trip_of_a_real_build_is_exact(built):
    raw = _raw(built)
    manifest = Manifest.from_dict(raw)
    assert manifest.to_dict() == raw  # key for key, value for value
    assert json.dumps(manifest.to_dict(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    opened = open_shards(built).manifest
    assert opened == manifest
    assert opened.profile == "qwen2-vl" and opened.config.max_length == 256 and opened.image_token_id == 151655
    assert opened.totals.rejected == 1 and opened.totals.rejects_by_reason == {"malformed_json": 1}
    assert opened.tokenizer.name == "qwen2-vl" and opened.shards[0].file == "shard-00000.parquet"


def _broken(raw: dict, path: list, value=None, *, delete: bool = False) -> dict:
    out = json.loads(json.dumps(raw))
    node = out
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "delete", "match"),
    [
        (["profile"], None, True, "has no 'profile'"),
        (["config"], None, True, "has no 'config'"),
        (["shards"], None, True, "has no 'shards'"),
        (["shards", 0, "rows"], None, True, r"'shards'\[0\] has no 'rows'"),
        (["shards", 0, "rows"], True, False, "'rows' is True, not int"),
        (["shards", 0], "shard-00000.parquet", False, "not an object with file, rows"),
        (["totals", "tokens"], "many", False, "'tokens' is 'many', not int"),
        (["tokenizer", "name"], None, True, "'tokenizer' has no 'name'"),
        (["inputs"], [1], False, "'inputs' must list file paths"),
        (["config", "max_lenght"], 5, False, "'config' is not a build config.*did you mean 'max_length'"),
        (["schema_version"], 1, False, "shard schema v1; this packer reads v2, v3, v4"),
    ],
)
def test_a_key_a_reader_needs_is_named(built, path, value, delete, match):
    with pytest.raises(ShardError, match=match):
        Manifest.from_dict(_broken(_raw(built), path, value, delete=delete), where="m.json")


def test_optional_keys_default_to_none(built):
    raw = _raw(built)
    for key in ("packer_version", "fingerprint", "tokenizer", "chat_template_sha256", "inputs", "base_dir",
                "image_token_id", "totals"):
        raw.pop(key)
    manifest = Manifest.from_dict(raw)
    assert manifest.tokenizer is None and manifest.totals is None and manifest.inputs == ()
    assert manifest.base_dir is None and manifest.resolve("x.jsonl") == str(Path.cwd() / "x.jsonl")
