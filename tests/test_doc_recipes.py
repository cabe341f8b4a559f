"""docs/training.md's trainer recipes run as written: every code block marked ``<!-- recipe: NAME -->`` is
extracted from the page and run in a directory holding what the page says it holds (``my_model/``: a tiny Llama
saved with the builtin tokenizer; ``my_shards/``, ``my_trees/``, ``my_pairs/``: real builds). A Python recipe with
``file=X`` is written to X and started by the recipe's ``run`` block (``torchrun``, ``accelerate launch``, 2
processes on CPU); any other Python recipe runs as ``python recipe.py`` would, as ``__main__`` of a process of its
own in its directory, forked from one interpreter per test worker that imported torch, transformers, datasets and
TRL once (``_RUNNER``: those imports are most of a recipe's seconds; the recipe's own code, its model, data and
trainer start from nothing in each). A recipe that drifts from the code fails here."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.trainer_helpers import A, U, build_jsonl, chats, tiny_llama, trees

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "training.md"
MARKER = re.compile(r"<!-- recipe: (?P<name>[\w-]+)(?P<opts>[^>]*)-->\n```(?P<lang>\w+)\n(?P<code>.*?)\n```", re.S)


def recipes() -> dict[str, dict]:
    """{name: {"code", "file", "run"}} from the page's marked blocks."""
    found: dict[str, dict] = {}
    for m in MARKER.finditer(DOC.read_text()):
        entry = found.setdefault(m["name"], {"code": None, "file": None, "run": None})
        opts = m["opts"].split()
        if "run" in opts:
            entry["run"] = m["code"]
        else:
            entry["code"] = m["code"]
            entry["file"] = next((o.split("=", 1)[1] for o in opts if o.startswith("file=")), None)
    return found


RECIPES = recipes()


def test_the_page_has_a_recipe_per_trainer():
    assert set(RECIPES) == {"trl-sft", "trl-sft-trees", "trl-dpo", "trl-grpo", "hf-trainer", "hf-trainer-weighting",
                            "torchrun", "accelerate"}
    for name in ("torchrun", "accelerate"):
        assert RECIPES[name]["file"] and RECIPES[name]["run"], name


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from packer.encode.tokenizers import load_tokenizer

    root = tmp_path_factory.mktemp("recipes")
    model = tiny_llama()
    model.save_pretrained(root / "my_model")
    load_tokenizer("qwen2-vl").save_pretrained(root / "my_model")
    build_jsonl(root, "my_shards", chats(12), max_length=128)
    build_jsonl(root, "my_trees", chats(6) + trees(5), max_length=128)
    pairs = [{"prompt": [U(f"Question {i}?")], "chosen": [A("A good answer " * (1 + i % 2))],
              "rejected": [A("No.")]} for i in range(6)]
    build_jsonl(root, "my_pairs", pairs, max_length=128)
    _mixed_build(root)
    return root


def _mixed_build(root: Path) -> None:
    """``my_mix/``: two sources, chats with a weighted turn and trees whose prefix carries loss."""
    import json

    from packer.config import BuildConfig
    from packer.pipeline.build import build

    chat = [{"messages": [U(f"q {i}"), {"role": "assistant", "content": "a " * (1 + i % 3), "loss": 0.5 + i % 2}]}
            for i in range(6)]
    tree = [{"messages": [U(f"t {i}"), A("shared"), U("go")], "branches": [[A("x " * (1 + i))], [A("y")]]}
            for i in range(4)]
    for name, recs in (("chat", chat), ("trees", tree)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    build(BuildConfig.from_dict({"sources": [{"name": n, "paths": [str(root / f"{n}.jsonl")]} for n in ("chat", "trees")],
                                 "output": str(root / "my_mix"), "profile": "text", "max_length": 128}), progress=False)


# The runner: imports what the Python recipes import, then for each request (a directory holding recipe.py) forks a
# child that runs the file as ``python recipe.py`` would (``__main__``, its directory first on sys.path, its output
# to stdout.txt / stderr.txt there, atexit handlers run) and answers with the child's exit status. Nothing of a
# recipe outlives its child; the runner itself runs no recipe code. Fork is safe here: the imports start no thread
# (OMP_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false) and nothing has run torch yet. The recipes' environment is the
# runner's (``_env``; datasets read HF_DATASETS_CACHE at import: the runner's directory).
_RUNNER = r"""
import atexit, json, os, runpy, sys, traceback
import datasets, torch, transformers, trl  # noqa: F401  # what the recipes import: once for all of them
import trl.trainer  # noqa: F401
import packer.train.trainers.trainer, packer.train.trainers.trl, packer.train.trl  # noqa: F401
base_path = list(sys.path[1:])
print("ready", flush=True)
for line in sys.stdin:
    run = json.loads(line)["dir"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(run)
            for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
                os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            sys.stdin = open(os.devnull)
            sys.argv = ["recipe.py"]
            sys.path[:] = [run, *base_path]
            try:
                runpy.run_path("recipe.py", run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp / "hf-cache"), "TOKENIZERS_PARALLELISM": "false",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """One runner per test worker (``_RUNNER``), started on the first Python recipe and stopped after the module."""
    tmp = tmp_path_factory.mktemp("runner")
    with open(tmp / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _RUNNER], cwd=tmp, env=_env(tmp), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    first = proc.stdout.readline()
    assert first == "ready\n", first + (tmp / "stderr.txt").read_text()[-6000:]
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def _run_in(runner: subprocess.Popen, run: Path, timeout: float = 600) -> int:
    runner.stdin.write(json.dumps({"dir": str(run)}) + "\n")
    runner.stdin.flush()
    ready, _, _ = select.select([runner.stdout], [], [], timeout)
    assert ready, f"the recipe in {run} ran past {timeout} s"
    return json.loads(runner.stdout.readline())["rc"]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_runs_as_written(workdir, name, tmp_path, request):
    recipe = RECIPES[name]
    run = tmp_path / "run"
    run.mkdir()
    for item in workdir.iterdir():
        (run / item.name).symlink_to(item)
    if recipe["file"]:
        (run / recipe["file"]).write_text(recipe["code"] + "\n")
        result = subprocess.run(["bash", "-c", recipe["run"]], cwd=run, env=_env(tmp_path), capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    else:
        (run / "recipe.py").write_text(recipe["code"] + "\n")
        rc = _run_in(request.getfixturevalue("runner"), run)
        assert rc == 0, (run / "stdout.txt").read_text()[-3000:] + (run / "stderr.txt").read_text()[-6000:]
