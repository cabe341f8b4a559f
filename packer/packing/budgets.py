"""Per-pack budgets as a cost matrix: the columns ``core.media.BUDGETS`` declares, their limits from a config,
and the words both packers reject an example with (``overlong`` rejects of ``packer build``'s
``pipeline.columns.read_chunk`` and of on-the-fly packing's ``over_budget``).

    costs   (n, k) int64: example i costs costs[i, j] of budget j (vision tokens, images, videos, ...)
    limits  (k,)  int or None: at most limits[j] per pack; None = unbounded
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from packer.core.media import BUDGETS, MEDIA
from packer.errors import ConfigError

FLAGS: tuple[str, ...] = tuple(b.flag for b in BUDGETS)
"""The config field of each cost column, in column order."""

VISION = next(j for j, b in enumerate(BUDGETS) if b.tokens and "image" in b.media)
"""The vision-token column (what ``balance_vision`` evens out)."""


def limits_of(config: Any) -> list[int | None]:
    """(k,) the limit of each budget in ``config`` (a ``BuildConfig``); None where unset."""
    return [getattr(config, flag) for flag in FLAGS]


def encoded_costs(example: Any) -> tuple[int, ...]:
    """(k,) one ``Encoded`` example's costs: its tokens per token budget, its items per count budget."""
    return tuple(_encoded_cost(example, b) for b in BUDGETS)


def _encoded_cost(example: Any, budget: Any) -> int:
    if budget.tokens:
        return int(getattr(example, budget.column))  # Encoded.num_vision_tokens etc.
    return len(getattr(example, next(m.plural for m in MEDIA if m.name == budget.media[0])))


def budget_message(config: Any, costs: Sequence[int]) -> str | None:
    """The reject message for an example costing ``costs`` (column order of ``BUDGETS``) under ``config``'s
    limits; None if it fits. One message per tower (the media sharing a token budget), the first tower
    whose budgets it breaks: its tokens, its first medium's items, then the other media's items where their
    budget is set::

        "900 vision tokens / 3 images exceed --max-vision-tokens / --max-images (or 2 videos exceed --max-videos)"
    """
    limits = limits_of(config)
    for token_col, budget in enumerate(BUDGETS):
        if not budget.tokens:
            continue
        group = [token_col] + [j for j, b in enumerate(BUDGETS) if not b.tokens and b.media[0] in budget.media]
        if not any(limits[j] is not None and costs[j] > limits[j] for j in group):
            continue
        first, *others = group[1:]
        message = (f"{costs[token_col]} {budget.what} / {costs[first]} {BUDGETS[first].what} exceed "
                   f"{_option(budget.flag)} / {_option(BUDGETS[first].flag)}")
        for j in others:
            if limits[j] is not None:
                message += f" (or {costs[j]} {BUDGETS[j].what} exceed {_option(BUDGETS[j].flag)})"
        return message
    return None


def _option(flag: str) -> str:
    return "--" + flag.replace("_", "-")


# ----------------------------------------------------------------------------------------------------------
# The named keywords ``plan`` and ``pack_stream`` took before the cost matrix (kept for callers who hold them)
# ----------------------------------------------------------------------------------------------------------

# (count keyword, budget keyword) of each column of BUDGETS, as the old signatures named them.
NAMED = tuple(zip(("vision", "images", "videos", "audio", "audios"), ("vision_budget", *FLAGS[1:]), strict=True))


def from_named(
    named: Mapping[str, Any], convert: Callable[[Any, str], Any]
) -> tuple[list[Any], list[int | None], list[str], int | None]:
    """The old keywords (``vision=``/``vision_budget=``, ``images=``/``max_images=``, ..., ``balance_vision=``)
    as ``(cost columns, limits, names, balance column)``: each count through ``convert(values, keyword)``
    (``plan``: arrays; ``pack_stream``: functions). A count given without its budget is an unbounded column
    (checked, and balanced if ``balance_vision``)."""
    named = dict(named)
    balance_vision = bool(named.pop("balance_vision", False))
    known = {k for pair in NAMED for k in pair}
    unknown = sorted(set(named) - known)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}; budgets are costs= and limits=")
    cols, limits, names, balance = [], [], [], None
    for (count, limit_kw), budget in zip(NAMED, BUDGETS, strict=True):
        values, limit = named.get(count), named.get(limit_kw)
        if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
            raise ConfigError(f"'{budget.flag}' must be a positive integer, got {limit!r}")
        if values is None:
            if limit is not None:
                raise ConfigError(f"'{limit_kw}' is set but no `{count}` counts were given ({budget.what})")
            continue
        if count == "vision" and balance_vision:
            balance = len(cols)
        cols.append(convert(values, count))
        limits.append(limit)
        names.append(budget.flag)
    return cols, limits, names, balance


def check_costs(costs: Any, limits: Sequence[int | None], names: Sequence[str], n: int) -> np.ndarray:
    """``costs`` as a C-contiguous (n, k) int64 matrix matching ``limits``/``names``, or ConfigError."""
    arr = np.asarray(costs if costs is not None else np.zeros((n, 0)), dtype=None)
    if arr.ndim == 1 and len(limits) == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] != len(limits):
        raise ConfigError(f"'costs' must be an (n, k) = ({n}, {len(limits)}) array (one column per limit), "
                          f"got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ConfigError(f"'costs' must hold integers, got dtype {arr.dtype}")
    if len(names) != len(limits):
        raise ConfigError(f"'names' has {len(names)} entries but there are {len(limits)} limits")
    return np.ascontiguousarray(arr, dtype=np.int64)


def noun(name: str) -> str:
    """What the budget called ``name`` counts (``"vision tokens"``), or the name itself for a custom one."""
    return next((b.what for b in BUDGETS if b.flag == name), f"'{name}' units")


def counts_tokens(name: str) -> bool:
    """Is the budget called ``name`` a part of each example's tokens (vision or audio tokens)?"""
    return any(b.flag == name and b.tokens for b in BUDGETS)
