"""Input kinds (packer/formats): every kind -> exact Example trees through the registry; every reject reason
with its location."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from packer.core.types import Example, ImageRef, Message, Node
from packer.errors import RecordError
from packer.formats import KINDS, parse_record
from packer.formats.common import Ctx, chat_messages
from tests.formats.conftest import IMG_A


def parse(obj, base_dir: Path, **kw) -> Example:
    return parse_record(obj, path="in.jsonl", line=7, base_dir=str(base_dir), **kw)


def shape(node: Node) -> list:
    """A node as nested plain data: [[(role, parts, loss), ...], [children...]]."""
    return [[(m.role, m.parts, m.loss) for m in node.messages], [shape(c) for c in node.children]]


# ---------------------------------------------------------------- formats


def test_messages_string_and_parts(imgdir: Path):
    rec = {
        "id": "r1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "What?"}],
            },
            {"role": "assistant", "content": "A cat.", "loss": False},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "sub/b.jpg"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A dog."}]},
        ],
    }
    ex = parse(rec, imgdir, source_name="mix")
    a, b = ImageRef(path=str(imgdir / "a.jpg")), ImageRef(path=str(imgdir / "sub" / "b.jpg"))
    assert ex.kind == "messages" and ex.example_id == "in.jsonl:7" and ex.source_name == "mix"
    assert shape(ex.root) == [
        [
            ("system", ["Be brief."], None),
            ("user", [a, "What?"], None),
            ("assistant", ["A cat."], False),
            ("user", [b], None),
            ("assistant", ["A dog."], None),
        ],
        [],
    ]
    assert ex.images == [a, b]


def test_text_record(tmp_path: Path):
    ex = parse({"text": "Once upon a time."}, tmp_path)
    assert ex.kind == "text" and ex.text == "Once upon a time." and ex.root.messages == [] and ex.images == []


def test_priority_messages_over_text(tmp_path: Path):
    ex = parse({"messages": [{"role": "user", "content": "hi"}], "text": "ignored"}, tmp_path)
    assert ex.kind == "messages" and ex.text is None


def test_llava_with_placeholders(imgdir: Path):
    rec = {
        "id": 12,
        "image": "a.jpg",
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "<image>\nDescribe."},
            {"from": "gpt", "value": "A plane."},
            {"from": "human", "value": "More?", "loss": True},
            {"from": "gpt", "value": "No.", "loss": False},
        ],
    }
    ex = parse(rec, imgdir)
    a = ImageRef(path=str(imgdir / "a.jpg"))
    assert ex.kind == "llava"
    assert shape(ex.root) == [
        [
            ("system", ["sys"], None),
            ("user", [a, "\nDescribe."], None),
            ("assistant", ["A plane."], None),
            ("user", ["More?"], True),
            ("assistant", ["No."], False),
        ],
        [],
    ]


def test_llava_image_list_placeholders_in_order(imgdir: Path):
    rec = {
        "images": ["a.jpg", "sub/b.jpg"],
        "conversations": [
            {"from": "human", "value": "first <image> then <image>"},
            {"from": "gpt", "value": "ok"},
        ],
    }
    a, b = ImageRef(path=str(imgdir / "a.jpg")), ImageRef(path=str(imgdir / "sub" / "b.jpg"))
    assert parse(rec, imgdir).root.messages[0].parts == ["first ", a, " then ", b]


def test_llava_without_placeholder_prepends_to_first_human(imgdir: Path):
    """LLaVA's convention: images with no <image> go first in the first human turn, each followed by \\n."""
    rec = {
        "image": ["a.jpg", "sub/b.jpg"],
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "Compare."},
            {"from": "gpt", "value": "Same."},
        ],
    }
    a, b = ImageRef(path=str(imgdir / "a.jpg")), ImageRef(path=str(imgdir / "sub" / "b.jpg"))
    msgs = parse(rec, imgdir).root.messages
    assert msgs[0].parts == ["sys"]
    assert msgs[1].parts == [a, "\n", b, "\nCompare."]


def test_messages_with_top_level_images(imgdir: Path):
    """LLaMA-Factory style: <image> in text and source-less image parts take the top-level images in order."""
    rec = {
        "images": ["a.jpg", "sub/b.jpg"],
        "messages": [
            {"role": "user", "content": "<image>What is this?"},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this?"}]},
            {"role": "assistant", "content": "y"},
        ],
    }
    a, b = ImageRef(path=str(imgdir / "a.jpg")), ImageRef(path=str(imgdir / "sub" / "b.jpg"))
    msgs = parse(rec, imgdir).root.messages
    assert msgs[0].parts == [a, "What is this?"] and msgs[2].parts == [b, "And this?"]


