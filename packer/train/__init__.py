"""Training on packer's shards, one subpackage per concern (docs/architecture.md, "train/"):

    data/        rows to batches: PackedDataset, collate, rank shares, resume, online packing, equal steps
    attention/   a packed row through a model: PackedLayout, backends, varlen kernels, spans, linear state,
                 context parallel, the transformers hook
    trainers/    the loss and the trainers: packed_cross_entropy, metrics, PackedTrainer, the TRL trainers
    keys.py      the batch keys all three share; options.py: the string options and their one check

The flat module paths of before (``packer.train.dataset``, ``packer.train.trl``, ...) stay importable: ``MOVED``
maps each to its new module, and importing the old name gives that very module object (so ``isinstance`` and
monkeypatching see one module). An alias rather than a shim file at the old path, so that every moved file is a
plain rename in git (history follows; a branch that edits the old file merges into the new one). Nothing here
imports torch: ``import packer.train`` stays light.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# old module path (before the cut by concern) -> the module that holds its code now; docs/training.md lists them
MOVED: dict[str, str] = {
    "packer.train.dataset": "packer.train.data.dataset",
    "packer.train.collate": "packer.train.data.collate",
    "packer.train.balance": "packer.train.data.rank_shares",
    "packer.train.resume": "packer.train.data.resume",
    "packer.train.online": "packer.train.data.online",
    "packer.train.join": "packer.train.data.join",
    "packer.train.layout": "packer.train.attention.layout",
    "packer.train.varlen_kernels": "packer.train.attention.varlen_kernels",
    "packer.train.span_attention": "packer.train.attention.spans",
    "packer.train.linear_state": "packer.train.attention.linear_state",
    "packer.train.context_parallel": "packer.train.attention.context_parallel",
    "packer.train.hf": "packer.train.attention.hf",
    "packer.train.trainer": "packer.train.trainers.trainer",
    "packer.train.trl": "packer.train.trainers.trl",
    "packer.train.loss": "packer.train.trainers.loss",
    "packer.train.metrics": "packer.train.trainers.metrics",
}
# ``packer.train.attention`` (the old backends module) is now the attention package: its __init__ re-exports the
# old module's names lazily.


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of ``MOVED`` and loads it as the new module itself."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])  # the real module; the import system keeps its attributes

    def exec_module(self, module: ModuleType) -> None:
        pass  # executed already under its new name


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.append(_Alias())
