"""Chat templates (templates.py): the pure-Python ChatML renderer against Jinja on random conversations,
which templates get it, marker transparency, the prefix fallback, and template errors through the Encoder."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import ImageRef, Message, VideoRef
from packer.encode.encoder import Encoder
from packer.encode.templates import CLOSE, OPEN, ChatTemplate
from packer.errors import ConfigError, RecordError
from packer.models import get_profile
from tests.encode.helpers import Seq, assert_encoded, builtin, example, msg, text


def chat(tok, source: str | None = None, *, images: bool = True) -> ChatTemplate:
    """``source`` (default: the tokenizer's template) as the Encoder would build it."""
    special = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
    return ChatTemplate(tok.chat_template if source is None else source, special_tokens=special, images=images)


def jinja(template: ChatTemplate) -> ChatTemplate:
    """The same template without its fast path: every conversation through Jinja."""
    slow = copy.copy(template)
    slow._fast = None
    return slow


def locate(template: ChatTemplate, conv: list[Message]) -> tuple | str:
    try:
        return template.locate(conv)
    except RecordError as e:
        return str(e)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]),
                                st.lists(st.one_of(text, st.just(None)), min_size=0, max_size=4)),
                      min_size=1, max_size=5))
def test_chatml_renderer_equals_jinja(qwen, convs):
    """Text and content spans equal the Jinja template's on any conversation (None parts are images)."""
    template = qwen._chat
    image = ImageRef(path="x.jpg")
    conv = [Message(role, [image if p is None else p for p in parts]) for role, parts in convs]
    fast = template._fast.locate(conv)
    want = locate(jinja(template), conv)
    if any(OPEN in p or CLOSE in p for _, parts in convs for p in parts if p is not None):
        assert fast is None  # a marker character in the content: Jinja (and its marker check) decides
    else:
        assert fast == want
    assert locate(template, conv) == want


_FAST_BUILTINS = {"qwen2-vl": "qwen2-vl", "qwen2.5": "text", "qwen3-vl": "qwen3-vl",  # tokenizer: its profile
                  "llava-onevision": "llava-onevision", "internvl3": "internvl", "qwen2.5-omni": "qwen2.5-omni",
                  "qwen3-omni": "qwen3-omni", "qwen2-audio": "qwen2-audio", "mistral3": "mistral3",
                  "molmo2": "molmo2", "smolvlm": "smolvlm", "gemma4": "gemma4",
                  "llama4": "llama4", "glm-4.6v": "glm-4.6v"}


@pytest.fixture(scope="module", params=sorted(_FAST_BUILTINS))
def fast_builtin(request) -> Encoder:
    """An Encoder of each builtin whose template registers a renderer, with its family's profile."""
    encoder = Encoder(builtin(request.param), get_profile(_FAST_BUILTINS[request.param]))
    assert encoder._chat._fast is not None, f"{request.param}'s registered template must take the fast path"
    return encoder


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]),
                                st.lists(st.one_of(text, text, st.just(None), st.just(1)), min_size=0, max_size=3)),
                      min_size=1, max_size=5))
def test_every_registered_chatml_renderer_equals_jinja(fast_builtin, convs):
    """Each builtin's registered renderer (Qwen2-VL's, Qwen2.5's, Qwen3-VL's, LLaVA-OneVision's, InternVL3's,
    Qwen2.5-Omni's, Qwen3-Omni's, Qwen2-Audio's, Molmo2's after its bos; Mistral 3's and SmolVLM's, not ChatML) gives Jinja's text and spans where
    it answers, and ``locate`` gives Jinja's (or its error) always: None parts are images, 1 a video; a tool turn
    (Qwen2.5, Qwen3-VL write it inside a user turn) and Qwen2.5's parts go to Jinja."""
    parts = {None: ImageRef(path="x.jpg"), 1: VideoRef(path="x.mp4")}
    conv = [Message(role, [parts.get(p, p) if not isinstance(p, str) else p for p in ps]) for role, ps in convs]
    template = fast_builtin._chat
    fast = template._fast.locate(conv)
    want = locate(jinja(template), conv)
    if fast is not None:
        assert fast == want
    if all(m.role != "tool" and all(isinstance(p, str) and OPEN not in p and CLOSE not in p for p in m.parts)
           and len(m.parts) == 1 for m in conv):
        assert fast is not None  # plain text turns are the fast path's
    assert locate(template, conv) == want


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool", "narrator"]),
                                         st.lists(st.one_of(text, text, text, st.just(None), st.just(1)),
                                                  min_size=0, max_size=2)),
                               min_size=0, max_size=4), min_size=0, max_size=8))
