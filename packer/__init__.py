"""packer: offline global sequence packing for LLM and vision-language training data.

The public API, imported lazily so that ``import packer`` (and ``packer stats``) never imports torch::

    from packer import BuildConfig, build, PackedDataset, collate, packed_cross_entropy, use_packed_attention

    result = build(BuildConfig.from_inputs(["train.jsonl"], "shards/", profile="qwen2-vl", max_length=8192))
    loader = DataLoader(PackedDataset("shards/"), batch_size=1, collate_fn=collate)

docs/architecture.md maps the packages (one per axis of growth) and what each may import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> module that defines it; resolved on first attribute access (PEP 562)
_API = {
    "BuildConfig": "packer.config",
    "build": "packer.pipeline.build",
    "plan": "packer.packing",
    "verify_build": "packer.report.verify",
    "PackedDataset": "packer.train.data.dataset",
    "collate": "packer.train.data.collate",
    "packed_cross_entropy": "packer.train.trainers.loss",
    "use_packed_attention": "packer.train.attention.hf",
}
__all__ = [
    "BuildConfig",
    "PackedDataset",
    "__version__",
    "build",
    "collate",
    "packed_cross_entropy",
    "plan",
    "use_packed_attention",
    "verify_build",
]

if TYPE_CHECKING:
    from packer.config import BuildConfig
    from packer.packing import plan
    from packer.pipeline.build import build
    from packer.report.verify import verify_build
    from packer.train.attention.hf import use_packed_attention
    from packer.train.data.collate import collate
    from packer.train.data.dataset import PackedDataset
    from packer.train.trainers.loss import packed_cross_entropy


def _version() -> str:
    """The installed distribution's version (importlib.metadata, ~50 ms to import: read at first use, not by every
    ``packer`` command)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("packer")
    except PackageNotFoundError:  # running from a source tree without install
        return "0.0.0+local"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = globals()[name] = _version()
        return value
    if name not in _API:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API, "__version__"})
