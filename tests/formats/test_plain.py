"""The plain-record fast path (formats/plain.py) against ``parse_record``, its reference: on random records, plain
and nearly plain (a role, a key, a part, an image, a branch off), the fast path gives ``parse_record``'s Example
or None, never another Example; and ``parse_line`` with it gives what it gives with the general path alone."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import ImageRef
from packer.errors import RecordError
from packer.formats import parse_record, read
from packer.formats.plain import parse_plain
from tests.formats.conftest import IMG_A, IMG_B

ROLE = st.sampled_from(["user", "assistant", "system", "tool", "human", "gpt", "bot", 3, None])
TEXT = st.sampled_from(["hi", "", " a <image> b ", "\ue000x", "long " * 5])
# "ROOT/": the images directory's absolute path (``_rooted``): an absolute path is taken as it is, unnormalized
IMAGE = st.sampled_from(["a.jpg", "sub/b.jpg", "missing.jpg", "", "http://x/a.jpg", "sub", 5, None, "./sub//b.jpg",
                         "sub/../a.jpg", "a:b.jpg", "ROOT/a.jpg", "ROOT/sub/../a.jpg", "ROOT/sub", "ROOT/missing.jpg",
                         "file://ROOT/a.jpg", "data:image/png;base64,", "a.jpg\x00"])
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(TEXT, st.just(7))}),
    st.fixed_dictionaries({"type": st.just("image"), "image": IMAGE}),
    st.fixed_dictionaries({"type": st.just("image")}),
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT, "extra": st.just(1)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.just("a.jpg")}),
    st.fixed_dictionaries({"text": TEXT, "value": TEXT}),
    st.just("not a part"),
)
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=3), st.just(None), st.just(5))
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT}),
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT, "loss": st.sampled_from([True, False, 0.5])}),
    st.fixed_dictionaries({"role": ROLE}),
    st.fixed_dictionaries({"role": ROLE, "name": st.just("x")}),
    st.just(["user", "hi"]),
)
PLAIN_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "human", "gpt"]),
                                       "content": st.one_of(TEXT, st.lists(PART, min_size=1, max_size=3))})
MESSAGES = st.lists(st.one_of(PLAIN_MESSAGE, PLAIN_MESSAGE, MESSAGE), max_size=4)
BRANCH = st.one_of(MESSAGES, st.fixed_dictionaries({"messages": MESSAGES}), st.just("x"))
RECORD = st.one_of(
    st.fixed_dictionaries({"messages": MESSAGES}),
    st.fixed_dictionaries({"messages": MESSAGES, "branches": st.one_of(st.lists(BRANCH, max_size=3), st.just(None),
                                                                       st.just({}))}),
    st.fixed_dictionaries({"messages": MESSAGES, "id": st.sampled_from(["r1", 7, True, 1.5, None, [1]])}),
    st.fixed_dictionaries({"messages": MESSAGES, "system": st.sampled_from(["Be brief.", "", None])}),
    st.fixed_dictionaries({"messages": MESSAGES, "images": st.just(["a.jpg"])}),
    st.fixed_dictionaries({"messages": MESSAGES, "tools": st.just([])}),
    st.fixed_dictionaries({"text": st.one_of(TEXT, st.just(3))}),
    st.fixed_dictionaries({"text": TEXT, "id": st.sampled_from(["t", 2, None])}),
    st.fixed_dictionaries({"text": TEXT, "conversations": st.just([])}),
    st.just([1, 2]),
)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    """A directory holding two real COCO images as a.jpg and sub/b.jpg (for every generated record alike)."""
    root = tmp_path_factory.mktemp("plain")
    (root / "sub").mkdir()
    shutil.copy(IMG_A, root / "a.jpg")
    shutil.copy(IMG_B, root / "sub" / "b.jpg")
    return str(root)


def _rooted(obj, root: str):
    """``obj`` with each string's ``ROOT/`` made the images directory's absolute path."""
    if isinstance(obj, dict):
        return {k: _rooted(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rooted(v, root) for v in obj]
    return obj.replace("ROOT/", root + "/") if isinstance(obj, str) else obj


def _general(obj, root):
    try:
        return parse_record(obj, path="f.jsonl", line=3, base_dir=root, source_name="src")
    except RecordError as e:
        return ("reject", e.reason, e.message)


@settings(max_examples=400, deadline=None)
@given(obj=RECORD)
def test_plain_is_parse_record_or_none(obj, images):
    root = images
    obj = _rooted(obj, root)
    fast = parse_plain(obj, path="f.jsonl", line=3, root_dir=root, source_name="src")
    if fast is not None:
        assert fast == _general(obj, root)


def test_plain_takes_the_common_records(imgdir):
    """The shapes bench_build's corpus and most chat data have: a linear chat, an image part, a tree, a text."""
    root = str(imgdir)
    chats = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"},
                                                   {"type": "text", "text": "What is it?"}]},
                      {"role": "assistant", "content": "A bus."}], "id": "r7"},
        {"messages": [{"role": "human", "content": [{"type": "image", "image": "sub/b.jpg"}]}],
         "branches": [[{"role": "gpt", "content": "One."}], [{"role": "gpt", "content": "Two."}]]},
        {"text": "Plain text."},
    ]
    for obj in chats:
        fast = parse_plain(obj, path="f.jsonl", line=3, root_dir=root, source_name="src")
        assert fast is not None and fast == _general(obj, root)
    image = parse_plain(chats[1], path="f.jsonl", line=3, root_dir=root).root.messages[0].parts[0]
    assert image == ImageRef(path=os.path.join(root, "a.jpg"))


