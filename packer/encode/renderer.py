"""Example -> Encoded: chat template + tokenizer -> token ids, labels, tree nodes, images, positions.

A conversation is rendered with the tokenizer's chat template ONCE, with each message's content wrapped in
two private-use characters (U+E000 ... U+E001), and tokenized ONCE (markers removed) with character offsets.
The markers say which characters are message content; tokens are assigned to messages by their offsets:

    <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n
    <|im_start|>assistant\nHello<|im_end|>\n
                         ^^^^^^^^^^^^^^^^  loss: the content ("Hello") and the end-of-turn token

Whether markers are safe is decided once per template: probe conversations (padded content, ``<think>``
blocks, image parts) must render identically with and without markers. A template that fails the probes
(one that trims content, say) is rendered twice per record and the two compared; where they differ, the
slower prefix-rendering method below takes over.

Loss rule (labels are NOT shifted: ``labels[t] = input_ids[t]`` where loss applies, -100 elsewhere):
a message carries loss if it is an assistant turn, or if its ``loss`` says so. A loss message's tokens are
every token that overlaps its content, plus its end-of-turn token: the first special token after the content
and before the next message's content (``<|im_end|>``, Llama-3's ``<|eot_id|>``, ...); what follows it (the
``\\n`` after ``<|im_end|>``) and the role header (``<|im_start|>assistant\\n``) carry none. A template with
no special token after the content has no end-of-turn token to learn.

Fallback (a template that alters content): each prefix ``conv[:k]`` is rendered and must be a string prefix
of ``conv[:k+1]`` (else ``template_error``, "not prefix-stable"); an assistant's header ends where
``add_generation_prompt=True`` ends; the loss span runs from there to the message's last special token.
Non-assistant messages with ``loss: true`` then also train on their header.

Trees: node n's tokens are the tokens of the path root..n minus those of the path root..parent(n); the
parent's tokens must be a token-level prefix (else ``template_error``). The system prompt a template inserts
on its own belongs to the root. Images: the template's single image token per image is expanded to the
profile's ``num_tokens`` copies (labels -100) with ``np.repeat``; no per-token Python loop anywhere.

Fast paths, each checked against the general one it replaces (tests/encode/test_render_fast.py):

- ``encode_batch``: one tokenizer call for a whole batch (the build passes a 512-line chunk). Interleaving one
  call per record with Python work made the same tokenizer calls ~1.8x slower (cold CPU caches).
- A registered ChatML template (Qwen2-VL's) is rendered in pure Python with its content spans, no markers:
  ~20x cheaper than the sandboxed Jinja render, and used only if it matches Jinja on the probes.
- For byte-level BPE tokenizers with no normalizer and no offset trimming (Qwen2's, GPT-2's) token boundaries
  come from each token's UTF-8 length, so the tokenizer runs without character offsets
  (``encode_batch_fast``, 13% less tokenizer time). Any other tokenizer keeps the offsets.

Cost, same process, CPU time, bench_build corpus: the build's whole per-chunk work (parse, encode_batch,
Arrow table, IPC write) takes 0.99x the time of the benchmark's baseline (``apply_chat_template`` + the
tokenizer's batch call) on the same records; the tokenizer is ~70% of it, labels/positions/images ~20%.
"""

from __future__ import annotations

import re
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packer.core.tree import tree_position_ids
from packer.core.types import IGNORE_INDEX, Encoded, EncodedImage, Example, ImageRef, Message, Node
from packer.errors import ConfigError, RecordError
from packer.models.base import ModelProfile
from packer.models.qwen_vl import mrope_position_ids

# tokenizers.Tokenizer -> (pipeline signature, token byte lengths); weak keys: it dies with its tokenizer
_BYTE_LENGTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
OPEN, CLOSE = "\ue000", "\ue001"  # private-use characters that mark content boundaries in a rendering
_MARKER = re.compile(f"[{OPEN}{CLOSE}]")
OVERLONG = ("drop", "truncate")


