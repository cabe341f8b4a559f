"""Packing: the global planner (lengths in, pack ids out), mixing of weighted sources, and on-the-fly packing.

Importing this package imports neither numba (the kernels load at the first ``plan``) nor numpy (the planner's
names load at first use, PEP 562), so ``ALGORITHMS`` is cheap to read: the CLI's ``--algorithm`` choices.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

ALGORITHMS = ("bfd", "ffd", "next-fit", "binpacking")
"""The planners ``plan`` runs (``BuildConfig.algorithm``)."""

_PLANNER = ("efficiency", "groups", "lower_bound", "lower_bound_l2", "pack_totals", "plan")

if TYPE_CHECKING:
    from packer.packing.planner import efficiency, groups, lower_bound, lower_bound_l2, pack_totals, plan

__all__ = ["ALGORITHMS", "efficiency", "groups", "lower_bound", "lower_bound_l2", "pack_totals", "plan"]


def __getattr__(name: str) -> Any:
    if name not in _PLANNER:
        raise AttributeError(f"module 'packer.packing' has no attribute {name!r}")
    value = getattr(import_module("packer.packing.planner"), name)
    globals()[name] = value
    return value