def test_locate_texts_equals_locate(fast_builtin, convs):
    """``ChatTemplate.locate_texts`` (a batch of conversations rendered at once) answers each conversation whose
    messages are each one text with ``locate``'s text and spans, and leaves every other one (parts, images,
    videos, no message, a marker in a text, a role its template does not write as a plain turn) None; any
    other registered renderer (Gemma's, Mistral's, ...) leaves them all. None parts are images, 1 a video."""
    parts = {None: ImageRef(path="x.jpg"), 1: VideoRef(path="x.mp4")}
    batch = [[Message(role, [parts.get(p, p) if not isinstance(p, str) else p for p in ps]) for role, ps in conv]
             for conv in convs]
    batch.append([Message("assistant", [], tool_calls=[{"type": "function", "function": {"name": "f"}}])])
    batch.append([Message("user", ["Hi"]), Message("assistant", ["Hello"])])
    template = fast_builtin._chat
    got = template.locate_texts(batch)
    assert len(got) == len(batch)
    chatml = type(template._fast).__name__ == "_ChatML"
    assert (got[-1] is not None) == chatml and got[-2] is None
    for conv, one in zip(batch, got, strict=True):
        if one is not None:
            assert chatml and one == template._fast.locate(conv)
        elif chatml and conv and all(len(m.parts) == 1 and isinstance(m.parts[0], str) and not m.tool_calls
                                     and OPEN not in m.parts[0] and CLOSE not in m.parts[0] for m in conv):
            assert template._fast.locate(conv) is None  # a role it leaves: so does locate's renderer
    assert template.locate_texts([]) == []


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool", "narrator1"]),
                                         text, st.sampled_from([None, None, None, 0.5, False])),
                               min_size=0, max_size=4), min_size=0, max_size=8))
def test_locate_columns_equals_locate_texts(fast_builtin, convs):
    """``ChatTemplate.locate_columns``: ``locate_texts``' answers, and as columns each rendered conversation's
    spans, whether each message is an assistant turn (a 9-character role beside it: its header as long as the
    assistant's, told apart by the header itself) and whether none has a ``loss`` of its own."""
    template = fast_builtin._chat
    batch = [[Message(role, [t], loss=loss) for role, t, loss in conv] for conv in convs]
    got, cols = template.locate_columns(batch)
    assert got == template.locate_texts(batch)
    if cols is None:
        assert type(template._fast).__name__ != "_ChatML" or not any(got)
        return
    taken = cols.taken.tolist()
    assert [c for c, one in enumerate(got) if one is not None] == [c for c in taken if got[c] is not None]
    assert cols.count.tolist() == [len(batch[c]) for c in taken]
    messages = [m for c in taken for m in batch[c]]
    assert cols.assistant.tolist() == [m.role == "assistant" for m in messages]
    assert cols.default.tolist() == [all(m.loss is None for m in batch[c]) for c in taken]
    rows = cols.chars.tolist()
    at = 0
    for c in taken:
        if got[c] is not None:
            assert [tuple(r) for r in rows[at : at + len(batch[c])]] == got[c][1]
        at += len(batch[c])


