"""A long text -> chunks of at most ``max_length`` tokens, each its own example (``--long-docs split``).

    tokens    [bos t1 t2 ... t9 eos]  (L = 11), max_length 4, overlap 1: stride 3
    chunk 0   bos t1 t2 t3            labels  -   t1 t2 t3      ("-": -100)
    chunk 1   t3  t4 t5 t6            labels  -   t4 t5 t6      t3 is context only: its loss is in chunk 0
    chunk 2   t6  t7 t8 t9            labels  -   t7 t8 t9
    chunk 3   t9  eos                 labels  -   eos

Every token is in some chunk (tokens lost = 0) and every target is trained once: the first ``overlap``
tokens of a later chunk repeat the previous chunk's last tokens as context, label -100. With overlap 0 the
first token of each later chunk has no loss (nothing in its chunk predicts it): n-1 targets of the document
go untrained, which overlap >= 1 avoids. Positions restart at 0 in every chunk; no bos is added to a later
chunk (it does not start the document), the eos stays in the last. Why: pretraining text is not lost to a
length limit, and each chunk is packed like any example.
"""

from __future__ import annotations

import numpy as np

from packer.core.types import IGNORE_INDEX


def split_windows(length: int, *, max_length: int, overlap: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of a ``length``-token document: ``split_windows(11, max_length=4,
    overlap=1) == [(0, 4), (3, 7), (6, 10), (9, 11)]``; one window when it fits.

    With overlap 0 a last chunk of one token would carry no loss (its only token is its first), so it starts
    one token earlier instead: ``split_windows(9, max_length=4) == [(0, 4), (4, 8), (7, 9)]``.
    """
    if not 0 <= overlap < max_length:
        raise ValueError(f"overlap must be in [0, max_length), got {overlap} for max_length {max_length}")
    stride = max_length - overlap
    windows = [(0, min(length, max_length))]
    while windows[-1][1] < length:
        start = windows[-1][0] + stride
        windows.append((start, min(length, start + max_length)))
    if len(windows) > 1 and windows[-1][1] - windows[-1][0] == 1:
        windows[-1] = (windows[-1][0] - 1, windows[-1][1])
    return windows


def chunk_labels(labels: np.ndarray, start: int, end: int, *, context_end: int) -> np.ndarray:
    """The labels of chunk ``[start, end)`` of a document whose labels are ``labels``, where the previous
    chunk ends at ``context_end`` (0 for the first): the chunk's first token and the tokens the previous chunk
    already holds (context, trained there) carry no loss."""
    out = labels[start:end].copy()
    out[: max(1, context_end - start)] = IGNORE_INDEX
    return out
