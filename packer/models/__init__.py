"""The model families packer knows, by profile name: ``get_profile("qwen2-vl", max_pixels=...)``.

A family is one ``ModelProfile`` subclass in one file (base.py says what it answers) plus one
``register_profile`` line below. Importing this package imports neither torch nor transformers: the CLI reads
``profile_names()`` for its choices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from packer.errors import ConfigError
from packer.models.base import ModelProfile
from packer.models.llava import LlavaProfile
from packer.models.qwen3_vl import Qwen3VLProfile
from packer.models.qwen_vl import QwenVLProfile
from packer.models.text import TextProfile

_PROFILES: dict[str, ModelProfile] = {}


def register_profile(profile: ModelProfile) -> ModelProfile:
    """Make ``profile`` known by its name (to ``get_profile``, the CLI, the reader and verify)."""
    if profile.name in _PROFILES:
        raise ConfigError(f"profile {profile.name!r} is already registered")
    _PROFILES[profile.name] = profile
    return profile


def profile_names() -> tuple[str, ...]:
    """Registered profile names, in registration order."""
    return tuple(_PROFILES)


def get_profile(name: str, **overrides: Any) -> ModelProfile:
    """The named profile, with ``overrides`` (e.g. min_pixels/max_pixels) applied; None values are ignored."""
    if name not in _PROFILES:
        raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(_PROFILES)}")
    profile = _PROFILES[name]
    changes = {k: v for k, v in overrides.items() if v is not None}
    known = list(dict.fromkeys(k for p in _PROFILES.values() for k in p.overridable))
    unknown = sorted(set(changes) - set(known))
    if unknown:
        raise ConfigError(f"cannot override {unknown} of profile {name!r}; overridable: {', '.join(known)}")
    foreign = sorted(set(changes) - set(profile.overridable))
    if foreign:  # another family's knob (today only Qwen's min_pixels / max_pixels)
        owners = [n for n, p in _PROFILES.items() if set(foreign) <= set(p.overridable)]
        raise ConfigError(
            f"{foreign} only apply to dynamic-resolution profiles ({', '.join(owners)}), not {name!r}"
        )
    return dataclasses.replace(profile, **changes) if changes else profile


def forward_keys() -> tuple[str, ...]:
    """Every batch key some registered family's model forward takes (a batch holds only its own family's)."""
    return tuple(dict.fromkeys(k for p in _PROFILES.values() for k in p.forward_keys))


register_profile(QwenVLProfile(name="qwen2-vl"))
register_profile(QwenVLProfile(name="qwen2.5-vl", tokens_per_second=2))
register_profile(Qwen3VLProfile(name="qwen3-vl"))
register_profile(LlavaProfile(name="llava"))
register_profile(TextProfile(name="text"))
