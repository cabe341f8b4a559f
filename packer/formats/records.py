"""Input records -> ``Example`` trees, with validation errors that say ``path:line``.

One JSON object per line, in one of these shapes (the first key found wins, in this order):

``messages``       chat messages; ``content`` is a string or a list of parts::

                       {"type": "text", "text": "..."}
                       {"type": "image", "image": "rel/or/abs/path.jpg" | "data:image/png;base64,..."}
                       {"type": "image_url", "image_url": {"url": ...}}   (OpenAI style; same sources)

                   With a top-level ``images`` / ``image`` list (LLaMA-Factory style), ``<image>`` in text and
                   ``{"type": "image"}`` parts without a source take those images in order.
                   A ``branches`` list turns the record into a message tree: ``messages`` is the shared
                   prefix, each branch is a list of messages or ``{"messages": [...], "branches": [...]}``.
``conversations``  LLaVA: ``[{"from": "human"|"gpt"|"system", "value": "..."}]`` + ``image`` (str or list);
                   each ``<image>`` placeholder takes the next image. A record with images but no placeholder
                   at all gets LLaVA's own convention: ``"<image>\\n"`` per image prepended to the first human
                   turn.
``text``           plain text (pretraining); every token carries loss.

Per message, ``"loss": true|false`` overrides the default (assistant turns carry loss). Relative image paths
resolve against the JSONL file's directory, or ``image_root`` when given; absolute paths stay. Only a cheap
existence check happens here (``missing_image``); decoding is the vision profile's job (``bad_image``).

Cost: ``read_jsonl`` parses ~50k two-turn image records/s on one core (one ``stat`` per image included);
the tokenizer, not this, bounds a build.
"""

from __future__ import annotations

import base64
import binascii
import glob
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from packer.core.types import Example, ImageRef, Message, Node
from packer.errors import ConfigError, RecordError

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


class _Ctx:
    """What resolving a record needs: where relative paths point and the pool of top-level images."""

    __slots__ = ("path", "line", "root_dir", "pool", "used")

    def __init__(self, path: str, line: int, root_dir: str, pool: list[ImageRef] | None):
        self.path = path
        self.line = line
        self.root_dir = root_dir
        self.pool = pool  # top-level images consumed by placeholders, or None when the record has none
        self.used = 0

    def error(self, reason: str, message: str) -> RecordError:
        return RecordError(reason, message, path=self.path, line=self.line)

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


