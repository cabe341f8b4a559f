"""The ``messages`` kind: chat messages, optionally a message tree.

``content`` is a string or a list of parts::

    {"type": "text", "text": "..."}
    {"type": "image", "image": "rel/or/abs/path.jpg" | "data:image/png;base64,..."}
    {"type": "image_url", "image_url": {"url": ...}}   (OpenAI style; same sources)
    {"type": "video", "video": "clip.mp4" | ["f0.jpg", "f1.jpg", ...], "fps": 2, "video_start": 3.0, ...}
        (qwen-vl-utils' options: fps/nframes, min/max_frames, video_start/end, min/max/total_pixels)

With a top-level ``images`` / ``image`` list (LLaMA-Factory style), ``<image>`` in text and
``{"type": "image"}`` parts without a source take those images in order; a top-level ``videos`` / ``video``
list and ``<video>`` / ``{"type": "video"}`` the same way. A ``branches`` list turns the
record into a message tree: ``messages`` is the shared prefix, each branch is a list of messages or
``{"messages": [...], "branches": [...]}``::

    {"messages": [user(img), "Caption it."], "branches": [[asst "A red bus."], [asst "A bus on a street."]]}
    -> root node [user] with two children [asst], [asst]

Tool use (passed to the chat template as given, as ``apply_chat_template(messages, tools=tools)`` takes it):
a record-level ``tools`` list; an assistant's ``tool_calls`` (its content may then be empty); ``tool`` turns
with ``tool_call_id`` / ``name``. Calls carry loss with their assistant turn; tool results carry none
unless ``"loss": true``::

    {"tools": [{"type": "function", "function": {"name": "get_weather", ...}}],
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "tool_calls": [{"type": "function",
                      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "name": "get_weather", "content": "18 C"},
                  {"role": "assistant", "content": "18 C in Paris."}]}
"""

from __future__ import annotations

from typing import Any

from packer.core.types import Example, Node
from packer.formats.common import (
    Ctx,
    bind_media,
    chat_messages,
    check_pool_used,
    record_tools,
    tree_branches,
    with_record_system,
)


def parse(obj: dict[str, Any], ctx: Ctx) -> Example:
    bind_media(obj, ctx)
    items = obj["messages"]
    if not isinstance(items, list):
        raise ctx.error("wrong_type", f"'messages' must be a list, got {type(items).__name__}")
    if not items:
        raise ctx.error(
            "empty_messages",
            "'messages' is empty"
            + (
                " (a tree needs a shared prefix; make each branch its own record)"
                if obj.get("branches")
                else ""
            ),
        )
    root = Node(
        messages=with_record_system(chat_messages(items, ctx, "messages"), obj, ctx),
        children=tree_branches(obj.get("branches"), ctx, "record"),
    )
    check_pool_used(ctx)
    return ctx.example(root, "messages", tools=record_tools(obj, ctx))
