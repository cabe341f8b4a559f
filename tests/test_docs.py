"""Docs that cannot drift: docs/cli.md is the commands' --help (like `cog --check`), and every test that
docs/*.md names as proof exists."""

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

TEST_REF = re.compile(r"tests/((?:\w+/)?test_\w+\.py)::(test_\w+)")


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


@pytest.mark.parametrize("doc", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
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
