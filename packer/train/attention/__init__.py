"""A packed row through a model: ``layout`` (the mask and varlen plan of a row), ``backends`` (``packed_attention``
on flash / varlen / flex / sdpa), ``varlen_kernels``, ``spans`` (bidirectional spans as two varlen calls),
``linear_state`` (recurrent layers per sequence and branch), ``context_parallel``, and ``hf`` (transformers'
hook). This package took the name of the old ``packer.train.attention`` module (now ``backends``): its names are
still found here, loaded on first use so that importing a sibling (``layout``) does not import the backends.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    backends = importlib.import_module("packer.train.attention.backends")
    try:
        return getattr(backends, name)
    except AttributeError:
        raise AttributeError(f"module 'packer.train.attention' has no attribute {name!r}") from None
