"""The layout is a contract (docs/architecture.md): which package may import which, no import cycles, and the
light entry points (``import packer``, ``packer stats``, ``packer inspect``, ``packer verify``) never import torch (nor transformers, nor ray).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "packer"

# package -> the packer packages it may import (lazily inside a function too). docs/architecture.md draws it.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "core": {"errors"},
    "media": {"errors", "core"},
    "formats": {"errors", "core"},
    "models": {"errors", "core", "media"},
    "encode": {"errors", "core", "models", "media"},
    "packing": {"errors", "core"},  # core.media: the budgets the media declare
    "shards": {"errors", "core", "config"},  # the manifest records the BuildConfig
    "config": {"errors", "packing", "encode", "models", "formats"},  # formats: dataset_info.json entries
    "pipeline": {"errors", "config", "core", "formats", "media", "models", "encode", "packing", "shards", "report"},
    "report": {"errors", "config", "core", "formats", "models", "encode", "packing", "shards"},
    "train": {"errors", "core", "media", "models", "shards",
              "config", "formats", "encode", "packing"},  # online.py: JSONL packed in the DataLoader
    "cli": {"errors", "config", "core", "models", "encode", "packing", "pipeline", "report", "shards"},
    "__init__": {"errors", "config", "packing", "pipeline", "train", "report"},
}
# train/'s parts (docs/architecture.md, "train/"): data/ (rows to batches) and attention/ (a packed row through a
# model) stand apart, trainers/ (loss, trainers) uses both; keys.py and options.py are shared by all three.
TRAIN_ALLOWED: dict[str, set[str]] = {
    "keys": set(),
    "options": set(),
    "data": {"keys", "options"},
    "attention": {"keys", "options"},
    "trainers": {"data", "attention", "keys", "options"},
    "__init__": set(),
}


@cache  # read once per test process: the tests below walk every module's imports, each asking for the others
def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(REPO).with_suffix("").parts): p for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per test process (nothing here changes a tree)."""
    return ast.parse(path.read_text())


