"""The loss rule: which tokens of a rendered conversation carry loss.

Labels are NOT shifted: ``labels[t] = input_ids[t]`` where loss applies, -100 elsewhere. A message carries
loss if it is an assistant turn, or if its ``loss`` says so. A loss message's tokens are every token that
overlaps its content, plus its end-of-turn token: the first special token after the content and before the
next message's content (``<|im_end|>``, Llama-3's ``<|eot_id|>``, ...). What follows it (the ``\\n`` after
``<|im_end|>``) and the role header (``<|im_start|>assistant\\n``) carry none:

    <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n
    <|im_start|>assistant\nHello<|im_end|>\n
                         ^^^^^^^^^^^^^^^^  loss: the content ("Hello") and the end-of-turn token

A template with no special token after the content has no end-of-turn token to learn. Where the template
alters content (the prefix fallback of templates.py: content end unknown), the loss span runs from the
content start to the message's last special token, so a non-assistant message with ``loss: true`` then
also trains on its header.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import chain

import numpy as np

from packer.core.types import IGNORE_INDEX, Message
from packer.encode.templates import Span
from packer.encode.tokenize import Boundaries, ByteOffsets


def carries_loss(m: Message) -> bool:
    """A message's ``loss`` if given (a weight: > 0), else whether it is an assistant turn."""
    return bool(m.loss) if m.loss is not None else m.role == "assistant"


def loss_weight(m: Message) -> float:
    """The weight a loss message's tokens carry: its ``loss`` when that is a number, else 1."""
    return 1.0 if m.loss is None or isinstance(m.loss, bool) else float(m.loss)


def loss_labels(
    ids: np.ndarray, spans: list[Span], *, is_special: np.ndarray, boundaries: Boundaries
) -> np.ndarray:
    """(L,) int32 labels of one tokenized rendering: the loss tokens of each message in ``spans`` (the loss
    messages' Spans), IGNORE_INDEX elsewhere. ``is_special``: (V,) bool, which ids are control tokens."""
    labels = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int32)
    # token indices of control tokens, as a list: bisect on a few items beats numpy's per-call overhead
    special = np.flatnonzero(is_special[ids]).tolist()
    n = ids.shape[0]
    token_at, starts_before = boundaries
    for cs, ce, limit in spans:
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


def merged_spans(spans: list[list[Span]], flat: tuple[np.ndarray, np.ndarray], *, only: list[int] | None = None
                 ) -> list[list[Span]]:
    """``spans`` (per text) with the rows of ``flat`` (each one's text, its Span as a row of an (L, 3) array)
    added to their texts' lists, as ``batch_loss_labels`` reads them together; with ``only``, just those texts'
    lists (the others as given). A new outer list: the lists added to are copies."""
    text, chars = flat
    out = list(spans)
    if only is None:
        rows = np.arange(text.shape[0])
    else:
        rows = np.flatnonzero(np.isin(text, np.asarray(only, dtype=np.int64)))
    added: dict[int, list[Span]] = {}
    for k, row in zip(text[rows].tolist(), chars[rows].tolist(), strict=True):
        added.setdefault(k, []).append(tuple(row))  # type: ignore[arg-type]
    for k, more in added.items():
        out[k] = [*out[k], *more]
    return out


