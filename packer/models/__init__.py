"""The model families packer knows, by profile name: ``get_profile("qwen2-vl", max_pixels=...)``.

A family is one package, ``packer/models/<family>/``, holding everything that family knows (its profiles, their
resize and count rules, positions, media planning, the reader and the proof, its builtin tokenizers); its
``__init__`` exports ``PROFILES`` (and ``TOKENIZERS``). Adding one is its package plus its name in ``FAMILIES``
below (docs/architecture.md, "Adding a model family"). Importing this package imports neither torch nor
transformers: the CLI reads ``profile_names()`` for its choices.
"""

from __future__ import annotations

from importlib import import_module

from packer.models.base import ModelProfile
from packer.models.registry import (
    builtin_tokenizers,
    family_of,
    forward_keys,
    get_profile,
    profile_names,
    register_family,
    register_profile,
    register_tokenizer,
)

__all__ = ["ModelProfile", "builtin_tokenizers", "family_of", "forward_keys", "get_profile", "profile_names", "register_family",
           "register_profile", "register_tokenizer", "FAMILIES"]

# The family packages, in the order their profiles are listed (``--profile`` choices, docs/models/).
FAMILIES = (
    "qwen_vl",
    "llava",
    "llava_onevision",
    "gemma3",
    "text",
    "internvl",
    "molmo2",
    "smolvlm",
    "mistral3",
    "glm46v",
    "gemma4",
    "llama4",
    "qwen_omni",
    "qwen2_audio",
)

for _name in FAMILIES:
    register_family(import_module(f"packer.models.{_name}"))
