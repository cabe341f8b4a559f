"""The registry: profiles by name (``--profile``) and builtin tokenizers by name (``--tokenizer``).

A leaf below the families: ``packer.models`` names each builtin family package and its profiles here
(``defer_families``), and a family is imported the first time one of its profiles is asked for by name
(``get_profile``), or one of its builtin tokenizers (``tokenizer_spec``: a build's ``--tokenizer``): a command that
uses one profile (``packer repack``, ``stats``, a build) imports one family, and one that names none (``packer
--help``, ``verify --help``) none; whatever searches every profile or tokenizer (``profile_names``,
``forward_keys``, ``fast_renderer``, an error message naming the alternatives) imports them all first. A
family's code may ask the registry (e.g. which profiles take videos) without importing the package that registers
it. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packer.errors import ConfigError, RecordError

if TYPE_CHECKING:
    from packer.models.shared.tokenizer import TokenizerSpec

ModelProfile = Any  # packer.models.base.ModelProfile; not imported: base imports this module (no cycle)
_PROFILES: dict[str, ModelProfile] = {}
_TOKENIZERS: dict[str, TokenizerSpec] = {}
_BUILTIN: dict[str, str] = {}
"""Builtin profile name -> its family package under ``packer/models/`` (``packer.models.PROFILE_FAMILIES``), in the
order ``profile_names`` lists them; not imported until asked for (``_load``)."""
_BUILTIN_TOKENIZERS: dict[str, str] = {}
"""Builtin tokenizer name -> its family package (``packer.models.TOKENIZER_FAMILIES``), in listing order."""
_FAMILIES: tuple[str, ...] = ()
_IMPORT: Callable[[str], ModuleType] | None = None  # packer.models' importer of a family package by name
_TOKENIZER_RANK: dict[str, int] = {}  # a builtin tokenizer -> its family's place in _FAMILIES (the listing order)
_LOADING = threading.RLock()  # one thread registers a family (and reorders the tables) at a time


def defer_families(families: tuple[str, ...], profiles: dict[str, str], load: Callable[[str], ModuleType],
                   tokenizers: dict[str, str] | None = None) -> None:
    """Name the builtin family packages (``packer.models.FAMILIES``, in listing order), which of them holds each
    builtin profile and each builtin tokenizer, and how to import one (``load``, packer.models': the registry
    imports no family itself): each is imported and registered the first time it is needed (``_load``)."""
    global _FAMILIES, _IMPORT
    _FAMILIES, _IMPORT = tuple(families), load
    _BUILTIN.update(profiles)
    _BUILTIN_TOKENIZERS.update(tokenizers or {})


def _load(family: str) -> None:
    """Import builtin family ``family`` and register its profiles and tokenizers (again where a test swapped the
    tables: what is there already stays)."""
    package = _IMPORT(family)  # outside the lock: the import system has its own
    with _LOADING:
        _register_builtin(family, package)


def _register_builtin(family: str, package: ModuleType) -> None:
    for profile in getattr(package, "PROFILES", ()):
        if _BUILTIN.get(profile.name) != family:
            raise ConfigError(f"profile {profile.name!r} of family {family} is not in packer.models.FAMILIES "
                              f"under {family!r}")
        _PROFILES.setdefault(profile.name, profile)
    specs = getattr(package, "TOKENIZERS", ())
    if [spec.name for spec in specs] != [n for n, f in _BUILTIN_TOKENIZERS.items() if f == family]:
        raise ConfigError(f"family {family}'s TOKENIZERS {[spec.name for spec in specs]} are not its line in "
                          f"packer.models.FAMILY_TOKENIZERS")
    for spec in specs:
        _TOKENIZER_RANK[spec.name] = _FAMILIES.index(family)
        _TOKENIZERS.setdefault(spec.name, spec)


def _load_all() -> None:
    """Every builtin family registered, and both tables in listing order: the builtins in ``FAMILIES`` order (as
    an eager import of every family registered them), then what was registered by hand, in its order."""
    if all(name in _PROFILES for name in _BUILTIN):
        return
    for family in dict.fromkeys(_BUILTIN[name] for name in _BUILTIN if name not in _PROFILES):
        _load(family)
    with _LOADING:
        rank = {name: i for i, name in enumerate(_BUILTIN)}
        _reorder(_PROFILES, lambda name: rank.get(name, len(rank)))
        _reorder(_TOKENIZERS, lambda name: _TOKENIZER_RANK.get(name, len(_FAMILIES)))


def _reorder(table: dict[str, Any], key: Any) -> None:
    """``table`` sorted in place by ``key`` of each name, ties in their insertion order (sorted is stable)."""
    items = sorted(table.items(), key=lambda item: key(item[0]))
    table.clear()
    table.update(items)


def known_profile(name: str) -> bool:
    """Whether profile ``name`` is registered, importing its builtin family first where it is one."""
    if name not in _PROFILES and name in _BUILTIN:
        _load(_BUILTIN[name])
    return name in _PROFILES


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
    if profile.name in _PROFILES or profile.name in _BUILTIN:
        raise ConfigError(f"profile {profile.name!r} is already registered")
    _PROFILES[profile.name] = profile
    return profile


def register_tokenizer(spec: TokenizerSpec) -> TokenizerSpec:
    """Make a builtin tokenizer known by its name (``--tokenizer``, ``load_tokenizer``)."""
    _load_all()  # a builtin family's tokenizer of the same name, not imported yet, would be shadowed
    if spec.name in _TOKENIZERS:
        raise ConfigError(f"builtin tokenizer {spec.name!r} is already registered")
    _TOKENIZERS[spec.name] = spec
    return spec


def profile_names() -> tuple[str, ...]:
    """Registered profile names, in registration order (the builtins first, in ``FAMILIES`` order)."""
    _load_all()
    return tuple(_PROFILES)


def get_profile(name: str, **overrides: Any) -> ModelProfile:
    """The named profile, with ``overrides`` (e.g. min_pixels/max_pixels) applied; None values are ignored.
    Imports the profile's own family only, unless an error must name the others."""
    if not known_profile(name):
        _load_all()
        raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(_PROFILES)}")
    profile = _PROFILES[name]
    changes = {k: v for k, v in overrides.items() if v is not None}
    if set(changes) <= set(profile.overridable):  # its own settings: nothing below can fail
        return dataclasses.replace(profile, **changes) if changes else profile
    _load_all()
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
    _load_all()
    return tuple(dict.fromkeys(k for p in _PROFILES.values() for k in p.forward_keys))


