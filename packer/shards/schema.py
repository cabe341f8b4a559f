"""The shard contract (docs/format.md) as code: the Parquet schema, the encode-cache schema, file names, and
the typed ``Manifest`` of ``manifest.json``.

Writer and readers import ``SCHEMA`` and ``Manifest`` from here, so the two sides cannot drift.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from packer.config import BuildConfig
from packer.errors import ConfigError, ShardError

SCHEMA_VERSION = 6  # 2: the videos and num_video_tokens columns; 3: seq_lengths (TRL's padding-free column);
# 4: loss_weights (per-token loss weights), the audios and num_audio_tokens columns; 5: mrope_position_ids float32
# (Qwen3-Omni's fractional video time positions), the audio struct's padded_samples; 6: mrope_position_ids stored
# sparse (mrope_runs, mrope_bases, mrope_rest: packer.shards.mrope), read back dense

MAX_EXACT_POSITION = 1 << 24
"""float32 holds every integer of magnitude below this: the largest mRoPE position stored exactly."""


MANIFEST = "manifest.json"


STATS = "stats.json"


REJECTS = "rejects.jsonl"


WORK_DIR = ".packer"


# Token ids and 1-D positions fit int32 (vocabularies < 2^31, rows < 2^31 tokens); int32 halves the bytes of int64.
IMAGE_TYPE = pa.struct(
    [
        ("source", pa.string()),  # resolved path, "" for inline bytes
        ("data", pa.binary()),  # inline image bytes, null for a path
        ("grid_t", pa.int32()),
        ("grid_h", pa.int32()),
        ("grid_w", pa.int32()),
        ("offset", pa.int32()),  # first vision token, relative to the row (example, in the encode cache)
        ("num_tokens", pa.int32()),
    ]
)


I32_LIST = pa.list_(pa.int32())


F32_LIST = pa.list_(pa.float32())


# One video (docs/format.md, "Videos"): what the reader decodes (source or frames, the sampled frame indices)
# and makes of it (height x width frames, grid), and where its tokens are.
VIDEO_TYPE = pa.struct(
    [
        ("source", pa.string()),  # resolved clip path, "" for a frame list
        ("frames", pa.list_(pa.string())),  # a frame list's resolved image paths, [] for a clip
        ("video_start", pa.float64()),  # the record's window in seconds, null when not given
        ("video_end", pa.float64()),
        ("frame_indices", I32_LIST),  # sampled frames in order (into the clip, or the padded frame list)
        ("video_fps", pa.float64()),  # the clip's average frame rate (a frame list: its raw_fps)
        ("grid_t", pa.int32()),
        ("grid_h", pa.int32()),
        ("grid_w", pa.int32()),
        ("height", pa.int32()),  # frame size in the vision tower, pixels
        ("width", pa.int32()),
        ("utils_height", pa.int32()),  # frame size after qwen-vl-utils' resize, before the processor's
        ("utils_width", pa.int32()),
        ("offset", pa.int32()),  # first video token, relative to the row (example, in the encode cache)
        ("num_tokens", pa.int32()),
        ("second_per_grid_t", pa.float64()),  # seconds per temporal patch (Qwen2.5-VL's second_per_grid_ts)
    ]
)


# One audio clip (docs/format.md, "Audio"): what the reader decodes (source or bytes, the window, a video's own
# track) and the features it makes of it (samples at the family's rate, feature frames), and where its tokens are.
AUDIO_TYPE = pa.struct(
    [
        ("source", pa.string()),  # resolved path ("" for inline bytes); a video's clip for its own sound track
        ("data", pa.binary()),  # inline audio bytes, null for a path
        ("audio_start", pa.float64()),  # the record's window in seconds, null when not given
        ("audio_end", pa.float64()),
        ("video", pa.bool_()),  # a video's own sound track (use_audio_in_video)
        ("sample_rate", pa.int32()),  # the rate the family's loader resamples to (Hz)
        ("num_samples", pa.int32()),  # mono samples the loader yields at sample_rate (37 h at 16 kHz fit)
        ("feature_length", pa.int32()),  # the feature frames the model reads (Whisper: log-mel frames)
        ("offset", pa.int32()),  # first audio token, relative to the row (example, in the encode cache)
        ("num_tokens", pa.int32()),
        ("padded_samples", pa.int32()),  # samples the clip was zero-padded to beside its example's other clips
        # (Qwen3-Omni: the longest clip's); null where the clip's features do not depend on the other clips
    ]
)


# The rows every reader gets (v5's layout, the dense mRoPE column): what ``packer.shards.io``'s shard files return
# for a shard of any version from v5 on, and what a v5 shard holds. One explicit schema: never inferred.
ROW_SCHEMA = pa.schema(
    [
        ("input_ids", I32_LIST),
        ("labels", I32_LIST),  # unshifted; -100 where no loss
        ("loss_weights", F32_LIST),  # T: each label's weight, 0 where -100; null where every loss weight is 1
        ("position_ids", I32_LIST),
        ("mrope_position_ids", F32_LIST),  # 3*T token-major (t,h,w per token); null without mRoPE; whole numbers
        # except where the profile's positions are fractional (Positions.fractional)
        ("cu_seqlens", I32_LIST),  # E+1, starts at 0, ends at T
        ("seq_lengths", I32_LIST),  # E example lengths where TRL's padding-free collator is exact; else null
        ("node_offsets", I32_LIST),
        ("node_parents", I32_LIST),
        ("images", pa.list_(IMAGE_TYPE)),
        ("videos", pa.list_(VIDEO_TYPE)),
        ("audios", pa.list_(AUDIO_TYPE)),
        ("example_ids", pa.list_(pa.string())),
        ("example_sources", pa.list_(pa.string())),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("num_vision_tokens", pa.int32()),  # image and video tokens
        ("num_video_tokens", pa.int32()),
        ("num_audio_tokens", pa.int32()),
    ],
    metadata={"packer.schema_version": "5"},
)


# What a v6 shard holds: ROW_SCHEMA with the dense mRoPE column stored as three sparse ones (packer.shards.mrope:
# text stretches as runs counting up from a base, every other token's (t, h, w) as they are), null without mRoPE.
SCHEMA = pa.schema(
    [g for f in ROW_SCHEMA for g in (
        [pa.field("mrope_runs", I32_LIST),  # 2*S: (start, length) of each run, row-relative
         pa.field("mrope_bases", F32_LIST),  # S: each run's first position (t = h = w, + 1 per token)
         pa.field("mrope_rest", F32_LIST)]  # 3*(T - run tokens): the other tokens' (t, h, w), token-major
        if f.name == "mrope_position_ids" else [f])],
    metadata={"packer.schema_version": str(SCHEMA_VERSION)},
)


_V4 = {"loss_weights", "audios", "num_audio_tokens"}


# v4's audio struct and mRoPE column (int32 positions, no padded_samples): what v2-v4 shards hold.
_AUDIO_TYPE_V4 = pa.struct([f for f in AUDIO_TYPE if f.name != "padded_samples"])
_SCHEMA_V4 = pa.schema(
    [pa.field("mrope_position_ids", I32_LIST) if f.name == "mrope_position_ids"
     else pa.field("audios", pa.list_(_AUDIO_TYPE_V4)) if f.name == "audios" else f for f in ROW_SCHEMA],
    metadata={"packer.schema_version": "4"},
)


# Shard schemas this packer reads, by version: v2 lacks seq_lengths, v2 and v3 the v4 columns (readers that need
# them say so; a row without ``loss_weights`` weighs every token 1, one without ``audios`` has no audio); v2-v4
# store mRoPE positions as int32 and no ``padded_samples`` (readers take either dtype; a missing field is null);
# v6 stores v5's mRoPE column sparse, and the shard files read it back dense (``packer.shards.mrope``).
SCHEMAS: dict[int, pa.Schema] = {
    2: pa.schema([f for f in _SCHEMA_V4 if f.name not in _V4 | {"seq_lengths"}],
                 metadata={"packer.schema_version": "2"}),
    3: pa.schema([f for f in _SCHEMA_V4 if f.name not in _V4], metadata={"packer.schema_version": "3"}),
    4: _SCHEMA_V4,
    5: ROW_SCHEMA,
    6: SCHEMA,
}


# The per-example encode cache (Arrow IPC files under .packer/encode/): same list columns, example-relative.
EXAMPLE_SCHEMA = pa.schema(
    [
        ("example_id", pa.string()),
        ("source_name", pa.string()),
        ("input_ids", I32_LIST),
        # labels and 1-D positions only where they cannot be derived (packer.shards.derived; cache format 3):
        # labels [] = input_ids on the label_runs' spans, -100 elsewhere; position_ids [] = 0 .. L-1
        ("labels", I32_LIST),
        ("label_runs", I32_LIST),  # 2*S: (start, length) of each loss span where labels is [], else []
        ("loss_weights", F32_LIST),  # L, or null (every loss weight 1)
        ("position_ids", I32_LIST),
        # mRoPE as a shard row stores it (SCHEMA's three columns, example-relative), or null: the write packs
        # them into rows without making them dense (packer.shards.mrope.row_columns); cache format 2
        ("mrope_runs", I32_LIST),
        ("mrope_bases", F32_LIST),
        ("mrope_rest", F32_LIST),
        ("node_offsets", I32_LIST),
        ("node_parents", I32_LIST),
        ("images", pa.list_(IMAGE_TYPE)),
        ("videos", pa.list_(VIDEO_TYPE)),
        ("audios", pa.list_(AUDIO_TYPE)),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("loss_weight", pa.float64()),  # the loss tokens' summed weight (num_loss_tokens when unweighted)
        ("num_vision_tokens", pa.int32()),
        ("num_video_tokens", pa.int32()),
        ("num_audio_tokens", pa.int32()),
        ("num_images", pa.int32()),
        ("num_videos", pa.int32()),
        ("num_audios", pa.int32()),
    ]
)


ROW_LIST_COLUMNS = ("input_ids", "labels", "position_ids", "mrope_position_ids")


# ---------------------------------------------------------------------------------------- manifest.json
def _field(data: dict[str, Any], key: str, kind: type, where: str, *, required: bool = True) -> Any:
    """``data[key]`` checked against ``kind``; ShardError naming the key when a reader cannot use it."""
    if key not in data or data[key] is None:
        if required:
            raise ShardError(f"{where} has no '{key}'; it is not a manifest this packer can read (rebuild it)")
        return None
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):  # JSON true is no count
        raise ShardError(f"{where}: '{key}' is {value!r}, not {kind.__name__}")
    return value


@dataclass(frozen=True, kw_only=True)
class ShardEntry:
    """One shard file of a build, as the manifest lists it."""

    file: str
    """File name inside the build directory (``shard-00000.parquet``)."""
    rows: int
    """Packed rows in the file."""
    bytes: int
    """File size."""
    sha256: str
    """Checksum of the whole file (``packer verify`` recomputes it)."""

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> ShardEntry:
        if not isinstance(data, dict):
            raise ShardError(f"{where} is {data!r}, not an object with file, rows, bytes, sha256")
        return cls(file=_field(data, "file", str, where), rows=_field(data, "rows", int, where),
                   bytes=_field(data, "bytes", int, where), sha256=_field(data, "sha256", str, where))

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "rows": self.rows, "sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True, kw_only=True)
class Totals:
    """What the whole build holds; ``packer verify`` checks each against the shards, rejects.jsonl and stats.json."""

    input_records: int
    """Non-blank input lines read."""
    rejected: int
    """Input lines not packed (each one is in rejects.jsonl)."""
    rejects_by_reason: dict[str, int]
    """Rejected lines per reason code (``packer.errors.REJECT_REASONS``), sorted by code."""
    examples: int
    """Packed examples, after source weights (a weight of 2 packs each line twice)."""
    packs: int
    """Packed rows over all shards."""
    tokens: int
    """Tokens over all rows."""
    loss_tokens: int
    """Tokens whose label is not -100."""
    vision_tokens: int
    """Image tokens over all rows."""

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> Totals:
        if not isinstance(data, dict):
            raise ShardError(f"{where} is {data!r}, not an object")
        values = {f.name: _field(data, f.name, dict if f.name == "rejects_by_reason" else int, where)
                  for f in dataclasses.fields(cls)}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, kw_only=True)
class TokenizerRef:
    """The tokenizer a build used."""

    name: str
    """HF name, directory or builtin name (``qwen2-vl``): what ``packer inspect`` loads to decode rows."""
    fingerprint: str
    """sha256 of its serialized vocabulary, special tokens and template."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "fingerprint": self.fingerprint}


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """``manifest.json``: what a finished build is (docs/format.md). The one place its keys and defaults live.

    The writer builds one and writes ``to_dict()``; readers get one from ``open_shards``. Keys a reader
    needs (schema_version, config, profile, shards) are required; the others are None when an older or
    hand-written manifest lacks them, and each reader says what it then cannot do.
    """

    schema_version: int
    """Shard schema version (``SCHEMA_VERSION`` for a new build; readers take any of ``SCHEMAS``)."""
    packer_version: str | None = None
    """The packer that wrote the build."""
    fingerprint: str | None = None
    """sha256 of the effective config (less run-time knobs), tokenizer fingerprint and input files: a rerun
    with the same fingerprint resumes, another needs ``--overwrite``."""
    config: BuildConfig
    """The effective build config (YAML + command line), every field."""
    profile: str
    """The vision profile name (``packer.models``): how images became tokens, and how to load their pixels."""
    tokenizer: TokenizerRef | None = None
    """The tokenizer used, None if not recorded (``packer inspect`` then needs ``--tokenizer`` or ``--ids``)."""
    chat_template_sha256: str | None = None
    """sha256 of the chat template used."""
    inputs: tuple[str, ...] = ()
    """The input files, as given (relative ones to ``base_dir``)."""
    base_dir: str | None = None
    """The directory relative input paths (and example ids) were resolved from; None: the working directory."""
    image_token_id: int | None = None
    """The profile's placeholder token id in the tokenizer; None for text profiles (or not recorded)."""
    video_token_id: int | None = None
    """The profile's video placeholder token id; None for profiles without video (or not recorded)."""
    audio_token_id: int | None = None
    """The profile's audio placeholder token id; None for profiles without audio (or not recorded)."""
    totals: Totals | None = None
    """Whole-build counts, None if not recorded (nothing for ``packer verify`` to compare then)."""
    shards: tuple[ShardEntry, ...]
    """The shard files, in order."""

    @classmethod
    def from_dict(cls, data: Any, *, where: str = MANIFEST) -> Manifest:
        """Parse a manifest; ShardError naming the key a reader needs and cannot use."""
        if not isinstance(data, dict):
            raise ShardError(f"{where} is not a JSON object")
        version = _field(data, "schema_version", int, where)
        if version not in SCHEMAS:
            raise ShardError(f"{where} has shard schema v{version}; this packer reads "
                             f"{', '.join(f'v{v}' for v in SCHEMAS)}")
        try:
            config = BuildConfig.from_dict(_field(data, "config", dict, where))
        except ConfigError as e:
            raise ShardError(f"{where}: 'config' is not a build config this packer reads: {e}") from e
        tok = _field(data, "tokenizer", dict, where, required=False)
        inputs = _field(data, "inputs", list, where, required=False) or []
        if not all(isinstance(p, str) for p in inputs):
            raise ShardError(f"{where}: 'inputs' must list file paths, got {inputs!r}")
        totals = _field(data, "totals", dict, where, required=False)
        shards = _field(data, "shards", list, where)
        return cls(
            schema_version=version,
            packer_version=_field(data, "packer_version", str, where, required=False),
            fingerprint=_field(data, "fingerprint", str, where, required=False),
            config=config,
            profile=_field(data, "profile", str, where),
            tokenizer=None if tok is None else TokenizerRef(
                name=_field(tok, "name", str, f"{where} 'tokenizer'"),
                fingerprint=_field(tok, "fingerprint", str, f"{where} 'tokenizer'")),
            chat_template_sha256=_field(data, "chat_template_sha256", str, where, required=False),
            inputs=tuple(inputs),
            base_dir=_field(data, "base_dir", str, where, required=False),
            image_token_id=_field(data, "image_token_id", int, where, required=False),
            video_token_id=_field(data, "video_token_id", int, where, required=False),
            audio_token_id=_field(data, "audio_token_id", int, where, required=False),
            totals=None if totals is None else Totals.from_dict(totals, where=f"{where} 'totals'"),
            shards=tuple(ShardEntry.from_dict(s, where=f"{where} 'shards'[{i}]") for i, s in enumerate(shards)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``manifest.json`` holds (``write_json_atomic`` sorts the keys)."""
        return {
            "schema_version": self.schema_version,
            "packer_version": self.packer_version,
            "fingerprint": self.fingerprint,
            "config": self.config.to_dict(),
            "profile": self.profile,
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_dict(),
            "chat_template_sha256": self.chat_template_sha256,
            "inputs": list(self.inputs),
            "base_dir": self.base_dir,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "audio_token_id": self.audio_token_id,
            "totals": None if self.totals is None else self.totals.to_dict(),
            "shards": [s.to_dict() for s in self.shards],
        }

    def resolve(self, path: str) -> str:
        """An input path or example-id path as the build resolved it: absolute, relative ones from ``base_dir``."""
        return os.path.abspath(os.path.join(self.base_dir or os.getcwd(), path))
