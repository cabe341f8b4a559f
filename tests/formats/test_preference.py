"""Preference pairs (TRL's conversational format) parse into prompt -> (chosen, rejected) trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from packer.errors import RecordError
from packer.formats import parse_record
from packer.formats.preference import split_prompt


def u(t):
    return {"role": "user", "content": t}


def a(t):
    return {"role": "assistant", "content": t}


def parse(rec: dict, base: Path):
    return parse_record(rec, path="p.jsonl", line=3, base_dir=str(base))


def texts(node):
    return [(m.role, "".join(p for p in m.parts if isinstance(p, str)), m.loss) for m in node.messages]


def test_explicit_prompt_is_the_root_chosen_then_rejected(tmp_path):
    ex = parse({"prompt": [u("Q"), a("earlier"), u("Q2")], "chosen": [a("good")], "rejected": [a("bad"), u("x"), a("y")]},
               tmp_path)
    assert ex.kind == "preference"
    assert texts(ex.root) == [("user", "Q", False), ("assistant", "earlier", False), ("user", "Q2", False)]
    assert [texts(c) for c in ex.root.children] == [[("assistant", "good", None)],
                                                   [("assistant", "bad", None), ("user", "x", None), ("assistant", "y", None)]]


def test_implicit_prompt_is_the_longest_common_prefix(tmp_path):
    ex = parse({"chosen": [u("Hi"), a("Hello"), u("Joke?"), a("Ha")], "rejected": [u("Hi"), a("Hello"), u("Joke?"), a("No")]},
               tmp_path)
    assert [m.role for m in ex.root.messages] == ["user", "assistant", "user"]
    assert [texts(c) for c in ex.root.children] == [[("assistant", "Ha", None)], [("assistant", "No", None)]]
    assert split_prompt([u("a"), a("b")], [u("a"), a("c")]) == 1 and split_prompt([u("a")], [u("b")]) == 0


def test_prompt_images_are_shared(tmp_path, coco_images):
    img = coco_images[0]
    ex = parse({"images": [str(img)], "prompt": [u("<image>Caption it.")], "chosen": [a("A.")], "rejected": [a("B.")]},
               tmp_path)
    assert [im.path for im in ex.images] == [str(img)]


@pytest.mark.parametrize(("rec", "match"), [
    ({"chosen": [u("a"), a("b")], "rejected": [u("x"), a("b")]}, r"empty_messages: the preference pair has no prompt"),
    ({"chosen": [u("a")], "rejected": [u("a")]}, r"empty_branch: 'chosen' has no message after the prompt"),
    ({"prompt": [u("a")], "chosen": [a("b")], "rejected": []}, r"empty_branch: 'rejected'"),
    ({"prompt": "a", "chosen": "b", "rejected": "c"}, r"wrong_type: 'chosen' must be a list of chat messages"),
    ({"chosen": [a("b")]}, r"wrong_type: 'rejected' must be a list"),
])
def test_bad_pairs_are_rejected(rec, match, tmp_path):
    with pytest.raises(RecordError, match=match):
        parse(rec, tmp_path)
