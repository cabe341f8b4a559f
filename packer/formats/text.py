"""The ``text`` kind: plain pretraining text, ``{"text": "..."}``; every token carries loss."""

from __future__ import annotations

from typing import Any

from packer.core.types import Example, Node
from packer.formats.common import Ctx


def parse(obj: dict[str, Any], ctx: Ctx) -> Example:
    text = obj["text"]
    if not isinstance(text, str):
        raise ctx.error("wrong_type", f"'text' must be a string, got {type(text).__name__}")
    if not text:
        raise ctx.error("empty_messages", "'text' is empty")
    return ctx.example(Node(messages=[]), "text", text=text)
