"""The model families packer knows, by profile name: ``get_profile("qwen2-vl", max_pixels=...)``.

A family is one package, ``packer/models/<family>/``, holding everything that family knows (its profiles, their
resize and count rules, positions, media planning, the reader and the proof, its builtin tokenizers); its
``__init__`` exports ``PROFILES`` (and ``TOKENIZERS``). Adding one is its package plus one line in ``FAMILIES``
below (its name and its profiles' names), and one in ``FAMILY_TOKENIZERS`` where it has builtin tokenizers
(docs/architecture.md, "Adding a model family"). Importing this package imports no family (the registry imports
one the first time one of its profiles or builtin tokenizers is asked for: ``get_profile``, ``tokenizer_spec``;
``profile_names()`` imports them all), nor torch nor transformers.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packer.models.registry import (
    builtin_tokenizers,
    defer_families,
    family_of,
    forward_keys,
    get_profile,
    profile_names,
    register_family,
    register_profile,
    register_tokenizer,
)

__all__ = ["ModelProfile", "builtin_tokenizers", "family_of", "forward_keys", "get_profile", "profile_names", "register_family",
           "register_profile", "register_tokenizer", "FAMILIES", "FAMILY_TOKENIZERS"]

# The family packages, in the order their profiles are listed (``--profile`` choices, docs/models/), each with its
# profiles' names in its ``PROFILES`` order: naming a profile imports its family alone (tests/models/test_registry.py
# checks each line against the family's ``PROFILES``).
FAMILIES = {
    "qwen_vl": ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5", "qwen3.5-moe"),
    "llava": ("llava",),
    "llava_onevision": ("llava-onevision",),
    "gemma3": ("gemma3",),
    "text": ("text",),
    "internvl": ("internvl",),
    "molmo2": ("molmo2",),
    "smolvlm": ("smolvlm",),
    "mistral3": ("mistral3",),
    "glm46v": ("glm-4.6v",),
    "gemma4": ("gemma4",),
    "llama4": ("llama4",),
    "qwen_omni": ("qwen2.5-omni", "qwen3-omni"),
    "qwen2_audio": ("qwen2-audio",),
}

PROFILE_FAMILIES = {profile: family for family, profiles in FAMILIES.items() for profile in profiles}
"""Every builtin profile's name -> its family package, in ``FAMILIES`` order."""

# Each family's builtin tokenizers (its ``TOKENIZERS``' names, in order), in ``FAMILIES`` order: naming a builtin
# tokenizer (a build's ``--tokenizer``, its directory, its spec) imports its family alone, not all of them to find
# it (tests/models/test_registry.py checks each line against the family's ``TOKENIZERS``; the registry refuses a
# family whose ``TOKENIZERS`` differ from its line).
FAMILY_TOKENIZERS = {
    "qwen_vl": ("qwen2-vl", "qwen2.5", "qwen3-vl", "qwen3.5-standin"),
    "llava_onevision": ("llava-onevision",),
    "gemma3": ("gemma3",),
    "text": ("llama3",),
    "internvl": ("internvl3",),
    "molmo2": ("molmo2",),
    "smolvlm": ("smolvlm",),
    "mistral3": ("mistral3",),
    "glm46v": ("glm-4.6v",),
    "gemma4": ("gemma4",),
    "llama4": ("llama4",),
    "qwen_omni": ("qwen2.5-omni", "qwen3-omni"),
    "qwen2_audio": ("qwen2-audio",),
}

TOKENIZER_FAMILIES = {name: family for family, names in FAMILY_TOKENIZERS.items() for name in names}
"""Every builtin tokenizer's name -> its family package, in ``FAMILIES`` order (the builtins' listing order)."""


def _import_family(name: str) -> ModuleType:
    return import_module(f"packer.models.{name}")


defer_families(tuple(FAMILIES), PROFILE_FAMILIES, _import_family, TOKENIZER_FAMILIES)

if TYPE_CHECKING:
    from packer.models.base import ModelProfile


def __getattr__(name: str) -> Any:
    if name == "ModelProfile":  # base imports PIL (packer.media.images): not for a command that reads no profile
        from packer.models.base import ModelProfile

        globals()[name] = ModelProfile
        return ModelProfile
    raise AttributeError(f"module 'packer.models' has no attribute {name!r}")
