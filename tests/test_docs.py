"""Docs that cannot drift: docs/cli.md is the commands' --help (like `cog --check`), docs/models/README.md is the
profile registry, every registered family has its page, and every test and module the docs name exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from packer.cli import cli

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
gen_cli_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_cli_docs)
_spec = importlib.util.spec_from_file_location("gen_model_docs", REPO / "scripts" / "gen_model_docs.py")
gen_model_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_model_docs)

TEST_REF = re.compile(r"tests/((?:\w+/)*test_\w+\.py)::(test_\w+)")
MODULE_PATH = re.compile(r"\bpacker/[\w/]*\.py\b")
DOTTED = re.compile(r"\bpacker(?:\.[A-Za-z_]\w*)+")
# The pages that must stay true of today's code. docs/benchmarks-log.md is history: the tests and modules it
# names were those of the day, and may since have moved.
DOCS = sorted(p for p in [*(REPO / "docs").glob("*.md"), *(REPO / "docs" / "models").glob("*.md")]
              if p.name != "benchmarks-log.md")


def test_cli_md_is_up_to_date():
    expected = gen_cli_docs.render()
    assert (REPO / "docs" / "cli.md").read_text() == expected, (
        "docs/cli.md is out of date: run `python scripts/gen_cli_docs.py` and commit docs/cli.md")
    assert gen_cli_docs.main(["--check"]) == 0


def test_cli_md_has_every_command_and_exit_code():
    text = (REPO / "docs" / "cli.md").read_text()
    for name in cli.commands:
        assert f"\n## packer {name}\n\n```text\n$ packer {name} --help\nUsage: packer {name} " in text
    for code in (0, 1, 2, 3, 4, 130):
        assert f"\n| {code} | " in text


def test_check_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "cli.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(gen_cli_docs, "DOC", stale)
    monkeypatch.setattr(gen_cli_docs, "REPO", tmp_path)
    assert gen_cli_docs.main(["--check"]) == 1
    assert capsys.readouterr().err == "cli.md is out of date: run `python scripts/gen_cli_docs.py`\n"
    assert gen_cli_docs.main([]) == 0 and gen_cli_docs.main(["--check"]) == 0


def test_models_md_is_up_to_date():
    expected = gen_model_docs.render()
    assert (REPO / "docs" / "models" / "README.md").read_text() == expected, (
        "docs/models/README.md is out of date: run `python scripts/gen_model_docs.py` and commit it")
    assert gen_model_docs.main(["--check"]) == 0


def test_models_check_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "models" / "README.md"
    monkeypatch.setattr(gen_model_docs, "DOC", stale)
    monkeypatch.setattr(gen_model_docs, "REPO", tmp_path)
    assert gen_model_docs.main(["--check"]) == 1
    assert capsys.readouterr().err == "models/README.md is out of date: run `python scripts/gen_model_docs.py`\n"
    assert gen_model_docs.main([]) == 0 and gen_model_docs.main(["--check"]) == 0


def test_every_family_has_a_page_and_every_page_a_family():
    from packer.models import family_of, get_profile, profile_names

    families = {family_of(get_profile(name)) for name in profile_names()}
    pages = {p.stem for p in (REPO / "docs" / "models").glob("*.md")} - {"README"}
    assert not families - pages, f"registered families without a page docs/models/<family>.md: {families - pages}"
    assert not pages - families, f"docs/models/ has pages for no registered family: {pages - families}"
    index = (REPO / "docs" / "models" / "README.md").read_text()
    for family in families:
        assert f"]({family}.md)" in index


def test_a_profiles_family_is_its_package():
    from packer.models import family_of, get_profile

    assert family_of(get_profile("qwen3-vl")) == "qwen_vl" and family_of(get_profile("llava-onevision")) == "llava_onevision"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO / "docs").as_posix())
def test_named_modules_exist(doc):
    """Every `packer/....py` file and `packer.module.name` a page names exists (docs/format.md once named
    modules that had moved)."""
    text = doc.read_text()
    missing = sorted({m for m in MODULE_PATH.findall(text) if not (REPO / m).exists()})
    for dotted in sorted(set(DOTTED.findall(text))):
        parts = dotted.split(".")
        obj, k = None, len(parts)
        while k and obj is None:
            try:
                obj = importlib.import_module(".".join(parts[:k]))
            except ImportError:
                k -= 1
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                missing.append(dotted)
                break
            obj = getattr(obj, attr)
    assert not missing, f"{doc.name} names modules or objects that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO / "docs").as_posix())
def test_named_tests_exist(doc):
    refs = TEST_REF.findall(doc.read_text())
    if doc.name == "pitfalls.md":
        assert len(refs) >= 25  # every pitfall names its proof
    missing = []
    for file, name in refs:
        path = REPO / "tests" / file
        if not path.exists() or not re.search(rf"^def {name}\(", path.read_text(), flags=re.M):
            missing.append(f"tests/{file}::{name}")
    assert not missing, f"{doc.name} names tests that do not exist: {missing}"
