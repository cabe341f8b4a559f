"""Stage one of encoding: render every root-to-node path of an example with the chat template, locating each
message's content (templates.py), and apply the processor's rewrite of an image's text where the family has one
(``ModelProfile.image_blocks``: Gemma 3's pan-and-scan writes an image as several blocks with text between,
BEFORE tokenizing, so the text around them tokenizes as the processor's does).

    Example (tree of Nodes)  ->  Staged(texts=[path 0's text, path 1's, ...], nodes, parents, spans,
                                        per node: its loss messages' spans, its media parts)

The per-node lists are made here, in one walk over each node's messages after rendering, for the steps after the
tokenizer (``draft.batch_tokens``' loss spans, ``finish.BatchFinish``'s images): they read them instead of walking
the messages again. An image is planned (its header size, ``ImageRule.plan``) once, here, where the general path
plans it (``rewrite_images`` for the images the rendering names), and the batch finish reads that size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packer.core.types import Example, ImageRef, Message, Node, Part
from packer.encode.labels import carries_loss, loss_weight
from packer.encode.templates import ChatTemplate, Span
from packer.errors import RecordError
from packer.models.base import ModelProfile, image_blocks
from packer.models.rules import ImageRule


@dataclass(slots=True)
class Staged:
    """One example between rendering and tokenization."""

    texts: list[str]  # what to tokenize: one rendering per root-to-node path (a text record: its text)
    nodes: list[Node]  # tree nodes, depth-first ([] for a text record)
    parents: list[int]  # parent index of each node (-1 for the root)
    spans: list[list[Span]]  # per path, per message (templates.ChatTemplate.locate)
    first: int = 0  # index of texts[0] in the batch's tokenizer call
    loss: list[list[Span]] = field(default_factory=list)  # per node: its own loss messages' spans (carries_loss)
    weights: list[list[float]] | None = None  # per node: those messages' loss weights; None: every weight is 1
    media: list[list[Part]] = field(default_factory=list)  # per node: its own messages' media parts, in order
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(ImageRef) -> its planned size


def stage(example: Example, chat: ChatTemplate, profile: ModelProfile) -> Staged:
    """Render every root-to-node path of ``example`` (a ``text`` record is its own text)."""
    if example.kind == "text":
        return Staged(texts=[example.text or ""], nodes=[], parents=[], spans=[])
    nodes, parents, paths = [], [], []
    for node, parent in example.root.walk():
        nodes.append(node)
        parents.append(parent)
        paths.append((paths[parent] if parent >= 0 else []) + node.messages)
    tools = example.tools
    located = [chat.locate_node(p, len(p) - len(node.messages), tools=tools) for p, node in zip(paths, nodes,
                                                                                                  strict=True)]
    out = Staged(texts=[one[0][0] for one in located], nodes=nodes, parents=parents,
                 spans=[one[0][1] for one in located])
    rule = profile.image
    rewrites = rule is not None and type(rule).blocks is not ImageRule.blocks  # images the processor rewrites
    if rewrites:
        _rewrite_images(out, paths, profile)  # the spans may move: the lists are made from them below
    else:
        _plan_images(out, paths, profile.image_token, rule)
    if rewrites or not all(loss is not None and media is not None for _, loss, media in located):
        _node_lists(out)
    else:  # the renderer's lists, made as it rendered
        out.loss = [loss for _, loss, _ in located]  # type: ignore[misc]
        out.media = [media for _, _, media in located]  # type: ignore[misc]
    return out


def _node_lists(staged: Staged) -> None:
    """``staged``'s per-node lists: each node's own loss messages' spans (and weights, where one is not 1) and
    media parts (what ``batch_tokens`` and the batch finish read)."""
    loss, media, weighted = staged.loss, staged.media, False
    for i, node in enumerate(staged.nodes):  # ``labels.carries_loss`` inlined: a call per message costs more
        msgs = node.messages
        own = staged.spans[i]
        if len(own) != len(msgs):
            own = own[-len(msgs):] if msgs else []
        loss.append([span for m, span in zip(msgs, own, strict=True)
                     if (m.role == "assistant" if m.loss is None else m.loss)])
        media.append([x for m in msgs if len(m.parts) != 1 or type(m.parts[0]) is not str
                      for x in m.parts if not isinstance(x, str)])
        weighted = weighted or any(type(m.loss) is not bool and m.loss is not None and float(m.loss) != 1.0
                                   for m in msgs)
    if weighted:  # a weight other than 1 somewhere: each node's loss messages' weights
        staged.weights = [[loss_weight(m) for m in node.messages if carries_loss(m)] for node in staged.nodes]


def _plan_images(staged: Staged, paths: list[list[Message]], token: str | None, rule: ImageRule | None) -> None:
    """``_rewrite_images`` for a rule that writes no image as blocks: it changes no text, it only plans (and
    raises the first error of) each image the rendering names, in its order: path by path, image i where the
    text holds at least i + 1 image tokens. The sizes are kept for the batch finish."""
    if token is None or rule is None:
        return
    sizes = staged.sizes
    for text, path in zip(staged.texts, paths, strict=True):
        n = text.count(token)
        if not n:
            continue
        for ref in [p for m in path for p in m.parts if isinstance(p, ImageRef)][:n]:
            if id(ref) not in sizes:
                sizes[id(ref)] = rule.plan(ref)


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
