"""Stage one of encoding: render every root-to-node path of an example with the chat template, locating each
message's content (templates.py), and apply the processor's rewrite of an image's text where the family has one
(``ModelProfile.image_blocks``: Gemma 3's pan-and-scan writes an image as several blocks with text between,
BEFORE tokenizing, so the text around them tokenizes as the processor's does).

    Example (tree of Nodes)  ->  Staged(texts=[path 0's text, path 1's, ...], nodes, parents, spans)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from packer.core.types import Example, ImageRef, Message, Node
from packer.encode.templates import ChatTemplate, Span, SpanColumns
from packer.errors import RecordError
from packer.models.base import ModelProfile, image_blocks


@dataclass(slots=True)
class Staged:
    """One example between rendering and tokenization."""

    texts: list[str]  # what to tokenize: one rendering per root-to-node path (a text record: its text)
    nodes: list[Node]  # tree nodes, depth-first ([] for a text record)
    parents: list[int]  # parent index of each node (-1 for the root)
    spans: list[list[Span]]  # per path, per message (templates.ChatTemplate.locate)
    first: int = 0  # index of texts[0] in the batch's tokenizer call
    # what ``stage_batch`` knows of it besides (not compared: ``stage``'s Staged equals it without them):
    # every message of every path one text (no media part, no tool call), and its paths' loss messages as columns
    # (None: ``draft.batch_tokens`` picks them from ``spans``), its first path's index there
    plain: bool = field(default=False, compare=False)
    loss: LossColumns | None = field(default=None, compare=False)
    loss_at: int = field(default=-1, compare=False)


class LossColumns:
    """The loss messages of a ``stage_batch``'s paths rendered together (``ChatTemplate.locate_columns``), where
    each path's own messages (its node's: the last ones on it) follow the default loss rule (no message's own
    ``loss``: the assistant turns carry loss, weight 1): ``path`` (L,) int64 each one's path, numbered as the
    batch's conversations, ``chars`` (L, 3) int64 its Span (``draft.batch_tokens`` reads these instead of
    picking each node's assistant spans in Python; tests/encode/test_render.py compares the two)."""

    __slots__ = ("path", "chars")

    def __init__(self, path: np.ndarray, chars: np.ndarray):
        self.path, self.chars = path, chars


def _loss_columns(own: list[int], cols: SpanColumns, n_convs: int) -> tuple[LossColumns, list[bool]]:
    """The loss messages of the conversations ``cols`` rendered (``own[c]``: how many of conversation c's last
    messages are its node's), and per conversation whether it is taken: no message of it has a ``loss`` of its
    own (``draft.batch_tokens``' common node: its assistant turns carry loss, weight 1; a conversation with one
    anywhere is left to ``batch_tokens``' per-node rule whole, though only its node's messages count there)."""
    taken, count = cols.taken, cols.count
    conv_of = np.repeat(np.arange(taken.shape[0]), count)  # each message's conversation (in ``taken``)
    lo = np.cumsum(count) - count
    mine = np.arange(conv_of.shape[0]) - lo[conv_of] >= (count - np.asarray(own, dtype=np.int64)[taken])[conv_of]
    ok = np.zeros(n_convs, dtype=bool)
    ok[taken[cols.default]] = True
    sel = mine & cols.assistant & cols.default[conv_of]
    return LossColumns(taken[conv_of[sel]], cols.chars[sel]), ok.tolist()


def stage(example: Example, chat: ChatTemplate, profile: ModelProfile) -> Staged:
    """Render every root-to-node path of ``example`` (a ``text`` record is its own text)."""
    if example.kind == "text":
        return Staged(texts=[example.text or ""], nodes=[], parents=[], spans=[])
    root = example.root
    if not root.children:  # a linear conversation (most records): its one path, no walk
        text, spans = chat.locate(root.messages, tools=example.tools)
        out = Staged(texts=[text], nodes=[root], parents=[-1], spans=[spans])
        if profile.image_token is not None:
            _rewrite_images(out, [root.messages], profile)
        return out
    nodes, parents, paths = [], [], []
    for node, parent in example.root.walk():
        nodes.append(node)
        parents.append(parent)
        paths.append((paths[parent] if parent >= 0 else []) + node.messages)
    located = [chat.locate(p, tools=example.tools) for p in paths]
    out = Staged(texts=[text for text, _ in located], nodes=nodes, parents=parents, spans=[sp for _, sp in located])
    _rewrite_images(out, paths, profile)
    return out


