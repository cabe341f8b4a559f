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

import numpy as np

from packer.core.types import IGNORE_INDEX, Message
from packer.encode.templates import Span
from packer.encode.tokenize import Boundaries


def carries_loss(m: Message) -> bool:
    """A message's ``loss`` if given, else whether it is an assistant turn."""
    return m.loss if m.loss is not None else m.role == "assistant"


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
