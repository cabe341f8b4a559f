"""The string options of training, each a ``Literal`` (what a type checker and a reader see) checked by one
function (what a user who mistypes one sees): ``check("weighting", "sqrtt", Weighting)`` raises
``ConfigError: 'weighting' must be one of 'token', 'example', 'sqrt', 'branches'; got 'sqrtt'``.

Strings rather than enums: the public calls (``use_packed_attention(model, "flex")``,
``PackedTrainer(..., weighting="sqrt")``) and every recipe in the docs take plain strings, and a ``Literal`` keeps
them valid as they are.
"""

from __future__ import annotations

from typing import Literal, get_args

from packer.errors import ConfigError

Backend = Literal["auto", "flash", "varlen", "flex", "sdpa", "sdpa_varlen"]  # attention.backends; auto per device
Loss = Literal["packer", "model"]  # a trainer's loss: packed_cross_entropy (any row) or the model's own (linear rows)
Weighting = Literal["token", "example", "sqrt", "branches"]  # what each loss token weighs (trainers.loss)
Prefix = Literal["once", "path"]  # a tree's shared loss tokens: counted once, or once per root-to-leaf path
Reduction = Literal["sum", "mean", "none"]  # packed_cross_entropy's

def choices(option: object) -> tuple[str, ...]:
    """The values of a ``Literal`` alias, in their order."""
    return get_args(option)


def check(name: str, value: object, option: object) -> str:
    """``value`` if it is one of ``option``'s values, else a ConfigError naming the option and what it takes."""
    allowed = get_args(option)
    if value not in allowed:
        raise ConfigError(f"{name!r} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value  # type: ignore[return-value]