def test_chatml_renderer_leaves_tool_calls_to_jinja(qwen):
    """A turn that calls tools is not the pure-Python renderer's: it answers None, and ``locate`` gives what
    Jinja gives (here: the template drops the calls, which ``locate`` refuses)."""
    call = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    conv = [Message("user", ["Weather?"]), Message("assistant", [], tool_calls=call)]
    assert qwen._chat._fast.locate(conv) is None
    assert locate(qwen._chat, conv) == locate(jinja(qwen._chat), conv)


def test_fast_path_only_for_registered_templates(tok):
    template = chat(tok)
    assert template._fast is not None
    # The same template with one byte changed renders the same, but it is not registered: the Jinja path.
    assert chat(tok, tok.chat_template + " ")._fast is None
    # A registered renderer that disagreed with Jinja on the probes would be refused.
    wrong = copy.copy(template._fast)
    wrong.default_system = "<|im_start|>system\nBe terse.<|im_end|>\n"
    assert jinja(template)._checked(wrong) is None


def test_marker_transparency_is_decided_per_template(tok, qwen):
    """Qwen2-VL's template renders marked content exactly like plain content: one rendering per conversation.
    A trimming template is not, so each record is rendered twice and checked."""
    trim = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}<|im_end|>{% endfor %}"
    assert qwen._chat._verify is False and chat(tok)._verify is False
    assert chat(tok, trim, images=False)._verify is True