def test_image_placeholder_is_text_without_images(tmp_path: Path):
    """A messages record with no top-level images keeps a literal "<image>" as text."""
    ex = parse({"messages": [{"role": "user", "content": "<image> tag"}]}, tmp_path)
    assert ex.root.messages[0].parts == ["<image> tag"]


def test_tree_nested(tmp_path: Path):
    def m(role: str, text: str) -> dict:
        return {"role": role, "content": text}

    rec = {
        "messages": [m("user", "Q")],
        "branches": [
            [m("assistant", "A1")],
            {
                "messages": [m("assistant", "A2")],
                "branches": [[m("user", "Q2a"), m("assistant", "A2a")], {"messages": [m("user", "Q2b")]}],
            },
            [m("assistant", "A3")],
        ],
    }
    ex = parse(rec, tmp_path)
    U, A = "user", "assistant"
    assert shape(ex.root) == [
        [(U, ["Q"], None)],
        [
            [[(A, ["A1"], None)], []],
            [
                [(A, ["A2"], None)],
                [[[(U, ["Q2a"], None), (A, ["A2a"], None)], []], [[(U, ["Q2b"], None)], []]],
            ],
            [[(A, ["A3"], None)], []],
        ],
    ]
    # depth-first order with parent indices, as the encoder lays the nodes out
    order = [(n.messages[0].parts[0], p) for n, p in ex.root.walk()]
    assert order == [("Q", -1), ("A1", 0), ("A2", 0), ("Q2a", 2), ("Q2b", 2), ("A3", 0)]


def test_empty_branches_list_is_linear(tmp_path: Path):
    ex = parse({"messages": [{"role": "user", "content": "q"}], "branches": []}, tmp_path)
    assert ex.root.children == []


# ---------------------------------------------------------------- image paths


def test_image_root_and_absolute(imgdir: Path, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere")
    rec = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": "sub/b.jpg"}, {"type": "image", "image": str(IMG_A)}],
            }
        ]
    }
    ex = parse(rec, other, image_root=str(imgdir))
    assert ex.images == [ImageRef(path=str(imgdir / "sub" / "b.jpg")), ImageRef(path=str(IMG_A))]
    with pytest.raises(
        RecordError, match=r"in.jsonl:7: missing_image: image .*elsewhere\d*/sub/b.jpg does not exist"
    ):
        parse(rec, other)


def test_relative_paths_normalised_and_file_url(imgdir: Path):
    rec = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "sub/../a.jpg"},
                    {"type": "image", "image": "file://" + str(imgdir / "a.jpg")},
                ],
            }
        ]
    }
    assert parse(rec, imgdir).images == [ImageRef(path=str(imgdir / "a.jpg"))] * 2


def test_inline_base64(tmp_path: Path):
    raw = IMG_A.read_bytes()
    url = "data:image/jpeg;base64," + base64.b64encode(raw).decode()
    rec = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": url}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        ]
    }
    ex = parse(rec, tmp_path)
    assert ex.images == [ImageRef(data=raw), ImageRef(data=raw)]
    assert ex.images[0].source == f"<inline {len(raw)} bytes>"


# ---------------------------------------------------------------- rejects

USER = {"role": "user", "content": "q"}


