"""Property: for random records (chats, LLaVA, plain text, message trees; with and without real COCO images;
random lengths and budgets), build -> verify passes -> every record is either rejected with the reason
``Encoder.encode`` gives it alone, or packed exactly once and recovered token for token."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.config import BuildConfig
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError, RejectRateError
from packer.formats.read import parse_line
from packer.models import get_profile
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.dataset import PackedDataset

MAX_PIXELS = 48 * 28 * 28  # at most 48 vision tokens per image: small rows, real images
IMAGES = ("a.jpg", "b.jpg", "c.jpg")

words = st.text(alphabet="abcdefghij klmnopqrstuvwxyzABC .,?!0123456789éü中", min_size=1, max_size=40)


@st.composite
def content(draw, *, images: bool) -> str | list[dict]:
    text = draw(words)
    if not images or not draw(st.booleans()):
        return text
    parts: list[dict] = [{"type": "image", "image": f"img/{draw(st.sampled_from(IMAGES))}"}]
    if draw(st.booleans()):
        parts.append({"type": "text", "text": text})
    return parts


@st.composite
def message(draw, role: str, *, images: bool = False) -> dict:
    m = {"role": role, "content": draw(content(images=images))}
    if draw(st.integers(0, 9)) == 0:
        m["loss"] = draw(st.booleans())
    return m


@st.composite
def turns(draw, *, images: bool) -> list[dict]:
    msgs = []
    if draw(st.booleans()):
        msgs.append(draw(message("system")))
    for k in range(draw(st.integers(1, 3))):
        msgs.append(draw(message("user", images=images and k == 0)))
        msgs.append(draw(message("assistant")))
    return msgs


@st.composite
def branch(draw, depth: int):
    msgs = [draw(message("assistant"))] if draw(st.booleans()) else [draw(message("user")), draw(message("assistant"))]
    if depth == 0 or draw(st.booleans()):
        return msgs
    return {"messages": msgs, "branches": draw(st.lists(branch(depth - 1), min_size=1, max_size=2))}


@st.composite
def record(draw) -> dict:
    kind = draw(st.sampled_from(["chat", "chat", "tree", "llava", "text"]))
    images = draw(st.booleans())
    if kind == "chat":
        return {"messages": draw(turns(images=images))}
    if kind == "tree":
        prefix = [draw(message("user", images=images))]
        return {"messages": prefix, "branches": draw(st.lists(branch(2), min_size=1, max_size=3))}
    if kind == "llava":
        n = draw(st.integers(0, 2)) if images else 0
        first = "<image>\n" * n + draw(words)
        conv = [{"from": "human", "value": first}, {"from": "gpt", "value": draw(words)}]
        rec: dict = {"conversations": conv}
        if n:
            rec["image"] = [f"img/{draw(st.sampled_from(IMAGES))}" for _ in range(n)]
        return rec
    return {"text": " ".join(draw(st.lists(words, min_size=1, max_size=30)))}


@pytest.fixture(scope="module")
def image_dir(coco_images, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("props")
    for name, src in zip(IMAGES, coco_images[:3], strict=True):
        shutil.copy(src, root / name)
    return root


def _examples_in(out: Path) -> dict[str, dict]:
    """Every packed example, cut out of its row and made example-relative."""
    got: dict[str, dict] = {}
    for row in PackedDataset(out, shuffle=False, load_images=False):
        cu, nodes, parents = row["cu_seqlens"], row["node_offsets"], row["node_parents"]
        for k, ex_id in enumerate(row["example_ids"]):
            lo, hi = int(cu[k]), int(cu[k + 1])
            sel = (nodes >= lo) & (nodes < hi)
            first = int(np.flatnonzero(sel)[0])
            assert ex_id not in got
            got[ex_id] = {
                "input_ids": row["input_ids"][lo:hi], "labels": row["labels"][lo:hi],
                "position_ids": row["position_ids"][lo:hi],
                "mrope": row["mrope_position_ids"][:, lo:hi],
                "node_offsets": nodes[sel] - lo,
                "node_parents": np.where(parents[sel] < 0, -1, parents[sel] - first),
                "images": [(im["source"], (im["grid_t"], im["grid_h"], im["grid_w"]), im["offset"] - lo, im["num_tokens"])
                           for im in row["images"] if lo <= im["offset"] < hi],
            }
    return got


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records=st.lists(record(), min_size=1, max_size=12),
       max_length=st.sampled_from([48, 160, 600]), overlong=st.sampled_from(["drop", "truncate"]),
       rows_per_shard=st.integers(1, 4), seed=st.integers(0, 3))
def test_build_verify_and_recover_every_example(image_dir, records, max_length, overlong, rows_per_shard, seed):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "img").symlink_to(image_dir)
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2-vl", max_length=max_length,
                                         max_pixels=MAX_PIXELS, overlong=overlong, rows_per_shard=rows_per_shard,
                                         rows_per_row_group=2, seed=seed)
        encoder = Encoder(load_tokenizer("qwen2-vl"), get_profile("qwen2-vl", max_pixels=MAX_PIXELS),
                          max_length=max_length, overlong=overlong)
        if not any(_encodes(encoder, raw, data, line, root)
                   for line, raw in enumerate(data.read_bytes().splitlines(), start=1)):
            # every record rejected: a build of nothing fails loudly, whatever --max-reject-fraction says
            with pytest.raises(RejectRateError, match="nothing to pack"):
                build(config, progress=False)
            return
        result = build(config, progress=False)
        report = verify_build(root / "out", inputs=[str(data)])
        assert report.ok, report.lines()

        got = _examples_in(root / "out")
        rejects = {r["line"]: r["reason"] for r in map(json.loads, (root / "out" / "rejects.jsonl").open())}
        for line, raw in enumerate(data.read_bytes().splitlines(), start=1):
            try:
                enc = encoder.encode(parse_line(raw, path=str(data), line=line, base_dir=str(root)))
            except RecordError as e:
                assert rejects.get(line) == e.reason and f"{data}:{line}" not in got
                continue
            assert line not in rejects
            g = got.pop(f"{data}:{line}")
            np.testing.assert_array_equal(g["input_ids"], enc.input_ids)
            np.testing.assert_array_equal(g["labels"], enc.labels)
            np.testing.assert_array_equal(g["position_ids"], enc.position_ids)
            np.testing.assert_array_equal(g["mrope"], enc.mrope_position_ids)
            np.testing.assert_array_equal(g["node_offsets"], enc.node_offsets)
            np.testing.assert_array_equal(g["node_parents"], enc.node_parents)
            assert g["images"] == [(im.source, im.grid_thw, im.offset, im.num_tokens) for im in enc.images]
        assert not got  # nothing packed that is not an input record
        assert result.manifest["totals"]["input_records"] == len(records)


def _encodes(encoder: Encoder, raw: bytes, data: Path, line: int, root: Path) -> bool:
    """Does the record on ``line`` encode (no RecordError)?"""
    try:
        encoder.encode(parse_line(raw, path=str(data), line=line, base_dir=str(root)))
    except RecordError:
        return False
    return True
