"""What the manifest promises about every row (capacity, examples per pack, each budget of ``core.media.BUDGETS``)
and the check that every row keeps it. A broken budget is reported, but the row is still checked further."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import packer.report.verify.family as family
from packer.core.media import BUDGETS, MEDIA
from packer.report.verify.decode import Rows
from packer.report.verify.report import RowCheck

if TYPE_CHECKING:
    from packer.models.base import ModelProfile
    from packer.shards.schema import Manifest


@dataclass(frozen=True)
class Promises:
    """The manifest's promises about every row, and what reads them."""

    max_length: int | None
    max_examples: int | None
    limits: dict[str, int | None]  # budget flag (``max_vision_tokens``...) -> its limit
    profile: ModelProfile
    token_ids: dict[str, int | None]  # medium -> its placeholder's id (None: an old manifest)


def promises(manifest: Manifest) -> Promises:
    cfg = manifest.config
    return Promises(
        max_length=cfg.max_length, max_examples=cfg.max_examples_per_pack,
        limits={b.flag: getattr(cfg, b.flag) for b in BUDGETS},
        profile=family.load_profile(manifest),
        token_ids={m.name: getattr(manifest, f"{m.placeholder}_id", None) for m in MEDIA},
    )


def check_budgets(d: Rows, check: RowCheck, promised: Promises) -> None:
    """Each row within ``max_length``, ``max_examples_per_pack`` and every budget the config sets."""
    T, E = d.num_tokens, d.num_examples
    if promised.max_length is not None:
        check(T > promised.max_length, "capacity", lambda i: f"{T[i]} tokens > max_length {promised.max_length}")
    if promised.max_examples is not None:
        check(E > promised.max_examples, "examples budget",
              lambda i: f"{E[i]} examples > max_examples_per_pack {promised.max_examples}")
    for budget in BUDGETS:
        limit = promised.limits[budget.flag]
        if limit is None:
            continue
        used = row_cost(d, budget)
        check(used > limit, f"{budget.what} budget",
              lambda i, used=used, budget=budget, limit=limit: f"{used[i]} {budget.what} > {budget.flag} {limit}")


def row_cost(d: Rows, budget) -> np.ndarray:
    """(R,) what each row spends of ``budget``: its stored token total, or its items of the medium counted."""
    if budget.tokens:
        return d.totals[budget.column]
    return d.media[budget.media[0]].per_row
