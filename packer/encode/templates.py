"""Chat templates: render a conversation and say where each message's content lies in the text.

A conversation is rendered ONCE with each message's content wrapped in two private-use characters
(U+E000 ... U+E001); the markers are removed and their positions are the content spans:

    <|im_start|>user\n{OPEN}Hi{CLOSE}<|im_end|>\n  ->  "<|im_start|>user\nHi<|im_end|>\n", content [17, 19)

Whether markers are safe is decided once per template: probe conversations (padded content, ``<think>``
blocks, image parts) must render identically with and without markers. A template that fails the probes
(one that trims content, say) is rendered twice per conversation and the two compared; where they differ,
the prefix fallback takes over: each prefix ``conv[:k]`` is rendered and must be a string prefix of
``conv[:k+1]`` (else ``template_error``, "not prefix-stable"), and an assistant's content starts where
``add_generation_prompt=True`` ends (its end is then unknown: see labels.py).

Fast path: a ChatML template a builtin tokenizer registers (Qwen2-VL's, Qwen2.5's, Qwen3-VL's, LLaVA-OneVision's,
InternVL3's, Qwen2.5-Omni's, Qwen3-Omni's, Qwen2-Audio's, Molmo2's; a user's file with the same template string too), and
Gemma 3's, the gemma4 stand-in's, Llama 4's and SmolVLM's (``_Gemma``, ``_Gemma4``, ``_Llama4``, ``_SmolVLM``: their
markers are checked, so they give the checked path's answer, markers or prefixes) and Mistral 3's (``_Mistral``), is
rendered in pure Python with its content spans,
because the sandboxed Jinja render checks every attribute access (Qwen3-VL's calls a macro per message); it is used only if it reproduces Jinja on the probes, it leaves to Jinja what it does not write as plain
ChatML (tool calls, a role or part its template writes otherwise), and tests/encode/test_templates.py compares
both on random conversations for every registered template.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import accumulate
from typing import Any

from packer.core.types import AudioRef, ImageRef, Message, VideoRef
from packer.errors import ConfigError, RecordError
from packer.models.registry import fast_renderer
from packer.models.shared.tokenizer import (
    Gemma4Renderer,
    GemmaRenderer,
    GlmRenderer,
    Llama4Renderer,
    MistralRenderer,
    SmolVLMRenderer,
)

OPEN, CLOSE = "\ue000", "\ue001"  # private-use characters that mark content boundaries in a rendering
_MARKER = re.compile(f"[{OPEN}{CLOSE}]")

Span = tuple[int, int | None, int]
"""One message in a rendering: (content start, content end, limit), character offsets. The limit is where
the next message's content starts (the text's end for the last message); content end None means unknown
(prefix fallback): the message's last special token before the limit ends its loss span."""


class SpanColumns:
    """The spans of a batch's conversations rendered at once (``_ChatML.locate_columns``), as columns:
    ``taken`` the conversations' indices in the batch, ``count`` their messages, ``chars`` (M, 3) int64 every
    message's Span (content start, content end, limit; none is None) and ``assistant`` (M,) whether it is an
    assistant turn, the conversations' messages back to back in ``taken``'s order; ``default`` per conversation,
    whether none of its messages has a ``loss`` of its own. What ``render.stage_batch`` hands on for the loss
    rule to read without a Span tuple per message (``draft.batch_tokens``)."""

    __slots__ = ("taken", "count", "chars", "assistant", "default")

    def __init__(self, taken: Any, count: Any, chars: Any, assistant: Any, default: Any):
        self.taken, self.count, self.chars, self.assistant, self.default = taken, count, chars, assistant, default


class RenderedChats:
    """Text chats rendered from columns (``ChatTemplate.render_chats``): ``texts`` every path of the records
    rendered, ``records`` (R,) their indices among the chats given, ``paths`` (R + 1,) each one's first path in
    ``texts`` (its root's; then its branches'), and per message of theirs, back to back: ``text`` (L,) its path
    (the one of its own node), ``chars`` (L, 3) int64 its Span there (none is None), ``assistant`` (L,) whether it
    is an assistant turn."""

    __slots__ = ("texts", "records", "paths", "text", "chars", "assistant")

    def __init__(self, texts: list[str], records: Any, paths: Any, text: Any, chars: Any, assistant: Any):
        self.texts, self.records, self.paths = texts, records, paths
        self.text, self.chars, self.assistant = text, chars, assistant