def _import_nodes(tree: ast.AST, *, top_level_only: bool, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run: at the top level (``top_level_only``) or anywhere, never inside an
    ``if TYPE_CHECKING:`` block (those are for the type checker and never run) unless ``type_checking``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                for other in child.body if type_checking else ():
                    visit(ast.Module(body=[other], type_ignores=[]), top)
                for other in child.orelse:
                    visit(other, top)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if top or not top_level_only:
                    out.append(child)
            elif not top_level_only or not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    visit(tree, True)
    return out


def _families() -> tuple[str, ...]:
    """``packer.models.FAMILIES``: the family packages the registry imports by name (import_module)."""
    tree = _tree(PACKAGE / "models" / "__init__.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAMILIES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("packer/models/__init__.py defines no FAMILIES")


def _imports(path: Path, module: str, *, top_level_only: bool, type_checking: bool = False) -> set[str]:
    """The packer modules ``module`` imports (absolute or relative), at its top level or anywhere (imports under
    ``if TYPE_CHECKING:`` never run and count only with ``type_checking``). ``packer.models`` imports its
    ``FAMILIES`` by name."""
    tree = _tree(path)
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _import_nodes(tree, top_level_only=top_level_only, type_checking=type_checking):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "packer"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "packer":
                continue
            found.add(name)
            found |= {f"{name}.{a.name}" for a in node.names}  # `from packer import cli` imports a module
    if module == "packer.models":
        found |= {f"packer.models.{f}" for f in _families()}
    modules = _modules()
    return {m for m in found if m in modules and m != module}


def _area(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_every_package_is_in_the_contract():
    areas = {_area(m) for m in _modules()}
    assert areas <= set(ALLOWED), f"packages missing from ALLOWED (and docs/architecture.md): {areas - set(ALLOWED)}"


@pytest.mark.slow
def test_packages_import_only_what_the_layering_allows():
    bad = []
    for module, path in _modules().items():
        area = _area(module)
        for imported in _imports(path, module, top_level_only=False):
            other = _area(imported)
            if other != area and other not in ALLOWED[area] and other != "__init__":
                bad.append(f"{module} imports {imported}")
    assert not bad, "imports that cross the layering of docs/architecture.md:\n" + "\n".join(bad)


def _train_part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 2 else parts[2]


def test_train_parts_import_only_what_the_cut_allows():
    modules = {m: p for m, p in _modules().items() if m.startswith("packer.train")}
    assert {_train_part(m) for m in modules} == set(TRAIN_ALLOWED), "a train/ part missing from TRAIN_ALLOWED"
    bad = []
    for module, path in modules.items():
        part = _train_part(module)
        for imported in _imports(path, module, top_level_only=False):
            other = _train_part(imported) if imported.startswith("packer.train") else None
            if other not in (None, part) and other not in TRAIN_ALLOWED[part]:
                bad.append(f"{module} imports {imported}")
    assert not bad, "imports across train/'s parts that docs/architecture.md does not allow:\n" + "\n".join(bad)


def _cycles(top_level_only: bool) -> list[str]:
    modules = _modules()
    graph = {m: _imports(p, m, top_level_only=top_level_only) for m, p in modules.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if n.startswith(m + "."):  # a package importing its own submodule is not a cycle
                continue
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]) if n in stack else f"{m} -> {n}")
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_import_cycles():
    """No cycle among packer's modules, counting every import that runs: inside functions too (a lazy import is
    a cycle that waits for its first call), not ``if TYPE_CHECKING:`` ones."""
    cycles = _cycles(top_level_only=False)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _simple_cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every elementary cycle of ``graph``, each once, written from its smallest module: for each module s, the
    paths back to s through modules after s only (a few dozen edges are involved: no need for Johnson's)."""
    out: set[tuple[str, ...]] = set()
    for s in sorted(graph):
        stack = [(s, [s])]
        while stack:
            m, path = stack.pop()
            for n in graph[m]:
                if n == s:
                    out.add(tuple(path))
                elif n > s and n not in path:
                    stack.append((n, [*path, n]))
    return out


# Cycles that `if TYPE_CHECKING:` imports close and that are allowed: none (issue 31 removed the last, in
# packer/models/). An entry that no longer exists fails the test too, so that the set only shrinks.
TYPE_CHECKING_CYCLES_ALLOWED: set[tuple[str, ...]] = set()


def test_no_cycles_behind_type_checking():
    """No cycle among packer's modules even counting the imports under ``if TYPE_CHECKING:``: such an import
    hides a cycle the code still has (a stage that needs its orchestrator's type is a stage reaching into it).
    ``test_no_import_cycles`` proves the imports that run have none, so each cycle here needs one of those."""
    modules = _modules()
    graph = {m: {n for n in _imports(p, m, top_level_only=False, type_checking=True) if not n.startswith(m + ".")}
             for m, p in modules.items()}  # a package importing its own submodule is not a cycle
    cycles = _simple_cycles(graph)
    new = sorted(" -> ".join((*c, c[0])) for c in cycles - TYPE_CHECKING_CYCLES_ALLOWED)
    gone = sorted(" -> ".join((*c, c[0])) for c in TYPE_CHECKING_CYCLES_ALLOWED - cycles)
    assert not new, "import cycles closed by `if TYPE_CHECKING:` imports:\n" + "\n".join(new)
    assert not gone, ("these allowed cycles no longer exist; remove them from TYPE_CHECKING_CYCLES_ALLOWED:\n"
                      + "\n".join(gone))


def test_a_family_imports_no_other_family():
    """A family package imports the shared parts (base, reader, proof, registry, shared/) and itself; what two
    families share lives in models/shared/, so adding or changing one family touches one package."""
    families = set(_families())
    bad = []
    for module, path in _modules().items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "models":
            continue
        own = parts[2] if parts[2] in families else None
        for imported in _imports(path, module, top_level_only=False):
            other = imported.split(".")
            if len(other) >= 3 and other[1] == "models" and other[2] in families and other[2] != own:
                if module != "packer.models":  # the registry's package imports them all
                    bad.append(f"{module} imports {imported}")
    assert not bad, "cross-family imports:\n" + "\n".join(bad)


def _heavy_modules(code: str) -> dict[str, bool]:
    probe = code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in ('torch', 'transformers', 'ray')}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_packer_is_light():
    assert _heavy_modules("import packer") == {"torch": False, "transformers": False, "ray": False}


@pytest.mark.parametrize("name", ["build", "BuildConfig", "plan", "PackedDataset", "collate", "packed_cross_entropy",
                                  "use_packed_attention", "verify_build"])
def test_public_api_is_lazy_and_complete(name):
    import packer

    assert name in packer.__all__ and name in dir(packer)
    assert callable(getattr(packer, name))


def test_cli_help_is_light():
    code = "from click.testing import CliRunner\nfrom packer.cli import cli\nCliRunner().invoke(cli, ['--help'])"
    assert _heavy_modules(code) == {"torch": False, "transformers": False, "ray": False}


def test_the_build_side_of_every_family_is_light():
    """Every profile, its media runs and the encoder load without torch or transformers: a family's reader and
    proof (reader.py, proof.py, where torch lives) load only when asked for."""
    code = ("from packer.models import get_profile, profile_names\nfrom packer.encode.encoder import Encoder\n"
            "import packer.encode.media, packer.encode.lengths\n"
            "profiles = [get_profile(n) for n in profile_names()]\n"
            "[p.media_runs([], __import__('numpy').array([-1])) for p in profiles]")
    assert _heavy_modules(code) == {"torch": False, "transformers": False, "ray": False}


def test_verify_asks_the_family_in_one_module():
    """verify's checks reach the model family only through ``report/verify/family.py`` (the one module to re-point
    when the family protocol changes): elsewhere in the package a profile is passed along and named, never asked."""
    asked = []
    for path in sorted((PACKAGE / "report" / "verify").glob("*.py")):
        if path.name == "family.py":
            continue
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Attribute) and node.attr != "name"
                    and (getattr(node.value, "id", None) == "profile" or getattr(node.value, "attr", None) == "profile")):
                asked.append(f"{path.name}:{node.lineno} profile.{node.attr}")
    assert not asked, "family hooks called outside report/verify/family.py:\n" + "\n".join(asked)
