"""Example -> Encoded: token ids, labels, tree nodes, images and positions, for one tokenizer, chat template
and model profile.

``Encoder.encode_batch`` runs three steps:

    stage     render every root-to-node path of each example: texts and content spans (templates.py)
    tokenize  ONE tokenizer call for all the batch's texts (tokenize.py), then labels for all (labels.py)
    finish    per example: tree nodes, image expansion, truncation, positions

Trees: node n's tokens are the tokens of the path root..n minus those of the path root..parent(n); the
parent's tokens must be a token-level prefix (else ``template_error``). The system prompt a template inserts
on its own belongs to the root. Images: the template's single image token per image is expanded to the
profile's ``num_tokens`` copies (labels -100) with ``np.repeat`` (then overwritten with the profile's own
run of tokens where it has one, Molmo2); no per-token Python loop anywhere. Videos the same way: the video
token (``<|video_pad|>``) becomes the ``num_tokens`` of the profile's ``plan_video`` (frames and grid from the
clip's header; a tree's branches share one clip, planned once).
Positions: a token's position on its root-to-leaf path; the profile adds its own (``extra_positions``:
mRoPE for the Qwen2-VL family).

Fast paths, each checked against the general one it replaces (tests/encode/test_encoder.py):

- ``encode_batch``: one tokenizer call per batch (the build passes a 512-line chunk), because one call per
  record interleaved with Python work runs slower: the tokenizer's tables leave the CPU caches.
- the ChatML template in pure Python (templates.py); token boundaries from byte lengths (tokenize.py).
- the batch's tokens as one array (``_Tokens``): the loss rule for all its texts in a few numpy calls
  (``labels.batch_loss_labels``, from byte lengths; ``loss_labels`` per text from offsets is the general path),
  and each text's image and video tokens counted once, so a linear example whose counts match its images
  skips the per-node check, and is its path's tokens as they are (no node bookkeeping).

Measured costs: docs/benchmarks.md, "Build throughput".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.core.ids import chunk_id
from packer.core.tree import ancestor_matrix, tree_position_ids
from packer.core.types import (
    IGNORE_INDEX,
    Encoded,
    EncodedImage,
    EncodedVideo,
    Example,
    ImageRef,
    Node,
    VideoRef,
)
from packer.encode import LONG_DOCS_POLICIES, OVERLONG_POLICIES
from packer.encode.labels import batch_loss_labels, carries_loss, loss_labels
from packer.encode.split import chunk_labels, split_windows
from packer.encode.templates import ChatTemplate, Span
from packer.encode.tokenize import (
    ByteOffsets,
    cached_token_byte_lengths,
    flat_ids,
    offset_boundaries,
    special_token_mask,
    tokenize,
)
from packer.errors import ConfigError, RecordError

if TYPE_CHECKING:
    from packer.models.base import ModelProfile


@dataclass(slots=True)
class _Staged:
    """One example between rendering and tokenization (see ``Encoder.encode_batch``)."""

    texts: list[str]  # what to tokenize: one rendering per root-to-node path (a text record: its text)
    nodes: list[Node]  # tree nodes, depth-first ([] for a text record)
    parents: list[int]  # parent index of each node (-1 for the root)
    spans: list[list[Span]]  # per path, per message (templates.ChatTemplate.locate)
    first: int = 0  # index of texts[0] in the batch's tokenizer call


@dataclass(slots=True)
class _Tokens:
    """A batch's tokens and labels, its texts back to back (``tokenize.flat_ids``): text k's are
    ``ids[starts[k]:starts[k + 1]]``. Labels are those of the loss rule (labels.py) for a conversation's
    path, IGNORE_INDEX for a text record (``_text_draft`` gives its own)."""

    ids: np.ndarray  # (T,) int32
    labels: np.ndarray  # (T,) int32
    starts: list[int]  # (texts + 1,)
    images: list[int]  # image tokens in each text (the template's placeholders: one per image named)
    videos: list[int]  # video tokens in each text

    def text(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Text k's ids and labels (views: the batch's texts do not overlap)."""
        a, b = self.starts[k], self.starts[k + 1]
        return self.ids[a:b], self.labels[a:b]


@dataclass(slots=True)
class _Draft:
    """One example between tokenization and its Encoded form; ``_finish``'s steps update it in place."""

    ids: np.ndarray  # (L,) int32
    labels: np.ndarray  # (L,) int32, IGNORE_INDEX where no loss
    node_offsets: np.ndarray  # (N,) int32, first token of each node
    node_parents: np.ndarray  # (N,) int32, -1 for the root
    refs: list[ImageRef | VideoRef]  # the images and videos named, in token order: one token each until expanded
    images: list[EncodedImage] = field(default_factory=list)  # set by _expand_images (and cut by _truncate)
    blocks: list[int] = field(default_factory=list)  # entries of `images` per image named (ImageBlocks), in order
    videos: list[EncodedVideo] = field(default_factory=list)  # likewise
    video_spans: list[int] = field(default_factory=list)  # tokens each video's expansion spans (Qwen3-VL: > num_tokens)


