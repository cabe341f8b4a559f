"""``chat_messages``' plain-message path (issue 33): what ``chat_message`` makes of the same message, errors too."""

from __future__ import annotations

import pytest

from packer.errors import RecordError
from packer.formats.common import Ctx, chat_message, chat_messages

MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "human", "content": "hi"},
    {"role": "gpt", "content": "yes"},
    {"role": "assistant", "content": "<image> stays text without a pool"},
    {"role": "assistant", "content": "x", "loss": False},
    {"content": "x", "role": "tool"},
    {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
]


@pytest.mark.parametrize("msg", MESSAGES)
def test_plain_path_equals_chat_message(msg):
    assert chat_messages([msg], Ctx("f.jsonl", 3, "/data"), "messages") == [
        chat_message(msg, Ctx("f.jsonl", 3, "/data"), "messages[0]")
    ]


@pytest.mark.parametrize("msg", [
    {"role": "robot", "content": "hi"}, {"role": "user", "content": ""}, {"role": ["user"], "content": "hi"},
    {"role": None, "content": "hi"}, {"role": "user", "text": "hi"},
])
def test_plain_path_errors_as_chat_message(msg):
    with pytest.raises(RecordError) as fast:
        chat_messages([{"role": "user", "content": "ok"}, msg], Ctx("f.jsonl", 3, "/data"), "messages")
    with pytest.raises(RecordError) as slow:
        chat_message(msg, Ctx("f.jsonl", 3, "/data"), "messages[1]")
    assert str(fast.value) == str(slow.value) and "messages[1]" in str(fast.value)