def _compile(template: str):
    """The compiled Jinja template, as transformers' apply_chat_template compiles it (cached there)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template)


class _ChatML:
    """Pure-Python rendering of one known ChatML template: Jinja's output and the content spans, ~20x faster.

    The Jinja render is ~0.4 ms per conversation (the sandbox checks every attribute access), as much as
    tokenizing ~100 tokens. This is used only for a template registered in ``_fast_template`` (by exact
    string) and only if it reproduces Jinja exactly on the probe conversations (``Renderer.__init__``);
    tests/encode/test_render_fast.py compares both on thousands of random conversations.
    """

    def __init__(self, *, default_system: str, image: str):
        self.default_system = default_system  # emitted before a first message that is not a system message
        self.image = image  # what one image part renders to

    def locate(self, conv: list[Message]) -> tuple[str, list[tuple[int, int | None, int]]] | None:
        """``Renderer._locate`` of ``conv``; None if a text holds a marker character (Jinja path decides)."""
        pieces: list[str] = []
        pos = 0
        starts, ends = [], []
        for k, m in enumerate(conv):
            if k == 0 and m.role != "system":
                pieces.append(self.default_system)
                pos += len(self.default_system)
            header = f"<|im_start|>{m.role}\n"
            pieces.append(header)
            pos += len(header)
            starts.append(pos)
            for p in m.parts:
                piece = p if isinstance(p, str) else self.image
                if isinstance(p, str) and (OPEN in p or CLOSE in p):
                    return None
                pieces.append(piece)
                pos += len(piece)
            ends.append(pos)
            pieces.append("<|im_end|>\n")
            pos += 11  # len("<|im_end|>\n")
        text = "".join(pieces)
        return text, list(zip(starts, ends, [*starts[1:], len(text)], strict=True))


def _fast_template(template: str | None) -> _ChatML | None:
    """The pure-Python renderer registered for exactly this template string, if any."""
    from packer.encode.tokenizers import QWEN2_VL_CHAT_TEMPLATE

    if template == QWEN2_VL_CHAT_TEMPLATE:  # also Qwen2-VL-*-Instruct's own chat_template.json
        return _ChatML(
            default_system="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
            image="<|vision_start|><|image_pad|><|vision_end|>",
        )
    return None


@dataclass(slots=True)
class _Staged:
    """One example between rendering and tokenization (see ``Renderer.encode_batch``)."""

    texts: list[str]  # what to tokenize: one rendering per root-to-node path (a text record: its text)
    nodes: list[Node]  # tree nodes, depth-first ([] for a text record)
    parents: list[int]  # parent index of each node (-1 for the root)
    spans: list[list[tuple[int, int | None, int]]]  # per path, per message: see ``Renderer._locate``
    first: int = 0  # index of texts[0] in the batch's tokenizer call


class Renderer:
    """Turns Examples into Encoded examples for one tokenizer, chat template and vision profile.

    ``max_length`` (None: unlimited) with ``overlong``: ``drop`` rejects a longer example (``overlong``),
    ``truncate`` keeps its first ``max_length`` tokens in the depth-first layout, never inside an image.
    """

    def __init__(
        self,
        tokenizer,
        profile: ModelProfile,
        *,
        max_length: int | None = None,
        overlong: str = "drop",
        chat_template: str | None = None,
    ):
        if overlong not in OVERLONG:
            raise ConfigError(f"'overlong' must be one of {', '.join(OVERLONG)}, got {overlong!r}")
        if max_length is not None and max_length < 1:
            raise ConfigError(f"'max_length' must be a positive integer, got {max_length}")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError("packer needs a fast (Rust-backed) tokenizer: it reads character offsets")
        self.tokenizer = tokenizer
        self.profile = profile
        self.max_length = max_length
        self.overlong = overlong
        self.template = (
            chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        )
        self._backend = backend
        self._compiled = None
        if self.template is not None:
            try:
                self._compiled = _compile(self.template)
            except Exception as e:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
                raise ConfigError(f"the chat template does not compile: {type(e).__name__}: {e}") from e
        self._template_kwargs = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        # Special (control) tokens: an end-of-turn marker is the first of them after a message's content.
        special = [i for i, t in tokenizer.added_tokens_decoder.items() if t.special]
        self._is_special = np.zeros(max([len(tokenizer), *special]) + 1, dtype=bool)  # id -> control token?
        self._is_special[special] = True
        self._token_bytes = self._cached_byte_lengths()  # (V,) UTF-8 bytes per token id, or None: use offsets
        self.image_token_id = self._token_id(profile.image_token)
        self.vision_start_id = self._token_id(profile.vision_start)
        self.bos_id = tokenizer.bos_token_id
        self.eos_id = tokenizer.eos_token_id
        self._verify = not self._marker_transparent()  # decided once per template (see _locate)
        self._fast: _ChatML | None = None  # set only after the Jinja path has checked it on the probes
        self._fast = None if self._verify else self._checked_fast(_fast_template(self.template))

    def __getstate__(self) -> dict:
        """What a worker process needs: the Rust tokenizer (8 MB pickled, ~0.5 s to load), the template
        source and the tables built from the tokenizer; not the transformers tokenizer around it.

        Unpickling therefore imports no transformers (the import alone takes ~3 s, and AutoTokenizer
        imports torch); after it ``tokenizer`` is None. The Jinja template is compiled on first use (a
        registered ChatML template never needs it).
        """
        state = self.__dict__.copy()
        state["tokenizer"] = None
        state["_compiled"] = None  # a compiled Jinja template does not pickle; compiled again on first use
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if (
            tid is None
            or tid == self.tokenizer.unk_token_id
            or self.tokenizer.convert_ids_to_tokens(tid) != token
        ):
            raise ConfigError(
                f"profile {self.profile.name!r} uses token {token!r}, which the tokenizer does not have"
            )
        return int(tid)

    # ------------------------------------------------------------------ public

    def encode(self, example: Example) -> Encoded:
        """Render, tokenize and label one example; raise RecordError (with ``path:line``) if unusable."""
        (result,) = self.encode_batch([example])
        if isinstance(result, RecordError):
            raise result
        return result

    def encode_batch(self, examples: Sequence[Example]) -> list[Encoded | RecordError]:
        """``encode`` for many examples with ONE tokenizer call: each example's Encoded or its RecordError.

        Errors are returned (located at ``path:line``), not raised, so one bad record does not cost the others
        their shared tokenizer call. The results equal ``encode`` one example at a time
        (tests/encode/test_render_fast.py). Why batch: the same tokenizer calls run ~1.8x slower when each is
        interleaved with a record's Python work (template, labels, numpy) than back to back (measured on the
        bench_build corpus, 2,000 records: 5.8 s vs 3.2 s), because the 151k-entry vocabulary and merge tables
        no longer stay in the CPU caches.
        """
        staged: list[_Staged | RecordError] = []
        texts: list[str] = []
        for example in examples:
            try:
                stage = self._stage(example)
            except RecordError as e:
                staged.append(e if e.path else e.located(example.path, example.line))
                continue
            stage.first = len(texts)
            texts.extend(stage.texts)
            staged.append(stage)
        encodings = self._tokenize(texts)
        out: list[Encoded | RecordError] = []
        for example, stage in zip(examples, staged, strict=True):
            if isinstance(stage, RecordError):
                out.append(stage)
                continue
            try:
                out.append(self._finish(example, stage, encodings[stage.first : stage.first + len(stage.texts)]))
            except RecordError as e:
                out.append(e if e.path else e.located(example.path, example.line))
        return out

    def _tokenize(self, texts: list[str]) -> list:
        """tokenizers.Encoding of each text, no special tokens added; without character offsets when token
        byte lengths stand in for them (``_byte_lengths``)."""
        if not texts:
            return []
        if len(texts) == 1:  # a batch call costs a thread-pool round trip; one text needs none
            return [self._backend.encode(texts[0], add_special_tokens=False)]
        if self._token_bytes is not None:
            return self._backend.encode_batch_fast(texts, add_special_tokens=False)
        return self._backend.encode_batch(texts, add_special_tokens=False)

    # ------------------------------------------------------------------ rendering

    def _render(self, conv: list[dict], *, add_generation_prompt: bool = False) -> str:
        if self.template is None:
            raise ConfigError("the tokenizer has no chat template; pass --chat-template FILE")
        if self._compiled is None:  # an unpickled Renderer: compiled here, on first use (see __getstate__)
            self._compiled = _compile(self.template)
        try:
            return self._compiled.render(
                messages=conv,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._template_kwargs,
            )
        except Exception as e:  # noqa: BLE001 - any Jinja error (incl. raise_exception) is this record's problem
            raise RecordError(
                "template_error", f"the chat template failed: {type(e).__name__}: {e}"
            ) from None

    @staticmethod
    def _hf_message(m: Message, marked: bool) -> dict:
        """A Message as the template sees it: string content if text-only, else parts with {"type": "image"}."""
        if all(isinstance(p, str) for p in m.parts):
            text = "".join(m.parts)  # type: ignore[arg-type]
            return {"role": m.role, "content": OPEN + text + CLOSE if marked else text}
        parts: list[dict] = [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in m.parts
        ]
        if marked:  # glue the markers onto text parts where possible, so no part is added
            if "text" in parts[0]:
                parts[0] = {"type": "text", "text": OPEN + parts[0]["text"]}
            else:
                parts.insert(0, {"type": "text", "text": OPEN})
            if "text" in parts[-1]:
                parts[-1] = {"type": "text", "text": parts[-1]["text"] + CLOSE}
            else:
                parts.append({"type": "text", "text": CLOSE})
        return {"role": m.role, "content": parts}

    def _locate(self, conv: list[Message]) -> tuple[str, list[tuple[int, int | None, int]]]:
        """Render ``conv``; return (text, per message (content_start, content_end, tail_limit)).

        content_end None means "unknown: the last special token before tail_limit ends the loss span"
        (fallback method).
        """
        if self._fast is not None:
            located = self._fast.locate(conv)
            if located is not None:
                return located
        marked = self._render([self._hf_message(m, True) for m in conv])
        markers = [(mo.start(), mo.group()) for mo in _MARKER.finditer(marked)]
        # the markers must come back as OPEN, CLOSE, OPEN, CLOSE, ...: one pair per message, in order
        if len(markers) == 2 * len(conv) and all(
            c == (OPEN if i % 2 == 0 else CLOSE) for i, (_, c) in enumerate(markers)
        ):
            text = marked.replace(OPEN, "").replace(CLOSE, "")
            if not self._verify or text == self._render([self._hf_message(m, False) for m in conv]):
                # marker i sits at clean position p - i (i markers precede it)
                starts = [p - i for i, (p, _) in enumerate(markers) if i % 2 == 0]
                ends = [p - i for i, (p, _) in enumerate(markers) if i % 2 == 1]
                limits = starts[1:] + [len(text)]
                return text, list(zip(starts, ends, limits, strict=True))
        clean = self._render([self._hf_message(m, False) for m in conv])
        return clean, self._locate_by_prefixes(conv, clean)

    def _marker_transparent(self) -> bool:
        """Whether this template renders marked content exactly like plain content on probe conversations.

        Probes cover what templates do to content: trimming, ``<think>`` splitting, leading/trailing
        newlines, image parts. A template that passes is rendered once per conversation; one that fails is
        rendered twice and every record is checked (or falls back to rendering prefixes).
        """
        if self.template is None:
            return False
        for conv in self._probes(images=self.image_token_id is not None):
            try:
                clean = self._render([self._hf_message(m, False) for m in conv])
                marked = self._render([self._hf_message(m, True) for m in conv])
            except RecordError:
                return False
            if marked.count(OPEN) != len(conv) or marked.replace(OPEN, "").replace(CLOSE, "") != clean:
                return False
        return True

    @staticmethod
    def _probes(*, images: bool) -> list[list[Message]]:
        """Probe conversations: what templates do to content (trimming, ``<think>`` splitting, leading and
        trailing newlines), a first message that is not a system prompt, and, with ``images``, image parts."""
        texts = [
            " Be brief. ",
            "\nHi\n",
            "  <think>x</think>\nHello  ",
            "a  b ",
            "<think>\n\n</think>\n\nBye\n",
        ]
        roles = ["system", "user", "assistant", "user", "assistant"]
        probe = [Message(r, [t]) for r, t in zip(roles, texts, strict=True)]
        convs = [probe, probe[1:], probe[1:3]]
        if images:
            image = ImageRef(path="probe.jpg")
            convs.append([Message("user", [image, " Describe. "]), Message("assistant", ["x"])])
            convs.append([Message("user", ["Look ", image]), Message("assistant", [" y "])])
        return convs

    def _checked_fast(self, fast: _ChatML | None) -> _ChatML | None:
        """``fast`` if it agrees with the Jinja rendering on every probe conversation, else None."""
        if fast is None:
            return None
        image = ImageRef(path="probe.jpg")
        extra = [  # multi-part messages, image-only content, a tool turn, a system turn later on
            [Message("user", [image, "a", image, "b ", image]), Message("assistant", ["c"], loss=True)],
            [Message("user", [image]), Message("tool", ["{}"]), Message("system", ["s"]), Message("assistant", [""])],
        ]
        for conv in self._probes(images=True) + extra:
            try:
                if fast.locate(conv) != self._locate(conv):  # self._fast is not set yet: this is Jinja
                    return None
            except RecordError:
                return None
        return fast

    def _locate_by_prefixes(self, conv: list[Message], full: str) -> list[tuple[int, int | None, int]]:
        """The generic fallback: message spans from rendered prefixes, headers from the generation prompt."""
        hf = [self._hf_message(m, False) for m in conv]
        spans = []
        prev = ""
        for k in range(len(conv)):
            cur = full if k == len(conv) - 1 else self._render(hf[: k + 1])
            if not cur.startswith(prev) or not full.startswith(cur):
                raise RecordError(
                    "template_error",
                    f"the chat template is not prefix-stable: rendering messages[:{k}] is not a prefix of "
                    f"rendering messages[:{k + 1}]",
                )
            start = len(prev)
            if conv[k].role == "assistant":
                header = self._render(hf[:k], add_generation_prompt=True)
                if not (header.startswith(prev) and cur.startswith(header)):
                    raise RecordError(
                        "template_error",
                        f"the generation prompt after messages[:{k}] is not a prefix of message {k}",
                    )
                start = len(header)
            spans.append((start, None, len(cur)))
            prev = cur
        return spans

    # ------------------------------------------------------------------ labels

    def _labels(
        self, ids: np.ndarray, enc, text: str, spans: list[tuple[int, int | None, int]], losses: list[bool]
    ) -> np.ndarray:
        """Labels of one tokenized rendering ``text`` (``enc``: its tokenizers.Encoding, for character
        offsets): loss tokens for the messages whose ``losses`` flag is set."""
        labels = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int32)
        if not any(losses):
            return labels
        # token indices of control tokens, as a list: bisect on a few items beats numpy's per-call overhead
        special = np.flatnonzero(self._is_special[ids]).tolist()
        n = ids.shape[0]
        token_at, starts_before = self._byte_boundaries(ids, text) or self._offset_boundaries(ids, enc, text)
        for (cs, ce, limit), loss in zip(spans, losses, strict=True):
            if not loss:
                continue
            first = token_at(cs)  # the first token overlapping the content
            lim = token_at(limit)  # the first token of the next message's content
            if ce is None:  # fallback: up to and including the last special token of the message
                k = bisect_left(special, lim) - 1
                last = special[k] + 1 if k >= 0 and special[k] >= first else lim
            else:
                last = token_at(ce)  # one past the last content token, unless that token straddles ce
                if last < n and starts_before(last, ce):
                    last += 1
                k = bisect_left(special, last)
                if k < len(special) and special[k] < lim:
                    last = special[k] + 1  # the end-of-turn token
            labels[first:last] = ids[first:last]
        return labels

    def _offset_boundaries(self, ids: np.ndarray, enc, text: str):
        """(token_at, starts_before) from the Encoding's character offsets (re-encoded if it has none).

        ``token_at(c)``: index of the first token that ends after character ``c`` (n at the end of the text);
        ``starts_before(t, c)``: whether token ``t`` starts before character ``c``.
        """
        if self._token_bytes is not None:  # the batch was encoded without offsets
            enc = self._backend.encode(text, add_special_tokens=False)
        n, size = ids.shape[0], len(text)
        token_ends: list[np.ndarray] = []  # (L,) end character of each token, built only when needed

        def token_at(char: int) -> int:
            if char >= size:
                return n
            i = enc.char_to_token(char)  # the first token containing ``char``: no offsets list needed
            if i is not None:
                return i
            if not token_ends:  # ``char`` belongs to no token (a normalizer dropped it): use the offsets
                token_ends.append(np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 1])
            return int(np.searchsorted(token_ends[0], char, side="right"))

        return token_at, lambda token, char: enc.token_to_chars(token)[0] < char

    def _byte_boundaries(self, ids: np.ndarray, text: str):
        """(token_at, starts_before) as ``_offset_boundaries`` gives them, from token byte lengths alone.

        Valid when the tokens spell the text's UTF-8 bytes exactly (``_token_bytes``; checked here on the
        total). A character split across tokens belongs to the token holding its first byte, as in the
        offsets (where ``char_to_token`` returns the first token whose span holds the character). None when
        not applicable: the caller uses the offsets.
        """
        if self._token_bytes is None or ids.shape[0] == 0:
            return None
        ends = np.cumsum(self._token_bytes[ids]).tolist()  # (L,) end byte of each token
        n, size = ids.shape[0], len(text)
        if text.isascii():
            if ends[-1] != size:
                return None
            char_byte = None
        else:
            codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            width = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)  # UTF-8 bytes
            char_byte = np.concatenate([[0], np.cumsum(width)]).tolist()  # byte offset of each character
            if ends[-1] != char_byte[-1]:
                return None

        def token_at(char: int) -> int:
            if char >= size:
                return n
            return bisect_right(ends, char if char_byte is None else char_byte[char])

        def starts_before(token: int, char: int) -> bool:
            start = ends[token - 1] if token else 0
            return start < (char if char_byte is None else char_byte[char])

        return token_at, starts_before

    def _cached_byte_lengths(self) -> np.ndarray | None:
        """``_byte_lengths``, computed once per tokenizer (~0.2 s: it reads the whole vocabulary) and reused
        while its vocabulary and pipeline are unchanged: a build may construct a Renderer per chunk."""
        tok = self._backend
        model = tok.model  # not repr(model): that serializes the whole vocabulary (0.2 s)
        signature = (
            tok.get_vocab_size(with_added_tokens=True), self._is_special.shape[0], repr(tok.normalizer),
            repr(tok.pre_tokenizer), repr(tok.post_processor), type(model).__name__,
            getattr(model, "continuing_subword_prefix", None), getattr(model, "end_of_word_suffix", None),
            getattr(model, "dropout", None),
        )
        cached = _BYTE_LENGTHS.get(tok)
        if cached is None or cached[0] != signature:
            cached = (signature, self._byte_lengths())
            _BYTE_LENGTHS[tok] = cached
        return cached[1]

    def _byte_lengths(self) -> np.ndarray | None:
        """UTF-8 length of every token id when the tokens spell the text's bytes exactly (byte-level BPE, no
        normalizer, no offset trimming), else None.

        With it, label boundaries come from the ids alone and the tokenizer runs without character offsets
        (``encode_batch_fast``): measured 13% less tokenizer time on the bench_build corpus.
        """
        from tokenizers import models, pre_tokenizers, processors

        tok = self._backend
        model, pre, post = tok.model, tok.pre_tokenizer, tok.post_processor
        if tok.normalizer is not None or not isinstance(model, models.BPE):
            return None
        if model.continuing_subword_prefix or model.end_of_word_suffix or model.dropout:
            return None
        steps = list(pre) if isinstance(pre, pre_tokenizers.Sequence) else [pre]
        if not any(isinstance(p, pre_tokenizers.ByteLevel) for p in steps) or not all(
            isinstance(p, pre_tokenizers.Split)
            or (isinstance(p, pre_tokenizers.ByteLevel) and not p.add_prefix_space)
            for p in steps
        ):
            return None
        if post is not None and not (isinstance(post, processors.ByteLevel) and not post.trim_offsets):
            return None
        vocab = tok.get_vocab(with_added_tokens=False)
        if not set("".join(vocab)) <= set(pre_tokenizers.ByteLevel.alphabet()):  # one character per byte
            return None
        lengths = np.zeros(self._is_special.shape[0], dtype=np.int32)
        lengths[np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))] = np.fromiter(
            map(len, vocab), dtype=np.int32, count=len(vocab)
        )
        for i, added in tok.get_added_tokens_decoder().items():  # matched in the raw text, as written
            lengths[i] = len(added.content.encode("utf-8"))
        return lengths

    # ------------------------------------------------------------------ encode

    def _stage(self, example: Example) -> _Staged:
        """Render every root-to-node path of ``example`` (a ``text`` record is its own text)."""
        if example.kind == "text":
            return _Staged(texts=[example.text or ""], nodes=[], parents=[], spans=[])
        nodes, parents, paths = [], [], []
        for node, parent in example.root.walk():
            nodes.append(node)
            parents.append(parent)
            paths.append((paths[parent] if parent >= 0 else []) + node.messages)
        located = [self._locate(p) for p in paths]
        return _Staged(
            texts=[text for text, _ in located], nodes=nodes, parents=parents, spans=[sp for _, sp in located]
        )

    def _finish(self, example: Example, stage: _Staged, encodings: list) -> Encoded:
        """Tokens of the staged texts -> the Encoded example (labels, images, truncation, positions)."""
        if example.kind == "text":
            ids, labels, node_offsets, node_parents, refs = self._encode_text(encodings[0])
        else:
            ids, labels, node_offsets, node_parents, refs = self._encode_tree(stage, encodings)
        ids, labels, node_offsets, images = self._expand_images(ids, labels, node_offsets, refs)
        if self.max_length is not None and ids.shape[0] > self.max_length:
            if self.overlong == "drop":
                raise RecordError("overlong", f"{ids.shape[0]} tokens > --max-length {self.max_length}")
            ids, labels, node_offsets, node_parents, images = self._truncate(
                ids, labels, node_offsets, node_parents, images
            )
        labels[0] = IGNORE_INDEX  # nothing predicts an example's first token
        if not (labels != IGNORE_INDEX).any():
            raise RecordError(
                "no_loss_tokens", 'no token carries loss (no assistant turn, or every turn has "loss": false)'
            )
        length = ids.shape[0]
        if node_offsets.shape[0] == 1:  # a linear example: positions are simply 0..L-1
            positions = np.arange(length, dtype=np.int32)
        else:
            positions = tree_position_ids(length, node_offsets, node_parents)
        enc = Encoded(
            example_id=example.example_id,
            input_ids=ids,
            labels=labels,
            position_ids=positions,
            node_offsets=node_offsets,
            node_parents=node_parents,
            images=images,
            source_name=example.source_name,
        )
        if self.profile.mrope and not images:  # get_rope_index on text alone: three equal rows
            mrope = np.empty((3, length), dtype=np.int32)
            mrope[:] = positions  # a broadcast copy: ~6x cheaper than np.tile's reshape-and-repeat
            enc.mrope_position_ids = mrope
        elif self.profile.mrope:
            enc.mrope_position_ids = mrope_position_ids(
                ids,
                node_offsets,
                node_parents,
                [im.grid_thw for im in images],
                image_token_id=self.image_token_id,
                spatial_merge_size=self.profile.merge_size,
            )
        return enc

    def _encode_text(self, enc):
        """A ``text`` record (``enc``: its Encoding): [bos] + tokens + eos, loss on every token (the first
        is cleared later)."""
        ids = enc.ids
        if self.bos_id is not None:
            ids = [self.bos_id, *ids]
        if self.eos_id is not None:
            ids = [*ids, self.eos_id]
        arr = np.asarray(ids, dtype=np.int32)
        if self.image_token_id is not None and (arr == self.image_token_id).any():
            raise RecordError(
                "image_count_mismatch", "the text holds the image token literally but names no image"
            )
        zero = np.zeros(1, dtype=np.int32)
        return arr, arr.copy(), zero, np.full(1, -1, dtype=np.int32), []

    def _encode_tree(self, stage: _Staged, encodings: list):
        """Nodes are path deltas: node n's tokens are its path's minus its parent's path's."""
        nodes, parents, texts = stage.nodes, stage.parents, stage.texts
        node_ids, node_labels, refs, path_ids = [], [], [], []
        for i, (node, parent) in enumerate(zip(nodes, parents, strict=True)):
            enc = encodings[i]
            ids = np.array(enc.ids, dtype=np.int32)
            path_ids.append(ids)
            start = 0
            if parent >= 0:
                start = path_ids[parent].shape[0]
                if not texts[i].startswith(texts[parent]) or not np.array_equal(
                    ids[:start], path_ids[parent]
                ):
                    raise RecordError(
                        "template_error",
                        f"tree node {i}: the rendering of its parent's path is not a token-level prefix of its "
                        "own path (the template or tokenizer is not prefix-stable at this branch)",
                    )
            spans = stage.spans[i][-len(node.messages) :]
            losses = [m.loss if m.loss is not None else m.role == "assistant" for m in node.messages]
            labels = self._labels(ids, enc, texts[i], spans, losses)
            node_ids.append(ids[start:])
            node_labels.append(labels[start:])
            refs.append([p for m in node.messages for p in m.parts if not isinstance(p, str)])
        if len(node_ids) == 1:  # a linear conversation, most records: nothing to join
            ids, labels, node_offsets = node_ids[0], node_labels[0], np.zeros(1, dtype=np.int32)
        else:
            sizes = np.array([a.shape[0] for a in node_ids], dtype=np.int64)
            if (sizes[1:] == 0).any():
                raise RecordError(
                    "template_error",
                    f"tree node {int(np.flatnonzero(sizes[1:] == 0)[0]) + 1} renders to no tokens",
                )
            ids = np.concatenate(node_ids)
            labels = np.concatenate(node_labels)
            node_offsets = (np.cumsum(sizes) - sizes).astype(np.int32)
        node_parents = np.array(parents, dtype=np.int32)
        self._check_image_tokens(ids, node_offsets, refs)
        return ids, labels, node_offsets, node_parents, [im for r in refs for im in r]

    def _check_image_tokens(
        self, ids: np.ndarray, node_offsets: np.ndarray, refs: list[list[ImageRef]]
    ) -> None:
        """Each node must hold exactly one image token per image its messages name."""
        if not any(refs) and (self.image_token_id is None or not (ids == self.image_token_id).any()):
            return  # the common text-only case: nothing to count
        want = np.array([len(r) for r in refs], dtype=np.int64)
        if self.image_token_id is None:
            if want.any():
                raise RecordError(
                    "image_count_mismatch",
                    f"profile {self.profile.name!r} takes no images, but the record names {int(want.sum())}; "
                    "use a vision profile (qwen2-vl, qwen2.5-vl, llava)",
                )
            return
        pos = np.flatnonzero(ids == self.image_token_id)
        got = np.bincount(np.searchsorted(node_offsets, pos, side="right") - 1, minlength=want.shape[0])
        if (got != want).any():
            node = int(np.flatnonzero(got != want)[0])
            if got[node] > want[node]:
                raise RecordError(
                    "image_count_mismatch",
                    f"{int(got.sum())} image tokens for {int(want.sum())} images: the text holds "
                    f"{self.profile.image_token!r} literally",
                )
            raise RecordError(
                "template_error",
                f"the chat template emitted {int(got.sum())} image tokens for {int(want.sum())} images; "
                'it must emit one per {"type": "image"} part',
            )

    def _expand_images(self, ids, labels, node_offsets, refs: list[ImageRef]):
        """Repeat each image token ``num_tokens`` times (labels -100); shift node offsets accordingly."""
        if not refs:
            return ids, labels, node_offsets, []
        pos = np.flatnonzero(ids == self.image_token_id)  # (I,) one per image, in order (checked above)
        repeats = np.ones(ids.shape[0], dtype=np.int64)
        sizes, grids, counts = {}, [], []
        for ref in refs:
            if ref not in sizes:  # a tree's shared image is measured once
                sizes[ref] = self.profile.image_size(ref)
            w, h = sizes[ref]
            grids.append(self.profile.grid_thw(w, h))
            counts.append(self.profile.num_tokens(w, h))
        repeats[pos] = counts
        new_index = np.cumsum(repeats) - repeats  # (L,) where each old token lands
        labels = labels.copy()
        labels[pos] = IGNORE_INDEX
        images = [
            EncodedImage(
                source=ref.path if ref.data is None else "",
                data=ref.data,
                grid_thw=tuple(int(x) for x in g),
                offset=int(new_index[p]),
                num_tokens=int(c),
            )
            for ref, g, c, p in zip(refs, grids, counts, pos, strict=True)
        ]
        return (
            np.repeat(ids, repeats),
            np.repeat(labels, repeats),
            new_index[node_offsets].astype(np.int32),
            images,
        )

    def _truncate(self, ids, labels, node_offsets, node_parents, images: list[EncodedImage]):
        """Keep the first max_length tokens (depth-first layout), cutting before an image, never inside."""
        cut = self.max_length
        for im in images:
            if im.offset < cut < im.offset + im.num_tokens:
                cut = im.offset
                break
        if self.vision_start_id is not None and cut > 0 and ids[cut - 1] == self.vision_start_id:
            cut -= 1  # a <|vision_start|> whose image was cut off would announce an image that never comes
        keep_nodes = int(np.searchsorted(node_offsets, cut, side="left"))  # nodes starting before the cut
        labels = labels[:cut]
        if keep_nodes == 0 or not (labels[1:] != IGNORE_INDEX).any():
            raise RecordError(
                "untruncatable",
                f"cutting to --max-length {self.max_length} (at token {cut}, before any image it would split) "
                "leaves no loss token; raise --max-length or use --overlong drop",
            )
        kept = [im for im in images if im.offset + im.num_tokens <= cut]
        return ids[:cut], labels, node_offsets[:keep_nodes], node_parents[:keep_nodes], kept
