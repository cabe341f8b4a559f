"""Packing: the global planner (lengths in, pack ids out), mixing of weighted sources, and on-the-fly packing.

Importing this package does not import numba (the kernels load at the first ``plan``), so ``ALGORITHMS``
is cheap to read.
"""

from packer.packing.planner import (
    ALGORITHMS,
    efficiency,
    groups,
    lower_bound,
    lower_bound_l2,
    pack_totals,
    plan,
)

__all__ = ["ALGORITHMS", "efficiency", "groups", "lower_bound", "lower_bound_l2", "pack_totals", "plan"]
