"""docs/training.md's trainer recipes run as written: every code block marked ``<!-- recipe: NAME -->`` is
extracted from the page and run in a directory holding what the page says it holds (``my_model/``: a tiny Llama
saved with the builtin tokenizer; ``my_shards/``, ``my_trees/``, ``my_pairs/``: real builds). A Python recipe with
``file=X`` is written to X and started by the recipe's ``run`` block (``torchrun``, ``accelerate launch``, 2
processes on CPU); any other Python recipe runs as ``python recipe.py``. A recipe that drifts from the code fails
here."""

from __future__ import annotations

import os
import re
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


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_runs_as_written(workdir, name, tmp_path):
    recipe = RECIPES[name]
    run = tmp_path / "run"
    run.mkdir()
    for item in workdir.iterdir():
        (run / item.name).symlink_to(item)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"), "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO)}
    if recipe["file"]:
        (run / recipe["file"]).write_text(recipe["code"] + "\n")
        cmd = ["bash", "-c", recipe["run"]]
    else:
        (run / "recipe.py").write_text(recipe["code"] + "\n")
        cmd = [sys.executable, "recipe.py"]
    result = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