@pytest.mark.parametrize(
    ("rec", "reason", "match"),
    [
        (
            {"prompt": "x", "completion": "y"},
            "unknown_format",
            r"none of 'messages', 'conversations', 'text', 'chosen' \(keys: completion, prompt\)",
        ),
        ([1, 2], "malformed_json", r"a JSON list, not an object"),
        ({"messages": "hi"}, "wrong_type", r"'messages' must be a list"),
        (
            {"messages": [{"role": "user", "content": 3}]},
            "wrong_type",
            r"messages\[0\] content must be a string or a list of parts, got int",
        ),
        ({"messages": [{"role": "user", "content": None}]}, "wrong_type", r"got NoneType"),
        ({"messages": [{"role": 1, "content": "x"}]}, "wrong_type", r"messages\[0\] role must be a string"),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "wrong_type", r"part 0 must be an object"),
        (
            {"messages": [{"role": "user", "content": [{"type": "sound", "sound": "a.wav"}]}]},
            "wrong_type",
            r"unsupported type 'sound'; use text, image, image_url, video or audio",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "wrong_type",
            r"'text' must be a string",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "image": 5}]}]},
            "wrong_type",
            r"image source must be a non-empty string",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "loss": "yes"}]},
            "wrong_type",
            r"'loss' must be true, false or a weight >= 0",
        ),
        ({"messages": [USER], "branches": {"a": 1}}, "wrong_type", r"record.branches must be a list"),
        (
            {"messages": [USER], "branches": ["x"]},
            "wrong_type",
            r"record.branches\[0\] must be a list of messages or an object",
        ),
        ({"messages": [USER], "id": [1]}, "wrong_type", r"'id' must be a string or an integer"),
        ({"text": 3}, "wrong_type", r"'text' must be a string"),
        (
            {"conversations": [{"from": "human", "value": 1}]},
            "wrong_type",
            r"conversations\[0\] 'value' must be a string",
        ),
        ({"messages": [USER], "images": 3}, "wrong_type", r"'images' must be a path or a list of paths"),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            "unknown_role",
            r"messages\[0\] role 'bot' is not one of",
        ),
        (
            {"conversations": [{"from": "robot", "value": "x"}]},
            "unknown_role",
            r"conversations\[0\] role 'robot'",
        ),
        ({"messages": []}, "empty_messages", r"'messages' is empty"),
        ({"messages": [], "branches": [[USER]]}, "empty_messages", r"a tree needs a shared prefix"),
        ({"conversations": []}, "empty_messages", r"'conversations' is empty"),
        ({"messages": [{"role": "user", "content": ""}]}, "empty_messages", r"messages\[0\] has no content"),
        ({"messages": [{"role": "user", "content": []}]}, "empty_messages", r"messages\[0\] has no content"),
        ({"messages": [{"role": "user"}]}, "empty_messages", r"messages\[0\] has no 'content'"),
        ({"text": ""}, "empty_messages", r"'text' is empty"),
        ({"messages": [USER], "branches": [[]]}, "empty_branch", r"record.branches\[0\] has no messages"),
        (
            {"messages": [USER], "branches": [[USER], {"messages": [USER], "branches": [{"messages": []}]}]},
            "empty_branch",
            r"record.branches\[1\].branches\[0\] has no messages",
        ),
        (
            {"conversations": [{"from": "human", "value": "<image> x"}]},
            "image_count_mismatch",
            r"more image placeholders than images \(the record lists 0\)",
        ),
        (
            {"image": ["a.jpg"], "conversations": [{"from": "human", "value": "<image><image>"}]},
            "image_count_mismatch",
            r"the record lists 1\)",
        ),
        (
            {"image": ["a.jpg", "a.jpg"], "conversations": [{"from": "human", "value": "<image>x"}]},
            "image_count_mismatch",
            r"lists 2 images but its messages have 1 image placeholders",
        ),
        (
            {"image": "a.jpg", "conversations": [{"from": "gpt", "value": "x"}]},
            "image_count_mismatch",
            r"no human turn",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "image_count_mismatch",
            r"the record lists 0",
        ),
        (
            {"images": ["a.jpg"], "messages": [USER]},
            "image_count_mismatch",
            r"lists 1 images but its messages have 0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "nope.jpg"}]}]},
            "missing_image",
            r"image .*/nope.jpg does not exist \(named 'nope.jpg'; set --image-root",
        ),
        (
            {"image": "nope.png", "conversations": [{"from": "human", "value": "<image>"}]},
            "missing_image",
            r"nope.png does not exist",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "https://x.org/a.jpg"}]}]},
            "missing_image",
            r"is a URL; packer works offline",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "data:image/png,abc"}]}]},
            "bad_image",
            r"not a base64 data URL",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "image": "data:image/png;base64,@@@"}]}
                ]
            },
            "bad_image",
            r"not valid base64",
        ),
    ],
)
def test_reject_reasons(imgdir: Path, rec, reason: str, match: str):
    with pytest.raises(RecordError, match=r"^in.jsonl:7: " + reason + ": .*" + match) as info:
        parse(rec, imgdir)
    assert (info.value.reason, info.value.path, info.value.line) == (reason, "in.jsonl", 7)


def test_message_dataclass_roundtrip():
    """The parsed tree is plain dataclasses (so it pickles to worker processes)."""
    import pickle

    node = Node(messages=[Message("user", ["hi", ImageRef(path="/x.jpg")], loss=True)])
    assert pickle.loads(pickle.dumps(node)) == node


def test_directory_named_as_image_is_bad_image(tmp_path):
    (tmp_path / "imgdir.jpg").mkdir()
    rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": "imgdir.jpg"}]},
                        {"role": "assistant", "content": "x"}]}
    with pytest.raises(RecordError, match="bad_image: image .*imgdir.jpg is a directory"):
        parse_record(rec, path="d.jsonl", line=1, base_dir=str(tmp_path))


