"""LLaMA-Factory v1's samples (content parts with ``"value"`` beside ``"type"``, ``image_url`` / ``video_url`` /
``audio_url``, ``tool_call`` parts, per-message ``loss_weight``, ``chosen_messages`` / ``rejected_messages``) and
OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}`` read as packer's own chat records, and pack to the
same rows (tests/data/llamafactory/v1_demo.jsonl: LLaMA-Factory's own records, Apache-2.0)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.core.types import ImageRef, VideoRef
from packer.errors import RecordError
from packer.formats import parse_record
from tests.formats.conftest import IMG_A, IMG_B

V1 = [json.loads(line) for line in (Path(__file__).parents[1] / "data" / "llamafactory" / "v1_demo.jsonl")
      .read_text().splitlines()]


def parse(obj: dict, root: Path):
    return parse_record(obj, path="v1.jsonl", line=3, base_dir=str(root))


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A directory laid out as LLaMA-Factory's repository root: data/mllm_demo_data/1..3.jpg (real COCO)."""
    (tmp_path / "data" / "mllm_demo_data").mkdir(parents=True)
    for name, src in (("1.jpg", IMG_A), ("2.jpg", IMG_B), ("3.jpg", IMG_A)):
        shutil.copy(src, tmp_path / "data" / "mllm_demo_data" / name)
    return tmp_path


def test_value_parts_are_text_and_image_urls(repo):
    ex = parse(V1[0], repo)
    first = ex.root.messages[0]
    assert isinstance(first.parts[0], ImageRef) and first.parts[0].path == str(repo / "data/mllm_demo_data/1.jpg")
    assert first.parts[1] == "Who are they?"
    assert [len(m.images) for m in ex.root.messages] == [1, 0, 1, 0]


def test_loss_weight_is_the_message_loss():
    ex = parse(V1[2], Path("."))
    assert [(m.role, m.loss) for m in ex.root.messages] == [("user", False), ("assistant", True)]
    half = {"messages": [{"role": "user", "content": [{"type": "text", "value": "q"}]},
                         {"role": "assistant", "content": [{"type": "text", "value": "a"}], "loss_weight": 0.5}]}
    assert parse(half, Path(".")).root.messages[1].loss == 0.5


def test_chosen_and_rejected_messages_are_a_preference_tree_with_the_common_prefix_as_prompt():
    ex = parse(V1[4], Path("."))
    assert [m.role for m in ex.root.messages] == ["system", "user"]
    assert [[m.role for m in c.messages] for c in ex.root.children] == [["assistant"], ["assistant"]]
    assert ex.root.children[0].messages[0].parts[0].startswith("When you fall in love")


def test_tool_call_parts_and_a_tools_json_string():
    rec = {"tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}]),
           "messages": [{"role": "user", "content": [{"type": "text", "value": "Weather?"}]},
                        {"role": "assistant", "content": [{"type": "tool_call", "value": json.dumps(
                            {"name": "get_weather", "arguments": {"city": "Paris"}})}]},
                        {"role": "tool", "content": [{"type": "text", "value": "18 C"}]},
                        {"role": "assistant", "content": [{"type": "text", "value": "18 C."}]}]}
    ex = parse(rec, Path("."))
    assert ex.tools == [{"type": "function", "function": {"name": "get_weather",
                                                         "parameters": {"type": "object", "properties": {}}}}]
    call = ex.root.messages[1]
    assert call.parts == [] and call.tool_calls == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


def test_video_and_audio_urls_with_value_or_url(repo, tmp_path):
    clip = tmp_path / "c.mp4"
    clip.write_bytes(b"\0")  # parsing checks only that the file is there; the header is read when encoding
    for part in ({"type": "video_url", "value": "c.mp4"}, {"type": "video_url", "video_url": {"url": "c.mp4"}}):
        ex = parse({"messages": [{"role": "user", "content": [part]}, {"role": "assistant", "content": "x"}]}, tmp_path)
        assert ex.root.messages[0].parts == [VideoRef(path=str(clip))]
    wav = tmp_path / "a.wav"
    wav.write_bytes(b"\0")
    ex = parse({"messages": [{"role": "user", "content": [{"type": "audio_url", "value": "a.wav"}]},
                             {"role": "assistant", "content": "x"}]}, tmp_path)
    assert ex.root.messages[0].parts[0].path == str(wav)


@pytest.mark.parametrize(("part", "match"), [
    ({"type": "image_url", "value": "missing.jpg"}, "missing.jpg does not exist"),
    ({"type": "reasoning", "value": "hmm"}, "unsupported type 'reasoning'"),
    ({"type": "tool_call", "value": "get()"}, r"part 0 \(tool_call\) is not JSON"),
])
def test_bad_v1_parts_are_rejects_at_their_line(repo, part, match):
    role = "assistant" if part["type"] == "tool_call" else "user"
    rec = {"messages": [{"role": "user", "content": "q"}, {"role": role, "content": [part]}]}
    with pytest.raises(RecordError, match=match) as e:
        parse(rec, repo)
    assert e.value.line == 3


NATIVE = [
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "data/mllm_demo_data/1.jpg"},
                                               {"type": "text", "text": "Who are they?"}]},
                  {"role": "assistant", "content": "They're Kane and Gretzka from Bayern Munich."},
                  {"role": "user", "content": [{"type": "text", "text": "What are they doing?"},
                                               {"type": "image_url", "image_url": {"url": "data/mllm_demo_data/1.jpg"}}]},
                  {"role": "assistant", "content": "They are celebrating on the soccer field."}]},
    {"messages": [{"role": "user", "content": "<image>Who is he?"},
                  {"role": "assistant", "content": "He's Thomas Muller from Bayern Munich."},
                  {"role": "user", "content": "Why is he on the ground?"},
                  {"role": "assistant", "content": "Because he's sliding on his knees to celebrate."}],
     "images": ["data/mllm_demo_data/2.jpg"]},
]


def test_v1_records_pack_what_their_native_twins_pack(repo, tmp_path):
    (repo / "v1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in V1[:2]))
    (repo / "native.jsonl").write_text("".join(json.dumps(r) + "\n" for r in NATIVE))
    common = ["--profile", "qwen2-vl", "--max-pixels", str(64 * 28 * 28), "--max-length", "2048", "-q"]
    rows = []
    for name in ("v1", "native"):
        got = CliRunner().invoke(cli, ["build", str(repo / f"{name}.jsonl"), "-o", str(tmp_path / name), *common])
        assert got.exit_code == 0, got.output
        table = pq.read_table(next((tmp_path / name).glob("shard-*.parquet"))).drop_columns(["example_ids"])
        rows.append(table.to_pylist())
    assert rows[0] == rows[1] and sum(len(r["images"]) for r in rows[0]) == 3