def stage_batch(examples: Sequence[Example], chat: ChatTemplate, profile: ModelProfile) -> list[Staged | RecordError]:
    """``stage`` of each example, or the RecordError it raises (located at the example's ``path:line``).

    The common chats are rendered as one batch (``ChatTemplate.locate_texts``: every message one text, no tools):
    a linear conversation's one path, a one-level tree's paths (its root, then the root's messages followed by
    each leaf branch's, in ``Node.walk``'s order). Such a text holds no image part, so ``_rewrite_images`` has
    nothing to rewrite. An example any of whose paths the batch leaves, and every other one, takes ``stage``
    (tests/encode/test_render.py compares the two on random batches)."""
    convs: list[list[Message]] = []
    own: list[int] = []  # per conversation, how many of its last messages are its node's own
    spans_at: list[int] = []  # per example, its first path's index in ``convs`` (-1: ``stage``)
    for example in examples:
        root = example.root
        if example.kind == "text" or example.tools:
            spans_at.append(-1)
            continue
        spans_at.append(len(convs))
        msgs = root.messages
        convs.append(msgs)
        own.append(len(msgs))
        for child in root.children:
            if child.children:  # a deeper tree: ``stage``'s walk
                del convs[spans_at[-1]:], own[spans_at[-1]:]
                spans_at[-1] = -1
                break
            convs.append(msgs + child.messages)
            own.append(len(child.messages))
    located, cols = chat.locate_columns(convs) if convs else ([], None)
    loss, fits = (None, []) if cols is None else _loss_columns(own, cols, len(convs))
    out: list[Staged | RecordError] = []
    used = 0
    for example, at in zip(examples, spans_at, strict=True):
        if at >= 0:
            root = example.root
            paths = located[at : at + 1 + len(root.children)]
            if None not in paths:
                used += len(paths)
                if not root.children:  # (positional: the build's most common Staged, ~0.4 us less than by keyword)
                    text, spans = paths[0]  # type: ignore[misc]
                    out.append(Staged([text], [root], [-1], [spans], 0, True, loss if fits[at] else None, at))
                else:
                    out.append(Staged([t for t, _ in paths], [root, *root.children],  # type: ignore[misc]
                                      [-1] + [0] * len(root.children), [sp for _, sp in paths], 0, True,  # type: ignore[misc]
                                      loss if all(fits[at : at + len(paths)]) else None, at))
                continue
        try:
            out.append(stage(example, chat, profile))
        except RecordError as e:
            out.append(e if e.path else e.located(example.path, example.line))
    if used:
        chat.paths["python"] += used
    return out


def _rewrite_images(staged: Staged, paths: list[list[Message]], profile: ModelProfile) -> None:
    """Each path's text with every image the processor rewrites (``image_blocks``) written its way."""
    token = profile.image_token
    if token is None or not any(token in t for t in staged.texts):  # the common case: one look per text
        return
    for k, path in enumerate(paths):
        text, spans = rewrite_images(staged.texts[k], staged.spans[k], path, profile)
        if text is not staged.texts[k]:
            staged.texts[k], staged.spans[k] = text, spans


def rewrite_images(text: str, spans: list[Span], path: list[Message], profile: ModelProfile) -> tuple[str, list[Span]]:
    """The rendering with each image the profile writes as blocks written as its processor writes it, and the
    message spans moved to match (``text`` itself where no image is rewritten)."""
    token = profile.image_token
    pieces, shifts, at, start = [], [], 0, 0
    for ref in (p for m in path for p in m.parts if isinstance(p, ImageRef)):
        at = text.find(token, at)
        if at < 0:
            return text, spans  # fewer image tokens than images: the token check says so
        blocks = image_blocks(profile, ref)
        if blocks is not None:
            a = at - blocks.rendered.index(token)
            if text[a : a + len(blocks.rendered)] != blocks.rendered:
                raise RecordError(
                    "template_error",
                    f"profile {profile.name!r} writes this image as blocks, and needs the chat template "
                    f"to write an image as {blocks.rendered!r} (the builtin {profile.default_tokenizer} "
                    "template does)",
                )
            pieces += [text[start:a], blocks.text]
            start = a + len(blocks.rendered)
            shifts.append((start, len(blocks.text) - len(blocks.rendered)))
        at += len(token)
    if not shifts:
        return text, spans
    ends = np.array([e for e, _ in shifts])
    moved = np.cumsum([d for _, d in shifts])

    def move(c: int | None) -> int | None:  # a position at or after a replaced rendering's end moves
        if c is None:
            return None
        k = int(np.searchsorted(ends, c, side="right"))
        return c + int(moved[k - 1]) if k else c

    return "".join([*pieces, text[start:]]), [(move(a), move(b), move(c)) for a, b, c in spans]
