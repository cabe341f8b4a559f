"""What every input kind shares: the record context (``Ctx``), image references, message parts, roles, the
per-message loss flag, message lists and tree branches.

An input kind (``chat.py``, ``llava.py``, ``text.py``) is a function ``parse(obj, ctx) -> Example`` built from
these; each raises ``ctx.error(reason, message)`` for a bad record, so every reject carries ``path:line``.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

from packer.core.types import Example, ImageRef, Message, Node
from packer.errors import RecordError

# Accepted roles -> canonical role. LLaVA / ShareGPT names map onto the chat roles.
ROLES: dict[str, str] = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
}
IMAGE_PLACEHOLDER = "<image>"  # LLaVA's placeholder for "the next image goes here"


class Ctx:
    """What resolving a record needs: where it is, where relative paths point, the pool of top-level images."""

    __slots__ = ("path", "line", "root_dir", "source_name", "pool", "used")

    def __init__(self, path: str, line: int, root_dir: str, source_name: str = ""):
        self.path = path
        self.line = line
        self.root_dir = root_dir
        self.source_name = source_name
        self.pool: list[ImageRef] | None = None  # top-level images consumed by placeholders; None: the record has none
        self.used = 0

    def error(self, reason: str, message: str) -> RecordError:
        return RecordError(reason, message, path=self.path, line=self.line)

    def example(self, root: Node, kind: str, *, text: str | None = None, tools: list[dict] | None = None) -> Example:
        return Example(
            root=root, kind=kind, path=self.path, line=self.line, source_name=self.source_name, text=text, tools=tools
        )

    def next_pooled(self) -> ImageRef:
        if self.pool is None or self.used >= len(self.pool):
            n = 0 if self.pool is None else len(self.pool)
            raise self.error(
                "image_count_mismatch",
                f"more image placeholders than images (the record lists {n}); "
                "give each placeholder an image or remove the extra placeholders",
            )
        ref = self.pool[self.used]
        self.used += 1
        return ref


def image_ref(source: Any, ctx: Ctx) -> ImageRef:
    """A path, a ``data:`` URL, raw bytes or a ``{"bytes", "path"}`` struct (``datasets.Image``) -> ImageRef
    (a path resolved and checked to exist; bytes kept as they are, never re-encoded; bytes win over path)."""
    if isinstance(source, dict) and ("bytes" in source or "path" in source):
        data, path = source.get("bytes"), source.get("path")
        if data is None:
            return image_ref(path, ctx)
        source = data
    if isinstance(source, (bytes, bytearray, memoryview)):
        if not source:
            raise ctx.error("bad_image", "embedded image bytes are empty")
        return ImageRef(data=bytes(source))
    if not isinstance(source, str) or not source:
        raise ctx.error(
            "wrong_type", "an image source must be a non-empty string (path or data URL), bytes or a "
            f'{{"bytes", "path"}} struct, got {source!r:.80}'
        )
    if source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ctx.error(
                "bad_image",
                f"inline image {header[:40]!r}... is not a base64 data URL (data:image/...;base64,...)",
            )
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ctx.error("bad_image", f"inline image is not valid base64: {e}") from None
        if not data:
            raise ctx.error("bad_image", "inline image is empty")
        return ImageRef(data=data)
    if source.startswith(("http://", "https://")):
        raise ctx.error(
            "missing_image", f"{source!r} is a URL; packer works offline: download the images and use paths"
        )
    if source.startswith("file://"):
        source = source[len("file://") :]
    path = source if os.path.isabs(source) else os.path.normpath(os.path.join(ctx.root_dir, source))
    if os.path.isdir(path):
        raise ctx.error("bad_image", f"image {path} is a directory, not an image file (named {source!r})")
    if not os.path.isfile(path):
        raise ctx.error(
            "missing_image",
            f"image {path} does not exist (named {source!r}; set --image-root if paths are relative to another directory)",
        )
    return ImageRef(path=path)


def _split_placeholders(text: str, ctx: Ctx, parts: list[str | ImageRef]) -> None:
    """Append ``text`` to ``parts``, each ``<image>`` replaced by the next pooled image."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    for i, piece in enumerate(pieces):
        if i:
            parts.append(ctx.next_pooled())
        if piece:
            parts.append(piece)