def batch_loss_labels(
    ids: np.ndarray, starts: list[int], texts: list[str], spans: list[list[Span]], *, is_special: np.ndarray,
    offsets: ByteOffsets, flat: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, list[int]]:
    """``loss_labels`` of a whole batch of texts at once (``tokenize.flat_ids``: text k's tokens are
    ``ids[starts[k]:starts[k + 1]]``, ``spans[k]`` its loss messages' Spans), boundaries from ``offsets``.

    ``flat``: more loss messages as columns (each one's text, its Span as an (L, 3) int64 row, every content end
    known: ``render.LossColumns``), taken with ``spans``' (``merged_spans`` gives the same spans per text).

    Returns the (T,) int32 labels and the texts it left unlabeled (IGNORE_INDEX): those with spans whose
    tokens do not spell their bytes, for ``loss_labels`` with offsets. Why: a few numpy calls per batch
    instead of a dozen per text (each costs about a microsecond, as much as a short text's whole rule).
    """
    labels = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int32)
    rest: list[int] = []
    if flat is not None and not flat[0].shape[0]:
        flat = None
    # per loss message: bytes of content start, content end (the limit where unknown), limit; text end token.
    # The batch's spans flat, in one pass; an ASCII text whose tokens spell as many bytes as it has characters
    # (``ByteOffsets.bytes_of``'s first case, most texts) has its bytes by numpy with the others; any other text
    # with spans asks ``bytes_of`` alone (None: ``rest``). The rows' order does not matter: labels are their union
    n_texts = len(texts)
    counts = np.fromiter(map(len, spans), dtype=np.int64, count=n_texts)  # loss messages per text
    listed = bool(counts.any())
    if not listed and flat is None:
        return labels, rest
    # (M, 3) characters: content start, content end, limit, in one conversion (a content end None: nan, exact
    # for every int below 2**53, then the limit)
    chars = np.array(list(chain.from_iterable(spans)), dtype=np.float64).reshape(-1, 3)
    known = ~np.isnan(chars[:, 1])
    chars[:, 1] = np.where(known, chars[:, 1], chars[:, 2])
    chars = chars.astype(np.int64)
    text_of = np.repeat(np.arange(n_texts), counts)  # (M,) each loss message's text
    if flat is not None:  # the rows given as columns, each with its content end
        text_of = np.concatenate([text_of, flat[0]]) if listed else flat[0]
        chars = np.concatenate([chars, flat[1]]) if listed else flat[1]
        known = np.ones(text_of.shape[0], dtype=bool) if not listed else np.concatenate(
            [known, np.ones(flat[0].shape[0], dtype=bool)])
        counts = counts + np.bincount(flat[0], minlength=n_texts)
    sizes = np.fromiter(map(len, texts), dtype=np.int64, count=n_texts)
    tokens = np.asarray(starts, dtype=np.int64)
    base = offsets.text_start  # (texts + 1,) byte where each text starts (and the last one ends)
    plain = (np.fromiter(map(str.isascii, texts), dtype=bool, count=n_texts)
             & (np.diff(base) == sizes) & (tokens[1:] > tokens[:-1]))
    take = plain[text_of]
    k = text_of[take]
    q = base[k, None] + np.minimum(chars[take], sizes[k, None])
    end = tokens[k + 1]
    known_end = known[take]
    others = np.flatnonzero(~plain & (counts > 0)).tolist()
    if others:
        queries: list[int] = []
        text_end: list[int] = []
        other_known: list[bool] = []
        every = spans if flat is None else merged_spans(spans, flat, only=others)
        for j in others:
            text_spans = every[j]
            found = offsets.bytes_of(j, texts[j], [c for cs, ce, limit in text_spans
                                                   for c in (cs, limit if ce is None else ce, limit)])
            if found is None:
                rest.append(j)
                continue
            queries += found
            text_end += [starts[j + 1]] * len(text_spans)
            other_known += [ce is not None for _, ce, _ in text_spans]
        if queries:
            q = np.concatenate([q, np.array(queries, dtype=np.int64).reshape(-1, 3)])
            end = np.concatenate([end, np.array(text_end, dtype=np.int64)])
            known_end = np.concatenate([known_end, np.array(other_known, dtype=bool)])
    if not q.shape[0]:
        return labels, rest
    first, last, lim = (offsets.token_at(q[:, j], end=end) for j in range(3))
    last += (last < end) & offsets.starts_before(last, q[:, 1])  # the last content token straddles the end
    # numba, imported only where labels come from byte lengths
    from packer.encode.kernels import check_ids, fill_spans

    check_ids(ids, is_special.shape[0])
    fill_spans(labels, ids, is_special, first, last, lim, known_end)
    return labels, rest