class Encoder:
    """Turns Examples into Encoded examples for one tokenizer, chat template and model profile.

    ``max_length`` (None: unlimited) with ``overlong`` (``packer.encode.OVERLONG_POLICIES``): ``drop``
    rejects a longer example (``overlong``), ``truncate`` keeps its first ``max_length`` tokens in the
    depth-first layout, never inside an image; ``truncate_left`` / ``keep_last_turns`` keep the end (a text's
    last tokens, a conversation's last whole turns). ``long_docs="split"``: a longer ``text`` record becomes
    several examples (``split.py``; ``long_docs_overlap`` tokens of context shared), so ``encode_batch``
    gives a list for it. ``chat_template``: a template source that replaces the tokenizer's.
    """

    def __init__(
        self,
        tokenizer: Any,
        profile: ModelProfile,
        *,
        max_length: int | None = None,
        overlong: str = "drop",
        long_docs: str = "off",
        long_docs_overlap: int = 0,
        chat_template: str | None = None,
    ):
        if overlong not in OVERLONG_POLICIES:
            raise ConfigError(f"'overlong' must be one of {', '.join(OVERLONG_POLICIES)}, got {overlong!r}")
        if max_length is not None and max_length < 1:
            raise ConfigError(f"'max_length' must be a positive integer, got {max_length}")
        if long_docs not in LONG_DOCS_POLICIES:
            raise ConfigError(f"'long_docs' must be one of {', '.join(LONG_DOCS_POLICIES)}, got {long_docs!r}")
        if long_docs_overlap < 0 or (max_length is not None and long_docs_overlap >= max_length):
            raise ConfigError(f"'long_docs_overlap' must be in [0, max_length), got {long_docs_overlap}")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError("packer needs a fast (Rust-backed) tokenizer: it reads character offsets")
        self.tokenizer = tokenizer
        self.profile = profile
        self.max_length = max_length
        self.overlong = overlong
        self.long_docs = long_docs
        self.long_docs_overlap = long_docs_overlap
        self._backend = backend
        self._chat = ChatTemplate(
            chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None),
            special_tokens={k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
            images=profile.has_vision,
        )
        # Special (control) tokens: an end-of-turn marker is the first of them after a message's content.
        self._is_special = special_token_mask(tokenizer)  # (V,) id -> control token?
        # (V,) UTF-8 bytes per token id, or None: boundaries from character offsets
        self._token_bytes = cached_token_byte_lengths(backend, size=self._is_special.shape[0])
        self.image_token_id = self._token_id(profile.image_token)
        self.video_token_id = self._token_id(profile.video_token)
        self._is_placeholder = np.zeros_like(self._is_special)  # (V,) id -> an image or video token?
        self._is_placeholder[[t for t in (self.image_token_id, self.video_token_id) if t is not None]] = True
        self.vision_start_id = self._token_id(profile.vision_start)
        # what the profile's extra_positions may look tokens up by (mRoPE finds each image's run)
        self._token_ids = {
            "image_token": self.image_token_id,
            "video_token": self.video_token_id,
            "vision_start": self.vision_start_id,
            "vision_end": self._token_id(profile.vision_end),
        }
        self._image_runs: dict[tuple[int, int, int], np.ndarray] = {}  # grid -> its tokens (expanded_images)
        self.bos_id = tokenizer.bos_token_id
        self.eos_id = tokenizer.eos_token_id

    @property
    def template(self) -> str | None:
        """The chat template source in use: ``chat_template``'s, else the tokenizer's."""
        return self._chat.source

    def __getstate__(self) -> dict:
        """What a worker process needs: the Rust tokenizer, the template source and the tables built from the
        tokenizer; not the transformers tokenizer around it, so unpickling imports no transformers (which
        imports torch through AutoTokenizer). After it ``tokenizer`` is None."""
        return {**self.__dict__, "tokenizer": None}

    def _token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        tok = self.tokenizer
        tid = tok.convert_tokens_to_ids(token)
        if tid is None or tid == tok.unk_token_id or tok.convert_ids_to_tokens(tid) != token:
            raise ConfigError(
                f"profile {self.profile.name!r} uses token {token!r}, which the tokenizer does not have"
            )
        return int(tid)

    # ------------------------------------------------------------------ public

    def encode(self, example: Example) -> Encoded | list[Encoded]:
        """Render, tokenize and label one example; raise RecordError (with ``path:line``) if unusable. A text
        split by ``long_docs="split"`` gives its chunks, in order."""
        (result,) = self.encode_batch([example])
        if isinstance(result, RecordError):
            raise result
        return result

    def encode_batch(self, examples: Sequence[Example]) -> list[Encoded | list[Encoded] | RecordError]:
        """``encode`` for many examples with ONE tokenizer call: each example's Encoded (a split text: the
        list of its chunks) or its RecordError.

        Errors are returned (located at ``path:line``), not raised, so one bad record does not cost the others
        their shared tokenizer call. The results equal ``encode`` one example at a time.
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
        encodings = tokenize(self._backend, texts, offsets=self._token_bytes is None)
        tokens = self._tokens([s for s in staged if not isinstance(s, RecordError)], texts, encodings)
        out: list[Encoded | RecordError] = []
        for example, stage in zip(examples, staged, strict=True):
            if isinstance(stage, RecordError):
                out.append(stage)
                continue
            try:
                out.append(self._finish(example, stage, tokens))
            except RecordError as e:
                out.append(e if e.path else e.located(example.path, example.line))
        return out

    # ------------------------------------------------------------------ stage

    def _stage(self, example: Example) -> _Staged:
        """Render every root-to-node path of ``example`` (a ``text`` record is its own text)."""
        if example.kind == "text":
            return _Staged(texts=[example.text or ""], nodes=[], parents=[], spans=[])
        root = example.root
        if not root.children:  # one node, one path (most conversations): the tree walk below, without its lists
            text, spans = self._chat.locate(root.messages, tools=example.tools)
            if self.profile.splits_images:
                text, spans = self._split_images(text, spans, root.messages)
            return _Staged(texts=[text], nodes=[root], parents=[-1], spans=[spans])
        nodes, parents, paths = [], [], []
        for node, parent in example.root.walk():
            nodes.append(node)
            parents.append(parent)
            paths.append((paths[parent] if parent >= 0 else []) + node.messages)
        located = [self._chat.locate(p, tools=example.tools) for p in paths]
        if self.profile.splits_images:
            located = [self._split_images(text, spans, p) for (text, spans), p in zip(located, paths, strict=True)]
        return _Staged(
            texts=[text for text, _ in located], nodes=nodes, parents=parents, spans=[sp for _, sp in located]
        )

    def _split_images(self, text: str, spans: list[Span], path: list) -> tuple[str, list[Span]]:
        """The rendering with each image the profile splits into blocks written as its processor writes it
        (``ModelProfile.image_blocks``: Gemma 3's crops), and the message spans moved to match."""
        token = self.profile.image_token
        pieces, shifts, at, start = [], [], 0, 0
        for ref in (p for m in path for p in m.parts if isinstance(p, ImageRef)):
            at = text.find(token, at)
            if at < 0:
                return text, spans  # fewer image tokens than images: _check_image_tokens says so
            blocks = self.profile.image_blocks(*self.profile.image_size(ref))
            if blocks is not None:
                a = at - blocks.rendered.index(token)
                if text[a : a + len(blocks.rendered)] != blocks.rendered:
                    raise RecordError(
                        "template_error",
                        f"profile {self.profile.name!r} writes this image as blocks, and needs the chat template "
                        f"to write an image as {blocks.rendered!r} (the builtin {self.profile.default_tokenizer} "
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

    # ------------------------------------------------------------------ tokens

    def _tokens(self, staged: list[_Staged], texts: list[str], encodings: list) -> _Tokens:
        """The batch's tokens (``encodings`` of ``texts``) with every conversation path's labels: the loss
        rule for all texts at once from byte lengths (``batch_loss_labels``), one text at a time from character
        offsets where those do not apply (the general path, ``loss_labels``)."""
        ids, starts = flat_ids(encodings)
        spans: list[list[Span]] = [[] for _ in texts]  # per text, its loss messages' spans
        for stage in staged:
            for i, node in enumerate(stage.nodes):  # a text record has none
                own = stage.spans[i][-len(node.messages) :]  # the node's own messages, the last on its path
                spans[stage.first + i] = [s for s, m in zip(own, node.messages, strict=True) if carries_loss(m)]
        if self._token_bytes is None:  # the batch was tokenized with offsets
            labels, rest = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int32), [k for k, s in enumerate(spans) if s]
        else:
            labels, rest = batch_loss_labels(ids, starts, texts, spans, is_special=self._is_special,
                                             offsets=ByteOffsets(ids, starts, self._token_bytes))
        for k in rest:
            a, b = starts[k], starts[k + 1]
            enc = encodings[k] if self._token_bytes is None else self._backend.encode(texts[k], add_special_tokens=False)
            labels[a:b] = loss_labels(ids[a:b], spans[k], is_special=self._is_special,
                                      boundaries=offset_boundaries(ids[a:b], enc, texts[k]))
        images, videos = (
            [0] * len(texts) if t is None else np.diff(np.searchsorted(np.flatnonzero(ids == t), starts)).tolist()
            for t in (self.image_token_id, self.video_token_id)
        )
        return _Tokens(ids, labels, starts, images=images, videos=videos)

    # ------------------------------------------------------------------ finish

    def _finish(self, example: Example, stage: _Staged, tokens: _Tokens) -> Encoded | list[Encoded]:
        """Tokens of the staged texts -> the Encoded example (labels, images, length policy, positions)."""
        draft = self._draft(example, stage, tokens)
        length = draft.ids.shape[0]
        if self.max_length is None or length <= self.max_length:
            return self._encoded(example, draft)
        text = example.kind == "text"
        if text and self.long_docs == "split":
            return self._split(example, draft)
        if self.overlong == "drop":
            raise RecordError("overlong", f"{length} tokens > --max-length {self.max_length}")
        if self.overlong == "truncate" or (text and self.overlong == "keep_last_turns"):
            self._truncate(draft)
        elif text:  # truncate_left
            self._truncate_left(draft)
        else:  # keep_last_turns, or truncate_left on a conversation
            draft = self._keep_last_turns(example, length)
        return self._encoded(example, draft)

    def _draft(self, example: Example, stage: _Staged, tokens: _Tokens) -> _Draft:
        """The whole example's tokens, labels and nodes, its images expanded (no length policy yet)."""
        draft = self._text_draft(tokens, stage.first) if example.kind == "text" else self._tree_draft(stage, tokens)
        self._expand_images(draft)
        return draft

    def _encoded(self, example: Example, draft: _Draft, *, example_id: str | None = None) -> Encoded:
        """The Encoded form of a draft that fits: first label cleared, positions (1-D and the profile's)."""
        ids, labels, node_offsets, node_parents, images = (
            draft.ids, draft.labels, draft.node_offsets, draft.node_parents, draft.images
        )  # fmt: skip
        labels[0] = IGNORE_INDEX  # nothing predicts an example's first token
        if labels.max() == IGNORE_INDEX == labels.min():  # every label is IGNORE_INDEX; one reduction, no mask
            raise RecordError(
                "no_loss_tokens", 'no token carries loss (no assistant turn, or every turn has "loss": false)'
            )
        if (images or draft.videos) and node_offsets.shape[0] > 1:  # a video's frames join Molmo2's block too
            starts = np.array([im.offset for im in [*images, *draft.videos]])
            self.profile.check_image_nodes(node_parents, np.searchsorted(node_offsets, starts, "right") - 1)
        length = ids.shape[0]
        if node_offsets.shape[0] == 1:  # a linear example: positions are simply 0..L-1
            positions = np.arange(length, dtype=np.int32)
        else:
            positions = tree_position_ids(length, node_offsets, node_parents)
        extra = self.profile.extra_positions(
            ids, positions, node_offsets, node_parents, [im.grid_thw for im in images], token_ids=self._token_ids,
            **({"videos": draft.videos} if draft.videos else {}),  # only a video family is ever passed videos
        )
        return Encoded(
            example_id=example.example_id if example_id is None else example_id,
            input_ids=ids,
            labels=labels,
            position_ids=positions,
            node_offsets=node_offsets,
            node_parents=node_parents,
            images=images,
            mrope_position_ids=extra,  # (3, L) for mRoPE families, else None
            source_name=example.source_name,
            videos=draft.videos,
        )

    def _text_draft(self, tokens: _Tokens, k: int) -> _Draft:
        """A ``text`` record (text ``k`` of ``tokens``): [bos] + tokens + eos, loss on every token (the first
        is cleared later)."""
        parts = [tokens.text(k)[0]]
        if self.bos_id is not None:
            parts.insert(0, np.array([self.bos_id], dtype=np.int32))
        if self.eos_id is not None:
            parts.append(np.array([self.eos_id], dtype=np.int32))
        arr = np.concatenate(parts)  # a copy: the batch's ids stay as they are
        for token_id, what in ((self.image_token_id, "image"), (self.video_token_id, "video")):
            if (tokens.images[k] or tokens.videos[k]) and token_id is not None and (arr == token_id).any():
                raise RecordError(
                    "image_count_mismatch", f"the text holds the {what} token literally but names no {what}"
                )
        return _Draft(arr, arr.copy(), np.zeros(1, dtype=np.int32), np.full(1, -1, dtype=np.int32), refs=[])

    def _tree_draft(self, stage: _Staged, tokens: _Tokens) -> _Draft:
        """Nodes are path deltas: node n's tokens are its path's minus its parent's path's."""
        nodes, parents, texts, first = stage.nodes, stage.parents, stage.texts, stage.first
        if len(nodes) == 1:  # a linear conversation, most records: its one path is the example
            ids, labels = tokens.text(first)
            node_offsets = np.zeros(1, dtype=np.int32)
            refs = [[p for m in nodes[0].messages for p in m.parts if not isinstance(p, str)]]
            # its counts are its text's, taken for the whole batch: the check below only runs to say what is wrong
            videos = sum(isinstance(r, VideoRef) for r in refs[0])
            counted = (tokens.images[first], tokens.videos[first]) == (len(refs[0]) - videos, videos) and (
                not self.profile.splits_images or not refs[0]  # a split image holds one token per block
            )
        else:
            ids, labels, node_offsets, refs = self._join_nodes(stage, tokens)
            paths = slice(first, first + len(texts))
            counted = not any(refs) and not any(tokens.images[paths]) and not any(tokens.videos[paths])
        if not counted:
            self._check_image_tokens(ids, node_offsets, refs)
        node_parents = np.array(parents, dtype=np.int32)
        return _Draft(ids, labels, node_offsets, node_parents, refs=[im for r in refs for im in r])

    def _join_nodes(
        self, stage: _Staged, tokens: _Tokens
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[ImageRef | VideoRef]]]:
        """A tree's ids, labels, node offsets and each node's images and videos, from its paths' tokens."""
        texts = stage.texts
        node_ids, node_labels, refs, path_ids = [], [], [], []
        for i, (node, parent) in enumerate(zip(stage.nodes, stage.parents, strict=True)):
            ids, labels = tokens.text(stage.first + i)
            path_ids.append(ids)
            start = 0
            if parent >= 0:
                start = path_ids[parent].shape[0]
                # bytes compared: np.array_equal's checks cost more than the compare on a few hundred tokens
                if not texts[i].startswith(texts[parent]) or ids[:start].tobytes() != path_ids[parent].tobytes():
                    raise RecordError(
                        "template_error",
                        f"tree node {i}: the rendering of its parent's path is not a token-level prefix of its "
                        "own path (the template or tokenizer is not prefix-stable at this branch)",
                    )
            node_ids.append(ids[start:])
            node_labels.append(labels[start:])
            refs.append([p for m in node.messages for p in m.parts if not isinstance(p, str)])
        sizes = [a.shape[0] for a in node_ids]
        if 0 in sizes[1:]:
            raise RecordError("template_error", f"tree node {sizes.index(0, 1)} renders to no tokens")
        offsets = np.array([0, *accumulate(sizes[:-1])], dtype=np.int32)
        return np.concatenate(node_ids), np.concatenate(node_labels), offsets, refs

    def _check_image_tokens(
        self, ids: np.ndarray, node_offsets: np.ndarray, refs: list[list[ImageRef | VideoRef]]
    ) -> None:
        """Each node must hold exactly one image token per image its messages name, and one video token per
        video."""
        videos = [[r for r in node if isinstance(r, VideoRef)] for node in refs]
        if any(videos) and self.video_token_id is None:
            self.profile.plan_video(next(v for node in videos for v in node))  # raises: no video in this family
        if self.video_token_id is not None and (any(videos) or (ids == self.video_token_id).any()):
            self._check_token_counts(ids, node_offsets, videos, self.video_token_id, self.profile.video_token, "video")
        images = [[r for r in node if isinstance(r, ImageRef)] for node in refs]
        if not any(images) and (self.image_token_id is None or not (ids == self.image_token_id).any()):
            return  # the common text-only case: nothing to count
        want = np.array([len(r) for r in images], dtype=np.int64)
        if self.profile.splits_images:  # an image written as blocks holds one image token per block
            images = [[b for r in node for b in self._blocks_of(r)] for node in images]
        if self.image_token_id is None:
            if want.any():
                raise RecordError(
                    "image_count_mismatch",
                    f"profile {self.profile.name!r} takes no images, but the record names {int(want.sum())}; "
                    "use a vision profile (qwen2-vl, qwen2.5-vl, llava)",
                )
            return
        self._check_token_counts(ids, node_offsets, images, self.image_token_id, self.profile.image_token, "image")

    def _check_token_counts(
        self, ids: np.ndarray, node_offsets: np.ndarray, refs: list[list], token_id: int, token: str, what: str
    ) -> None:
        want = np.array([len(r) for r in refs], dtype=np.int64)
        pos = np.flatnonzero(ids == token_id)
        got = np.bincount(np.searchsorted(node_offsets, pos, side="right") - 1, minlength=want.shape[0])
        if (got != want).any():
            node = int(np.flatnonzero(got != want)[0])
            if got[node] > want[node]:
                raise RecordError(
                    "image_count_mismatch",
                    f"{int(got.sum())} {what} tokens for {int(want.sum())} {what}s: the text holds {token!r} literally",
                )
            raise RecordError(
                "template_error",
                f"the chat template emitted {int(got.sum())} {what} tokens for {int(want.sum())} {what}s; "
                f'it must emit one per {{"type": "{what}"}} part',
            )

    def _expand_images(self, draft: _Draft) -> None:
        """Repeat each image (video) token ``num_tokens`` times (labels -100); shift node offsets accordingly.

        Placeholder positions are Python ints: an example names a few images, and numpy calls on a few items
        cost a microsecond each for nothing."""
        refs = draft.refs
        if not refs:
            return
        # one per image or video (per block of a split image), in order
        pos = np.flatnonzero(self._is_placeholder[draft.ids]).tolist()
        sizes: dict[ImageRef, tuple[int, int]] = {}
        plans: dict[VideoRef, Any] = {}
        for ref in refs:
            if isinstance(ref, VideoRef):
                if ref not in plans:  # a tree's shared clip is planned once
                    plans[ref] = self.profile.plan_video(ref)
            elif ref not in sizes:  # a tree's shared image is measured once
                sizes[ref] = self.profile.image_size(ref)
        split = [self.profile.image_blocks(*sizes[r]) if r in sizes and self.profile.splits_images else None
                 for r in refs]  # ImageBlocks of an image written as several blocks (_split_images), else None
        draft.blocks = [1 if b is None else len(b.grids) for r, b in zip(refs, split, strict=True) if r in sizes]
        ref_pos, at = [], 0  # each ref's first placeholder
        for b in split:
            ref_pos.append(pos[at])
            at += 1 if b is None else len(b.grids)
        is_video = [isinstance(r, VideoRef) for r in refs]
        if self.video_token_id is not None and (
            [t == self.video_token_id for t in draft.ids[ref_pos].tolist()] != is_video
        ):
            raise RecordError("template_error", "the chat template put the images and videos out of their order")
        if self.profile.video_alone and any(is_video):
            _check_video_alone(np.searchsorted(draft.node_offsets, ref_pos, side="right") - 1, refs,
                               draft.node_parents, self.profile.name)
        spliced: dict[int, np.ndarray] = {}  # placeholder position -> the video's own tokens (Qwen3-VL)
        for ref, p in zip(refs, ref_pos, strict=True):
            if isinstance(ref, VideoRef):
                tokens = self._video_tokens(plans[ref], draft.ids, p)
                if tokens is not None:  # the profile's own expansion (Qwen3-VL: timestamped frames)
                    spliced[p] = tokens
        # the example's images together: a family's count may depend on the others on a path (LLaVA-OneVision)
        image_pos = np.array([p for p, v in zip(ref_pos, is_video, strict=True) if not v], dtype=np.int64)
        image_plans = iter(self.profile.example_images(
            [sizes[r] for r in refs if not isinstance(r, VideoRef)], node_parents=draft.node_parents,
            image_nodes=np.searchsorted(draft.node_offsets, image_pos, side="right") - 1,
        ))
        grids, counts, entries = [], [], []  # counts: the tokens each placeholder becomes (a spliced video: its text)
        for ref, blocks, p in zip(refs, split, ref_pos, strict=True):
            if isinstance(ref, VideoRef):
                g, c = plans[ref].grid_thw, plans[ref].num_tokens if p not in spliced else spliced[p].shape[0]
            else:
                g, c = next(image_plans)
            if blocks is None:
                grids.append(g)
                counts.append(c)
                entries.append(ref)
            else:  # one entry per block, each its own run of placeholders
                grids += blocks.grids
                counts += self.profile.grid_num_tokens(np.array(blocks.grids)).tolist()
                entries += [ref] * len(blocks.grids)
        refs = entries
        wrap = int(self.profile.processor_wraps_images)  # <img> + run + </img>: the processor's, not the template's
        runs = [int(c) + 2 * wrap for c in counts]  # the tokens each placeholder becomes
        starts, shift = [], 0  # where each placeholder's run starts once expanded
        for p, r in zip(pos, runs, strict=True):
            starts.append(p + shift)
            shift += r - 1
        repeats = np.ones(draft.ids.shape[0], dtype=np.int64)
        repeats[pos] = runs
        labels = draft.labels.copy()
        labels[pos] = IGNORE_INDEX
        draft.images, draft.videos, draft.video_spans = [], [], []
        for ref, g, c, offset in zip(refs, grids, counts, starts, strict=True):
            grid = tuple(int(x) for x in g)
            if isinstance(ref, VideoRef):
                draft.videos.append(_encoded_video(ref, plans[ref], offset=offset))
                draft.video_spans.append(int(c))
            else:
                draft.images.append(EncodedImage(
                    source=ref.path if ref.data is None else "", data=ref.data, grid_thw=grid, offset=offset + wrap,
                    num_tokens=int(c),
                ))
        draft.ids = np.repeat(draft.ids, repeats)
        if self.profile.expanded_images:  # Molmo2: the run is the image's own layout of several tokens
            for im in draft.images:
                draft.ids[im.offset : im.offset + im.num_tokens] = self._image_run(im.grid_thw)
        start_of = dict(zip(pos, starts, strict=True))
        for p, tokens in spliced.items():
            draft.ids[start_of[p] : start_of[p] + tokens.shape[0]] = tokens
        draft.labels = np.repeat(labels, repeats)
        if wrap:
            draft.ids[starts] = self._token_ids["vision_start"]
            draft.ids[[a + r - 1 for a, r in zip(starts, runs, strict=True)]] = self._token_ids["vision_end"]
        if draft.node_offsets.shape[0] > 1:  # a linear example's one node starts at 0, before every image
            shifts = np.cumsum([0] + [r - 1 for r in runs])  # (P + 1,) tokens the first k placeholders add
            before = np.searchsorted(np.array(pos, dtype=np.int64), draft.node_offsets, side="left")
            draft.node_offsets = (draft.node_offsets + shifts[before]).astype(np.int32)

    def _blocks_of(self, ref: ImageRef) -> list[ImageRef]:
        """``ref`` once per block the profile writes it as (``ModelProfile.image_blocks``)."""
        blocks = self.profile.image_blocks(*self.profile.image_size(ref))
        return [ref] if blocks is None else [ref] * len(blocks.grids)

    def _image_run(self, grid: tuple[int, int, int]) -> np.ndarray:
        """The token ids of ``profile.image_token_names(grid)``, once per distinct grid."""
        if grid not in self._image_runs:
            names = self.profile.image_token_names(grid)
            ids = {name: self._token_id(name) for name in set(names)}
            self._image_runs[grid] = np.array([ids[name] for name in names], dtype=np.int32)
        return self._image_runs[grid]

    def _video_tokens(self, plan, ids: np.ndarray, p: int) -> np.ndarray | None:
        """The tokens a video's placeholder at ``p`` becomes where the profile writes its own text for it
        (``ModelProfile.video_text``), else None (the placeholder repeated ``num_tokens`` times).

        The text is tokenized alone, which equals tokenizing it in place only where a special token precedes
        it: the template's <|vision_start|> (Qwen3-VL's timestamps are text, and BPE would merge a "<" with a
        preceding space or punctuation), so anything else is refused. A family without a vision start (Molmo2)
        writes text that begins with a digit, which Qwen2's pre-tokenizer always splits off on its own."""
        text = self.profile.video_text(plan)
        if text is None:
            return None
        if self.vision_start_id is not None and (p == 0 or ids[p - 1] != self.vision_start_id):
            raise RecordError(
                "template_error",
                f"the chat template must put {self.profile.vision_start!r} right before each "
                f"{self.profile.video_token!r} (the video's timestamps are tokenized after it)",
            )
        return np.asarray(self._backend.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def _truncate(self, draft: _Draft) -> None:
        """Keep the first max_length tokens (depth-first layout), cutting before an image or video, never
        inside."""
        cut = self.max_length
        tail = int(self.profile.processor_wraps_images)  # the image's </img> stays with it
        firsts = np.cumsum([0, *draft.blocks])  # an image's blocks go together (its crops and the text between)
        spans = [(draft.images[i].offset, draft.images[j - 1].offset + draft.images[j - 1].num_tokens + tail)
                 for i, j in zip(firsts[:-1], firsts[1:], strict=True)]  # [first token, end) of each image
        spans += [(v.offset, v.offset + n) for v, n in zip(draft.videos, draft.video_spans, strict=True)]
        for start, end in spans:
            if start < cut < end:
                cut = start
                break
        if self.vision_start_id is not None and cut > 0 and draft.ids[cut - 1] == self.vision_start_id:
            cut -= 1  # a <|vision_start|> whose image was cut off would announce an image that never comes
        keep_nodes = int(np.searchsorted(draft.node_offsets, cut, side="left"))  # nodes that start before it
        labels = draft.labels[:cut]
        if keep_nodes == 0 or not (labels[1:] != IGNORE_INDEX).any():
            raise RecordError(
                "untruncatable",
                f"cutting to --max-length {self.max_length} (at token {cut}, before any image it would split) "
                "leaves no loss token; raise --max-length or use --overlong drop",
            )
        kept = [im for im in draft.images if im.offset + im.num_tokens <= cut]
        whole = [draft.images[i] for i, (_, end) in zip(firsts[:-1], spans[: len(draft.blocks)], strict=True)
                 if end - tail <= cut]  # each kept image's first block
        if 0 < len(kept) < len(draft.images):
            image_refs = [r for r in draft.refs if not isinstance(r, VideoRef)][: len(whole)]
            starts = np.array([im.offset for im in whole])
            try:
                alone = [c for _, c in self.profile.example_images(
                    [self.profile.image_size(r) for r in image_refs], node_parents=draft.node_parents[:keep_nodes],
                    image_nodes=np.searchsorted(draft.node_offsets[:keep_nodes], starts, side="right") - 1,
                )]
            except RecordError:  # the cut tree's paths disagree on a kept image (image_tree): no count fits
                alone = None
            if alone != [im.num_tokens for im in whole]:  # the count depended on the lost images
                raise RecordError(
                    "untruncatable",
                    f"cutting to --max-length {self.max_length} drops images that decide how many tokens the "
                    f"kept ones take (profile {self.profile.name!r}); raise --max-length or use --overlong drop",
                )
        draft.images = kept
        kept_videos = [(v, n) for v, n in zip(draft.videos, draft.video_spans, strict=True) if v.offset + n <= cut]
        draft.videos, draft.video_spans = [v for v, _ in kept_videos], [n for _, n in kept_videos]
        draft.ids, draft.labels = draft.ids[:cut], labels
        draft.node_offsets = draft.node_offsets[:keep_nodes]
        draft.node_parents = draft.node_parents[:keep_nodes]

    def _truncate_left(self, draft: _Draft) -> None:
        """A text record keeps its last max_length tokens (no bos re-added: the tail does not start the
        document; its first token's label is cleared by ``_encoded``). Text records hold no images."""
        cut = draft.ids.shape[0] - self.max_length
        draft.ids, draft.labels = draft.ids[cut:], draft.labels[cut:].copy()

    def _split(self, example: Example, draft: _Draft) -> list[Encoded]:
        """A long text record -> its chunks (``split.py``), ids ``path:line@k``."""
        windows = split_windows(draft.ids.shape[0], max_length=self.max_length, overlap=self.long_docs_overlap)
        one = np.zeros(1, dtype=np.int32), np.full(1, -1, dtype=np.int32)
        ends = [0] + [b for _, b in windows[:-1]]  # where each chunk's context (the previous chunk) ends
        return [
            self._encoded(
                example,
                _Draft(draft.ids[a:b], chunk_labels(draft.labels, a, b, context_end=e), *one, refs=[]),
                example_id=chunk_id(example.example_id, k),
            )
            for k, ((a, b), e) in enumerate(zip(windows, ends, strict=True))
        ]

    def _keep_last_turns(self, example: Example, length: int) -> _Draft:
        """Drop the fewest whole early turns of the root that make ``example`` fit; re-rendered by the template
        (a template may depend on what precedes a turn), found by bisection: O(log turns) tokenizer calls.

        Turns: the root's leading system messages are always kept; the rest is cut into turns, each starting
        at a user message (messages before the first user message form a turn of their own). The root's last
        turn is always kept: a tree's branches continue it, and the kept part starts at a user message.
        """
        root = example.root
        head = 0
        while head < len(root.messages) and root.messages[head].role == "system":
            head += 1
        rest = root.messages[head:]
        starts = [0] + [i for i, m in enumerate(rest) if i > 0 and m.role == "user"]

        def drafted(k: int) -> _Draft:  # the example without its first k turns
            shorter = replace(example, root=Node(root.messages[:head] + rest[starts[k]:], root.children))
            stage = self._stage(shorter)
            encodings = tokenize(self._backend, stage.texts, offsets=self._token_bytes is None)
            return self._draft(shorter, stage, self._tokens([stage], stage.texts, encodings))

        last = len(starts) - 1
        best = drafted(last) if last > 0 else None
        kept = length if best is None else best.ids.shape[0]
        if kept > self.max_length:
            raise RecordError(
                "untruncatable",
                f"the system prompt and the last turn alone are {kept} tokens > --max-length {self.max_length}; "
                "raise --max-length, or use --overlong truncate to keep the head",
            )
        lo, hi = 1, last  # drafted(hi) fits; find the smallest k that does
        while lo < hi:
            mid = (lo + hi) // 2
            candidate = drafted(mid)
            if candidate.ids.shape[0] <= self.max_length:
                best, hi = candidate, mid
            else:
                lo = mid + 1
        if not (best.labels[1:] != IGNORE_INDEX).any():
            raise RecordError(
                "untruncatable",
                f"the last {len(starts) - hi} turn(s) that fit --max-length {self.max_length} carry no loss; "
                "raise --max-length or use --overlong drop",
            )
        return best


def _encoded_video(ref: VideoRef, plan, *, offset: int) -> EncodedVideo:
    """A planned video (``packer.media.video.VideoPlan``) at ``offset`` of its example."""
    options = dict(ref.options)
    start, end = options.get("video_start"), options.get("video_end")
    return EncodedVideo(
        source=ref.path,
        frames=list(ref.frames),
        video_start=None if start is None else float(start),
        video_end=None if end is None else float(end),
        frame_indices=list(plan.frame_indices),
        video_fps=float(plan.video_fps),
        grid_thw=tuple(int(x) for x in plan.grid_thw),
        height=int(plan.size[0]),
        width=int(plan.size[1]),
        utils_height=int(plan.utils_size[0]),
        utils_width=int(plan.utils_size[1]),
        offset=offset,
        num_tokens=int(plan.num_tokens),
        second_per_grid_t=float(plan.second_per_grid_t),
    )


def _check_video_alone(nodes: np.ndarray, refs: list, node_parents: np.ndarray, profile: str) -> None:
    """RecordError when a root-to-leaf path holds two videos, or a video and an image (``video_alone``)."""
    anc = ancestor_matrix(node_parents)
    leaves = np.setdiff1d(np.arange(len(node_parents)), node_parents)
    videos = np.zeros(len(node_parents), dtype=np.int64)
    images = np.zeros(len(node_parents), dtype=np.int64)
    for node, ref in zip(nodes.tolist(), refs, strict=True):
        (videos if isinstance(ref, VideoRef) else images)[node] += 1
    per_path_videos, per_path_images = anc[leaves] @ videos, anc[leaves] @ images
    if (per_path_videos > 1).any():
        raise RecordError("bad_video", f"profile {profile!r} takes at most one video per example (path); "
                                       f"one holds {int(per_path_videos.max())}: split them into separate records")
    if ((per_path_videos > 0) & (per_path_images > 0)).any():
        raise RecordError("bad_video", f"profile {profile!r} takes no image beside a video in one example (path): "
                                       "its model refuses pixel_values with pixel_values_videos; split the record")