def profiles_with(what: str) -> tuple[str, ...]:
    """Names of the profiles that take ``what`` ("image", "video", "audio" or "audio_in_video": a video's sound
    track), for error messages."""
    def takes(p: ModelProfile) -> bool:
        if what == "audio_in_video":
            return p.audio is not None and p.video is not None and p.audio.in_video
        return getattr(p, what) is not None

    _load_all()
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
    """Names of the builtin tokenizers, in registration order (the families' first, in ``FAMILIES`` order, then
    what was registered by hand), importing no family: their names are ``packer.models.FAMILY_TOKENIZERS``' (a
    family's own ``TOKENIZERS`` must agree, ``_register_builtin``), and one registered by hand has imported them
    all already (``register_tokenizer``)."""
    return tuple(dict.fromkeys([*_BUILTIN_TOKENIZERS, *_TOKENIZERS]))


def known_tokenizer(name: str) -> bool:
    """Whether builtin tokenizer ``name`` is registered, importing its own family first where it is a builtin."""
    if name not in _TOKENIZERS and name in _BUILTIN_TOKENIZERS:
        _load(_BUILTIN_TOKENIZERS[name])
    return name in _TOKENIZERS


def tokenizer_spec(name: str) -> TokenizerSpec:
    """The builtin tokenizer ``name``'s spec: its family alone imported, unless the error must name them all."""
    if not known_tokenizer(name):
        _load_all()
        raise ConfigError(f"unknown builtin tokenizer {name!r}; builtins: {', '.join(_TOKENIZERS)}")
    return _TOKENIZERS[name]


def fast_renderer(template: str | None) -> Any:
    """The pure-Python renderer a builtin registers for exactly this chat template source, or None."""
    _load_all()
    for spec in _TOKENIZERS.values():
        if spec.fast_renderer is not None and spec.chat_template == template:
            return spec.fast_renderer
    return None