def test_trimming_template_uses_prefix_fallback(tok):
    """A template that trims content defeats the content markers; the prefix method gives the same labels."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = Encoder(tok, get_profile("text"), chat_template=template)
    enc = r.encode(
        example({"messages": [msg("user", " Hi "), msg("assistant", "  Yes.\n"), msg("user", "Ok")]})
    )
    seq = Seq(tok).turn("user", "Hi", False).turn("assistant", "Yes.", True).turn("user", "Ok", False)
    assert_encoded(enc, seq)


def test_not_prefix_stable_tree(tok):
    template = "{% for m in messages %}{{ m['content'] }}{% if loop.last %}<|im_end|>{% endif %}{% endfor %}"
    r = Encoder(tok, get_profile("text"), chat_template=template)
    rec = {"messages": [msg("user", "Q")], "branches": [[msg("assistant", "A")]]}
    with pytest.raises(
        RecordError, match=r"^t.jsonl:3: template_error: tree node 1: .* not a token-level prefix"
    ):
        r.encode(example(rec))


def test_template_errors(tok):
    r = Encoder(tok, get_profile("text"), chat_template="{{ raise_exception('only user turns') }}")
    with pytest.raises(
        RecordError, match=r"template_error: the chat template failed: TemplateError: only user turns"
    ):
        r.encode(example({"messages": [msg("user", "x"), msg("assistant", "y")]}))
    with pytest.raises(ConfigError, match=r"the chat template does not compile"):
        Encoder(tok, get_profile("text"), chat_template="{% for %}")
    with pytest.raises(ConfigError, match=r"the tokenizer has no chat template; pass --chat-template FILE"):
        ChatTemplate(None, special_tokens={}, images=False).locate([Message("user", ["x"])])


def test_locate_of_no_message_is_a_record_error(tok, qwen):
    """``ChatTemplate.locate([])`` raises a RecordError (``empty_messages``), as every other bad record does, on
    both paths (its Jinja branch used to end in a ValueError from ``zip(strict=True)``). No parser reaches it:
    a chat's ``messages`` and each branch must be non-empty (``formats.common`` rejects them first), so this
    guards a caller that builds conversations itself."""
    for template in (qwen._chat, jinja(qwen._chat), chat(tok)):
        with pytest.raises(RecordError, match=r"^empty_messages: the conversation to render has no messages$"):
            template.locate([])


def test_template_dropping_images(tok, img):
    template = "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% endif %}<|im_end|>{% endfor %}"
    r = Encoder(tok, get_profile("qwen2-vl"), chat_template=template)
    with pytest.raises(
        RecordError, match=r"template_error: the chat template emitted 0 image tokens for 1 images"
    ):
        r.encode(
            example(
                {"messages": [msg("user", [{"type": "image", "image": str(img)}]), msg("assistant", "y")]}
            )
        )


def test_a_template_that_reads_only_parts_gets_text_as_a_part():
    """SmolVLM's template (transformers' DEFAULT_CHAT_TEMPLATE) reads ``content[0]['type']`` and iterates parts: a
    string content renders as nothing. The template is probed once and given text-only content as one text part,
    so no message text is lost; a template that renders no text in either form is refused."""
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    template = ChatTemplate(DEFAULT_CHAT_TEMPLATE, special_tokens={}, images=True)
    conv = [Message("user", ["What is two plus two?"]), Message("assistant", ["Four."])]
    text, spans = template.locate(conv)
    assert text == "<|im_start|>User: What is two plus two?<end_of_utterance>\nAssistant: Four.<end_of_utterance>\n"
    assert [text[a:b] for a, b, _ in spans] == ["What is two plus two?", "Four."]
    mixed = [Message("user", [ImageRef(path="a.jpg"), "Caption it."]), Message("assistant", ["A cat."])]
    assert template.locate(mixed)[0] == "<|im_start|>User:<image>Caption it.<end_of_utterance>\nAssistant: A cat.<end_of_utterance>\n"
    with pytest.raises(ConfigError, match="renders no message text"):
        ChatTemplate("{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_end|>{% endfor %}", special_tokens={},
                     images=False)


def test_registered_renderers_encode_as_jinja(fast_builtin, img):
    """Through the Encoder: the builtin's records (an image turn, a caption tree, a tool turn, a later system
    turn) encode byte-identically with the pure-Python renderer and with Jinja alone (``fast=False``)."""
    from tests.encode.helpers import assert_same, general, one_by_one, parse_all

    encoder = fast_builtin.replace()  # path counts of its own
    image = [{"type": "image", "image": img.name}, {"type": "text", "text": "What is it?"}]
    records = [
        {"messages": [msg("user", "Hi <b>"), msg("assistant", " Hello\n"), msg("system", "Be brief."),
                      msg("user", "and?"), msg("assistant", "Yes.")]},
        {"messages": [msg("user", "Weather?"), msg("assistant", "Calling."), msg("tool", '{"t": 20}'),
                      msg("assistant", "20 degrees.")]},
        {"messages": [msg("system", "S"), msg("user", "Q")],
         "branches": [[msg("assistant", "A1")], [msg("assistant", "A2 longer")]]},
        {"messages": [msg("user", image), msg("assistant", "A cat.")]},
    ]
    examples = parse_all(records, img.parent)
    got, want = one_by_one(encoder, examples), one_by_one(general(encoder), examples)
    for a, b in zip(got, want, strict=True):
        assert_same(a, b)
    assert encoder.path_counts()["render:python"] >= 3


def _checked_renderer(tokenizer: str, profile: str) -> Encoder:
    """The builtin ``tokenizer``'s Encoder with ``profile``, whose pure-Python renderer passed Jinja's probes."""
    encoder = Encoder(builtin(tokenizer), get_profile(profile))
    assert encoder._chat._verify and encoder._chat._fast is not None, f"{tokenizer}'s renderer must pass the probes"
    return encoder


@pytest.fixture(scope="module")
def gemma() -> Encoder:
    """Gemma 3's builtin (its template trims every text) with its family's profile."""
    return _checked_renderer("gemma3", "gemma3")


_PADDED = st.sampled_from(["a", " a", "a ", "\nb c\n", "  ", "", "x\ty", "\u00a0z", "<think>t</think>\n\nq"])


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(system=st.one_of(st.none(), _PADDED), turns=st.lists(
    st.lists(st.one_of(_PADDED, st.just(None)), min_size=1, max_size=3), min_size=1, max_size=4))
def test_gemma_renderer_equals_jinja(gemma, system, turns):
    """Gemma 3's renderer on alternating user / model turns (a leading system text or not; texts padded or not,
    so that either the marker spans or the prefix fallback is Jinja's answer; None parts are images) gives what
    ``locate`` gives through Jinja, text and spans."""
    image = ImageRef(path="x.jpg")
    conv = [Message("system", [system])] if system is not None else []
    conv += [Message("user" if i % 2 == 0 else "assistant", [image if p is None else p for p in ps])
             for i, ps in enumerate(turns)]
    fast = gemma._chat._fast.locate(conv)
    assert fast is not None
    assert fast == locate(jinja(gemma._chat), conv)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]),
                                st.lists(st.one_of(_PADDED, st.just(None), st.just(1)), min_size=0, max_size=3)),
                      min_size=0, max_size=5))
def test_gemma_renderer_leaves_the_rest_to_jinja(gemma, convs):
    """Any conversation (roles out of turn, a later system turn, videos, no turn at all): the renderer answers
    Jinja's or None, and ``locate`` gives Jinja's answer (or its error) always."""
    parts = {None: ImageRef(path="x.jpg"), 1: VideoRef(path="x.mp4")}
    conv = [Message(role, [parts.get(p, p) if not isinstance(p, str) else p for p in ps]) for role, ps in convs]
    want = locate(jinja(gemma._chat), conv)
    fast = gemma._chat._fast.locate(conv)
    if fast is not None:
        assert fast == want
    assert locate(gemma._chat, conv) == want


def test_gemma_encodes_as_jinja(gemma, img):
    """Through the Encoder: Gemma 3's records (padded texts, a system text, an image turn, a caption tree, a turn
    out of order) encode byte-identically with ``_Gemma`` and with Jinja alone (``fast=False``), pan-and-scan's
    blocks included."""
    from tests.encode.helpers import assert_same, general, one_by_one, parse_all

    encoder = gemma.replace()  # path counts of its own
    pan = Encoder(gemma.tokenizer, get_profile("gemma3", do_pan_and_scan=True, pan_and_scan_min_crop_size=64,
                                               pan_and_scan_min_ratio_to_activate=1.2))
    image = [{"type": "image", "image": img.name}, {"type": "text", "text": " What is it? "}]
    records = [
        {"messages": [msg("system", " Be brief. "), msg("user", "Hi <b>"), msg("assistant", " Hello\n"),
                      msg("user", "and?"), msg("assistant", "Yes.")]},
        {"messages": [msg("user", image), msg("assistant", "A cat.")]},
        {"messages": [msg("system", "S"), msg("user", "Q")],
         "branches": [[msg("assistant", "A1")], [msg("assistant", "  A2 longer")]]},
        {"messages": [msg("user", "Q"), msg("user", "again")]},  # not alternating: Jinja's error
    ]
    examples = parse_all(records, img.parent)
    for enc in (encoder, pan):
        got, want = one_by_one(enc, examples), one_by_one(general(enc), examples)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
        assert len(got[1].images) == (1 if enc is encoder else 3)  # pan-and-scan: the whole image and 2 crops
    assert encoder.path_counts()["render:python"] >= 3


@pytest.fixture(scope="module")
def gemma4() -> Encoder:
    """The gemma4 stand-in (its template trims every text) with its family's profile."""
    return _checked_renderer("gemma4", "gemma4")