def test_plain_leaves_what_it_cannot_prove(imgdir):
    """Each of these is the general path's: a reject it words, or a default another field sets."""
    root = str(imgdir)
    for obj in [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "missing.jpg"}]}]},  # missing_image
        {"messages": [{"role": "user", "content": ""}]},  # empty_messages
        {"messages": [{"role": "bot", "content": "x"}]},  # unknown_role
        {"messages": [{"role": "user", "content": "x", "loss": True}]},
        {"messages": [{"role": "user", "content": "<image>"}], "images": ["a.jpg"]},
        {"messages": [{"role": "user", "content": "x"}], "system": "Be brief."},
        {"messages": [{"role": "user", "content": "x"}], "branches": [[]]},  # empty_branch
        {"messages": [{"role": "user", "content": "x"}], "id": 1.5},
        {"text": ""},
    ]:
        assert parse_plain(obj, path="f.jsonl", line=3, root_dir=root) is None, obj


@settings(max_examples=150, deadline=None)
@given(obj=RECORD)
def test_parse_line_equals_the_general_path(obj, images):
    """End to end: ``parse_line`` (orjson, then the fast path) against json and ``parse_record`` alone."""
    import json

    raw = json.dumps(_rooted(obj, images)).encode()

    def run():
        try:
            return read.parse_line(raw, path="f.jsonl", line=3, base_dir=images, source_name="src")
        except RecordError as e:
            return ("reject", e.reason, e.message, e.path, e.line)

    fast = run()
    saved, read.orjson = read.orjson, None  # the json branch never takes the fast path
    try:
        slow = run()
    finally:
        read.orjson = saved
    assert fast == slow


def test_plain_lookups_refuse_what_a_type_test_refused(imgdir):
    """``_messages`` reads a message by its two lookups, not by a type test of the message and its role: every
    JSON value a type test refused is refused by them (a 2-character string or a 2-item list as a message, a
    number, boolean, null, list or dict as a role), and a record of one key is read without the id check."""
    root = str(imgdir)
    for msg in ["ab", ["user", "hi"], {"role": 1, "content": "x"}, {"role": True, "content": "x"},
                {"role": None, "content": "x"}, {"role": ["user"], "content": "x"}, {"role": {"a": 1}, "content": "x"},
                {"role": "user", "text": "x"}, {"content": "x", "name": "user"}, 2, None]:
        obj = {"messages": [{"role": "user", "content": "Hi"}, msg]}
        assert parse_plain(obj, path="f.jsonl", line=3, root_dir=root) is None, msg
    for obj in [{"messages": None}, {"messages": None, "id": "r"}, {"messages": None, "text": "x"}, {"id": "r"},
                {"branches": []}, {"text": "x", "messages": [{"role": "user", "content": "Hi"}]}]:
        assert parse_plain(obj, path="f.jsonl", line=3, root_dir=root) is None, obj
    for obj in [{"messages": [{"role": "gpt", "content": "Hi"}]}, {"text": "x"}, {"text": "x", "id": 3},
                {"messages": [{"role": "user", "content": "Hi"}], "id": "r", "branches": None}]:
        fast = parse_plain(obj, path="f.jsonl", line=3, root_dir=root, source_name="src")
        assert fast is not None and fast == _general(obj, root), obj
