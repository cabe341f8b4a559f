"""The ``packer`` command line: a thin click layer over the library.

Exit codes (docs/cli.md): 0 success; 1 a configuration, input-file or shard error (the message says what
to change); 2 a usage error, or a bad record under --strict; 3 more input rejected than
--max-reject-fraction allows, or no example left to pack; 4 ``packer verify`` found violations; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

import click

from packer.config import BuildConfig
from packer.core.media import BUDGETS
from packer.errors import PackerError, RecordError, RejectRateError
from packer.report.verify.report import DEFAULT_LIMIT, DEFAULT_TOKENIZER_CHECK

EXIT_ERROR, EXIT_BAD_RECORD, EXIT_REJECT_RATE, EXIT_VERIFY = 1, 2, 3, 4


class BuildDir(click.ParamType):
    """A build's directory (must exist) or object-store URL (``s3://bucket/prefix``, read as is)."""

    name = "directory"
    _local = click.Path(exists=True, file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from packer.shards.store import is_url

        return value if is_url(value) else self._local.convert(value, param, ctx)


BUILD_DIR = BuildDir()

# Option bundles shared by commands, as decorators (sqlite-utils' cli.py style).
directory_argument = click.argument("directory", type=BUILD_DIR)
"""A finished build's DIRECTORY (stats, inspect, verify)."""


class LazyChoice(click.Choice):
    """A ``click.Choice`` whose names a function gives at their first use (its command's --help, a value given), not
    when the CLI is defined: ``--profile``'s names import every model family, which no other command needs."""

    def __init__(self, names: Callable[[], Any]) -> None:
        self._names, self._choices = names, None
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            self._choices = tuple(self._names())
        return self._choices

    @choices.setter
    def choices(self, value: Any) -> None:  # click.Choice.__init__'s (): the names come from the function
        pass


def _config_fields(config: type = BuildConfig) -> list[dataclasses.Field]:
    """The config's fields that are ``packer build`` options (those made with ``config.option``: a help)."""
    return [f for f in dataclasses.fields(config) if "help" in f.metadata]


def _field_option(f: dataclasses.Field, hint: Any, default_from: str | None = None) -> Callable:
    """The click option of one BuildConfig field: its name, type and choices from the field, its help from the
    field's ``help`` with the field's default appended. ``default=None`` (a flag too): an option not given
    leaves the YAML's value (``BuildConfig.from_dict`` ignores None); ``default_from`` names where an option not
    given comes from instead of the field's default (``packer repack``: the build it repacks)."""
    meta = f.metadata
    arms = [a for a in typing.get_args(hint) if a is not type(None)] if isinstance(hint, types.UnionType) else [hint]
    kind = typing.get_origin(arms[0]) or arms[0]  # int, float, str, bool; dict: a string the config parses
    decls = list(meta.get("flags", ["--" + f.name.replace("_", "-")]))
    kw: dict[str, Any] = {"default": None, "metavar": meta.get("metavar"), "multiple": meta.get("multiple", False)}
    if kind is bool:
        decls = [f"{decls[0]}/--no-{decls[0][2:]}"]
    if "choices" in meta:
        choices = meta["choices"]
        kw["type"] = LazyChoice(choices) if callable(choices) else click.Choice(choices)
    elif meta.get("path") == "dir":
        kw["type"] = click.Path(file_okay=False)
    elif kind in (int, float):
        kw["type"] = kind
    if kw["multiple"]:
        kw["default"] = ()
    default = default_from or meta.get("default_help")
    if default is None and f.default is not dataclasses.MISSING and f.default is not None:
        default = ("on" if f.default else "off") if kind is bool else f.default
    kw["help"] = meta["help"] if default is None else f"{meta['help']} [default: {default}]"
    return click.option(*decls, f.name, **kw)


def config_options(*names: str, exclude: tuple[str, ...] = (), config: type = BuildConfig,
                   default_from: str | None = None) -> Callable:
    """Decorator: the options of BuildConfig's fields ``names`` (none: every option field but ``exclude``), in
    the fields' order. A field made with ``config.option`` is an option here with nothing else to write.
    ``default_from``: ``_field_option``'s."""
    hints = typing.get_type_hints(config)
    fields = [f for f in _config_fields(config) if (f.name in names if names else f.name not in exclude)]

    def decorate(command: Callable) -> Callable:
        for f in reversed(fields):  # click lists options in decorator order, top first
            command = _field_option(f, hints[f.name], default_from)(command)
        return command

    return decorate


def config_overrides(options: dict[str, Any], config: type = BuildConfig) -> dict[str, Any]:
    """The BuildConfig fields given on the command line (None or no values: not given), each read by its
    field's ``parse`` where it has one; pops them from ``options``."""
    out = {}
    for f in _config_fields(config):
        value = options.pop(f.name, None)
        if value is not None and value != ():
            out[f.name] = f.metadata["parse"](value) if "parse" in f.metadata else value
    return out


def _fail(message: str, code: int) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(code)


def handle_errors(func):
    """Turn packer's typed errors into one red line and a documented exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except RecordError as e:
            _fail(f"{e} (rerun without --strict to reject such records instead of stopping)", EXIT_BAD_RECORD)
        except RejectRateError as e:
            _fail(str(e), EXIT_REJECT_RATE)
        except PackerError as e:
            _fail(str(e), EXIT_ERROR)
        except OSError as e:  # disk full, permission denied, a path that vanished: the message, not a traceback
            if os.environ.get("PACKER_DEBUG"):
                raise
            where = f": {e.filename}" if e.filename else ""
            _fail(f"{e.strerror or e}{where} (set PACKER_DEBUG=1 to see the traceback)", EXIT_ERROR)
        except KeyboardInterrupt:
            click.secho("interrupted: rerun the same command to resume", fg="yellow", err=True)
            sys.exit(130)

    return wrapper


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: click's own option's words, the version read only when asked (importlib.metadata)."""
    if value and not ctx.resilient_parsing:
        from packer import __version__

        click.echo(f"packer, version {__version__}")
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
def cli() -> None:
    """Pack multimodal training data offline into Parquet shards of packed sequences.

    \b
    Typical use:
      packer build data/*.jsonl --output shards/ --profile qwen2-vl --max-length 8192
      packer build --config configs/qwen2-vl.yaml data/*.jsonl -o shards/
      packer stats shards/ --plot stats.png
      packer inspect shards/ --row 0 --mask mask.png

    \b
    Exit codes: 0 success; 1 a configuration, input-file or shard error (the message says what to
    change); 2 a usage error, or a bad record under --strict; 3 more input rejected than
    --max-reject-fraction allows, or no example left to pack; 4 `packer verify` found violations; 130 interrupted (rerun to resume).
    """


def _source_option(value: tuple[str, ...]) -> list[dict[str, Any]] | None:
    if not value:
        return None
    sources = []
    for item in value:
        name, sep, rest = item.partition("=")
        if not sep or not rest:
            raise click.BadParameter(f"{item!r}: expected NAME=PATH_OR_GLOB[@WEIGHT]", param_hint="--source")
        path, _, weight = rest.rpartition("@") if "@" in rest else (rest, "", "1")
        try:
            sources.append({"name": name, "paths": [path], "weight": float(weight)})
        except ValueError:
            raise click.BadParameter(f"{item!r}: weight {weight!r} is not a number", param_hint="--source") from None
    return sources


@cli.command(short_help="Read JSONL, pack it globally, write Parquet shards.")
@click.argument("inputs", nargs=-1)
@config_options("output")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML build config (configs/*.yaml); command-line options override it.")
@click.option("--source", "sources", multiple=True, metavar="NAME=GLOB[@W]",
              help="A named source with an optional weight: 2 repeats each example twice, 0.5 keeps a seeded "
                   "half, 1.5 all plus a seeded half. Repeat the option for a mixture.")
@click.option("--dataset-info", "dataset_info", type=click.Path(exists=True, dir_okay=False), metavar="JSON",
              help="A LLaMA-Factory dataset_info.json; each --dataset names one of its datasets (a source).")
@click.option("--dataset", "datasets", multiple=True, metavar="NAME[=PATH][@W]",
              help="A dataset of --dataset-info, with an optional weight (as --source); =PATH reads a local copy "
                   "instead of its file_name (the way to read a Hub entry offline). Repeatable.")
@config_options(exclude=("output",))  # every other BuildConfig option field
@click.option("-q", "--quiet", is_flag=True, help="No progress bars; print only errors.")
@handle_errors
def build(inputs: tuple[str, ...], config_file: str | None, sources: tuple[str, ...], quiet: bool,
          **options: Any) -> None:
    """Read JSONL records, render and encode them, pack them globally and write Parquet shards.

    INPUTS are JSONL, Parquet or Arrow files, JSON arrays, .gz/.zst/.bz2/.xz files, .txt files, webdataset
    .tar shards (docs/format.md, "Input files"), directories (their *.jsonl, else their tables, else those
    files; a `datasets` directory, from save_to_disk or a Hub snapshot, its train split) or globs (quote
    globs). Rerunning an interrupted
    build with the same command resumes it; the result is byte-identical to an uninterrupted build.
    Rejected records go to OUTPUT/rejects.jsonl with file, line and reason.

    \b
    Examples:
      packer build train.jsonl --output out/ --max-length 8192
      packer build 'data/*.jsonl' -o out/ --profile qwen2-vl --max-vision-tokens 4096 --num-proc 8
      packer build --config configs/qwen2-vl.yaml train.jsonl -o out/
      packer build -o out/ --source chat=chat.jsonl@2 --source captions=caps.jsonl@0.5
      packer build llava-snapshot/ -o out/ --columns conversations=dialog,image=picture
      packer build --dataset-info data/dataset_info.json --dataset mllm_demo --dataset alpaca_en_demo@0.5 -o out/
      packer build '/shared/data/*.jsonl' -o /shared/out --executor ray --ray-address auto
    """
    from packer.pipeline.build import build as run_build

    output = options.pop("output")
    dataset_info, datasets = options.pop("dataset_info"), options.pop("datasets")
    if datasets and not dataset_info and not config_file:
        raise click.UsageError("--dataset names a dataset of --dataset-info FILE; give that file too")
    overrides = config_overrides(options)
    if dataset_info:
        overrides["dataset_info"] = dataset_info
    if datasets:
        overrides["datasets"] = list(datasets)
    if output:  # an empty -o leaves the config's output
        overrides["output"] = output
    source_list = _source_option(sources)
    if inputs and source_list:
        raise click.UsageError("give INPUT files or --source options, not both")
    # Inputs on the command line replace the YAML's inputs AND sources: an empty list (not None, which
    # from_dict ignores) clears the other key.
    if inputs:
        overrides["inputs"] = list(inputs)
        overrides["sources"] = []
    elif source_list:
        overrides["sources"] = source_list
        overrides["inputs"] = []
    if config_file:
        config = BuildConfig.from_yaml(config_file, **overrides)
    else:
        if not inputs and not source_list and not datasets:
            raise click.UsageError("no input: give JSONL files, --source, or --config with inputs")
        config = BuildConfig.from_dict({}, **overrides)
    result = run_build(config, progress=not quiet)
    if not quiet:
        st = result.stats
        click.secho(
            f"packed {st['examples']:,} examples into {st['packs']:,} packs "
            f"({100 * st['efficiency']:.2f}% full, lower bound {st['lower_bound_packs']:,}); "
            f"{st['rejected']:,} rejected; {len(result.manifest['shards'])} shard(s) in {result.output}",
            fg="green",
        )
        if st["rejected"]:
            click.echo(f"rejected records and reasons: {result.output / 'rejects.jsonl'}")
        for note in getattr(result, "notes", []):  # rejects mostly of one reason, and what the input looks like
            click.secho(f"note: {note}", fg="yellow", err=True)
        click.echo(f"details: packer stats {result.output}")


REPACK_OPTIONS = ("output", "max_length", *(b.flag for b in BUDGETS), "max_examples_per_pack", "algorithm", "balance_vision",
                  "refine", "seed", "rows_per_shard", "rows_per_row_group", "num_proc", "executor", "ray_address",
                  "max_reject_fraction")  # packer.pipeline.repack.CHANGEABLE, as options (and --overwrite, below)


def _weights(items: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, weight = item.rpartition("=")
        try:
            out[name] = float(weight)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected NAME=WEIGHT (a number)", param_hint="--weight") from None
        if not sep:
            raise click.BadParameter(f"{item!r}: expected NAME=WEIGHT", param_hint="--weight")
    return out


@cli.command(short_help="Pack a build's encoded examples again with other packing options.")
@directory_argument
@config_options("output")
@config_options(*REPACK_OPTIONS[1:], default_from="DIRECTORY's")
@config_options("overwrite")  # never DIRECTORY's: repack replaces a non-empty output only when told to
@click.option("--weight", "weights", multiple=True, metavar="NAME=W",
              help="A source's new sampling weight (as --source's @W); `=W` for the unnamed source. Repeatable.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars; print only errors.")
@handle_errors
def repack(directory: str, weights: tuple[str, ...], quiet: bool, **options: Any) -> None:
    """Pack the encoded examples of the finished build DIRECTORY into --output with other packing options
    (max length, budgets, algorithm, seed, source weights, shard size), without re-tokenizing: the shards are
    byte-identical to a fresh `packer build` with the same options. A --max-length above the longest example
    DIRECTORY's encode cache kept (its --keep-up-to, else its --max-length) is refused: build again.

    \b
    Examples:
      packer repack out/ -o out-16k/ --max-length 16384
      packer repack out/ -o out-b/ --max-vision-tokens 4096 --seed 1 --weight chat=2
    """
    from packer.pipeline.repack import repack as run_repack

    overrides = config_overrides(options)
    output = overrides.pop("output", None)
    if not output:
        raise click.UsageError("repack needs --output NEW (another directory than DIRECTORY)")
    result = run_repack(directory, output, weights=_weights(weights), progress=not quiet, **overrides)
    if not quiet:
        st = result.stats
        click.secho(f"repacked {st['examples']:,} examples into {st['packs']:,} packs "
                    f"({100 * st['efficiency']:.2f}% full); {st['rejected']:,} rejected; "
                    f"{len(result.manifest['shards'])} shard(s) in {result.output}", fg="green")
        click.echo(f"details: packer stats {result.output}")


@cli.command(short_help="What the packing achieved: table, JSON or picture.")
@directory_argument
@click.option("--json", "as_json", is_flag=True, help="Print stats.json instead of the table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Also draw the picture: pack fill, examples and vision tokens per pack, and the padding "
                   "waste of naive batches, fixed-length rows and packer's packs on the same examples.")
@handle_errors
def stats(directory: str, as_json: bool, plot_path: str | None) -> None:
    """Show what a build's packing achieved: efficiency, distance to the lower bound, padding avoided.

    \b
    Examples:
      packer stats out/
      packer stats out/ --plot stats.png
      packer stats out/ --json | jq .efficiency
    """
    from packer.report.stats import format_stats
    from packer.shards.io import open_shards
    from packer.shards.schema import STATS

    shards = open_shards(directory)
    data = json.loads((shards.root / STATS).read_text())
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.secho(f"{directory}  (profile {shards.manifest.profile}, {len(shards.shards)} shard(s))", bold=True)
        click.echo(format_stats(data))
    if plot_path:
        from packer.report.plots import plot_stats

        click.secho(f"wrote {plot_stats(directory, plot_path)}", fg="green", err=True)


@cli.command(short_help="One packed row: examples, tree, roles, images, mask.")
@directory_argument
@click.option("--row", type=int, help="The row (packed sequence) to show, counted from 0 across shards. [default: 0]")
@click.option("--example", "example_id", metavar="PATH:LINE",
              help="Show the row that holds this example (an id from example_ids or rejects) instead of --row.")
@click.option("--mask", "mask_path", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Also draw the row's attention mask: examples as blocks on the diagonal, shared prefixes, "
                   "branches that see their parent but not each other, image spans.")
@click.option("--json", "as_json", is_flag=True, help="Print the row's structure as JSON instead of text.")
@click.option("--ids", is_flag=True, help="Show token ids instead of decoded text (loads no tokenizer).")
@click.option("--tokenizer", help="Decode with this tokenizer instead of the one the manifest names.")
@click.option("--width", type=click.IntRange(min=0), default=160, show_default=True,
              help="Characters of decoded text per node (the middle is elided); 0 shows all.")
@handle_errors
def inspect(directory: str, row: int | None, example_id: str | None, mask_path: str | None, as_json: bool,
            ids: bool, tokenizer: str | None, width: int) -> None:
    """Show one packed row: its examples, each example's tree of nodes (span, parent, role, loss tokens,
    decoded text), and its images (source, grid, token span).

    Roles are read from the tokens (the chat template's headers), decoded with the build's tokenizer.

    \b
    Examples:
      packer inspect out/ --row 0
      packer inspect out/ --row 12 --mask mask.png
      packer inspect out/ --example data/train.jsonl:1042
      packer inspect out/ --row 3 --json | jq '.examples[].nodes[].roles'
    """
    from packer.report.rowview import describe_row, draw_mask, find_example, format_row
    from packer.shards.io import open_shards

    shards = open_shards(directory)
    if row is not None and example_id is not None:
        raise click.UsageError("give --row or --example, not both")
    if example_id is not None:
        row = find_example(shards, example_id)
    row = 0 if row is None else row
    if not 0 <= row < shards.num_rows:
        raise click.BadParameter(f"{row} is out of range: {directory} has {shards.num_rows} row(s), "
                                 f"0..{shards.num_rows - 1}", param_hint="--row")
    tok = None
    if tokenizer and not ids:
        from packer.encode.tokenizers import load_tokenizer

        tok = load_tokenizer(tokenizer)
    info = describe_row(directory, row, tokenizer=tok, decode=not ids)
    if as_json:
        click.echo(json.dumps(info.to_dict(), indent=2))
    else:
        click.echo(format_row(info, width=width))
    if mask_path:
        click.secho(f"wrote {draw_mask(directory, row, mask_path)}", fg="green", err=True)


@cli.command("verify")
@directory_argument
@click.option("--input", "inputs", multiple=True, metavar="FILE_OR_GLOB",
              help="Also check that every non-blank line (table row) of these inputs is packed or rejected exactly once.")
@click.option("--limit", type=int, default=DEFAULT_LIMIT, show_default=True,
              help="Violations listed per check and file (the rest are counted).")
@click.option("--tokenizer-check", "tokenizer_check", default=str(DEFAULT_TOKENIZER_CHECK), show_default=True,
              metavar="N|all",
              help="With --input: re-tokenize N input records (spread over the inputs), or all, with the HF "
                   "tokenizer on the general path and compare with the packed tokens and labels; 0: off.")
@handle_errors
def verify_command(directory: str, inputs: tuple[str, ...], limit: int, tokenizer_check: str) -> None:
    """Check a finished build: checksums, schema, and every invariant of docs/format.md.

    Exit 0 when everything holds; 4 with one line per violation (file, row, what) otherwise.

    \b
    Examples:
      packer verify out/
      packer verify out/ --input train.jsonl --input 'more/*.jsonl'
      packer verify out/ --input train.jsonl --tokenizer-check all
    """
    from packer.report.verify import verify_build

    if tokenizer_check != "all" and not tokenizer_check.isdigit():
        raise click.BadParameter(f"{tokenizer_check!r} is not a count or 'all'", param_hint="--tokenizer-check")
    check: int | str = tokenizer_check if tokenizer_check == "all" else int(tokenizer_check)
    report = verify_build(directory, inputs=list(inputs) or None, limit=limit, tokenizer_check=check)
    for line in report.lines():
        click.echo(line)
    checked = f"{report.shards} shard(s), {report.rows:,} rows, {report.examples:,} examples"
    if report.input_records is not None:
        checked += f", {report.input_records:,} input records"
    if report.tokenized:
        checked += f" ({report.tokenized:,} re-tokenized with the HF tokenizer)"
    if report.ok:
        click.secho(f"ok: {checked}", fg="green")
        return
    click.secho(f"{report.num_violations:,} violation(s) in {checked}", fg="red", err=True)
    sys.exit(EXIT_VERIFY)


def main() -> None:
    try:
        cli(prog_name="packer")
    finally:  # the process ends here: what it holds is frozen out of the interpreter's full collections at
        # exit (~0.3 CPU-s of a repack's 200k bench run, serial; docs/benchmarks.md, "Repack"). Not in ``cli``
        # itself, which tests call in a process that goes on (frozen objects are never collected)
        import gc

        gc.freeze()


if __name__ == "__main__":
    main()