def content_parts(content: Any, ctx: Ctx, where: str) -> list[str | ImageRef]:
    """A message's content (string or list of parts) -> text strings and ImageRefs in order."""
    parts: list[str | ImageRef] = []
    if isinstance(content, str):
        if ctx.pool is not None:
            _split_placeholders(content, ctx, parts)
        elif content:
            parts.append(content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise ctx.error(
                    "wrong_type",
                    f'{where} part {j} must be an object like {{"type": "text", ...}}, got {type(part).__name__}',
                )
            kind = part.get("type")
            if kind == "text" or (kind is None and "text" in part):
                text = part.get("text")
                if not isinstance(text, str):
                    raise ctx.error(
                        "wrong_type", f"{where} part {j}: 'text' must be a string, got {type(text).__name__}"
                    )
                if ctx.pool is not None:
                    _split_placeholders(text, ctx, parts)
                elif text:
                    parts.append(text)
            elif kind == "image" or (kind is None and "image" in part):
                source = part.get("image")
                parts.append(ctx.next_pooled() if source is None else image_ref(source, ctx))
            elif kind == "image_url" or (kind is None and "image_url" in part):
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                parts.append(image_ref(url, ctx))
            else:
                raise ctx.error(
                    "wrong_type",
                    f"{where} part {j} has unsupported type {kind!r}; use text, image or image_url",
                )
    else:
        raise ctx.error(
            "wrong_type", f"{where} content must be a string or a list of parts, got {type(content).__name__}"
        )
    if not parts:
        raise ctx.error("empty_messages", f"{where} has no content")
    return parts


def loss_flag(msg: dict[str, Any], ctx: Ctx, where: str) -> bool | None:
    loss = msg.get("loss")
    if loss is not None and not isinstance(loss, bool):
        raise ctx.error("wrong_type", f"{where} 'loss' must be true or false, got {loss!r}")
    return loss


def canonical_role(role: Any, ctx: Ctx, where: str) -> str:
    if not isinstance(role, str):
        raise ctx.error("wrong_type", f"{where} role must be a string, got {type(role).__name__}")
    canonical = ROLES.get(role)
    if canonical is None:
        raise ctx.error(
            "unknown_role", f"{where} role {role!r} is not one of system/user/assistant/tool (or human/gpt)"
        )
    return canonical


def tool_calls(msg: dict[str, Any], role: str, ctx: Ctx, where: str) -> list[dict] | None:
    """An assistant's ``tool_calls`` (OpenAI style: ``{"type": "function", "function": {"name": ...,
    "arguments": {...}}}``, or the bare ``{"name", "arguments"}``), checked and kept as given for the
    template; None when the message has none."""
    calls = msg.get("tool_calls")
    if calls is None or calls == []:
        return None
    if role != "assistant":
        raise ctx.error("wrong_type", f"{where} has 'tool_calls' but role {role!r}; only assistant turns call tools")
    if not isinstance(calls, list):
        raise ctx.error("wrong_type", f"{where} 'tool_calls' must be a list, got {type(calls).__name__}")
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ctx.error(
                "wrong_type",
                f'{where} tool_calls[{j}] must be {{"function": {{"name": "...", "arguments": {{...}}}}}}, got {call!r}'[:300],
            )
    return calls


def _optional_str(msg: dict[str, Any], key: str, ctx: Ctx, where: str) -> str | None:
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise ctx.error("wrong_type", f"{where} '{key}' must be a string, got {type(value).__name__}")
    return value


def chat_messages(items: Any, ctx: Ctx, where: str) -> list[Message]:
    """A ``messages`` list (``role`` + ``content``; an assistant's ``tool_calls``; a tool result's
    ``tool_call_id`` and ``name``) -> Messages. An assistant turn with calls may have no content."""
    if not isinstance(items, list):
        raise ctx.error("wrong_type", f"{where} must be a list of messages, got {type(items).__name__}")
    out = []
    for i, msg in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(msg, dict):
            raise ctx.error(
                "wrong_type", f"{w} must be an object with 'role' and 'content', got {type(msg).__name__}"
            )
        role = canonical_role(msg.get("role"), ctx, w)
        calls = tool_calls(msg, role, ctx, w)
        content = msg.get("content")
        if calls is not None and content in (None, "", []):
            parts: list[str | ImageRef] = []  # a turn that only calls tools
        elif "content" not in msg:
            raise ctx.error("empty_messages", f"{w} has no 'content'")
        else:
            parts = content_parts(content, ctx, w)
        out.append(
            Message(
                role=role,
                parts=parts,
                loss=loss_flag(msg, ctx, w),
                tool_calls=calls,
                tool_call_id=_optional_str(msg, "tool_call_id", ctx, w),
                name=_optional_str(msg, "name", ctx, w),
            )
        )
    return out


def record_tools(obj: dict[str, Any], ctx: Ctx) -> list[dict] | None:
    """The record-level ``tools`` list (function definitions, JSON schema), kept as given for the template."""
    tools = obj.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ctx.error("wrong_type", "'tools' must be a list of tool definitions (JSON objects)")
    return tools


def _branch(obj: Any, ctx: Ctx, where: str) -> Node:
    """One tree branch: a list of messages, or ``{"messages": [...], "branches": [...]}``."""
    if isinstance(obj, list):
        messages, branches = obj, None
    elif isinstance(obj, dict):
        messages, branches = obj.get("messages", []), obj.get("branches")
    else:
        raise ctx.error(
            "wrong_type",
            f"{where} must be a list of messages or an object with 'messages', got {type(obj).__name__}",
        )
    if isinstance(messages, list) and not messages:
        raise ctx.error(
            "empty_branch", f"{where} has no messages; drop the branch or give it at least one message"
        )
    return Node(
        messages=chat_messages(messages, ctx, f"{where}.messages" if isinstance(obj, dict) else where),
        children=tree_branches(branches, ctx, where),
    )


def tree_branches(obj: Any, ctx: Ctx, where: str) -> list[Node]:
    """A ``branches`` list (None: no branches) -> child nodes, each a list of messages or a subtree."""
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise ctx.error(
            "wrong_type", f"{where}.branches must be a list of branches, got {type(obj).__name__}"
        )
    return [_branch(b, ctx, f"{where}.branches[{i}]") for i, b in enumerate(obj)]


def image_pool(obj: dict[str, Any], ctx: Ctx) -> list[ImageRef] | None:
    """The top-level ``images`` / ``image`` field (str or list), resolved; None when absent."""
    key = "images" if "images" in obj else "image" if "image" in obj else None
    if key is None or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, (str, dict, bytes)):  # one image: a path, a {"bytes", "path"} struct, bytes
        value = [value]
    if not isinstance(value, list):
        raise ctx.error(
            "wrong_type", f"'{key}' must be a path or a list of paths, got {type(value).__name__}"
        )
    return [image_ref(v, ctx) for v in value]


def check_pool_used(ctx: Ctx) -> None:
    if ctx.pool is not None and ctx.used != len(ctx.pool):
        raise ctx.error(
            "image_count_mismatch",
            f"the record lists {len(ctx.pool)} images but its messages have {ctx.used} image placeholders; "
            'put one <image> (or {"type": "image"} part) per image',
        )
