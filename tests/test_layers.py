"""The package's import layers: each subpackage imports only the layers below it (never upward),
no two modules import each other in a circle, and the lab (``nnunet_dro.lab``: the benchmark,
its CPU-budget trainers, the experiments) imports the product while no part of the product
imports the lab. Read from the source (every ``import`` and
``from ... import`` of ``nnunet_dro``, also inside functions), so a new upward arrow fails here
before it tangles the architecture."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nnunet_dro"
#: layer of each top-level part (a part may import any part of a lower layer, and itself)
LAYERS = {
    "__init__": 0, "errors": 0,
    "atomic": 1, "tables": 1, "processes": 1,
    "sampling": 2, "data": 2,
    "weighting": 3, "evaluation": 3,
    "discovery": 4,  # imports evaluation, data, tables; never training or workflows
    "training": 4,
    "ext_trainers": 5,
    "workflows": 6,
    "lab": 7,
    "commands": 8,
    "cli": 9, "__main__": 10,
}
LAB = "lab"
#: product modules allowed to import the lab, and why: ``nnunet_dro demo`` is the lab's one
#: command (it runs the benchmark's pipeline on a small cohort), imported when it runs
PRODUCT_INTO_LAB = {"nnunet_dro.commands.demo": "the demo command runs the lab's pipeline"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("nnunet_dro"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("nnunet_dro"))
    return found


GRAPH = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_part_has_a_layer():
    assert {part_of(m) for m in GRAPH} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_upward_import(module):
    mine = LAYERS[part_of(module)]
    upward = sorted(t for t in GRAPH[module] if part_of(t) != part_of(module) and LAYERS[part_of(t)] >= mine)
    assert not upward, f"{module} (layer {mine}) imports {upward}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if part_of(m) != LAB))
def test_the_product_does_not_import_the_lab(module):
    into_lab = sorted(t for t in GRAPH[module] if part_of(t) == LAB)
    assert not into_lab or module in PRODUCT_INTO_LAB, f"{module} (product) imports the lab: {into_lab}"


def test_the_lab_is_above_every_product_part_it_uses():
    assert LAYERS[LAB] > max(LAYERS[part_of(t)] for m in GRAPH if part_of(m) == LAB for t in GRAPH[m]
                             if part_of(t) != LAB)


def _nnunet_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nnunetv2":
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "nnunetv2"]
    return found


@pytest.mark.parametrize("path", sorted(p for part in ("workflows", "commands") for p in (PACKAGE / part).rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_workflows_and_commands_reach_nnunet_through_its_cli_or_nnunet_compat(path):
    """nnU-Net's internals are named in ``training/nnunet_compat.py`` only (where an upgrade is checked)."""
    assert not _nnunet_imports(path), f"{path.relative_to(PACKAGE)} imports {_nnunet_imports(path)}"


def test_no_import_cycle_between_modules():
    known = set(GRAPH)

    def resolve(target: str) -> str | None:  # "pkg.mod.Name" -> the module it names
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    edges = {m: {r for t in ts if (r := resolve(t)) and r != m and not m.startswith(r + ".")} for m, ts in GRAPH.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])


SCRIPTS = sorted((PACKAGE.parent / "scripts").glob("*.py")) + sorted((PACKAGE.parent / "tests").rglob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_scripts_import_the_installed_package_without_editing_sys_path(path):
    """A script that puts the repository on ``sys.path`` imports whatever checkout it sits in, not
    the package that is installed (and tested); what a script shares lives in the package. Tests
    share their helpers through pytest's ``pythonpath`` (pyproject.toml), not by editing it."""
    edits = [node.lineno for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr in ("insert", "append", "extend")
             and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
             and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"]
    assert not edits, f"{path.relative_to(PACKAGE.parent)} edits sys.path (line {edits[0]}); import nnunet_dro as installed"