@pytest.mark.parametrize("field", ["branches", "tools", "image", "images", "video", "videos"])
def test_a_null_field_is_an_absent_one(tmp_path: Path, field: str):
    """A chat record's ``branches``, ``tools``, ``image(s)`` or ``video(s)`` set to null parses as the record
    without that field."""
    rec = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    assert parse({**rec, field: None}, tmp_path) == parse(rec, tmp_path)


def _parse_prompt(obj: dict, ctx: Ctx) -> Example:
    """A toy kind, as a new kind's file would define it: ``{"prompt": ..., "completion": ...}``."""
    messages = chat_messages([{"role": "user", "content": obj["prompt"]},
                              {"role": "assistant", "content": obj["completion"]}], ctx, "record")
    return ctx.example(Node(messages=messages), "messages")


def test_a_new_kind_is_one_parser_and_one_registry_line(tmp_path: Path, monkeypatch):
    rec = {"prompt": "Hi", "completion": "Hello."}
    with pytest.raises(RecordError, match=r"unknown_format: the record has none of 'messages', 'conversations', "
                                          r"'text', 'chosen' \(keys: completion, prompt\)"):
        parse(rec, tmp_path)
    monkeypatch.setitem(KINDS, "prompt", _parse_prompt)
    ex = parse(rec, tmp_path, source_name="s")
    assert shape(ex.root) == [[("user", ["Hi"], None), ("assistant", ["Hello."], None)], []]
    assert (ex.kind, ex.example_id, ex.source_name) == ("messages", "in.jsonl:7", "s")
    with pytest.raises(RecordError, match=r"none of 'messages', 'conversations', 'text', 'chosen', 'prompt' \(keys: x\)"):
        parse({"x": 1}, tmp_path)


def _fields(ex):
    return [(m.role, m.parts, m.loss) for node, _ in ex.root.walk() for m in node.messages], ex.tools


@pytest.mark.parametrize("key", ["system", "system_prompt"])
def test_a_top_level_system_prompt_is_the_first_message(tmp_path: Path, key: str):
    """ms-swift's rule (MessagesPreprocessor): the record's ``system`` goes first, in both conversation shapes;
    it used to be dropped without a word."""
    chat = {key: "Be brief.", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    sharegpt = {key: "Be brief.", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}
    want = [("system", ["Be brief."], None), ("user", ["Hi"], None), ("assistant", ["Yo"], None)]
    for rec in (chat, sharegpt):
        assert _fields(parse_record(rec, path="in.jsonl", line=1, base_dir=str(tmp_path)))[0] == want
    same = {key: "Be brief.", "messages": [{"role": "system", "content": "Be brief."}, *chat["messages"]]}
    assert _fields(parse_record(same, path="in.jsonl", line=1, base_dir=str(tmp_path)))[0] == want
    other = {key: "Be brief.", "messages": [{"role": "system", "content": "Be kind."}, *chat["messages"]]}
    with pytest.raises(RecordError, match=r"in.jsonl:4: conflicting_system: .*'" + key):
        parse_record(other, path="in.jsonl", line=4, base_dir=str(tmp_path))
    with pytest.raises(RecordError, match="wrong_type: .*must be a string, got list"):
        parse_record({**chat, key: ["x"]}, path="in.jsonl", line=1, base_dir=str(tmp_path))


def test_sharegpt_tools_and_openai_weights(tmp_path: Path):
    """A ``conversations`` record's ``tools`` reach the template; OpenAI's per-message ``weight`` 0/1 is the
    message's loss flag, any other value refused."""
    ex = parse_record({"tools": '[{"name": "f"}]', "conversations": [{"from": "human", "value": "Hi"},
                                                                      {"from": "gpt", "value": "Yo"}]},
                      path="in.jsonl", line=1, base_dir=str(tmp_path))
    assert ex.tools == [{"type": "function", "function": {"name": "f"}}]
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "weight": 1}]
    ex = parse_record({"messages": msgs}, path="in.jsonl", line=1, base_dir=str(tmp_path))
    assert [m.loss for m in ex.root.messages] == [None, False, None, True]
    with pytest.raises(RecordError, match=r"messages\[1\] 'weight' .* must be 0 or 1, got 0.5"):
        parse_record({"messages": [msgs[0], {**msgs[1], "weight": 0.5}]}, path="in.jsonl", line=1,
                     base_dir=str(tmp_path))