_PADDED4 = st.sampled_from(["a", " a", "a ", "\nb c\n", "  ", "", "x\ty", "\u00a0z", "<think>t</think>\n\nq",
                            "a<|channel>t<channel|>b"])


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "user", "assistant", "tool"]),
                                st.lists(st.one_of(_PADDED4, st.just(None), st.just(1), st.just(2), st.just(3)),
                                         min_size=0, max_size=3)),
                      min_size=1, max_size=5))
def test_gemma4_renderer_equals_jinja(gemma4, convs):
    """The gemma4 stand-in's renderer on any conversation (padded texts, so that either the marker spans or the
    prefix fallback is Jinja's answer; a first or later system turn; None parts images, 1 videos, 2 audio clips,
    3 a video with its sound track; thinking channels in a model text, tool turns) gives what ``locate`` gives through
    Jinja, text and spans, or None; every conversation of user / model / system texts without channels is its."""
    from packer.core.types import AudioRef

    parts = {None: [ImageRef(path="x.jpg")], 1: [VideoRef(path="x.mp4")], 2: [AudioRef(path="x.wav")],
             3: [VideoRef(path="x.mp4"), AudioRef(path="x.mp4", video=True)]}
    conv = [Message(role, [q for p in ps for q in ([p] if isinstance(p, str) else parts[p])]) for role, ps in convs]
    want = locate(jinja(gemma4._chat), conv)
    fast = gemma4._chat._fast.locate(conv)
    if fast is not None:
        assert fast == want
    if conv and all(m.role != "tool" and all(isinstance(p, str) and "channel" not in p for p in m.parts)
                    for m in conv):
        assert fast is not None
    assert locate(gemma4._chat, conv) == want