def compile_template(source: str) -> Any:
    """The compiled Jinja template, as transformers' apply_chat_template compiles it (cached there)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(source)


def hf_message(m: Message, *, marked: bool, parts: bool = False) -> dict:
    """A Message as the template sees it: string content if text-only (``parts``: a list of one text part, for
    a template that reads only parts), else parts with {"type": "image"}, {"type": "video"} and {"type": "audio"}
    (a video's sound track, ``AudioRef.video``, is no part: the template writes its video's placeholder only);
    with ``marked``, the content wrapped in OPEN ... CLOSE. Tool fields (``tool_calls``, ``tool_call_id``,
    ``name``) are passed as the record gave them. A turn with no content (it only calls tools) is never
    marked: templates test its content for truth (Qwen2.5: ``{% if message.content %}``)."""
    out = _hf_content(m, marked=marked and not _calls_only(m), parts=parts)
    if m.tool_calls is not None:
        out["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _hf_content(m: Message, *, marked: bool, parts: bool = False) -> dict:
    if all(isinstance(p, str) for p in m.parts) and not (parts and m.parts):
        text = "".join(m.parts)  # type: ignore[arg-type]
        return {"role": m.role, "content": OPEN + text + CLOSE if marked else text}
    out: list[dict] = [
        {"type": "text", "text": p} if isinstance(p, str) else {"type": _PART_TYPES[type(p)]}
        for p in m.parts if not (isinstance(p, AudioRef) and p.video)
    ]
    if parts and all(isinstance(p, str) for p in m.parts):  # text only: one text part, as a processor writes it
        out = [{"type": "text", "text": "".join(m.parts)}]  # type: ignore[arg-type]
    if marked:  # glue the markers onto text parts where possible, so no part is added
        if "text" in out[0]:
            out[0] = {"type": "text", "text": OPEN + out[0]["text"]}
        else:
            out.insert(0, {"type": "text", "text": OPEN})
        if "text" in out[-1]:
            out[-1] = {"type": "text", "text": out[-1]["text"] + CLOSE}
        else:
            out.append({"type": "text", "text": CLOSE})
    return {"role": m.role, "content": out}


_PART_TYPES = {ImageRef: "image", VideoRef: "video", AudioRef: "audio"}


def _calls_only(m: Message) -> bool:
    """A turn with tool calls and no content: not marked (see ``hf_message``)."""
    return not m.parts and bool(m.tool_calls)


def _uses_tools(conv: list[Message], tools: list[dict] | None) -> bool:
    return bool(tools) or any(m.tool_calls for m in conv)


def _check_tools_rendered(text: str, conv: list[Message], tools: list[dict] | None) -> None:
    """A template without tool support drops calls and tool lists silently: refuse that, naming the fix."""
    names = [(c.get("function", c))["name"] for m in conv for c in m.tool_calls or ()]
    names += [(t.get("function", t)).get("name") for t in tools or ()]
    missing = [n for n in names if isinstance(n, str) and n not in text]
    if missing:
        raise RecordError(
            "template_error",
            f"the chat template does not render tool calls or tools (no {missing[0]!r} in its text); use a "
            "template that supports tools (--tokenizer qwen2.5, or --chat-template FILE)",
        )


def probe_conversations(*, images: bool) -> list[list[Message]]:
    """What templates do to content (trimming, ``<think>`` splitting, leading and trailing newlines), a first
    message that is not a system prompt, and, with ``images``, image parts."""
    texts = [" Be brief. ", "\nHi\n", "  <think>x</think>\nHello  ", "a  b ", "<think>\n\n</think>\n\nBye\n"]
    roles = ["system", "user", "assistant", "user", "assistant"]
    probe = [Message(r, [t]) for r, t in zip(roles, texts, strict=True)]
    convs = [probe, probe[1:], probe[1:3]]
    if images:
        image = ImageRef(path="probe.jpg")
        convs.append([Message("user", [image, " Describe. "]), Message("assistant", ["x"])])
        convs.append([Message("user", ["Look ", image]), Message("assistant", [" y "])])
    return convs


class ChatTemplate:
    """One chat template source, compiled, with its way of locating content decided once at construction.

    ``special_tokens`` are passed to the template (``bos_token``, ``eos_token``, ...); ``images``: whether the
    probes include image parts (the profile takes images); ``fast`` False: never the pure-Python renderer (the
    general path, which the fast one is checked against). A None ``source`` fails on the first chat record
    (a text-only build needs no template). ``paths`` counts the renderings each path made.
    """

    def __init__(self, source: str | None, *, special_tokens: dict[str, str], images: bool, fast: bool = True):
        self.source = source
        self.paths: Counter[str] = Counter()  # renderings by path: "python", "jinja", "jinja+prefixes"
        self._kwargs = special_tokens
        self._compiled = None
        if source is not None:
            try:
                self._compiled = compile_template(source)
            except Exception as e:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
                raise ConfigError(f"the chat template does not compile: {type(e).__name__}: {e}") from e
        self._parts = self._content_as_parts()  # text-only content given as a list of parts, not a string
        self._verify = not self._marker_transparent(images=images)  # True: check every marked rendering
        self._fast: _Fast | None = None  # set only after the Jinja path has checked it on the probes
        renderer = _fast_template(source, special_tokens) if fast else None
        if self._verify and isinstance(renderer, _ChatML):
            renderer = None  # ChatML's renderer gives marker spans only (Gemma's gives the checked path's answers)
        self._fast = self._checked(renderer)
        self.paths.clear()  # the probes' renderings are not the data's

    def __getstate__(self) -> dict:
        """A compiled Jinja template does not pickle: it is compiled again on first use (a registered ChatML
        template never needs it), so unpickling imports no transformers."""
        return {**self.__dict__, "_compiled": None}

    def render(
        self, conv: list[dict], *, add_generation_prompt: bool = False, tools: list[dict] | None = None
    ) -> str:
        """The template's text for ``conv`` (messages as ``hf_message`` gives them) and ``tools``;
        RecordError if it fails."""
        if self.source is None:
            raise ConfigError("the tokenizer has no chat template; pass --chat-template FILE")
        if self._compiled is None:  # unpickled: compiled here, on first use (see __getstate__)
            self._compiled = compile_template(self.source)
        try:
            return self._compiled.render(
                messages=conv,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._kwargs,
            )
        except Exception as e:  # noqa: BLE001 - any Jinja error (incl. raise_exception) is this record's problem
            raise RecordError(
                "template_error", f"the chat template failed: {type(e).__name__}: {e}"
            ) from None

    def locate(self, conv: list[Message], *, tools: list[dict] | None = None) -> tuple[str, list[Span]]:
        """Render ``conv`` (with the record's ``tools``): the text and one Span per message.

        A turn with no content (it only calls tools) is not marked; its content starts where the generation
        prompt after the messages before it ends, which is where a model starts writing its calls. A
        conversation with tools is always checked against its unmarked rendering (the probes hold none). No
        message at all is a RecordError (``empty_messages``), as every other bad record's (no parser makes such a
        conversation: a chat's ``messages`` and each branch must be non-empty)."""
        if not conv:
            raise RecordError("empty_messages", "the conversation to render has no messages")
        if self._fast is not None and not tools:
            located = self._fast.locate(conv)  # None where a message calls tools: the checks below see to them
            if located is not None:
                self.paths["python"] += 1
                return located
        uses_tools = _uses_tools(conv, tools)
        marked = self.render([self._message(m, marked=True) for m in conv], tools=tools)
        markers = [(mo.start(), mo.group()) for mo in _MARKER.finditer(marked)]
        has = [not _calls_only(m) for m in conv]  # which messages carry markers
        # the markers must come back as OPEN, CLOSE, OPEN, CLOSE, ...: one pair per marked message, in order
        if len(markers) == 2 * sum(has) and all(
            c == (OPEN if i % 2 == 0 else CLOSE) for i, (_, c) in enumerate(markers)
        ):
            text = marked.replace(OPEN, "").replace(CLOSE, "")
            clean = None
            if self._verify or uses_tools:
                clean = self.render([self._message(m, marked=False) for m in conv], tools=tools)
            if clean is None or text == clean:
                if uses_tools:
                    _check_tools_rendered(text, conv, tools)
                # marker i sits at clean position p - i (i markers precede it)
                opens = iter(p - i for i, (p, _) in enumerate(markers) if i % 2 == 0)
                closes = iter(p - i for i, (p, _) in enumerate(markers) if i % 2 == 1)
                starts, ends = [], []
                for k, marked_k in enumerate(has):
                    if marked_k:
                        starts.append(next(opens))
                        ends.append(next(closes))
                    else:
                        start = self._generation_start(conv, k, text, tools)
                        starts.append(start)
                        ends.append(start)
                limits = starts[1:] + [len(text)]
                self.paths["jinja"] += 1
                return text, list(zip(starts, ends, limits, strict=True))
        clean = self.render([self._message(m, marked=False) for m in conv], tools=tools)
        if uses_tools:
            _check_tools_rendered(clean, conv, tools)
        self.paths["jinja+prefixes"] += 1
        return clean, self._locate_by_prefixes(conv, clean, tools)

    def locate_texts(self, convs: list[list[Message]]) -> list[tuple[str, list[Span]] | None]:
        """``locate`` (without tools) of each conversation the pure-Python ChatML renderer takes in one batch
        (``_ChatML.locate_texts``: every message one text), None for the others: ``locate`` decides them. The
        answers are not counted in ``paths``: the caller counts those it uses."""
        if type(self._fast) is not _ChatML:
            return [None] * len(convs)
        return self._fast.locate_texts(convs)

    def locate_columns(self, convs: list[list[Message]]) -> tuple[list[tuple[str, list[Span]] | None],
                                                                   SpanColumns | None]:
        """``locate_texts``, and the spans of every conversation the ChatML renderer rendered as columns
        (``SpanColumns``; None where it rendered none, or for any other renderer)."""
        if type(self._fast) is not _ChatML:
            return [None] * len(convs), None
        return self._fast.locate_columns(convs)

    @property
    def renders_chats(self) -> bool:
        """Whether ``render_chats`` renders (the ChatML renderer is this template's)."""
        return type(self._fast) is _ChatML

    def render_chats(self, nodes: list[int], counts: list[int], roles: list[str], contents: list[str]
                     ) -> RenderedChats | None:
        """Text chats given as columns, rendered by the ChatML renderer (``_ChatML.render_chats``); None for any
        other renderer (``locate_columns``' rule)."""
        if type(self._fast) is not _ChatML:
            return None
        return self._fast.render_chats(nodes, counts, roles, contents)

    def _generation_start(self, conv: list[Message], k: int, text: str, tools: list[dict] | None) -> int:
        """Where message k's content starts in ``text``: the end of the generation prompt after ``conv[:k]``."""
        header = self.render(
            [self._message(m, marked=False) for m in conv[:k]], add_generation_prompt=True, tools=tools
        )
        if not text.startswith(header):
            raise RecordError(
                "template_error",
                f"the generation prompt after messages[:{k}] is not a prefix of the rendering (message {k} has "
                "no content to mark)",
            )
        return len(header)

    def _locate_by_prefixes(self, conv: list[Message], full: str, tools: list[dict] | None = None) -> list[Span]:
        """The fallback: message spans from rendered prefixes, an assistant's header from the generation
        prompt."""
        hf = [self._message(m, marked=False) for m in conv]
        spans = []
        prev = ""
        for k in range(len(conv)):
            cur = full if k == len(conv) - 1 else self.render(hf[: k + 1], tools=tools)
            if not cur.startswith(prev) or not full.startswith(cur):
                raise RecordError(
                    "template_error",
                    f"the chat template is not prefix-stable: rendering messages[:{k}] is not a prefix of "
                    f"rendering messages[:{k + 1}]",
                )
            start = len(prev)
            if conv[k].role == "assistant":
                header = self.render(hf[:k], add_generation_prompt=True, tools=tools)
                if not (header.startswith(prev) and cur.startswith(header)):
                    raise RecordError(
                        "template_error",
                        f"the generation prompt after messages[:{k}] is not a prefix of message {k}",
                    )
                start = len(header)
            spans.append((start, None, len(cur)))
            prev = cur
        return spans

    def _message(self, m: Message, *, marked: bool) -> dict:
        return hf_message(m, marked=marked, parts=self._parts)

    def _content_as_parts(self) -> bool:
        """Whether this template renders a text-only message only when its content is a list of parts
        (SmolVLM's reads ``content[0]['type']`` and iterates parts: a string renders as nothing). Decided once
        on a probe; a template that renders a plain message's text in neither form is refused (ConfigError):
        it would train on conversations with their text silently dropped."""
        if self.source is None:
            return False
        probe = [Message("user", ["Zqx probe question."]), Message("assistant", ["Zqy probe answer."])]

        def shows(parts: bool) -> bool | None:
            try:
                text = self.render([hf_message(m, marked=False, parts=parts) for m in probe])
            except RecordError:
                return None  # the template wants something else of a conversation: no verdict
            return "Zqx probe question." in text and "Zqy probe answer." in text

        as_string = shows(False)
        if as_string is not False:
            return False
        if shows(True):
            return True
        raise ConfigError("the chat template renders no message text, as a string or as text parts; pass a template "
                          "that writes each message's content (--chat-template FILE)")

    def _marker_transparent(self, *, images: bool) -> bool:
        """Whether marked content renders exactly like plain content on every probe conversation."""
        if self.source is None:
            return False
        for conv in probe_conversations(images=images):
            try:
                clean = self.render([self._message(m, marked=False) for m in conv])
                marked = self.render([self._message(m, marked=True) for m in conv])
            except RecordError:
                return False
            if marked.count(OPEN) != len(conv) or marked.replace(OPEN, "").replace(CLOSE, "") != clean:
                return False
        return True

    def _checked(self, fast: _Fast | None
                 ) -> _Fast | None:
        """``fast`` if it agrees with the Jinja rendering on every probe conversation, else None."""
        if fast is None:
            return None
        image, video = ImageRef(path="probe.jpg"), VideoRef(path="probe.mp4")
        extra = [  # multi-part messages, image-only content, videos, a tool turn, a system turn later on
            [Message("user", [image, "a", image, "b ", image]), Message("assistant", ["c"], loss=True)],
            [Message("user", [video, "a", image, video]), Message("assistant", ["c"])],
            [
                Message("user", [image]),
                Message("tool", ["{}"]),
                Message("system", ["s"]),
                Message("assistant", [""]),
            ],
        ]
        for conv in probe_conversations(images=True) + extra:
            got = fast.locate(conv)
            try:
                want = self.locate(conv)  # self._fast is not set yet: this is Jinja
            except RecordError:
                if got is not None:  # Jinja refuses it: so must the fast path
                    return None
                continue
            if got is None and all(len(m.parts) == 1 and type(m.parts[0]) is str for m in conv):
                return None  # the text-only probes Jinja renders must be the fast path's: else it earns nothing
            if got is not None and got != want:
                return None
        return fast


def _marked(text: str, conv: list[Message]) -> bool:
    """Whether a text of ``conv`` holds a span marker (then Jinja's path decides). One look at the whole text
    first: an ASCII text cannot hold one, so most records need no scan of their parts."""
    return (OPEN in text or CLOSE in text) and any(
        isinstance(p, str) and (OPEN in p or CLOSE in p) for m in conv for p in m.parts)


def _spans(conv: list[Message], text: str, starts: list[int], ends: list[int], bounds: list[int] | None = None,
           *, head: int = 0, generation: int = 0) -> tuple[str, list[Span]] | None:
    """A renderer's answer: None where a text holds a marker; else the marker spans, or with ``bounds`` (each
    message's end) the prefix fallback's: message k from the end of ``conv[:k]``'s rendering, an assistant's
    after the generation prompt (``generation`` characters, after the template's ``head`` for a first one)."""
    if _marked(text, conv):
        return None
    if bounds is None:
        return text, list(zip(starts, ends, [*starts[1:], len(text)], strict=True))
    spans: list[Span] = []
    for k, m in enumerate(conv):
        before = bounds[k - 1] if k else 0
        if m.role == "assistant":
            before = (bounds[k - 1] if k else head) + generation
        spans.append((before, None, bounds[k]))
    return text, spans


def _layout(pieces: list[str]) -> tuple[str, list[int], list[int], list[int]]:
    """A renderer's text from its pieces (a head, then each turn's header, content and tail) and, per turn, where
    its content starts and ends and where the turn ends (offsets summed in C, not per turn in Python)."""
    at = list(accumulate(map(len, pieces)))
    return "".join(pieces), at[1::3], at[2::3], at[3::3]


class _ChatML:
    """Pure-Python rendering of one known ChatML template: Jinja's exact text and the content spans.

    Used only for a template registered in ``_fast_template`` (by exact string), and only if it reproduces
    Jinja on the probe conversations (``ChatTemplate._checked``).
    """

    def __init__(self, *, default_system: str, image: str | None, video: str | None,
                 roles: tuple[str, ...] | None = None, prefix: str = ""):
        self.prefix = prefix  # emitted first (Molmo2's bos_token)
        self.default_system = default_system  # emitted before a first message that is not a system message
        self.image = image  # what one image part renders to (None: Jinja renders a message with one)
        self.video = video  # and one video part
        self.roles = None if roles is None else frozenset(roles)  # the roles written as plain turns (None: all)
        self._heads: dict[str, str] = {}  # each role's turn header, made once (``locate_texts``)

    def _head(self, role: str) -> str | None:
        """``<|im_start|>{role}\\n``, kept per role; None for a role this template does not write as a plain turn."""
        if type(role) is not str or (self.roles is not None and role not in self.roles):
            return None
        head = self._heads[role] = f"<|im_start|>{role}\n"
        return head

    def locate_texts(self, convs: list[list[Message]]) -> list[tuple[str, list[Span]] | None]:
        """``locate`` of each conversation whose messages are each one text (the common chat), None for any
        other (``locate`` decides: parts, tool calls, a role not written as a plain turn, a marker in a text,
        no message). One pass over the batch's messages; the span offsets of every conversation summed by
        numpy at once, not per message in Python (tests/encode/test_templates.py compares it with ``locate``)."""
        return self.locate_columns(convs)[0]

    def locate_columns(self, convs: list[list[Message]]) -> tuple[list[tuple[str, list[Span]] | None],
                                                                   SpanColumns | None]:
        """``locate_texts``, and the same spans as columns (``SpanColumns``: every message of the conversations
        it rendered, answered or not, in order), None where it rendered none."""
        import numpy as np

        out: list[tuple[str, list[Span]] | None] = [None] * len(convs)
        pieces: list[str] = []  # per conversation taken: its lead, then each message's header, text, tail
        bounds: list[int] = [0]  # where each taken conversation's pieces start (then one past the last's)
        taken: list[int] = []  # their indices in ``convs``
        heads, end = self._heads, "<|im_end|>\n"
        get = heads.get
        lead_system = self.prefix  # before a first system message
        lead = self.prefix + self.default_system  # before any other first message
        weighted: list[int] = []  # the conversations taken (their index in ``taken``) with a message's own ``loss``
        for c, conv in enumerate(convs):
            if not conv:
                continue
            at, own_loss = len(pieces), False
            pieces.append(lead_system if conv[0].role == "system" else lead)
            for m in conv:
                parts = m.parts
                if m.tool_calls or len(parts) != 1 or type(parts[0]) is not str:
                    break
                head = get(m.role) or self._head(m.role)
                if head is None:
                    break
                if m.loss is not None:
                    own_loss = True
                pieces += (head, parts[0], end)
            else:
                bounds.append(len(pieces))
                if own_loss:
                    weighted.append(len(taken))
                taken.append(c)
                continue
            del pieces[at:]
        if not taken:
            return out, None
        lens = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        ends = np.cumsum(lens)  # each piece's end in its batch-long concatenation
        begins = ends - lens
        b = np.asarray(bounds)
        sizes = b[1:] - b[:-1]
        base = begins[b[:-1]]  # each conversation's start in the concatenation
        offset = np.arange(len(pieces)) - np.repeat(b[:-1], sizes)  # a piece's index inside its conversation
        content = np.flatnonzero(offset % 3 == 2)  # the messages' texts (after the lead and each header)
        count = (sizes - 1) // 3  # messages per conversation
        shift = np.repeat(base, count)
        starts = begins[content] - shift
        limits = np.empty_like(starts)
        limits[:-1] = starts[1:]
        limits[np.cumsum(count) - 1] = ends[b[1:] - 1] - base  # a last message's limit: its text's end
        stops = ends[content] - shift
        spans = list(zip(starts.tolist(), stops.tolist(), limits.tolist(), strict=True))
        first, join = 0, "".join
        for c, n, a, b in zip(taken, count.tolist(), bounds[:-1], bounds[1:], strict=True):  # (``_marked``'s first look inline)
            text = join(pieces[a:b])
            if (OPEN in text or CLOSE in text) and _marked(text, convs[c]):
                first += n
                continue  # a marker in a text: Jinja's path decides
            out[c] = text, spans[first : first + n]
            first += n
        # the assistant turns by their header's length, where no other role's header has that length (the headers
        # are ``_heads``' strings); else by the header itself
        assistant = heads.get("assistant")  # None: no assistant turn taken (its header is made at the first)
        if assistant is None:
            is_assistant = np.zeros(content.shape[0], dtype=bool)
        elif all(h is assistant or len(h) != len(assistant) for h in heads.values()):
            is_assistant = lens[content - 1] == len(assistant)
        else:
            is_assistant = np.fromiter((pieces[i] is assistant for i in (content - 1).tolist()), dtype=bool,
                                       count=content.shape[0])
        default = np.ones(len(taken), dtype=bool)
        default[weighted] = False
        return out, SpanColumns(np.asarray(taken, dtype=np.int64), count, np.stack([starts, stops, limits], axis=1),
                                is_assistant, default)

    def render_chats(self, nodes: list[int], counts: list[int], roles: list[str], contents: list[str]
                     ) -> RenderedChats:
        """``locate_columns`` of text chats given as columns (``ChatTemplate.render_chats``): record k has
        ``nodes[k]`` nodes, its root then each branch (a linear chat: one), node n ``counts[n]`` messages, the
        next ones of ``roles`` and ``contents``, each one text with no ``loss`` of its own. Each record's paths
        are rendered (its root's messages, then the root's followed by each branch's, as ``render.stage_batch``
        lays a one-level tree out), a branch's path as its root's text followed by the branch's turns. A record
        with a role this template does not write as a plain turn, or a marker in a text, is not rendered."""
        import numpy as np

        r, n, m = len(nodes), len(counts), len(contents)
        empty = np.zeros(0, dtype=np.int64)
        if not r:
            return RenderedChats([], empty, np.zeros(1, dtype=np.int64), empty, empty.reshape(0, 3), empty.astype(bool))
        end = "<|im_end|>\n"
        head_of = {role: self._head(role) for role in set(roles)}
        heads = list(map(head_of.__getitem__, roles))
        node_first = np.zeros(n + 1, dtype=np.int64)  # each node's first message (then the last one's end)
        np.cumsum(counts, out=node_first[1:])
        rec_first = np.zeros(r + 1, dtype=np.int64)  # each record's first node
        np.cumsum(nodes, out=rec_first[1:])
        firsts = node_first[rec_first[:-1]].tolist()  # each record's first message
        ok = np.ones(r, dtype=bool)
        if None in head_of.values():
            bad = np.fromiter((h is None for h in heads), dtype=bool, count=m)
            ok &= np.add.reduceat(bad, firsts) == 0  # (every record has a message)
            heads = ["" if h is None else h for h in heads]  # such records are rendered, and dropped
        lead_system, lead = self.prefix, self.prefix + self.default_system
        for a in firsts:  # the lead rides on each root's first header
            heads[a] = (lead_system if roles[a] == "system" else lead) + heads[a]
        pieces: list[Any] = [None] * (3 * m)  # each message's header, text, tail, back to back
        pieces[0::3], pieces[1::3], pieces[2::3] = heads, contents, [end] * m
        join = "".join
        cut = (3 * node_first).tolist()
        own = [join(pieces[a:b]) for a, b in zip(cut[:-1], cut[1:], strict=True)]  # each node's own text
        big = join(contents)
        if OPEN in big or CLOSE in big:  # a marker in a text (headers hold none): ``locate`` decides the record
            marked = np.fromiter((OPEN in t or CLOSE in t for t in own), dtype=bool, count=n)
            ok &= np.add.reduceat(marked, rec_first[:-1].tolist()) == 0
        if n == r:  # linear chats only: each record's one path is its root's text
            texts = own if ok.all() else [t for t, x in zip(own, ok.tolist(), strict=True) if x]
        else:  # a branch's path: its root's text, then its own
            texts = []
            for a, b, x in zip(rec_first[:-1].tolist(), rec_first[1:].tolist(), ok.tolist(), strict=True):
                if x:
                    root = own[a]
                    texts.append(root)
                    texts += [root + t for t in own[a + 1 : b]]
        lens = np.empty(3 * m, dtype=np.int64)
        lens[0::3] = np.fromiter(map(len, heads), dtype=np.int64, count=m)
        lens[1::3] = np.fromiter(map(len, contents), dtype=np.int64, count=m)
        lens[2::3] = len(end)
        ends = np.cumsum(lens)  # each piece's end in the batch-long concatenation
        base = np.concatenate([[0], ends])[3 * node_first]  # each node's start (then the last one's end)
        node_len = base[1:] - base[:-1]  # each node's own text
        rec_of_node = np.repeat(np.arange(r), nodes)
        root_of_node = rec_first[:-1][rec_of_node]
        at = np.where(np.arange(n) == root_of_node, 0, node_len[root_of_node])  # each node's text in its path's
        shift = np.repeat(base[:-1] - at, counts)
        starts = ends[0::3] - shift  # each message's text, inside its path's text
        stops = ends[1::3] - shift
        limits = np.empty_like(starts)
        limits[:-1] = starts[1:]
        limits[node_first[1:] - 1] = (node_len + at)  # a node's last message's limit: its path's text's end
        assistant = np.fromiter(map("assistant".__eq__, roles), dtype=bool, count=m)
        taken = np.repeat(ok, nodes)  # the nodes of the records rendered, each one path (text)
        path_of = np.cumsum(taken) - 1  # each node's path among ``texts``
        keep = np.repeat(taken, counts)
        paths = np.zeros(int(ok.sum()) + 1, dtype=np.int64)
        np.cumsum(np.asarray(nodes)[ok], out=paths[1:])
        return RenderedChats(texts, np.flatnonzero(ok), paths, np.repeat(path_of, counts)[keep],
                             np.stack([starts, stops, limits], axis=1)[keep], assistant[keep])

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None if a text holds a marker character, a message calls
        tools or has a role or part this template does not write as plain ChatML (Jinja decides)."""
        if not conv:
            return None
        pieces: list[str] = [self.prefix]
        if conv[0].role != "system" and self.default_system:
            pieces.append(self.default_system)
        pos = sum(map(len, pieces))
        starts, ends = [], []
        roles = self.roles
        for m in conv:
            if m.tool_calls or (roles is not None and m.role not in roles):
                return None
            parts = m.parts
            if len(parts) == 1 and type(parts[0]) is str:  # the common text-only message: no join
                content = parts[0]
            elif any(isinstance(p, AudioRef) for p in parts) or (
                    self.image is None and any(not isinstance(p, str) for p in parts)):
                return None  # the builtin ChatML renderers write no audio: Jinja decides
            else:
                content = "".join(
                    [p if isinstance(p, str) else self.video if isinstance(p, VideoRef) else self.image for p in parts]
                )
            header = f"<|im_start|>{m.role}\n"
            pos += len(header)
            starts.append(pos)
            pos += len(content)
            ends.append(pos)
            pos += 11  # len("<|im_end|>\n")
            pieces += (header, content, "<|im_end|>\n")
        text = "".join(pieces)
        return _spans(conv, text, starts, ends)


class _Gemma:
    """Pure-Python rendering of Gemma 3's template: Jinja's text and ``ChatTemplate.locate``'s spans.

    The template trims every text, so its markers are checked on each conversation (``_verify``): where a
    content's trimmed ends touch its markers the marked text differs from the clean one and ``locate`` takes
    the prefix fallback (content end None, an assistant's start after the generation prompt). This renderer
    gives either answer, whichever Jinja's ``locate`` would (``ChatTemplate._checked``, and the fuzz in
    tests/encode/test_templates.py).
    """

    def __init__(self, *, bos: str, image: str):
        self.bos = bos
        self.image = image

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None where Jinja decides (module docstring of the class)."""
        system = None
        turns = conv
        if conv and conv[0].role == "system":
            if not all(type(p) is str for p in conv[0].parts):
                return None
            system = "".join(conv[0].parts)  # type: ignore[arg-type]
            turns = conv[1:]
        if not turns:
            return None
        image = self.image
        pieces = [self.bos]
        pos = len(self.bos)
        starts: list[int] = []  # content spans as the markers give them
        ends: list[int] = []
        bounds: list[int] = [pos] if system is not None else []  # each message's rendering's end (prefixes)
        heads: list[int] = []  # where each turn's rendering starts
        exact = True  # the marked rendering equals the clean one: spans from markers, else from prefixes
        for i, m in enumerate(turns):
            if m.tool_calls or m.role != ("user" if i % 2 == 0 else "assistant"):
                return None
            header = "<start_of_turn>user\n" if i % 2 == 0 else "<start_of_turn>model\n"
            heads.append(pos)
            pieces.append(header)
            pos += len(header)
            if i == 0 and system is not None:
                starts.append(pos)
                pos += len(system)
                ends.append(pos)
                pieces.append(system + "\n\n")
                pos += 2
            parts = m.parts
            if all(type(p) is str for p in parts):
                content = "".join(parts)  # type: ignore[arg-type]
                trimmed = content.strip()
                exact = exact and trimmed == content
            elif any(type(p) is not str and type(p) is not ImageRef for p in parts):
                return None
            else:
                out = [p.strip() if type(p) is str else image for p in parts]  # type: ignore[union-attr]
                first, last = parts[0], parts[-1]
                # a marker glued to the first (last) text keeps what trim would take from that end
                exact = exact and (type(first) is not str or first.rstrip() == first.strip()) and (
                    type(last) is not str or last.lstrip() == last.strip())
                trimmed = "".join(out)
            starts.append(pos)
            pos += len(trimmed)
            ends.append(pos)
            pos += 14  # len("<end_of_turn>\n")
            pieces += (trimmed, "<end_of_turn>\n")
            bounds.append(pos)
        text = "".join(pieces)
        if _marked(text, conv):
            return None
        if exact:
            return text, list(zip(starts, ends, [*starts[1:], len(text)], strict=True))
        # the prefix fallback: message k from the end of messages[:k]'s rendering (a model turn: past its header)
        spans: list[Span] = []
        if system is not None:
            spans.append((0, None, bounds[0]))
        for i in range(len(turns)):
            k = len(spans)
            before = bounds[k - 1] if k else 0
            start = before + len("<start_of_turn>model\n") if i % 2 else before
            spans.append((start, None, bounds[k]))
        return text, spans


class _Mistral:
    """Pure-Python rendering of Mistral 3's template: Jinja's text and the content spans (its markers are
    transparent: no trim). System texts, user turns of text and images, assistant texts; None otherwise."""

    def __init__(self, *, bos: str, eos: str, image: str):
        self.bos, self.eos, self.image = bos, eos, image

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None where Jinja decides."""
        if not conv:
            return None
        pieces = [self.bos]
        for m in conv:
            if m.tool_calls:
                return None
            parts = m.parts
            text_only = all(type(p) is str for p in parts)
            if m.role == "user":
                if not text_only and any(type(p) is not str and type(p) is not ImageRef for p in parts):
                    return None
                head, tail = "[INST]", "[/INST]"
                content = "".join([p if type(p) is str else self.image for p in parts])  # type: ignore[misc]
            elif m.role == "system" and text_only:
                head, tail = "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"
                content = "".join(parts)  # type: ignore[arg-type]
            elif m.role == "assistant" and text_only:
                head, tail = "", self.eos
                content = "".join(parts)  # type: ignore[arg-type]
            else:
                return None
            pieces += (head, content, tail)
        text, starts, ends, _ = _layout(pieces)
        return _spans(conv, text, starts, ends)


class _SmolVLM:
    """Pure-Python rendering of SmolVLM's template: Jinja's text and ``ChatTemplate.locate``'s spans. The template
    writes ``Role:`` before a content that starts with an image and ``Role: `` otherwise, so a marker put before
    that image changes the text and Jinja's path takes the prefix fallback for the conversation: this renderer
    gives that answer there (content end None, an assistant's start after ``Assistant:``), the marker spans
    elsewhere."""

    HEAD = "<|im_start|>"
    END = "<end_of_utterance>\n"

    def __init__(self, *, image: str, video: str):
        self.image, self.video = image, video

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None where Jinja decides."""
        if not conv:
            return None
        pieces = [self.HEAD]
        exact = True
        for m in conv:
            if m.tool_calls:
                return None
            parts = m.parts
            role = m.role.capitalize()
            if all(type(p) is str for p in parts):
                head, content = role + ": ", "".join(parts)  # type: ignore[arg-type]
            elif any(type(p) is not str and type(p) is not ImageRef and type(p) is not VideoRef for p in parts):
                return None
            else:
                image_first = type(parts[0]) is ImageRef
                exact = exact and not image_first  # the marker before the image turns ":" into ": "
                head = role + (":" if image_first else ": ")
                content = "".join([p if type(p) is str else self.image if type(p) is ImageRef else self.video
                                   for p in parts])  # type: ignore[misc]
            pieces += (head, content, self.END)
        text, starts, ends, bounds = _layout(pieces)
        return _spans(conv, text, starts, ends, bounds if not exact else None,
                      head=len(self.HEAD), generation=len("Assistant:"))


class _Gemma4:
    """Pure-Python rendering of the gemma4 stand-in's template: Jinja's text and ``ChatTemplate.locate``'s spans.
    It trims every text (a model turn's after dropping thinking channels: left to Jinja), so, as ``_Gemma``, it
    gives the marker spans where trimming leaves each content's ends alone and the prefix fallback's elsewhere."""

    TURN, END, MODEL = "<|turn>", "<turn|>\n", "<|turn>model\n"

    def __init__(self, *, bos: str, image: str, video: str, audio: str):
        self.bos = bos
        self.parts = {ImageRef: image, VideoRef: video, AudioRef: audio}

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None where Jinja decides."""
        if not conv:
            return None
        pieces = [self.bos]
        exact = True  # the marked rendering equals the clean one: spans from markers, else from prefixes
        for i, m in enumerate(conv):
            if m.tool_calls or m.role not in ("user", "assistant", "system"):
                return None
            role = "model" if m.role == "assistant" else m.role
            parts = m.parts
            if all(type(p) is str for p in parts):
                content = "".join(parts)  # type: ignore[arg-type]
                if role == "model" and ("<|channel>" in content or "<channel|>" in content):
                    return None
                trimmed = content.strip()
                exact = exact and trimmed == content
            elif i == 0 and role == "system":
                return None  # the template raises: a first system turn of parts
            else:
                shown = [p for p in parts if not (type(p) is AudioRef and p.video)]  # as hf_message gives them
                out = []
                for p in shown:
                    if type(p) is str:
                        if role == "model" and ("<|channel>" in p or "<channel|>" in p):
                            return None
                        out.append(p.strip())
                    elif type(p) in self.parts:
                        out.append(self.parts[type(p)])
                    else:
                        return None
                if not shown:
                    return None
                first, last = shown[0], shown[-1]
                # a marker glued to the first (last) text keeps what trim would take from that end
                exact = exact and (type(first) is not str or first.rstrip() == first.strip()) and (
                    type(last) is not str or last.lstrip() == last.strip())
                trimmed = "".join(out)
            pieces += (self.TURN + role + "\n", trimmed, self.END)
        text, starts, ends, bounds = _layout(pieces)
        return _spans(conv, text, starts, ends, bounds if not exact else None,
                      head=len(self.bos), generation=len(self.MODEL))


class _Llama4:
    """Pure-Python rendering of Llama 4's template: Jinja's text and ``ChatTemplate.locate``'s spans. Only a first
    system message's text is trimmed, so the marker spans are Jinja's answer unless trimming touches it, where
    its prefix fallback's are (as ``_Gemma``)."""

    HEAD, EOT, ASSISTANT = "<|header_start|>", "<|eot|>", "<|header_start|>assistant<|header_end|>\n\n"

    def __init__(self, *, bos: str, image: str):
        self.bos, self.image = bos, image

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None where Jinja decides."""
        if not conv:
            return None
        pieces = [self.bos]
        exact = True  # the marked rendering equals the clean one: spans from markers, else from prefixes
        for i, m in enumerate(conv):
            if m.tool_calls is not None or m.role not in ("user", "assistant", "system"):
                return None  # a tool turn or call ("tool_calls" in message, even empty): Jinja
            parts = m.parts
            if all(type(p) is str for p in parts):
                content = "".join(parts)  # type: ignore[arg-type]
                if i == 0 and m.role == "system":
                    trimmed = content.strip()
                    exact = trimmed == content
                    content = trimmed
            elif (i == 0 and m.role == "system") or any(type(p) is not str and type(p) is not ImageRef
                                                         for p in parts):
                return None  # a first system turn of parts (its first part's text), a video or audio: Jinja
            else:
                content = "".join([p if type(p) is str else self.image for p in parts])  # type: ignore[misc]
            pieces += (f"{self.HEAD}{m.role}<|header_end|>\n\n", content, self.EOT)
        text, starts, ends, bounds = _layout(pieces)
        # the prefix fallback only where a first system text was trimmed (so message 0 is no assistant)
        return _spans(conv, text, starts, ends, bounds if not exact else None,
                      generation=len(self.ASSISTANT))


class _Glm:
    """Pure-Python rendering of GLM-4.6V's template: Jinja's text and ``ChatTemplate.locate``'s spans. An assistant's
    content is written stripped after an empty thinking block, so, as ``_Gemma``, it gives the marker spans where
    stripping leaves every assistant content alone (and it is not empty) and the prefix fallback's elsewhere."""

    PREFIX, USER, SYSTEM, ASSISTANT = "[gMASK]<sop>", "<|user|>\n", "<|system|>\n", "<|assistant|>"
    THINK, GENERATION = "\n<think></think>", "<|assistant|>\n"  # an empty thinking block; the generation prompt

    def __init__(self, *, image: str, video: str):
        self.image, self.video = image, video

    def locate(self, conv: list[Message]) -> tuple[str, list[Span]] | None:
        """``ChatTemplate.locate`` of ``conv``; None where Jinja decides."""
        if not conv:
            return None
        pieces = [self.PREFIX]
        exact = True  # the marked rendering equals the clean one: spans from markers, else from prefixes
        stable = True  # every prefix's rendering a prefix of the whole (else Jinja's fallback fails)
        last_user = max((i for i, m in enumerate(conv) if m.role == "user"), default=-1)
        for i, m in enumerate(conv):
            if m.tool_calls:
                return None
            parts = m.parts
            if len(parts) == 1 and type(parts[0]) is str:
                content = parts[0]
            elif any(type(p) is not str and type(p) is not ImageRef and type(p) is not VideoRef for p in parts):
                return None  # an audio part (the template writes none): Jinja
            else:
                content = "".join([p if type(p) is str else self.image if type(p) is ImageRef else self.video
                                   for p in parts])  # type: ignore[misc]
            if m.role == "assistant":
                if "</think>" not in content:
                    stripped = content.strip()
                    exact = exact and stripped == content and content != ""
                    head = self.ASSISTANT + self.THINK + ("\n" if stripped else "")
                    content = stripped
                else:  # the template's split: the thinking shown after the last user turn only, all stripped
                    pre, post = content.split("</think>")[0], content.split("</think>")[-1]
                    reasoning = pre.rstrip("\n").split("<think>")[-1].lstrip("\n")
                    body = post.lstrip("\n").strip()
                    shown = i > last_user and reasoning != ""
                    stable = stable and (i > last_user or not reasoning.strip())
                    # the marked content keeps its open marker only without a <think> before the split, and in
                    # the thinking shown; trimming must leave both ends alone
                    exact = (exact and "<think>" not in pre and i > last_user and pre.rstrip() == pre.strip()
                             and body != "" and post.lstrip("\n").lstrip() == body)
                    think = "\n<think>" + reasoning.strip() + "</think>" if shown else self.THINK
                    if exact:  # the span starts inside the thinking block, where the open marker sits
                        head = self.ASSISTANT + "\n<think>"
                        content = think[len("\n<think>"):] + "\n" + body
                    else:
                        head = self.ASSISTANT + think + ("\n" if body else "")
                        content = body
            elif m.role == "user":
                head = self.USER
            elif m.role == "system":
                head = self.SYSTEM
            else:
                return None  # a tool turn: Jinja
            pieces += (head, content, "")
        text, starts, ends, bounds = _layout(pieces)
        if not exact and not stable:
            return None  # Jinja's prefix fallback fails (template_error): let it say so
        return _spans(conv, text, starts, ends, bounds if not exact else None,
                      head=len(self.PREFIX), generation=len(self.GENERATION))


_Fast = _ChatML | _Gemma | _Gemma4 | _Glm | _Llama4 | _Mistral | _SmolVLM


def _fast_template(source: str | None, special_tokens: dict[str, str]) -> _Fast | None:
    """The pure-Python renderer a builtin tokenizer registers for exactly this template string, if any
    (``TokenizerSpec.fast_renderer``: Qwen2-VL's, which is also Qwen2-VL-*-Instruct's own chat_template.json)."""
    spec = fast_renderer(source)
    if spec is None:
        return None
    if isinstance(spec, SmolVLMRenderer):
        return _SmolVLM(image=spec.image, video=spec.video)
    if isinstance(spec, MistralRenderer):
        bos, eos = special_tokens.get("bos_token"), special_tokens.get("eos_token")
        if not (isinstance(bos, str) and isinstance(eos, str)):
            return None
        return _Mistral(bos=bos, eos=eos, image=spec.image)
    if isinstance(spec, GlmRenderer):
        return _Glm(image=spec.image, video=spec.video)
    if isinstance(spec, Llama4Renderer):
        bos = special_tokens.get("bos_token")
        return None if not isinstance(bos, str) else _Llama4(bos=bos, image=spec.image)
    if isinstance(spec, Gemma4Renderer):
        bos = special_tokens.get("bos_token")
        return None if not isinstance(bos, str) else _Gemma4(bos=bos, image=spec.image, video=spec.video,
                                                             audio=spec.audio)
    if isinstance(spec, GemmaRenderer):
        bos = special_tokens.get("bos_token")
        return None if not isinstance(bos, str) else _Gemma(bos=bos, image=spec.image)
    prefix = special_tokens.get("bos_token") if spec.bos else ""
    if not isinstance(prefix, str):
        return None
    return _ChatML(default_system=spec.default_system, image=spec.image, video=spec.video, roles=spec.roles,
                   prefix=prefix)
