"""The encode's compiled loops (numba): the labels' per-message fill and the batch's token byte offsets, one
pass each where numpy needs several (T,) passes (a gather, a cumsum, a mask) over the batch's tokens. Imported
only where a batch is labeled by byte lengths (``draft._labels``), so importing packer.encode does not import
numba; a build's pool inherits them loaded (``warm``)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def byte_starts(ids: np.ndarray, byte_lengths: np.ndarray) -> np.ndarray:
    """(T + 1,) int64: the byte where each token starts (and the last one ends), from each id's UTF-8 length:
    ``np.concatenate(([0], np.cumsum(byte_lengths[ids])))`` in one pass."""
    out = np.empty(ids.shape[0] + 1, dtype=np.int64)
    out[0] = 0
    acc = 0
    for i in range(ids.shape[0]):
        acc += byte_lengths[ids[i]]
        out[i + 1] = acc
    return out


@njit(cache=True, nogil=True)
def fill_spans(labels: np.ndarray, ids: np.ndarray, is_special: np.ndarray, first: np.ndarray, last: np.ndarray,
               lim: np.ndarray, known: np.ndarray) -> None:
    """Each loss message's tokens labeled (``labels[t] = ids[t]``): ``first`` up to ``last`` (one past its last
    content token), then through its end-of-turn token (the first control token at or after ``last``, before
    ``lim``); where its content's end is unknown (not ``known``), up to and including the last control token
    before ``lim`` at or after ``first`` (none: up to ``lim``). Only the tokens near each message's end are
    read, not a mask of the batch's."""
    for m in range(first.shape[0]):
        a, b, limit = first[m], last[m], lim[m]
        if known[m]:
            t = b
            while t < limit and not is_special[ids[t]]:
                t += 1
            if t < limit:
                b = t + 1
        else:
            t = limit - 1
            while t >= a and not is_special[ids[t]]:
                t -= 1
            b = t + 1 if t >= a else limit
        for t in range(a, b):
            labels[t] = ids[t]


def check_ids(ids: np.ndarray, size: int) -> None:
    """Every id indexes a table of ``size`` entries: the kernels above read their tables unchecked (numpy's
    gather would raise), so an id past the tokenizer's tables is refused here, never read as a stray byte."""
    if ids.shape[0] and (int(ids.max()) >= size or int(ids.min()) < 0):
        raise ValueError(f"token id outside the tokenizer's {size:,} ids (ids {int(ids.min())}..{int(ids.max())})")


def warm() -> None:
    """Both kernels loaded (from numba's cache) for the build's dtypes: run before a pool forks, so that its
    workers inherit them instead of each loading them at its first chunk."""
    ids = np.zeros(1, dtype=np.int32)
    one = np.zeros(1, dtype=np.int64)
    byte_starts(ids, np.ones(1, dtype=np.int32))
    fill_spans(np.zeros(1, dtype=np.int32), ids, np.zeros(1, dtype=bool), one, one, one, np.zeros(1, dtype=bool))
