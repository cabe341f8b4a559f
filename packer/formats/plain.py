"""The common record's fast path: a chat (a linear conversation or a message tree) or a text record in its
plainest shape, made into its Example without the general parser's per-field checks (``parse_record`` is
the reference: the same Example, or None and the general path decides, errors included).

Plain means: the record's keys are among ``messages`` / ``branches`` / ``id`` (a chat) or ``text`` / ``id``;
every message is exactly ``{"role", "content"}`` with a known role and a non-empty string or a list of
``{"type": "text", "text"}`` / ``{"type": "image", "image": path}`` parts; every branch a non-empty list of
such messages. No pools, no tools, no loss flags, no system field: nothing in it takes a default another field
sets. Anything else, and any record whose image the general path would reject, is ``parse_record``'s
(tests/formats/test_plain.py compares the two on random records). Its measured gain: docs/benchmarks.md,
"Fast paths".
"""

from __future__ import annotations

from typing import Any

from packer.core.types import Example, Message, Node, Part
from packer.errors import RecordError
from packer.formats.common import ROLES, Ctx, image_ref

_CHAT_KEYS = frozenset(("messages", "branches", "id"))
_TEXT_KEYS = frozenset(("text", "id"))


def parse_plain(obj: Any, *, path: str, line: int, root_dir: str, source_name: str = "") -> Example | None:
    """``parse_record(obj, ...)`` for a plain record (module docstring), else None. ``root_dir``: the absolute
    directory relative image paths resolve against (``Ctx.root_dir``). ``obj`` is a JSON value (orjson's or
    json's: no ``str`` subclass, no ``dict`` subclass), which ``_messages``' lookups rely on."""
    if type(obj) is not dict:
        return None
    alone = len(obj) == 1  # the commonest record, {"messages"} or {"text"}: no id to check, no other key
    if not alone:
        rid = obj.get("id")
        if rid is not None and not isinstance(rid, (str, int)):
            return None
    items = obj.get("messages")
    if items is not None:  # ("messages": null is the general path's, as a record with another key is)
        if not alone and not obj.keys() <= _CHAT_KEYS:
            return None
        where = (path, line, root_dir, source_name)
        try:
            messages = _messages(items, where)
            if messages is None:
                return None
            children: list[Node] = []
            branches = None if alone else obj.get("branches")
            if branches is not None:
                if type(branches) is not list:
                    return None
                for branch in branches:
                    one = _messages(branch, where)
                    if one is None:
                        return None
                    children.append(Node(one, []))
        except RecordError:  # an image the general path rejects: it says so, in its own order
            return None
        return Example(Node(messages, children), "messages", path, line, source_name)
    if "text" in obj and (alone or obj.keys() <= _TEXT_KEYS):
        text = obj["text"]
        if type(text) is not str or not text:
            return None
        return Example(Node([], []), "text", path, line, source_name, text=text)
    return None


def _messages(items: Any, where: tuple[str, int, str, str]) -> list[Message] | None:
    """A non-empty list of plain messages, or None. ``where``: ``Ctx``'s arguments, for an image's path."""
    if type(items) is not list or not items:
        return None
    out: list[Message] = []
    append = out.append
    for msg in items:
        # exactly {"role": a known role, "content": ...}: two keys, both these. The lookups check the types: any
        # other JSON value has no len or no str subscript (TypeError), a missing key or an unknown role is a
        # KeyError, a list or dict role is unhashable (TypeError) and no other JSON scalar equals a role's name
        # (cheaper than a type test of each; a dict's keys() view costs more than the two lookups)
        try:
            if len(msg) != 2:
                return None
            role = ROLES[msg["role"]]
            content = msg["content"]
        except (KeyError, TypeError):
            return None
        if type(content) is str:
            if not content:
                return None
            append(Message(role, [content]))
            continue
        if type(content) is not list:
            return None
        parts: list[Part] = []
        for part in content:
            if type(part) is not dict or len(part) != 2:
                return None
            kind = part.get("type")
            if kind == "text":
                text = part.get("text")
                if type(text) is not str:
                    return None
                if text:
                    parts.append(text)
            elif kind == "image":
                source = part.get("image")
                if type(source) is not str:
                    return None
                parts.append(image_ref(source, Ctx(*where)))
            else:
                return None
        if not parts:
            return None
        append(Message(role, parts))
    return out


def text_chat(obj: Any, counts: list[int], roles: list[str], contents: list[str]) -> int:
    """Where ``parse_plain(obj, ...)`` is a chat whose every message is one text (a string, or a part list holding
    one non-empty text: ``_one_text``), append its nodes' message counts (the root's, then each branch's) to
    ``counts`` and their messages' roles (the canonical names) and texts to ``roles`` and ``contents``, and return
    how many nodes; else 0, nothing appended (``read.text_chats``: the records ``Encoder.encode_chats`` takes as
    columns, without an Example or a Message each)."""
    if type(obj) is not dict:
        return 0
    branches = None
    if len(obj) != 1:  # as parse_plain: an id it checks (not keeps), no key but these
        rid = obj.get("id")
        if (rid is not None and not isinstance(rid, (str, int))) or not obj.keys() <= _CHAT_KEYS:
            return 0
        branches = obj.get("branches")
        if branches is not None and type(branches) is not list:
            return 0
    items = obj.get("messages")
    at, nodes = len(roles), len(counts)
    for node in (items, *branches) if branches else (items,):
        if type(node) is not list or not node:
            break
        for msg in node:
            try:  # ``_messages``' lookups, which check the types (its comment)
                if len(msg) != 2:
                    break
                role = ROLES[msg["role"]]
                content = msg["content"]
            except (KeyError, TypeError):
                break
            if type(content) is not str:
                content = _one_text(content)
                if content is None:
                    break
            elif not content:
                break
            roles.append(role)
            contents.append(content)
        else:
            counts.append(len(node))
            continue
        break
    else:
        return len(counts) - nodes
    del roles[at:], contents[at:], counts[nodes:]
    return 0


def _one_text(content: Any) -> str | None:
    """The text of a part list ``_messages`` reads as one text part (text parts only, one of them non-empty: it
    drops the empty ones), else None."""
    if type(content) is not list:
        return None
    found = None
    for part in content:
        if type(part) is not dict or len(part) != 2 or part.get("type") != "text":
            return None
        text = part.get("text")
        if type(text) is not str:
            return None
        if text:
            if found is not None:
                return None
            found = text
    return found


def plain_text(obj: Any) -> str | None:
    """The text where ``parse_plain(obj, ...)`` is a ``text`` record (``{"text"}``, maybe with an id), else None
    (``read.text_chats``: the records ``Encoder.encode_texts`` takes as columns)."""
    if type(obj) is not dict:
        return None
    if len(obj) != 1:
        rid = obj.get("id")
        if (rid is not None and not isinstance(rid, (str, int))) or not obj.keys() <= _TEXT_KEYS:
            return None
    text = obj.get("text")
    return text if type(text) is str and text else None

