"""The command line as people use it: --version, --help with examples on every command, progress and --quiet,
the stats table / JSON / picture, and one-line errors with the documented exit codes and exact text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from packer import __version__
from packer.cli import cli
from packer.models import profile_names

CHATS = [{"messages": [{"role": "user", "content": f"Question {i}?" + " more" * (7 * i)},
                       {"role": "assistant", "content": f"Answer {i}."}]} for i in range(12)]
OPTS = ["--profile", "text", "--max-length", "256", "--rows-per-shard", "2"]


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, str]:
    """A small text build made through the CLI, with its progress output (stderr)."""
    root = tmp_path_factory.mktemp("cli")
    data = _jsonl(root / "data.jsonl", [*CHATS, "{broken"])
    res = CliRunner().invoke(cli, ["build", str(data), "-o", str(root / "out"), *OPTS])
    assert res.exit_code == 0, res.output
    return data, root / "out", res


def test_version():
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0 and res.stdout == f"packer, version {__version__}\n"


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_has_help_with_examples(command):
    for flag in ("--help", "-h"):
        res = CliRunner().invoke(cli, [command, flag])
        assert res.exit_code == 0
        assert res.stdout.startswith(f"Usage: cli {command} [OPTIONS]")
        assert "Example" in res.stdout and f"packer {command} " in res.stdout


def test_top_level_help_lists_commands_and_exit_codes():
    res = CliRunner().invoke(cli, ["--help"], terminal_width=100)
    assert res.exit_code == 0
    assert all(f"\n  {c} " in res.stdout for c in cli.commands)
    assert "Exit codes: 0 success; 1 a configuration" in res.stdout and "130 interrupted" in res.stdout


_PROBE = """import json, sys
from packer.cli import cli
try:
    cli(sys.argv[1:], standalone_mode=False)
finally:
    families = sorted({m.split('.')[2] for m in sys.modules if m.startswith('packer.models.')} - {'registry'})
    heavy = [m for m in ('transformers', 'torch', 'pandas', 'numba', 'numpy', 'pyarrow.compute', 'PIL.Image',
                         'importlib.metadata', 'packer.encode.encoder', 'packer.report.verify.build') if m in sys.modules]
    print(json.dumps([families, heavy]), file=sys.stderr)
