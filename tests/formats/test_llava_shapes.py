"""The LLaVA shapes people download, as their files hold them: LLaVA-Instruct-150K (``<image>`` at the end of
the first human turn, image named by file name), ShareGPT4V (image paths relative to a data root: ``--image-root``),
llava_v1_5_mix665k's text-only records (no ``image``) and multi-image LLaVA-OneVision records (``image`` a
list). Each packs exactly as the same record written as packer's chat messages, the image where the text puts it."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
from click.testing import CliRunner

from packer.cli import cli
from tests.formats.conftest import IMG_A, IMG_B

LLAVA = [
    # LLaVA-Instruct-150K (llava_instruct_150k.json): the image by file name, <image> after the question
    {"id": "000000033471", "image": "coco/train2017/000000033471.jpg",
     "conversations": [{"from": "human", "value": "What are the colors of the bus in the image?\n<image>"},
                       {"from": "gpt", "value": "The bus in the image is white and red."},
                       {"from": "human", "value": "What feature can be seen on the back of the bus?"},
                       {"from": "gpt", "value": "The back of the bus features an advertisement."}]},
    # ShareGPT4V (share-captioner_coco_lcs_sam_1246k_1107.json): <image> first, a path under the data root
    {"id": "sa_545504", "image": "sam/images/sa_545504.jpg",
     "conversations": [{"from": "human", "value": "<image>\nWhat do you see happening in this image?"},
                       {"from": "gpt", "value": "The image shows a street scene."}]},
    # llava_v1_5_mix665k: a text-only ShareGPT record (no image), an integer-like id
    {"id": "i6IyJda_0", "conversations": [{"from": "human", "value": "Hi, what is 2+2?"},
                                          {"from": "gpt", "value": "4."}]},
    # LLaVA-OneVision: several images, one placeholder each
    {"id": 7, "image": ["coco/train2017/000000033471.jpg", "sam/images/sa_545504.jpg"],
     "conversations": [{"from": "human", "value": "<image>\n<image>\nAre these the same scene?"},
                       {"from": "gpt", "value": "No."}]},
]


def _native(rec: dict) -> dict:
    """The same record as packer chat messages, each image part where its placeholder is."""
    images = rec.get("image", [])
    images = [images] if isinstance(images, str) else list(images)
    messages = []
    for turn in rec["conversations"]:
        pieces = turn["value"].split("<image>")
        content = []
        for k, piece in enumerate(pieces):
            if k:
                content.append({"type": "image", "image": images.pop(0)})
            if piece:
                content.append({"type": "text", "text": piece})
        messages.append({"role": {"human": "user", "gpt": "assistant"}[turn["from"]], "content": content})
    return {"messages": messages}


def test_llava_shapes_pack_as_their_chat_twins(tmp_path):
    root = tmp_path / "data_root"  # the downloads' image root, apart from the annotation file
    for rel, src in (("coco/train2017/000000033471.jpg", IMG_A), ("sam/images/sa_545504.jpg", IMG_B)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / rel)
    (tmp_path / "llava.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LLAVA))
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(_native(r)) + "\n" for r in LLAVA))
    common = ["--profile", "qwen2-vl", "--max-pixels", str(64 * 28 * 28), "--max-length", "2048", "--image-root",
              str(root), "-q"]
    tables = []
    for name in ("llava", "chat"):
        got = CliRunner().invoke(cli, ["build", str(tmp_path / f"{name}.jsonl"), "-o", str(tmp_path / name), *common])
        assert got.exit_code == 0, got.output
        assert not (tmp_path / name / "rejects.jsonl").read_text()
        tables.append(pq.read_table(next((tmp_path / name).glob("shard-*.parquet")))
                      .drop_columns(["example_ids"]).to_pylist())
    assert tables[0] == tables[1]
    assert sum(len(r["images"]) for r in tables[0]) == 4
