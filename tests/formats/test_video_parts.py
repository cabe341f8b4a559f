"""Video parts in every input form: a chat part (clip or frame list, with qwen-vl-utils' options), a top-level
``videos`` pool taken by ``<video>``, LLaVA-Video records, videos inside tree branches; and the rejects."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from packer.core.types import ImageRef, VideoRef
from packer.errors import RecordError
from packer.formats import parse_record
from packer.formats.common import VIDEO_OPTIONS
from packer.models.shared.qwen_video_plan import VideoRequest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("clip.mp4", "other.mp4", "f0.jpg", "f1.jpg", "a.jpg"):
        (tmp_path / name).write_bytes(b"x")  # parsing checks existence only; the header is read when encoding
    return tmp_path


def parse(obj: dict, root: Path):
    return parse_record(obj, path="in.jsonl", line=3, base_dir=str(root))


def parts(example) -> list:
    return [p for node, _ in example.root.walk() for m in node.messages for p in m.parts]


def test_options_are_qwen_vl_utils_names():
    assert set(VIDEO_OPTIONS) == {f.name for f in dataclasses.fields(VideoRequest)}


def test_chat_clip_and_frame_list(root):
    ex = parse({"messages": [
        {"role": "user", "content": [{"type": "video", "video": "clip.mp4", "fps": 1, "video_end": 3.5, "x": "y"},
                                     {"type": "text", "text": "And?"},
                                     {"type": "video", "video": ["f0.jpg", "f1.jpg"], "sample_fps": 2}]},
        {"role": "assistant", "content": "A clip."}]}, root)
    clip, text, frames, answer = parts(ex)
    assert clip == VideoRef(path=str(root / "clip.mp4"), options=(("fps", 1), ("video_end", 3.5)))
    assert frames == VideoRef(frames=(str(root / "f0.jpg"), str(root / "f1.jpg")), options=(("sample_fps", 2),))
    assert (text, answer) == ("And?", "A clip.") and ex.videos == [clip, frames]


def test_pool_placeholders_and_trees(root):
    ex = parse({"messages": [{"role": "user", "content": "<video>\nThis <image> and <video>?"}],
                "videos": ["clip.mp4", ["f0.jpg", "f1.jpg"]], "images": ["a.jpg"],
                "branches": [[{"role": "assistant", "content": "Yes."}],
                             [{"role": "assistant", "content": [{"type": "text", "text": "No: "}]},
                              {"role": "user", "content": [{"type": "video", "video": "other.mp4"}]},
                              {"role": "assistant", "content": "see."}]]}, root)
    got = parts(ex)
    assert got[0] == VideoRef(path=str(root / "clip.mp4")) and got[2] == ImageRef(path=str(root / "a.jpg"))
    assert got[4] == VideoRef(frames=(str(root / "f0.jpg"), str(root / "f1.jpg")))
    assert VideoRef(path=str(root / "other.mp4")) in got  # a video inside a branch
    assert [len(n.messages) for n, _ in ex.root.walk()] == [1, 1, 3]


def test_llava_video_forms(root):
    turns = [{"from": "human", "value": "Describe."}, {"from": "gpt", "value": "Grey."}]
    prepended = parse({"conversations": turns, "video": "clip.mp4"}, root)  # no placeholder: LLaVA's convention
    assert parts(prepended)[:2] == [VideoRef(path=str(root / "clip.mp4")), "\nDescribe."]
    marked = parse({"conversations": [{"from": "human", "value": "<image>\nDescribe."}, turns[1]],
                    "video": "clip.mp4"}, root)  # LLaVA-Video-178K marks its clip with <image>
    assert parts(marked)[:2] == parts(prepended)[:2]
    both = parse({"conversations": [{"from": "human", "value": "<image> then <video>"}, turns[1]],
                  "video": "clip.mp4", "image": "a.jpg"}, root)
    assert parts(both)[:3] == [ImageRef(path=str(root / "a.jpg")), " then ", VideoRef(path=str(root / "clip.mp4"))]


@pytest.mark.parametrize(
    ("content", "top", "reason", "match"),
    [
        ([{"type": "video", "video": "missing.mp4"}], {}, "missing_video", r"video .*missing.mp4 does not exist"),
        ([{"type": "video", "video": "http://x/a.mp4"}], {}, "missing_video", "is a URL; packer works offline"),
        ([{"type": "video", "video": []}], {}, "bad_video", "frame list is empty"),
        ([{"type": "video", "video": ["f0.jpg", "nope.jpg"]}], {}, "missing_image", "frame image .*nope.jpg"),
        ([{"type": "video", "video": "clip.mp4", "fps": "2"}], {}, "wrong_type", "'fps' must be a number"),
        ([{"type": "video", "video": 5}], {}, "wrong_type", "a video source must be a file path"),
        ([{"type": "video"}], {}, "image_count_mismatch", "more video placeholders than videos"),
        ("plain", {"videos": ["clip.mp4"]}, "image_count_mismatch", "lists 1 videos but .* 0 video placeholders"),
    ],
)
def test_rejects(root, content, top, reason, match):
    with pytest.raises(RecordError, match=match) as e:
        parse({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "x"}], **top}, root)
    assert e.value.reason == reason and e.value.line == 3


def test_preference_pairs_bind_the_video_and_audio_pools(root):
    """Every kind that takes placeholders binds every pool: a pair's top-level ``videos`` used to be dropped and
    its ``<video>`` kept as literal text."""
    ex = parse({"videos": ["clip.mp4"], "prompt": [{"role": "user", "content": "<video>What happens?"}],
                "chosen": [{"role": "assistant", "content": "A."}], "rejected": [{"role": "assistant", "content": "B."}]},
               root)
    assert ex.kind == "preference" and ex.videos == [VideoRef(path=str(root / "clip.mp4"))]
    assert [p for m in ex.root.messages for p in m.parts] == [VideoRef(path=str(root / "clip.mp4")), "What happens?"]
    with pytest.raises(RecordError, match="video_count_mismatch|lists 1 videos"):
        parse({"videos": ["clip.mp4"], "prompt": [{"role": "user", "content": "What happens?"}],
               "chosen": [{"role": "assistant", "content": "A."}], "rejected": [{"role": "assistant", "content": "B."}]},
              root)