"""


def _imported(*args: str) -> tuple[list[str], list[str]]:
    """What ``packer ARGS`` imported, in a fresh process: the model families (``packer/models/<family>`` and the
    shared modules) and which of the heavy modules."""
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    return tuple(json.loads(res.stderr.strip().splitlines()[-1]))


def test_each_command_imports_what_it_uses(built):
    """``packer --help``, ``--version`` and a command's --help import no model family, numpy, pyarrow.compute,
    encoder or verify check (their choices and defaults are read lazily); ``build --help`` lists every profile
    (``--profile``'s choices: every family); ``stats`` imports its build's family alone; none imports
    transformers, torch, pandas or numba."""
    _, out, _ = built
    for args in (["--help"], ["verify", "--help"], ["repack", "--help"], ["stats", "--help"]):
        assert _imported(*args) == ([], []), args
    families, heavy = _imported("build", "--help")
    assert "qwen_omni" in families and not {"transformers", "torch", "pandas"} & set(heavy)
    assert _imported("--version") == ([], ["importlib.metadata"])
    families, heavy = _imported("stats", str(out))
    assert families == ["base", "rules", "shared", "text"]  # the build's profile, text: its family, the shared modules
    assert not {"transformers", "torch", "pandas", "numba", "packer.encode.encoder"} & set(heavy)


def test_build_shows_progress_with_counts_and_rates_then_a_summary(built):
    _, out, res = built
    # tqdm bars on stderr: what each stage did, how many, how fast
    assert "encode: 100%" in res.stderr and "examples=12, rejects=1" in res.stderr and "line/s" in res.stderr
    assert "write: 100%" in res.stderr and "pack/s" in res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("packed 12 examples into ") and lines[0].endswith(f"1 rejected; 2 shard(s) in {out}")
    assert lines[1:] == [f"rejected records and reasons: {out / 'rejects.jsonl'}", f"details: packer stats {out}"]


def test_quiet_build_prints_nothing(built, tmp_path):
    data, _, _ = built
    res = CliRunner().invoke(cli, ["build", str(data), "-o", str(tmp_path / "q"), *OPTS, "--quiet"])
    assert res.exit_code == 0 and res.stdout == "" and res.stderr == ""


@pytest.mark.slow
def test_stats_table_json_and_picture(built, tmp_path):
    _, out, _ = built
    runner = CliRunner()
    table = runner.invoke(cli, ["stats", str(out)])
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0] == f"{out}  (profile text, 2 shard(s))"
    assert lines[1:4] == ["input records            13", "rejected                 1  (malformed_json: 1)",
                          "packed examples          12"]
    assert [line.split("  ")[0] for line in lines[4:]] == [
        "packs", "tokens", "loss tokens", "vision tokens", "packing efficiency", "lower bound", "examples / pack",
        "tokens / pack", "naive padding, batch 8", "naive padding, batch 32", "fixed-length padding"]
    as_json = runner.invoke(cli, ["stats", str(out), "--json"])
    assert json.loads(as_json.stdout) == json.loads((out / "stats.json").read_text())
    picture = runner.invoke(cli, ["stats", str(out), "--plot", str(tmp_path / "s.png")])
    assert picture.exit_code == 0 and picture.stdout == table.stdout
    assert picture.stderr == f"wrote {tmp_path / 's.png'}\n"
    with Image.open(tmp_path / "s.png") as im:
        assert im.format == "PNG"
    both = runner.invoke(cli, ["stats", str(out), "--json", "--plot", str(tmp_path / "j.svg")])
    assert json.loads(both.stdout)["packs"] > 0 and (tmp_path / "j.svg").read_text().startswith("<?xml")


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["build", "-o", "{tmp}/o"], 2, "Error: no input: give JSONL files, --source, or --config with inputs\n"),
        (["build", "{data}", "--source", "a={data}", "-o", "{tmp}/o"], 2,
         "Error: give INPUT files or --source options, not both\n"),
        (["build", "{data}"], 1, "error: no output directory: pass --output DIR or set 'output' in the config\n"),
        (["build", "{tmp}/none.jsonl", "-o", "{tmp}/o"], 1,
         "error: input '{tmp}/none.jsonl' matches no file; give JSONL files, directories or glob patterns\n"),
        (["build", "{data}", "-o", "{tmp}/o", "--profile", "gpt"], 2,
         "Error: Invalid value for '--profile': 'gpt' is not one of {profiles}.\n"),  # the registry's, in order
        (["build", "{data}", "-o", "{tmp}/o", "--max-length", "0"], 1,
         "error: 'max_length' must be a positive integer, got 0\n"),
        (["build", "{data}", "-o", "{out}", *OPTS, "--max-length", "512", "-q"], 1,
         "error: {out} holds a different packer build; pass --overwrite to replace it or choose another --output\n"),
        (["build", "{data}", "-o", "{tmp}/o", *OPTS, "--max-reject-fraction", "0.01", "-q"], 3,
         "error: 1 of 13 input records were rejected (7.7% > --max-reject-fraction 0.01); see "
         "{tmp}/o/.packer/encode/*.rejects.jsonl for the reasons, fix the input or the config\n"),
        (["build", "{data}", "-o", "{tmp}/o", *OPTS, "--strict", "-q"], 2,
         "error: {data}:13: malformed_json: Expecting property name enclosed in double quotes at column 2 "
         "(rerun without --strict to reject such records instead of stopping)\n"),
        (["stats", "{tmp}"], 1, "error: {tmp} has no manifest.json: the build did not finish (or this is not a "
                                "packer output). Rerun the same `packer build` command to complete it.\n"),
        (["stats", "{tmp}/nothing"], 2, "Error: Invalid value for 'DIRECTORY': Directory '{tmp}/nothing' does not "
                                        "exist.\n"),
        (["stats", "{out}", "--plot", "{tmp}/s.jpg"], 1, "error: cannot draw {tmp}/s.jpg: name the picture .png, "
                                                         ".svg or .pdf\n"),
        (["stats", "{out}", "--plot", "{data}/s.png"], 1,
         "error: File exists: {data} (set PACKER_DEBUG=1 to see the traceback)\n"),
    ],
)
@pytest.mark.slow
def test_errors_are_one_line_with_documented_exit_codes(built, tmp_path, args, code, message):
    data, out, _ = built
    fill = {"tmp": tmp_path, "data": data, "out": out, "profiles": ", ".join(map(repr, profile_names()))}
    res = CliRunner().invoke(cli, [a.format(**fill) for a in args])
    assert res.exit_code == code
    tail = res.stderr.splitlines(keepends=True)[-1]  # click's usage errors put "Usage:/Try" lines first
    assert tail == message.format(**fill)
    if code != 2 or message.startswith("error:"):
        assert res.stderr == tail  # packer's own errors are exactly one line


def test_errors_are_red_on_a_terminal(built, tmp_path):
    data, _, _ = built
    res = CliRunner().invoke(cli, ["build", str(data)], color=True)
    assert res.exit_code == 1
    assert res.stderr == ("\x1b[31merror: no output directory: pass --output DIR or set 'output' in the config"
                          "\x1b[0m\n")
