"""The product's functions take at most ``MAX_PARAMETERS`` parameters (issue 81): a longer list
is a group of values that travel together and belong in one frozen, validated object (the
pattern of ``PredictionSettings``, ``ExportRequest``, ``CohortSpec``...), which a caller builds
once and a reader sees named. Read from the source with ``ast`` (every ``def``, nested ones and
methods included) so a new long signature fails here. The lab (``nnunet_dro/lab/``) measures the
product and is outside this rule."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nnunet_dro"
LAB = PACKAGE / "lab"
MAX_PARAMETERS = 8
#: {qualified name ("module:Class.function"): why an object is the wrong shape there}; a name
#: here must still exist and still be over the limit (test_the_allowlist_is_current)
ALLOWED: dict[str, str] = {}


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    """Positional (incl. positional-only), keyword-only, ``*args`` and ``**kwargs`` (one each);
    the first parameter of a method (``self``/``cls``) is not counted unless it is a staticmethod."""
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    if in_class and not static and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def functions_in(source: str, module: str) -> dict[str, int]:
    """``{"module:Outer.name": parameter count}`` of every function defined in ``source``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found[f"{module}:{name}"] = parameter_count(child, in_class)
                visit(child, name + ".", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", True)
            else:
                visit(child, prefix, in_class)

    visit(ast.parse(source), "", False)
    return found


def functions_of(path: Path) -> dict[str, int]:
    return functions_in(path.read_text(), ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))


PRODUCT = sorted(p for p in PACKAGE.rglob("*.py") if LAB not in p.parents)
FUNCTIONS = {name: count for path in PRODUCT for name, count in functions_of(path).items()}


def test_the_walk_sees_the_product():
    """A walk that found nothing would pass the rule vacuously."""
    assert len(FUNCTIONS) > 500 and "nnunet_dro.cli:main" in FUNCTIONS
    assert not any(name.startswith("nnunet_dro.lab.") for name in FUNCTIONS)


def test_no_product_function_takes_more_than_the_limit():
    over = sorted(f"{name} ({count})" for name, count in FUNCTIONS.items()
                  if count > MAX_PARAMETERS and name not in ALLOWED)
    assert not over, f"more than {MAX_PARAMETERS} parameters (group them in a frozen dataclass): {over}"
    stale = sorted(name for name in ALLOWED if FUNCTIONS.get(name, 0) <= MAX_PARAMETERS)
    assert not stale, f"ALLOWED names a function that is gone or within the limit: {stale}"


def test_the_walk_names_methods_and_nested_functions():
    source = ("class A:\n    def m(self, a, b, c, d, e, f, g, h, i): pass\n"
              "def outer(x):\n    def inner(a, b): pass\n")
    assert functions_in(source, "pkg.mod") == {"pkg.mod:A.m": 9, "pkg.mod:outer": 1, "pkg.mod:outer.inner": 2}


@pytest.mark.parametrize("source, in_class, expected", [
    ("def f(a, b, /, c, *args, d, e=1, **kw): pass", False, 7),
    ("def f(self, a): pass", True, 1),
    ("def f(cls, a): pass", True, 1),
    ("@staticmethod\ndef f(self, a): pass", True, 2),
    ("def f(self, a): pass", False, 2),
    ("async def f(*, a, b): pass", False, 2),
])
def test_parameter_count(source, in_class, expected):
    assert parameter_count(ast.parse(source).body[0], in_class) == expected
