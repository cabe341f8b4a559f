"""The build configuration: one frozen dataclass, fed by YAML (configs/*.yaml) and overridden by the CLI."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.encode import LONG_DOCS_POLICIES, OVERLONG_POLICIES
from packer.errors import ConfigError
from packer.models import get_profile, profile_names
from packer.packing import ALGORITHMS

EXECUTORS = ("local", "ray")  # packer/pipeline/build.py's make_executor runs each


def _type_ok(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arm) for arm in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, tuple)
    if origin is dict:
        return isinstance(value, dict)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _check_types(config: Any) -> None:
    """ConfigError naming the key when a YAML/CLI value has the wrong type (a string max_length, say)."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not _type_ok(value, hints[f.name]):
            expected = str(hints[f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            raise ConfigError(f"'{f.name}' must be {expected}, got {value!r} ({type(value).__name__})")


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """One named input source of a (possibly mixed) build."""

    name: str
    """Name shown in stats and stored per example (`example_sources`)."""
    paths: tuple[str, ...]
    """JSONL files or glob patterns."""
    weight: float = 1.0
    """Sampling factor: 2.0 repeats every example twice, 0.5 keeps a seeded half, 1.5 all + a seeded half."""

    def __post_init__(self) -> None:
        _check_types(self)
        if not self.paths:
            raise ConfigError(f"source {self.name!r}: 'paths' must list at least one file or glob")
        if not self.weight > 0:
            raise ConfigError(f"source {self.name!r}: 'weight' must be > 0, got {self.weight}")


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything that determines a build's output. Same config + same input = byte-identical shards."""

    sources: tuple[SourceConfig, ...]
    """The inputs; a plain `packer build a.jsonl b.jsonl` is one source named ''."""
    output: str
    """Output directory for shards, manifest, stats and rejects; or an object-store URL (``s3://bucket/prefix``,
    the ``s3`` extra), where the encode cache lives too."""
    profile: str = "qwen2-vl"
    """Model family profile (``packer.models.profile_names()``): qwen2-vl, qwen2.5-vl, llava, text, ..."""
    tokenizer: str | None = None
    """HF tokenizer name or path; None means the profile's ``default_tokenizer``."""
    chat_template: str | None = None
    """A Jinja chat template (string or path to a file) to use instead of the tokenizer's own."""
    max_length: int = 4096
    """Pack capacity in tokens (and the longest example allowed)."""
    max_vision_tokens: int | None = None
    """Optional vision-token budget per pack."""
    max_images: int | None = None
    """Optional image-count budget per pack."""
    max_videos: int | None = None
    """Optional video-count budget per pack (each clip or frame list counts one)."""
    max_audio_tokens: int | None = None
    """Optional audio-token budget per pack (the audio encoder's work, apart from the vision tower's)."""
    max_audios: int | None = None
    """Optional audio-clip budget per pack (each clip, a video's sound track included, counts one)."""
    max_examples_per_pack: int | None = None
    """Optional cap on examples per pack."""
    algorithm: str = "bfd"
    """Planner: bfd (default), ffd, next-fit, binpacking."""
    balance_vision: bool = False
    """Spread vision tokens evenly across packs (same pack count, lower vision-load spread)."""
    refine: bool = True
    """Also try BFD with exact pack completion and keep the plan with fewer packs (a few times the planner's
    time, never more packs; measured in docs/benchmarks.md, "Planner")."""
    overlong: str = "drop"
    """What to do with an example longer than max_length: drop (reject), truncate (keep the head),
    truncate_left (keep the end: a text's last tokens, a conversation's last turns) or keep_last_turns
    (drop whole early turns; a text keeps its head). See ``packer.encode.OVERLONG_POLICIES``."""
    long_docs: str = "off"
    """``text`` records longer than max_length: off (follow ``overlong``) or split (into chunks, each an
    example ``path:line@k``; no token lost)."""
    long_docs_overlap: int = 0
    """With ``long_docs: split``, tokens each chunk repeats from the previous one as context (no loss)."""
    image_root: str | None = None
    """Resolve relative image paths against this directory instead of each JSONL file's directory."""
    use_audio_in_video: bool = False
    """Every clip video also brings its own sound track (qwen-omni-utils' ``use_audio_in_video``), for a profile
    that lays the two out together; a record's own ``use_audio_in_video`` wins."""
    columns: dict[str, str] | None = None
    """Packer field -> the input's column (or key) holding it, e.g. ``{"messages": "conversations",
    "images": "image"}``; YAML takes a mapping, the CLI ``messages=conversations,images=image``."""
    image_token: str | None = None
    """The tokenizer's image placeholder token, if not the profile's (e.g. `<image>` for a LLaVA tokenizer)."""
    min_pixels: int | None = None
    """Override the profile's min_pixels (Qwen2-VL smart resize)."""
    max_pixels: int | None = None
    """Override the profile's max_pixels (Qwen2-VL smart resize)."""
    profile_options: dict[str, Any] | None = None
    """Family settings beyond the ones above, by the profile's names (its ``overridable``), e.g. InternVL's
    ``{"max_tiles": 6}`` or Gemma 3's ``{"do_pan_and_scan": true}``; YAML takes a mapping, the CLI
    ``--profile-option KEY=VALUE`` (repeatable). Stored in the manifest, so the reader rebuilds the profile."""
    processor_config: str | None = None
    """A checkpoint directory, or one of its processor files (preprocessor_config.json,
    video_preprocessor_config.json, processor_config.json), the build's counts must agree with: refused where the
    profile would count otherwise, naming the option that follows the file (``packer/models/checkpoint.py``). A
    ``tokenizer`` that is a directory is checked the same way."""
    seed: int = 0
    """Seed of the pack shuffle and of source down-sampling."""
    num_proc: int = 1
    """Processes for encoding (the local executor)."""
    executor: str = "local"
    """What runs the encode and write tasks (``EXECUTORS``): local (this machine, ``num_proc`` processes) or
    ray (a Ray cluster: ``pip install packer[ray]``). Never changes the output bytes."""
    ray_address: str | None = None
    """With ``executor: ray``, the cluster to join (``ray.init(address=...)``); None: ``RAY_ADDRESS`` or a
    Ray started on this machine for the build."""
    rows_per_shard: int = 2048
    """Packs per Parquet file."""
    rows_per_row_group: int = 64
    """Packs per Parquet row group (the unit a reader decodes at once)."""
    strict: bool = False
    """Stop at the first bad record (exit 2) instead of rejecting it."""
    max_reject_fraction: float = 1.0
    """Fail the build (exit 3) when more than this fraction of input records is rejected."""
    overwrite: bool = False
    """Replace an output directory that holds a different build."""
    storage_options: dict[str, Any] | None = None
    """fsspec options for an object-store ``output`` (e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}``
    for s3fs); unset: the standard AWS environment and config. Never stored in the manifest (it may hold
    credentials) and no part of the build's identity."""

    def __post_init__(self) -> None:
        _check_types(self)
        if not self.sources:
            raise ConfigError("no input: give at least one JSONL file or a `sources:` list")
        if self.max_length < 1:
            raise ConfigError(f"'max_length' must be a positive integer, got {self.max_length}")
        for name in ("max_vision_tokens", "max_images", "max_videos", "max_audio_tokens", "max_audios",
                     "max_examples_per_pack", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"'{name}' must be a positive integer or unset, got {value}")
        if self.profile not in profile_names():
            raise ConfigError(f"unknown profile {self.profile!r}; known profiles: {', '.join(profile_names())}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"'algorithm' must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.overlong not in OVERLONG_POLICIES:
            raise ConfigError(f"'overlong' must be one of {', '.join(OVERLONG_POLICIES)}, got {self.overlong!r}")
        if self.long_docs not in LONG_DOCS_POLICIES:
            raise ConfigError(f"'long_docs' must be one of {', '.join(LONG_DOCS_POLICIES)}, got {self.long_docs!r}")
        if not 0 <= self.long_docs_overlap < self.max_length:
            raise ConfigError(f"'long_docs_overlap' must be in [0, max_length {self.max_length}), "
                              f"got {self.long_docs_overlap}")
        if self.num_proc < 1:
            raise ConfigError(f"'num_proc' must be >= 1, got {self.num_proc}")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"'executor' must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise ConfigError(f"'ray_address' is for executor: ray, got executor {self.executor!r}")
        if self.rows_per_shard < 1 or self.rows_per_row_group < 1:
            raise ConfigError("'rows_per_shard' and 'rows_per_row_group' must be >= 1")
        if self.columns is not None:
            bad = {k: v for k, v in self.columns.items() if not (isinstance(k, str) and isinstance(v, str) and k and v)}
            if bad:
                raise ConfigError(f"'columns' maps packer fields to column names (strings), got {bad}")
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ConfigError(f"'max_reject_fraction' must be in [0, 1], got {self.max_reject_fraction}")
        if self.profile_options is not None:
            _check_profile_options(self)
        checkpoints = [p for p in (self.processor_config,) if p is not None]
        if self.processor_config is not None and not Path(self.processor_config).exists():
            raise ConfigError(f"'processor_config': {self.processor_config} does not exist")
        if self.tokenizer is not None and Path(self.tokenizer).is_dir():
            checkpoints.append(self.tokenizer)
        for where in checkpoints:  # a checkpoint's own processor files win over the profile's defaults
            from packer.models.checkpoint import check_processor_files

            overrides = {k for k, v in self.profile_overrides().items() if v is not None}
            check_processor_files(get_profile(self.profile, **self.profile_overrides()), where, explicit=overrides)

    @classmethod
    def from_inputs(cls, inputs: list[str] | tuple[str, ...], output: str, **options: Any) -> BuildConfig:
        """A single-source config from a list of JSONL paths/globs."""
        return cls(sources=(SourceConfig(name="", paths=tuple(inputs)),), output=output, **options)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> BuildConfig:
        """Build from a YAML/JSON mapping; ``overrides`` (CLI options that were given) win."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(data.get("profile_options"), dict) and isinstance(given.get("profile_options"), dict):
            given["profile_options"] = {**data["profile_options"], **given["profile_options"]}  # per key
        data = {**data, **given}
        if isinstance(data.get("columns"), str):
            data["columns"] = parse_columns(data["columns"])
        known = {f.name for f in dataclasses.fields(cls)} | {"inputs"}
        unknown = sorted(set(data) - known)
        if unknown:
            import difflib

            hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            did_you_mean = "".join(f" ('{k}': did you mean '{m[0]}'?)" for k, m in hints.items() if m)
            raise ConfigError(
                f"unknown config keys {unknown}{did_you_mean}; known keys: {', '.join(sorted(known))}"
            )
        inputs = data.pop("inputs", None)
        sources = data.pop("sources", None)
        if inputs and sources:
            raise ConfigError("give either 'inputs' or 'sources', not both")
        if inputs:
            sources = [{"name": "", "paths": [inputs] if isinstance(inputs, str) else inputs}]
        parsed = []
        for s in sources or []:
            if not isinstance(s, dict) or "paths" not in s:
                raise ConfigError(f"each source needs 'name' and 'paths', got {s!r}")
            paths = s["paths"]
            parsed.append(
                SourceConfig(
                    name=str(s["name"]) if "name" in s else Path(str(paths if isinstance(paths, str) else paths[0])).stem,
                    paths=tuple([paths] if isinstance(paths, str) else paths),
                    weight=float(s.get("weight", 1.0)),
                )
            )
        if "output" not in data:
            raise ConfigError("no output directory: pass --output DIR or set 'output' in the config")
        return cls(sources=tuple(parsed), **data)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> BuildConfig:
        """Load a YAML config file (paths in it are relative to the working directory, as on the command line)."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping of option: value")
        return cls.from_dict(data, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """The effective config, JSON-serialisable (stored in the manifest), less ``storage_options``."""
        d = dataclasses.asdict(self)
        del d["storage_options"]
        for key in ("profile_options", "processor_config"):
            if d[key] is None:  # unset: the manifest and fingerprint of a build stay as before it existed
                del d[key]
        d["sources"] = [{**s, "paths": list(s["paths"])} for s in d["sources"]]
        return d

    def tokenizer_name(self) -> str:
        """``tokenizer``, else the profile's ``default_tokenizer``; a ConfigError where neither is set (a family
        with no honest default, LLaVA-1.5's Vicuna, must be told which tokenizer its model uses)."""
        name = self.tokenizer or get_profile(self.profile).default_tokenizer
        if name is None:
            raise ConfigError(
                f"profile {self.profile!r} has no default tokenizer: set `tokenizer:` in the config (or "
                "--tokenizer) to the model's own tokenizer (a local HF directory), or a builtin stand-in "
                "such as qwen2-vl"
            )
        return name

    def profile_overrides(self) -> dict[str, Any]:
        """The profile settings this config overrides (for ``packer.models.get_profile``)."""
        return profile_overrides(self.to_dict())

    @property
    def column_map(self) -> dict[str, str]:
        """``columns``, or {} when unset."""
        return dict(self.columns or {})

    def replace(self, **changes: Any) -> BuildConfig:
        return dataclasses.replace(self, **changes)


def parse_columns(text: str) -> dict[str, str]:
    """``"messages=conversations,images=image"`` -> ``{"messages": "conversations", "images": "image"}``."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        field, sep, column = item.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise ConfigError(f"'columns': {item!r} is not FIELD=COLUMN (e.g. messages=conversations,images=image)")
        out[field.strip()] = column.strip()
    return out


def parse_profile_options(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["max_tiles=6", "do_pan_and_scan=true"]`` -> ``{"max_tiles": 6, "do_pan_and_scan": True}``: each value
    read as a bool (true/false), an int, a float, else kept as the string (as YAML would read it)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"'profile_options': {item!r} is not KEY=VALUE (e.g. max_tiles=6)")
        out[key.strip()] = _scalar(text.strip())
    return out


def _scalar(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _check_profile_options(config: BuildConfig) -> None:
    """ConfigError unless every key of ``profile_options`` is a setting the profile lets a build change, with
    a value of that setting's type, and is not also given as its own config key."""
    profile = get_profile(config.profile)
    options = config.profile_options or {}
    unknown = sorted(k for k in options if not isinstance(k, str) or k not in profile.overridable)
    if unknown:
        raise ConfigError(f"'profile_options': profile {config.profile!r} has no setting {unknown}; it takes "
                          f"{', '.join(profile.overridable)}")
    hints = typing.get_type_hints(type(profile))
    for key, value in options.items():
        if not _type_ok(value, hints[key]):
            expected = str(hints[key]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            raise ConfigError(f"'profile_options': {key!r} of profile {config.profile!r} must be {expected}, "
                              f"got {value!r}")
        if key in _OWN_KEYS and getattr(config, key) is not None:
            raise ConfigError(f"'{key}' is set both as its own key and in 'profile_options'; set it once")
    get_profile(config.profile, **config.profile_overrides())  # the family's own checks (Gemma 3's sizes)


_OWN_KEYS = ("min_pixels", "max_pixels", "image_token")  # profile settings with a config key of their own


def profile_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """Vision-profile overrides from a config mapping (a manifest's stored config too)."""
    return {**{k: config.get(k) for k in _OWN_KEYS}, **(config.get("profile_options") or {})}