@pytest.fixture(scope="module")
def llama4() -> Encoder:
    """Llama 4's builtin (its template trims a first system text) with its family's profile."""
    return _checked_renderer("llama4", "llama4")


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "user", "assistant", "tool"]),
                                st.lists(st.one_of(_PADDED4, st.just(None), st.just(1)), min_size=0, max_size=3)),
                      min_size=1, max_size=5), calls=st.booleans())
def test_llama4_renderer_equals_jinja(llama4, convs, calls):
    """Llama 4's renderer on any conversation (a first system text padded or not, so that either the marker spans
    or the prefix fallback is Jinja's answer; a later system turn; None parts images, 1 videos; tool turns, and
    with ``calls`` an assistant's empty tool-call list) gives what ``locate`` gives through Jinja, or None; every
    conversation of user / assistant / system texts is its."""
    parts = {None: ImageRef(path="x.jpg"), 1: VideoRef(path="x.mp4")}
    conv = [Message(role, [parts.get(p, p) if not isinstance(p, str) else p for p in ps],
                    tool_calls=[] if calls and role == "assistant" else None) for role, ps in convs]
    want = locate(jinja(llama4._chat), conv)
    fast = llama4._chat._fast.locate(conv)
    if fast is not None:
        assert fast == want
    if not calls and all(m.role != "tool" and all(isinstance(p, str) for p in m.parts) for m in conv):
        assert fast is not None
    assert locate(llama4._chat, conv) == want


_THINKING = st.sampled_from(["r</think>a", "r</think>\n\nb ", " r</think>b", "\n<think>r\n</think>\nb", "</think>",
                             "</think>\n", "a</think>b</think>c", "<think>", "\n\n</think>x"])


@pytest.fixture(scope="module")
def glm() -> Encoder:
    """GLM-4.6V's builtin (its template strips an assistant's text) with its family's profile."""
    return _checked_renderer("glm-4.6v", "glm-4.6v")


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "user", "assistant", "tool"]),
                                st.lists(st.one_of(_PADDED4, _THINKING, st.just(None), st.just(1), st.just(2)),
                                         min_size=0, max_size=3)),
                      min_size=1, max_size=5))
def test_glm_renderer_equals_jinja(glm, convs):
    """GLM-4.6V's renderer on any conversation (assistant texts padded, empty or not, so that either the marker
    spans or the prefix fallback is Jinja's answer; thinking blocks; None parts images, 1 videos, 2 audio clips;
    tool turns) gives what ``locate`` gives through Jinja, or None; every conversation of user / assistant / system
    texts without a thinking block is its."""
    from packer.core.types import AudioRef

    parts = {None: ImageRef(path="x.jpg"), 1: VideoRef(path="x.mp4"), 2: AudioRef(path="x.wav")}
    conv = [Message(role, [parts.get(p, p) if not isinstance(p, str) else p for p in ps]) for role, ps in convs]
    want = locate(jinja(glm._chat), conv)
    fast = glm._chat._fast.locate(conv)
    if fast is not None:
        assert fast == want
    if all(m.role != "tool" and all(isinstance(p, str) and "think>" not in p for p in m.parts) for m in conv):
        assert fast is not None
    assert locate(glm._chat, conv) == want
