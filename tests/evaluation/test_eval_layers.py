"""The evaluation's imports: no cycle between its modules, nothing from training, sampling,
weighting or workflows (every import counts, also those inside functions or TYPE_CHECKING)."""
from __future__ import annotations

import ast
from pathlib import Path

import nnunet_dro.evaluation

PACKAGE = Path(nnunet_dro.evaluation.__file__).parent
FORBIDDEN = ("nnunet_dro.training", "nnunet_dro.sampling", "nnunet_dro.weighting", "nnunet_dro.workflows",
             "nnunet_dro.commands")


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


MODULES = {f"nnunet_dro.evaluation.{p.stem}": imports_of(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def test_no_import_of_training_sampling_weighting_workflows():
    bad = {m: sorted(i for i in names if i.startswith(FORBIDDEN)) for m, names in MODULES.items()}
    assert not {m: b for m, b in bad.items() if b}


def test_no_import_cycle_between_evaluation_modules():
    graph = {m: {i for i in names if i in MODULES and i != m} for m, names in MODULES.items()}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(n == target or (n not in seen and reaches(n, target, seen | {n})) for n in graph[start])

    cycles = sorted(m for m in graph if reaches(m, m, {m}))
    assert not cycles, f"modules on an import cycle: {cycles}"
    assert "nnunet_dro.evaluation.api" not in graph["nnunet_dro.evaluation.reports"]
