"""The Cauldron's Parquet (HuggingFaceM4/the_cauldron's features: ``images`` a sequence of ``datasets.Image``,
``texts`` a list of ``{user, assistant, source}``), written by ``datasets`` with real COCO JPEG and PNG bytes,
packs to exactly what its JSONL twin (packer's own chat records, the images as data URLs) packs to."""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image as PILImage

from packer.cli import cli
from packer.errors import RecordError
from packer.formats import parse_record

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def images(coco_images) -> list[tuple[bytes, str]]:
    """(bytes, mime) of one COCO JPEG as it is and one COCO photo re-saved as PNG."""
    jpeg = coco_images[0].read_bytes()
    buf = io.BytesIO()
    PILImage.open(coco_images[1]).convert("RGB").resize((96, 64)).save(buf, format="PNG")
    return [(jpeg, "image/jpeg"), (buf.getvalue(), "image/png")]


def _rows(images):
    (jpeg, _), (png, _) = images
    return [
        {"images": [{"bytes": jpeg, "path": None}],
         "texts": [{"user": "What is shown?", "assistant": "A street.", "source": "coco"}]},
        {"images": [{"bytes": jpeg, "path": None}, {"bytes": png, "path": None}],
         "texts": [{"user": "Compare the two images.", "assistant": "The second is smaller.", "source": "coco"},
                   {"user": "Which is a PNG?", "assistant": "The second.", "source": "coco"}]},
        {"images": [], "texts": [{"user": "Say hi.", "assistant": "Hi.", "source": "text"}]},
        {"images": [{"bytes": jpeg, "path": None}], "texts": []},  # row 4: no turn at all
    ]


def _twin(row: dict, images) -> dict:
    mime = {b: m for b, m in images}
    urls = [f"data:{mime[im['bytes']]};base64," + base64.b64encode(im["bytes"]).decode() for im in row["images"]]
    messages = []
    for i, t in enumerate(row["texts"]):
        parts = [{"type": "image", "image": u} for u in urls] if i == 0 else []
        messages += [{"role": "user", "content": parts + [{"type": "text", "text": t["user"]}]},
                     {"role": "assistant", "content": t["assistant"]}]
    return {"messages": messages}


def test_cauldron_parquet_packs_what_its_jsonl_twin_packs(tmp_path, images):
    from datasets import Dataset, Features, Image, Sequence, Value

    features = Features({"images": Sequence(Image()), "texts": [
        {"user": Value("string"), "assistant": Value("string"), "source": Value("string")}]})
    rows = _rows(images)
    Dataset.from_list(rows, features=features).to_parquet(str(tmp_path / "cauldron.parquet"))
    (tmp_path / "twin.jsonl").write_text("".join(json.dumps(_twin(r, images)) + "\n" for r in rows[:3]))
    common = ["--profile", "qwen2-vl", "--max-pixels", str(64 * 28 * 28), "--max-length", "2048", "-q"]
    tables = []
    for name in ("cauldron.parquet", "twin.jsonl"):
        got = CliRunner().invoke(cli, ["build", str(tmp_path / name), "-o", str(tmp_path / name.split(".")[0]), *common])
        assert got.exit_code == 0, got.output
        tables.append(pq.read_table(next((tmp_path / name.split(".")[0]).glob("shard-*.parquet")))
                      .drop_columns(["example_ids"]).to_pylist())
    assert tables[0] == tables[1]
    stored = [im["data"] for r in tables[0] for im in r["images"]]
    assert sorted(stored) == sorted([images[0][0], images[0][0], images[1][0]])  # embedded bytes, kept as they are
    rejects = [json.loads(line) for line in (tmp_path / "cauldron" / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["path"]).name, r["line"], r["reason"]) for r in rejects] == [
        ("cauldron.parquet", 4, "empty_messages")]
    check = CliRunner().invoke(cli, ["verify", str(tmp_path / "cauldron"), "--input", str(tmp_path / "cauldron.parquet")])
    assert check.exit_code == 0, check.output


def test_a_bad_turn_is_a_reject_naming_it(tmp_path):
    with pytest.raises(RecordError, match=r"texts\[1\] must be") as e:
        parse_record({"images": [], "texts": [{"user": "a", "assistant": "b"}, {"user": "c"}]}, path="c.parquet",
                     line=9, base_dir=str(tmp_path))
    assert e.value.reason == "wrong_type" and e.value.line == 9