def _image_ref(source: Any, ctx: _Ctx) -> ImageRef:
    """A path or a ``data:`` URL -> ImageRef (path resolved and checked to exist)."""
    if not isinstance(source, str) or not source:
        raise ctx.error(
            "wrong_type", f"an image source must be a non-empty string (path or data URL), got {source!r}"
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


def _split_placeholders(text: str, ctx: _Ctx, parts: list[str | ImageRef]) -> None:
    """Append ``text`` to ``parts``, each ``<image>`` replaced by the next pooled image."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    for i, piece in enumerate(pieces):
        if i:
            parts.append(ctx.next_pooled())
        if piece:
            parts.append(piece)


def _parts(content: Any, ctx: _Ctx, where: str) -> list[str | ImageRef]:
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
                parts.append(ctx.next_pooled() if source is None else _image_ref(source, ctx))
            elif kind == "image_url" or (kind is None and "image_url" in part):
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                parts.append(_image_ref(url, ctx))
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


def _loss(msg: dict[str, Any], ctx: _Ctx, where: str) -> bool | None:
    loss = msg.get("loss")
    if loss is not None and not isinstance(loss, bool):
        raise ctx.error("wrong_type", f"{where} 'loss' must be true or false, got {loss!r}")
    return loss


def _role(role: Any, ctx: _Ctx, where: str) -> str:
    if not isinstance(role, str):
        raise ctx.error("wrong_type", f"{where} role must be a string, got {type(role).__name__}")
    canonical = ROLES.get(role)
    if canonical is None:
        raise ctx.error(
            "unknown_role", f"{where} role {role!r} is not one of system/user/assistant/tool (or human/gpt)"
        )
    return canonical


def _chat_messages(items: Any, ctx: _Ctx, where: str) -> list[Message]:
    """A ``messages`` list (``role`` + ``content``) -> Messages."""
    if not isinstance(items, list):
        raise ctx.error("wrong_type", f"{where} must be a list of messages, got {type(items).__name__}")
    out = []
    for i, msg in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(msg, dict):
            raise ctx.error(
                "wrong_type", f"{w} must be an object with 'role' and 'content', got {type(msg).__name__}"
            )
        if "content" not in msg:
            raise ctx.error("empty_messages", f"{w} has no 'content'")
        out.append(
            Message(
                role=_role(msg.get("role"), ctx, w),
                parts=_parts(msg["content"], ctx, w),
                loss=_loss(msg, ctx, w),
            )
        )
    return out


def _branch(obj: Any, ctx: _Ctx, where: str) -> Node:
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
        messages=_chat_messages(messages, ctx, f"{where}.messages" if isinstance(obj, dict) else where),
        children=_branches(branches, ctx, where),
    )


def _branches(obj: Any, ctx: _Ctx, where: str) -> list[Node]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise ctx.error(
            "wrong_type", f"{where}.branches must be a list of branches, got {type(obj).__name__}"
        )
    return [_branch(b, ctx, f"{where}.branches[{i}]") for i, b in enumerate(obj)]


def _image_pool(obj: dict[str, Any], ctx: _Ctx) -> list[ImageRef] | None:
    """The top-level ``images`` / ``image`` field (str or list), resolved; None when absent."""
    key = "images" if "images" in obj else "image" if "image" in obj else None
    if key is None or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ctx.error(
            "wrong_type", f"'{key}' must be a path or a list of paths, got {type(value).__name__}"
        )
    return [_image_ref(v, ctx) for v in value]


def _check_pool_used(ctx: _Ctx) -> None:
    if ctx.pool is not None and ctx.used != len(ctx.pool):
        raise ctx.error(
            "image_count_mismatch",
            f"the record lists {len(ctx.pool)} images but its messages have {ctx.used} image placeholders; "
            'put one <image> (or {"type": "image"} part) per image',
        )


def _parse_messages(obj: dict[str, Any], ctx: _Ctx) -> Node:
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
        messages=_chat_messages(items, ctx, "messages"),
        children=_branches(obj.get("branches"), ctx, "record"),
    )
    _check_pool_used(ctx)
    return root


def _parse_llava(obj: dict[str, Any], ctx: _Ctx) -> Node:
    turns = obj["conversations"]
    if not isinstance(turns, list):
        raise ctx.error("wrong_type", f"'conversations' must be a list, got {type(turns).__name__}")
    if not turns:
        raise ctx.error("empty_messages", "'conversations' is empty")
    rows: list[tuple[str, str, bool | None, str]] = []
    for i, turn in enumerate(turns):
        w = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise ctx.error(
                "wrong_type", f"{w} must be an object with 'from' and 'value', got {type(turn).__name__}"
            )
        role = _role(turn.get("from", turn.get("role")), ctx, w)
        value = turn.get("value", turn.get("content"))
        if not isinstance(value, str):
            raise ctx.error("wrong_type", f"{w} 'value' must be a string, got {type(value).__name__}")
        rows.append((role, value, _loss(turn, ctx, w), w))
    n_placeholders = sum(v.count(IMAGE_PLACEHOLDER) for _, v, _, _ in rows)
    if ctx.pool and n_placeholders == 0:
        # LLaVA's convention (llava/train/train.py preprocess_multimodal): the image goes first in the first
        # human turn, followed by a newline.
        first_user = next((i for i, r in enumerate(rows) if r[0] == "user"), None)
        if first_user is None:
            raise ctx.error(
                "image_count_mismatch",
                f"the record has {len(ctx.pool)} images, no <image> placeholder and no human turn to put them in",
            )
        role, value, loss, w = rows[first_user]
        rows[first_user] = (role, (IMAGE_PLACEHOLDER + "\n") * len(ctx.pool) + value, loss, w)
    if ctx.pool is None:
        ctx.pool = []  # placeholders with no images must fail, not pass through as text
    messages = [Message(role=role, parts=_parts(value, ctx, w), loss=loss) for role, value, loss, w in rows]
    _check_pool_used(ctx)
    return Node(messages=messages)


def parse_record(
    obj: Any, *, path: str, line: int, base_dir: str, image_root: str | None = None, source_name: str = ""
) -> Example:
    """Parse one decoded JSON record into an Example; raise RecordError (with ``path:line``) when unusable.

    ``base_dir`` is the directory relative image paths resolve against (the JSONL file's), unless
    ``image_root`` is given.
    """
    ctx = _Ctx(path, line, os.path.abspath(image_root if image_root is not None else base_dir), None)
    if not isinstance(obj, dict):
        raise ctx.error("malformed_json", f"the line is a JSON {type(obj).__name__}, not an object")
    rid = obj.get("id")
    if rid is not None and not isinstance(rid, (str, int)):
        raise ctx.error("wrong_type", f"'id' must be a string or an integer, got {type(rid).__name__}")
    if "messages" in obj:
        ctx.pool = _image_pool(obj, ctx)
        return Example(
            root=_parse_messages(obj, ctx), kind="messages", path=path, line=line, source_name=source_name
        )
    if "conversations" in obj:
        ctx.pool = _image_pool(obj, ctx)
        return Example(
            root=_parse_llava(obj, ctx), kind="llava", path=path, line=line, source_name=source_name
        )
    if "text" in obj:
        text = obj["text"]
        if not isinstance(text, str):
            raise ctx.error("wrong_type", f"'text' must be a string, got {type(text).__name__}")
        if not text:
            raise ctx.error("empty_messages", "'text' is empty")
        return Example(
            root=Node(messages=[]), kind="text", path=path, line=line, source_name=source_name, text=text
        )
    keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
    raise ctx.error(
        "unknown_format", f"the record has none of 'messages', 'conversations', 'text' (keys: {keys})"
    )


def parse_line(
    raw: bytes,
    *,
    path: str,
    line: int,
    base_dir: str,
    image_root: str | None = None,
    source_name: str = "",
) -> Example:
    """Bytes of one JSONL line -> Example; RecordError for bad UTF-8, bad JSON or a bad record."""
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark some editors write
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(
            "not_utf8",
            f"invalid UTF-8 byte {raw[e.start : e.start + 1]!r} at byte {e.start}; re-encode the file as UTF-8",
            path=path,
            line=line,
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError("malformed_json", f"{e.msg} at column {e.colno}", path=path, line=line) from None
    except (ValueError, RecursionError) as e:  # a 5000-digit integer, arrays nested 100k deep
        raise RecordError("malformed_json", f"{type(e).__name__}: {str(e)[:200]}", path=path, line=line) from None
    if "\\ud" in text or "\\uD" in text:  # only such lines can hold a lone surrogate escape
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # "\ud800" alone is not text: the tokenizer would raise on it
            raise RecordError(
                "not_utf8",
                "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text; "
                "fix the producer's escaping",
                path=path,
                line=line,
            ) from None
    return parse_record(
        obj, path=path, line=line, base_dir=base_dir, image_root=image_root, source_name=source_name
    )


def read_jsonl(
    path: str, *, image_root: str | None = None, source_name: str = ""
) -> Iterator[tuple[int, Example | RecordError]]:
    """Stream ``(line_number, Example or RecordError)`` for every non-blank line of a JSONL file.

    Lines are read as bytes one at a time (1-based numbers; blank lines are skipped but counted), so a bad
    byte or a bad line becomes a RecordError for that line, never an exception for the file.
    """
    base_dir = os.path.dirname(os.path.abspath(path))
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield number, parse_line(
                    raw, path=path, line=number, base_dir=base_dir, image_root=image_root, source_name=source_name
                )
            except RecordError as e:
                yield number, e


def expand_inputs(patterns: Iterable[str]) -> list[str]:
    """Files, directories (their ``*.jsonl``) and glob patterns -> sorted, deduplicated file paths.

    Raises ConfigError naming the first pattern that matches no file.
    """
    found: set[str] = set()
    for pattern in patterns:
        if os.path.isfile(pattern):
            matches = [pattern]
        elif os.path.isdir(pattern):
            matches = glob.glob(os.path.join(glob.escape(pattern), "*.jsonl"))
        else:
            matches = [m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m)]
        if not matches:
            raise ConfigError(
                f"input {pattern!r} matches no file; give JSONL files, directories or glob patterns"
            )
        found.update(os.path.normpath(m) for m in matches)
    return sorted(found)
