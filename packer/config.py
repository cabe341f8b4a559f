"""The build configuration: one frozen dataclass, fed by YAML (configs/*.yaml) and overridden by the CLI."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer.encode import LONG_DOCS_POLICIES, OVERLONG_POLICIES
from packer.errors import ConfigError
from packer.models import get_profile, profile_names
from packer.models.registry import known_profile
from packer.packing import ALGORITHMS

if TYPE_CHECKING:  # the encoder's modules load where an Encoder is made (make_encoder), not with every config
    from packer.encode.encoder import Encoder

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


def option(default: Any = dataclasses.MISSING, *, help: str, **cli: Any) -> Any:
    """A ``BuildConfig`` field that ``packer build`` also takes as ``--field-name`` (cli.py's ``config_options``
    makes the option from the field): ``help`` is its --help line, the field's default appended to it there.
    The field's type gives the option's (int, float, str; a bool is a ``--x/--no-x`` flag); ``cli`` says what
    the type cannot: ``choices`` (a tuple, also checked by ``__post_init__``, or a function giving the
    names), ``metavar``, ``path="dir"`` (a directory), ``flags`` (the option's names, e.g. ``("-o",
    "--output")``), ``default_help`` (words for a default of None), ``multiple`` with ``parse`` (the values given
    -> the field's value). A plain field (no ``help``) is config-only."""
    return dataclasses.field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """One named input source of a (possibly mixed) build."""

    name: str
    """Name shown in stats and stored per example (`example_sources`)."""
    paths: tuple[str, ...]
    """JSONL files or glob patterns."""
    weight: float = 1.0
    """Sampling factor: 2.0 repeats every example twice, 0.5 keeps a seeded half, 1.5 all + a seeded half."""
    dataset: dict[str, Any] | None = None
    """A LLaMA-Factory dataset's spec (``formats.llamafactory.dataset_spec``: formatting, ranking, every column and
    tag): its records are read with that mapping. Set from ``dataset_info`` + ``datasets``; None: packer's kinds."""
    image_root: str | None = None
    """Where this source's relative media paths resolve (a dataset_info.json's directory, as LLaMA-Factory's
    ``media_dir``); the build's ``image_root`` wins; None: each input file's directory."""

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
    output: str = option(help="Output directory for shards, or an object-store URL (s3://bucket/prefix).",
                         flags=("-o", "--output"), path="dir")
    """Output directory for shards, manifest, stats and rejects; or an object-store URL (``s3://bucket/prefix``,
    the ``s3`` extra), where the encode cache lives too."""
    profile: str = option("qwen2-vl", help="Model family profile.", choices=profile_names)
    """Model family profile (``packer.models.profile_names()``): qwen2-vl, qwen2.5-vl, llava, text, ..."""
    tokenizer: str | None = option(None, help="HF tokenizer name or directory.",
                                   default_help="the profile's, offline qwen2-vl")
    """HF tokenizer name or path; None means the profile's ``default_tokenizer``."""
    chat_template: str | None = option(None, help="Jinja chat template (string or file) instead of the tokenizer's.")
    """A Jinja chat template (string or path to a file) to use instead of the tokenizer's own."""
    max_length: int = option(4096, help="Pack capacity in tokens.")
    """Pack capacity in tokens (and the longest example allowed)."""
    keep_up_to: int | None = option(None, default_help="--max-length",
                                    help="Keep encoded examples of up to this many tokens in the encode cache "
                                         "(--overlong drop, --long-docs off), so that `packer repack` may raise "
                                         "--max-length up to it without re-tokenizing.")
    """The longest example the encode cache keeps (``--overlong drop`` with ``--long-docs off``: there
    ``max_length`` only filters, and the examples between it and this ceiling are rejected when planned), so a
    repack (``packer repack``) or a rebuild may raise ``max_length`` up to it; None: ``max_length``."""
    max_vision_tokens: int | None = option(None, help="Vision-token budget per pack.")
    """Optional vision-token budget per pack."""
    max_images: int | None = option(None, help="Image budget per pack.")
    """Optional image-count budget per pack."""
    max_videos: int | None = option(None, help="Video budget per pack.")
    """Optional video-count budget per pack (each clip or frame list counts one)."""
    max_audio_tokens: int | None = option(None, help="Audio-token budget per pack (the audio encoder's work).")
    """Optional audio-token budget per pack (the audio encoder's work, apart from the vision tower's)."""
    max_audios: int | None = option(None, help="Audio-clip budget per pack (a video's sound track counts one).")
    """Optional audio-clip budget per pack (each clip, a video's sound track included, counts one)."""
    max_examples_per_pack: int | None = option(None, help="Cap on examples per pack.")
    """Optional cap on examples per pack."""
    algorithm: str = option("bfd", help="Planner.", choices=ALGORITHMS)
    """Planner: bfd (default), ffd, next-fit, binpacking."""
    balance_vision: bool = option(False, help="Spread vision tokens evenly over packs.")
    """Spread vision tokens evenly across packs (same pack count, lower vision-load spread)."""
    refine: bool = option(True, help="Also try BFD with exact pack completion; keep the plan with fewer packs.")
    """Also try BFD with exact pack completion and keep the plan with fewer packs (a few times the planner's
    time, never more packs; measured in docs/benchmarks.md, "Planner")."""
    overlong: str = option("drop", choices=OVERLONG_POLICIES,
                           help="Over-long examples: reject (drop), keep the head (truncate), keep the end "
                                "(truncate_left: a text's last tokens, a chat's last turns) or drop early turns "
                                "(keep_last_turns).")
    """What to do with an example longer than max_length: drop (reject), truncate (keep the head),
    truncate_left (keep the end: a text's last tokens, a conversation's last turns) or keep_last_turns
    (drop whole early turns; a text keeps its head). See ``packer.encode.OVERLONG_POLICIES``."""
    long_docs: str = option("off", choices=LONG_DOCS_POLICIES,
                            help="Text records over --max-length: follow --overlong (off) or split them into chunks.")
    """``text`` records longer than max_length: off (follow ``overlong``) or split (into chunks, each an
    example ``path:line@k``; no token lost)."""
    long_docs_overlap: int = option(0, help="Tokens each chunk repeats from the previous one as context.")
    """With ``long_docs: split``, tokens each chunk repeats from the previous one as context (no loss)."""
    image_root: str | None = option(None, help="Resolve relative image paths here instead.", path="dir")
    """Resolve relative image paths against this directory instead of each JSONL file's directory."""
    use_audio_in_video: bool = option(False, help="Each clip video also brings its sound track (qwen-omni-utils' "
                                      "use_audio_in_video); a record's own use_audio_in_video wins.")
    """Every clip video also brings its own sound track (qwen-omni-utils' ``use_audio_in_video``), for a profile
    that lays the two out together; a record's own ``use_audio_in_video`` wins."""
    columns: dict[str, str] | None = option(None, metavar="FIELD=COLUMN,...",  # the string parse_columns reads
                                            help="Map input columns onto packer's fields, e.g. "
                                                 "messages=conversations,images=image.")
    """Packer field -> the input's column (or key) holding it, e.g. ``{"messages": "conversations",
    "images": "image"}``; YAML takes a mapping, the CLI ``messages=conversations,images=image``."""
    image_token: str | None = option(None, help="The tokenizer's image placeholder token, e.g. '<image>' for "
                                                 "LLaVA tokenizers.")
    """The tokenizer's image placeholder token, if not the profile's (e.g. `<image>` for a LLaVA tokenizer)."""
    min_pixels: int | None = option(None, help="Override the profile's min_pixels.")
    """Override the profile's min_pixels (Qwen2-VL smart resize)."""
    max_pixels: int | None = option(None, help="Override the profile's max_pixels.")
    """Override the profile's max_pixels (Qwen2-VL smart resize)."""
    profile_options: dict[str, Any] | None = option(
        None, flags=("--profile-option",), metavar="KEY=VALUE", multiple=True, parse=parse_profile_options,
        help="Set one of the profile's settings, e.g. max_tiles=6 (internvl), do_pan_and_scan=true (gemma3); "
             "repeatable. The value is read as a bool, int, float or string.")
    """Family settings beyond the ones above, by the profile's names (its ``overridable``), e.g. InternVL's
    ``{"max_tiles": 6}`` or Gemma 3's ``{"do_pan_and_scan": true}``; YAML takes a mapping, the CLI
    ``--profile-option KEY=VALUE`` (repeatable). Stored in the manifest, so the reader rebuilds the profile."""
    processor_config: str | None = option(
        None, metavar="DIR_OR_JSON",
        help="A checkpoint directory (or its preprocessor_config.json / video_preprocessor_config.json / "
             "processor_config.json) the build's counts must agree with; refused where the profile would count "
             "otherwise. A --tokenizer directory is checked the same way.")
    """A checkpoint directory, or one of its processor files (preprocessor_config.json,
    video_preprocessor_config.json, processor_config.json), the build's counts must agree with: refused where the
    profile would count otherwise, naming the option that follows the file (``packer/models/checkpoint.py``). A
    ``tokenizer`` that is a directory is checked the same way."""
    seed: int = option(0, help="Seed of the pack shuffle and of source sampling.")
    """Seed of the pack shuffle and of source down-sampling."""
    num_proc: int = option(1, help="Processes for the encode and write tasks (the local executor).")
    """Processes for the encode and write tasks (the local executor; LocalExecutor runs both in its pool)."""
    executor: str = option("local", choices=EXECUTORS,
                           help="Run the encode and write tasks on this machine or on a Ray cluster (pip install "
                                "'packer[ray]'); the bytes are the same.")
    """What runs the encode and write tasks (``EXECUTORS``): local (this machine, ``num_proc`` processes) or
    ray (a Ray cluster: ``pip install packer[ray]``). Never changes the output bytes."""
    ray_address: str | None = option(None, metavar="ADDR", default_help="RAY_ADDRESS, else Ray on this machine",
                                     help="The Ray cluster to join with --executor ray.")
    """With ``executor: ray``, the cluster to join (``ray.init(address=...)``); None: ``RAY_ADDRESS`` or a
    Ray started on this machine for the build."""
    rows_per_shard: int = option(2048, help="Packs per Parquet file.")
    """Packs per Parquet file."""
    rows_per_row_group: int = option(64, help="Packs per Parquet row group.")
    """Packs per Parquet row group (the unit a reader decodes at once)."""
    strict: bool = option(False, help="Stop at the first bad record (exit 2).")
    """Stop at the first bad record (exit 2) instead of rejecting it."""
    max_reject_fraction: float = option(1.0, help="Fail (exit 3) above this rejected fraction.")
    """Fail the build (exit 3) when more than this fraction of input records is rejected."""
    overwrite: bool = option(False, help="Replace an output directory holding another build.")
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
        if not known_profile(self.profile):  # its family only; a name that is none lists them all
            raise ConfigError(f"unknown profile {self.profile!r}; known profiles: {', '.join(profile_names())}")
        for f in dataclasses.fields(self):  # algorithm, overlong, long_docs, executor: their option's choices
            choices, value = f.metadata.get("choices"), getattr(self, f.name)
            if isinstance(choices, tuple) and value not in choices:
                raise ConfigError(f"'{f.name}' must be one of {', '.join(choices)}, got {value!r}")
        if self.keep_up_to is not None and self.keep_up_to < self.max_length:
            raise ConfigError(f"'keep_up_to' must be >= max_length {self.max_length}, got {self.keep_up_to}")
        if self.keep_up_to is not None and not (self.overlong == "drop" and self.long_docs == "off"):
            raise ConfigError("'keep_up_to' keeps examples longer than max_length only with overlong: drop and "
                              "long_docs: off (truncating or splitting makes max_length part of the encoded rows)")
        if not 0 <= self.long_docs_overlap < self.max_length:
            raise ConfigError(f"'long_docs_overlap' must be in [0, max_length {self.max_length}), "
                              f"got {self.long_docs_overlap}")
        if self.num_proc < 1:
            raise ConfigError(f"'num_proc' must be >= 1, got {self.num_proc}")
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
        if self.columns and all(s.dataset is not None for s in self.sources):
            raise ConfigError("'columns' maps packer's own inputs; a dataset_info.json dataset is read with its "
                              "entry's own 'columns' and 'tags': set them there")
        names = [s.name for s in self.sources]
        if any(s.dataset is not None for s in self.sources) and len(set(names)) != len(names):
            raise ConfigError(f"source names must differ when a dataset_info.json dataset is one of them, got {names}")

    @classmethod
    def from_inputs(cls, inputs: list[str] | tuple[str, ...], output: str, **options: Any) -> BuildConfig:
        """A single-source config from a list of JSONL paths/globs."""
        return cls(sources=(SourceConfig(name="", paths=tuple(inputs)),), output=output, **options)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> BuildConfig:
        """Build from a YAML/JSON mapping; ``overrides`` (CLI options that were given) win.

        Besides the fields: ``inputs`` (files or globs: one source named ''), and ``dataset_info`` (a
        LLaMA-Factory dataset_info.json) with ``datasets`` (names in it, each ``NAME[=PATH][@WEIGHT]`` or
        ``{name, path, weight}``), each dataset one more source (``dataset_sources``).
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(data.get("profile_options"), dict) and isinstance(given.get("profile_options"), dict):
            given["profile_options"] = {**data["profile_options"], **given["profile_options"]}  # per key
        data = {**data, **given}
        if isinstance(data.get("columns"), str):
            data["columns"] = parse_columns(data["columns"])
        known = {f.name for f in dataclasses.fields(cls)} | {"inputs", "dataset_info", "datasets"}
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
        info, datasets = data.pop("dataset_info", None), data.pop("datasets", None)
        if inputs and sources:
            raise ConfigError("give either 'inputs' or 'sources', not both")
        if inputs:
            sources = [{"name": "", "paths": [inputs] if isinstance(inputs, str) else inputs}]
        if info or datasets:
            sources = list(sources or []) + dataset_sources(info, datasets)
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
                    dataset=s.get("dataset"),
                    image_root=s.get("image_root"),
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
        for key in ("profile_options", "processor_config", "keep_up_to"):
            if d[key] is None:  # unset: the manifest and fingerprint of a build stay as before it existed
                del d[key]
        d["sources"] = [{**{k: v for k, v in s.items() if v is not None or k not in ("dataset", "image_root")},
                         "paths": list(s["paths"])} for s in d["sources"]]  # unset: manifests stay as before
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

    def record_options(self, source_name: str) -> dict[str, Any]:
        """How the records of source ``source_name`` parse: ``formats.parse_record``'s keywords."""
        source = next((s for s in self.sources if s.name == source_name), None)
        own = source.image_root if source is not None else None
        return {"image_root": self.image_root if self.image_root is not None else own, "columns": self.column_map,
                "audio_in_video": self.use_audio_in_video, "dataset": source.dataset if source is not None else None}

    @property
    def column_map(self) -> dict[str, str]:
        """``columns``, or {} when unset."""
        return dict(self.columns or {})

    def replace(self, **changes: Any) -> BuildConfig:
        return dataclasses.replace(self, **changes)


def dataset_sources(info: Any, datasets: Any) -> list[dict[str, Any]]:
    """``dataset_info`` (a LLaMA-Factory dataset_info.json) + ``datasets`` -> one source mapping per dataset.

    Each dataset is ``NAME``, ``NAME@WEIGHT``, ``NAME=PATH[@WEIGHT]`` or ``{name, path, weight}``. Its files are
    the entry's ``file_name`` (a file, glob or folder) relative to the JSON's directory, as LLaMA-Factory's
    ``dataset_dir``; ``PATH`` (a file, glob, folder or local Hub snapshot) replaces it, the one way to read a Hub
    or script entry (``hf_hub_url``, ``ms_hub_url``, ``om_hub_url``, ``script_url``) offline. Media paths resolve
    against the JSON's directory (LLaMA-Factory's ``media_dir`` default).
    """
    import json
    import os

    from packer.formats.llamafactory import HUB_KEYS, dataset_spec

    if not isinstance(info, str) or not info:
        raise ConfigError("'datasets' needs 'dataset_info': the path of a LLaMA-Factory dataset_info.json")
    if isinstance(datasets, str):
        datasets = [datasets]
    if not isinstance(datasets, (list, tuple)) or not datasets:
        raise ConfigError(f"'dataset_info' {info} needs 'datasets': the names of the datasets to pack (--dataset NAME)")
    try:
        with open(info, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read dataset_info {info}: {e}") from e
    if not isinstance(entries, dict):
        raise ConfigError(f"dataset_info {info} must be a JSON object of name: entry")
    base = os.path.dirname(info)
    out: list[dict[str, Any]] = []
    for item in datasets:
        if isinstance(item, dict):
            name, path, weight = item.get("name"), item.get("path"), item.get("weight", 1.0)
        elif isinstance(item, str):
            rest, at, w = item.rpartition("@") if "@" in item else (item, "", "1")
            name, _, path = rest.partition("=")
            try:
                weight = float(w)
            except ValueError:
                raise ConfigError(f"dataset {item!r}: weight {w!r} is not a number") from None
        else:
            raise ConfigError(f"each of 'datasets' is NAME[=PATH][@WEIGHT] or a mapping, got {item!r}")
        if not isinstance(name, str) or name not in entries:
            known = ", ".join(sorted(map(str, entries))[:12])
            raise ConfigError(f"dataset {name!r} is not in {info} (it has {len(entries)}: {known}, ...)")
        if any(o["name"] == name for o in out):
            raise ConfigError(f"dataset {name!r} is named twice; give it once with a weight (--dataset {name}@2)")
        entry = entries[name]
        where = f"{info} {name!r}"
        spec = dataset_spec(name, entry, where)
        hub = next((k for k in HUB_KEYS if k in entry), None)
        if path:
            paths = [path]
        elif hub is not None:
            raise ConfigError(
                f"{where} is a {hub} entry ({entry[hub]!r}); packer works offline: download it (e.g. "
                f"`huggingface-cli download --repo-type dataset {entry[hub]} --local-dir DIR`) and point the name "
                f"at the copy: --dataset {name}=DIR (YAML: {{name: {name}, path: DIR}})")
        elif isinstance(entry.get("file_name"), str) and entry["file_name"]:
            local = os.path.join(base, entry["file_name"])
            paths = [os.path.join(local, "*") if os.path.isdir(local) and not _is_dataset_dir(local) else local]
        else:
            raise ConfigError(f"{where} has no file_name (and no Hub URL); give it a file: --dataset {name}=PATH")
        if len(paths) == 1 and os.path.isdir(paths[0]) and _is_dataset_dir(paths[0]):
            paths = _snapshot_files(paths[0], entry, where, name, hub=hub is not None)
        out.append({"name": name, "paths": paths, "weight": weight, "dataset": spec,
                    "image_root": os.path.abspath(base)})
    return out


def _snapshot_files(path: str, entry: dict[str, Any], where: str, name: str, *, hub: bool) -> list[str]:
    """A dataset directory's files as LLaMA-Factory's ``load_dataset`` call reads them: the entry's ``subset``
    (a config name) and ``split`` (default: the directory's train split); a Hub entry's ``folder`` (its
    ``data_dir``) is refused (name its files) rather than read past."""
    from packer.formats.tables import dataset_files

    if hub and entry.get("folder") is not None:
        raise ConfigError(f"{where} sets folder {entry['folder']!r} (a data_dir inside the Hub repo): point the "
                          f"dataset at that folder's files, --dataset {name}=PATH/{entry['folder']}/*.parquet")
    subset, split = entry.get("subset"), entry.get("split")
    if subset is None and split is None:
        return [path]  # the build reads it as any dataset directory
    try:
        return dataset_files(path, config=subset, split=split)
    except ConfigError as e:
        raise ConfigError(f"{where} (subset {subset!r}, split {split!r}): {e}") from None


def _is_dataset_dir(path: str) -> bool:
    from packer.formats.tables import is_dataset_dir

    return is_dataset_dir(path)


def make_encoder(config: BuildConfig, *, fast: bool | Iterable[str] = True, tokenizer: Any = None,
                 max_length: int | None = None) -> Encoder:
    """The Encoder of ``config`` (profile, tokenizer, chat template, length policy): the one a build, online
    packing and ``verify``'s tokenizer check all use. Loading the tokenizer is the expensive part, so a build
    makes one and its executor ships it to the workers. ``fast``: ``Encoder``'s (False: the general path);
    ``tokenizer``: the one ``config`` names, loaded already; ``max_length``: the encoder's instead of
    ``config.max_length`` (a build whose encode cache keeps more: ``keep_up_to``)."""
    from packer.encode.encoder import Encoder
    from packer.encode.tokenizers import load_tokenizer

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer_name())
    return Encoder(tokenizer, get_profile(config.profile, **config.profile_overrides()),
                   max_length=max_length or config.max_length, overlong=config.overlong, long_docs=config.long_docs,
                   long_docs_overlap=config.long_docs_overlap, chat_template=chat_template_source(config), fast=fast)


def chat_template_source(config: BuildConfig) -> str | None:
    """``chat_template``: a file's contents, else the template itself; None: the tokenizer's (the Encoder's)."""
    template = config.chat_template
    if template and Path(template).is_file():
        template = Path(template).read_text()
    return template


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
