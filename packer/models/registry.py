"""The registry: profiles by name (``--profile``) and builtin tokenizers by name (``--tokenizer``).

A leaf below the families: ``packer.models`` registers each family package here (``register_family``), and a
family's code may ask the registry (e.g. which profiles take videos) without importing the package that
registers it. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packer.errors import ConfigError, RecordError

if TYPE_CHECKING:
    from packer.models.shared.tokenizer import TokenizerSpec

ModelProfile = Any  # packer.models.base.ModelProfile; not imported: base imports this module (no cycle)
_PROFILES: dict[str, ModelProfile] = {}
_TOKENIZERS: dict[str, TokenizerSpec] = {}


def register_family(package: ModuleType) -> None:
    """Register a family package: its ``PROFILES`` (ModelProfile instances, in order) and its ``TOKENIZERS``
    (builtin ``TokenizerSpec``s, optional)."""
    profiles = getattr(package, "PROFILES", None)
    if not profiles:
        raise ConfigError(f"family package {package.__name__} defines no PROFILES")
    for profile in profiles:
        register_profile(profile)
    for spec in getattr(package, "TOKENIZERS", ()):
        register_tokenizer(spec)


def register_profile(profile: ModelProfile) -> ModelProfile:
    """Make ``profile`` known by its name (to ``get_profile``, the CLI, the reader and verify)."""
    if profile.name in _PROFILES:
        raise ConfigError(f"profile {profile.name!r} is already registered")
    _PROFILES[profile.name] = profile
    return profile


def register_tokenizer(spec: TokenizerSpec) -> TokenizerSpec:
    """Make a builtin tokenizer known by its name (``--tokenizer``, ``load_tokenizer``)."""
    if spec.name in _TOKENIZERS:
        raise ConfigError(f"builtin tokenizer {spec.name!r} is already registered")
    _TOKENIZERS[spec.name] = spec
    return spec


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
    if foreign:  # another family's knob
        owners = [n for n, p in _PROFILES.items() if set(foreign) <= set(p.overridable)]
        raise ConfigError(f"{foreign} only apply to profiles {', '.join(owners)}, not {name!r}; {name!r} takes: "
                          f"{', '.join(profile.overridable)}")
    return dataclasses.replace(profile, **changes) if changes else profile


def family_of(profile: Any) -> str:
    """The family package a profile lives in (``packer/models/<family>/``, docs/models/<family>.md)."""
    parts = type(profile).__module__.split(".")
    return parts[2] if parts[:2] == ["packer", "models"] and len(parts) > 3 else parts[-1]


def forward_keys() -> tuple[str, ...]:
    """Every batch key some registered family's model forward takes (a batch holds only its own family's)."""
    return tuple(dict.fromkeys(k for p in _PROFILES.values() for k in p.forward_keys))


def profiles_with(what: str) -> tuple[str, ...]:
    """Names of the profiles that take ``what`` ("image", "video", "audio" or "audio_in_video": a video's sound
    track), for error messages."""
    def takes(p: ModelProfile) -> bool:
        if what == "audio_in_video":
            return p.audio is not None and p.video is not None and p.audio.in_video
        return getattr(p, what) is not None

    return tuple(n for n, p in _PROFILES.items() if takes(p))


def no_medium(name: str, medium: str) -> RecordError | ConfigError:
    """The error for a record (or a reader) asking profile ``name`` for a ``medium`` it lacks, naming the profiles
    that take it: RecordError for a video or audio clip, ConfigError for images (a build-wide mistake)."""
    names = profiles_with(medium)
    if medium == "video":
        return RecordError("image_count_mismatch",
                           f"profile {name!r} takes no videos, but the record names one; use {' or '.join(names)}")
    if medium == "audio":
        use = f"use {' or '.join(names)}" if names else "no registered profile takes audio"
        return RecordError("unsupported_medium", f"profile {name!r} takes no audio, but the record names some; {use}")
    choices = " or ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))  # "a, b or c"
    return ConfigError(f"profile {name!r} has no vision encoder; use {choices}")


def builtin_tokenizers() -> tuple[str, ...]:
    """Names of the builtin tokenizers, in registration order."""
    return tuple(_TOKENIZERS)


def tokenizer_spec(name: str) -> TokenizerSpec:
    if name not in _TOKENIZERS:
        raise ConfigError(f"unknown builtin tokenizer {name!r}; builtins: {', '.join(_TOKENIZERS)}")
    return _TOKENIZERS[name]


def fast_renderer(template: str | None) -> Any:
    """The pure-Python renderer a builtin registers for exactly this chat template source, or None."""
    for spec in _TOKENIZERS.values():
        if spec.fast_renderer is not None and spec.chat_template == template:
            return spec.fast_renderer
    return None
