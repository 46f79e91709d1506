"""The README and docs/ stay runnable: their commands exist, the short ones run, their links resolve.

- Shell commands in fenced code blocks (and ``nnunet_dro ...`` in inline code) are split into
  commands. The short, side-effect-free ones (``nnunet_dro --help``, ``nnunet_dro SUB --help``,
  ``nnunet_dro trainer-dir``, ``nnunet_dro cleanup-shm --dry-run``) are run; every other
  ``nnunet_dro SUB ...`` must name a sub-command of the parser and only options it has, so a
  renamed sub-command or option breaks this test. nnU-Net commands (``nnUNetv2_train ...``) and
  ``scripts/*.py`` are checked against their ``-h`` output, ``make X`` against the Makefile.
- An option quoted on its own in inline code (`` `--group-by` ``) must belong to one of the
  commands that the same page mentions.
- Trainer names (`` `nnUNetTrainerDRO_beta10` ``, ``-tr NAME``) must be importable classes.
- Python blocks must parse, and their imports must resolve.
- Every relative link (``[text](path#anchor)``) must point to a file, and an anchor to a heading.
- The test command that ``.ci/run`` runs is the one the README states.
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib
import itertools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nnunet_dro.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
#: ``nnunet_dro`` argument lists that are short and change nothing: these are run.
RUNNABLE = {(), ("--help",), ("-h",), ("--version",), ("trainer-dir",), ("cleanup-shm", "--dry-run")}


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {' '.join(self.argv)}"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    text: str


def fenced_blocks(page: Path) -> list[Block]:
    blocks, language, start, body = [], None, 0, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if language is None and stripped.startswith("```"):
            language, start, body = stripped[3:].strip().lower(), number, []
        elif language is not None and stripped.startswith("```"):
            blocks.append(Block(page, start, language, "\n".join(body)))
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def prose(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced code blocks."""
    lines, inside = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((number, line))
    return lines


def inline_code(page: Path) -> list[tuple[int, str]]:
    return [(number, span) for number, line in prose(page) for span in re.findall(r"`([^`]+)`", line)]


def split_commands(text: str) -> list[list[str]]:
    """Shell text -> commands (token lists): continuation lines joined, comments dropped, ``$(...)``
    substitutions taken out as commands of their own, split at ``&&``, ``||``, ``;`` and ``|``, leading
    ``VAR=value`` assignments dropped."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        for inner in re.findall(r"\$\(([^()]*)\)", line):
            commands.extend(split_commands(inner))
        line = re.sub(r"\$\(([^()]*)\)", "SUBSTITUTION", line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in {";", "&&", "||", "|", "&"}:
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    # `VAR=value command ...`: the shell's environment for one command; the command is what is checked
    commands = [list(itertools.dropwhile(lambda token: re.fullmatch(r"[A-Za-z_]\w*=\S*", token), c))
                for c in commands]
    return [c for c in commands if c]


def commands_of(page: Path) -> list[Command]:
    """Every command of the page's shell blocks, and every ``nnunet_dro``/``nnUNetv2_`` command
    quoted in inline code."""
    found = []
    for block in fenced_blocks(page):
        if block.language in SHELL_LANGUAGES:
            found += [Command(page, block.line, tuple(argv)) for argv in split_commands(block.text)]
    for number, span in inline_code(page):
        if re.match(r"(nnunet_dro|nnUNetv2_\w+|python -m nnunet_dro) ", span + " "):
            found += [Command(page, number, tuple(argv)) for argv in split_commands(span)]
        elif re.match(r"scripts/\w+\.py( |$)", span):  # `scripts/x.py --option`: run with python
            found += [Command(page, number, ("python", *argv)) for argv in split_commands(span)]
    return found


def nnunet_dro_argv(argv: tuple[str, ...]) -> tuple[str, ...] | None:
    if argv[:1] == ("nnunet_dro",):
        return argv[1:]
    if argv[:3] in {("python", "-m", "nnunet_dro"), ("python3", "-m", "nnunet_dro")}:
        return argv[3:]
    return None


ALL_COMMANDS = [command for page in DOCS for command in commands_of(page)]
NNUNET_DRO = [(c, nnunet_dro_argv(c.argv)) for c in ALL_COMMANDS if nnunet_dro_argv(c.argv) is not None]


@functools.cache
def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def is_option(token: str) -> bool:
    return token.startswith("-") and token not in {"-", "--"} and not re.fullmatch(r"-[\d.]+", token)


def is_placeholder(token: str) -> bool:
    return token.isupper() or token.startswith("<")


@functools.cache
def help_options(executable: tuple[str, ...]) -> frozenset[str]:
    """The options a command's ``-h`` output names (nnU-Net's commands, scripts/)."""
    result = subprocess.run([*executable, "-h"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, f"{' '.join(executable)} -h failed:\n{result.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", result.stdout))


def executable_of(argv: tuple[str, ...]) -> tuple[tuple[str, ...], int] | None:
    """How to run ``argv``'s command for its ``-h``, and how many tokens of ``argv`` name it; None
    if it is not a command we check (pip, export, ...)."""
    if argv[0].startswith("nnUNetv2_"):
        path = BIN / argv[0]
        assert path.exists(), f"{argv[0]} is not a command of the installed nnunetv2"
        return (str(path),), 1
    python = argv[0] in {"python", "python3"} or argv[0].endswith("/python")
    if python and argv[1:3] == ("-m", "pytest"):
        return (sys.executable, "-m", "pytest"), 3
    if python and len(argv) > 1 and argv[1].startswith("scripts/"):
        assert (ROOT / argv[1]).is_file(), f"{argv[1]} does not exist"
        return (sys.executable, str(ROOT / argv[1])), 2
    return None


def option_names(argv: tuple[str, ...]) -> list[str]:
    return [token.split("=", 1)[0] for token in argv if is_option(token)]


# ----------------------------------------------------------------------------------- commands


def test_the_docs_are_there_and_hold_commands():
    names = {page.name for page in DOCS}
    assert {"README.md", "getting-started.md", "training.md", "evaluation.md", "methods.md"} <= names
    assert len(NNUNET_DRO) >= 10, [str(c) for c, _ in NNUNET_DRO]


@pytest.mark.parametrize("argv", sorted({argv for _, argv in NNUNET_DRO if argv in RUNNABLE
                                         or (len(argv) == 2 and argv[1] in {"-h", "--help"}
                                             and not is_placeholder(argv[0]))}),
                         ids=lambda argv: " ".join(argv) or "(none)")
def test_short_commands_run(argv):
    console_script = BIN / "nnunet_dro"
    prefix = [str(console_script)] if console_script.exists() else [sys.executable, "-m", "nnunet_dro"]
    result = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    # `nnunet_dro` without a sub-command prints the help and exits 2, as argparse does
    assert result.returncode == (2 if argv == () else 0), result.stderr
    assert "Traceback" not in result.stderr
    if argv == ("trainer-dir",):
        assert Path(result.stdout.strip()).is_dir()


@pytest.mark.parametrize("command, argv", NNUNET_DRO, ids=[str(c) for c, _ in NNUNET_DRO])
def test_nnunet_dro_commands_exist_in_the_parser(command, argv):
    if not argv or argv[0].startswith("-"):
        assert set(option_names(argv)) <= {"-h", "--help", "--version"}, command
        return
    if is_placeholder(argv[0]) or argv[0].endswith(":"):  # `nnunet_dro COMMAND -h`, an error message
        return
    assert argv[0] in subparsers(), f"{command}: no sub-command {argv[0]!r} (have {sorted(subparsers())})"
    known = subparsers()[argv[0]]._option_string_actions
    unknown = [name for name in option_names(argv[1:]) if name not in known]
    assert not unknown, f"{command}: {argv[0]} has no option {unknown} (has {sorted(known)})"


OTHER = [c for c in ALL_COMMANDS if nnunet_dro_argv(c.argv) is None]


@pytest.mark.parametrize("command", OTHER, ids=[str(c) for c in OTHER])
def test_other_commands_exist(command):
    argv = command.argv
    if argv[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        targets = re.findall(r"^([\w-]+):", makefile, re.M)
        variables = {arg.split("=")[0] for arg in argv[1:] if "=" in arg}  # make install TORCH_INDEX=...
        assert {arg for arg in argv[1:] if "=" not in arg} <= set(targets), f"{command}: Makefile targets are {targets}"
        assert all(re.search(rf"^{name} \??=", makefile, re.M) for name in variables), f"{command}: no such variable"
        return
    found = executable_of(argv)
    if found is None:  # pip, export, ...: nothing of ours to check
        return
    executable, length = found
    unknown = [name for name in option_names(argv[length:]) if name not in help_options(executable)]
    assert not unknown, f"{command}: {' '.join(argv[:2])} -h names no {unknown}"


def commands_mentioned(page: Path) -> list[tuple[str, ...]]:
    """Each command a page mentions, as the argv prefix naming it."""
    mentioned = []
    for command in commands_of(page):
        argv = nnunet_dro_argv(command.argv)
        if argv is not None and argv and argv[0] in subparsers():
            mentioned.append(("nnunet_dro", argv[0]))
        elif executable_of(command.argv) is not None:
            mentioned.append(command.argv[:executable_of(command.argv)[1]])
    for _, span in inline_code(page):
        if span in subparsers() or (span.startswith("nnunet_dro ") and span.split()[1] in subparsers()):
            mentioned.append(("nnunet_dro", span.split()[1] if " " in span else span))
    return list(dict.fromkeys(mentioned))


def options_of(command: tuple[str, ...]) -> frozenset[str]:
    if command[0] == "nnunet_dro":
        return frozenset(subparsers()[command[1]]._option_string_actions)
    return help_options(executable_of(command)[0])


BARE_OPTIONS = [(page, number, span.split()[0].split("=", 1)[0]) for page in DOCS
                for number, span in inline_code(page) if is_option(span.split()[0])]


@pytest.mark.parametrize("page, number, option", BARE_OPTIONS,
                         ids=[f"{p.relative_to(ROOT)}:{n}: {o}" for p, n, o in BARE_OPTIONS])
def test_options_named_in_prose_belong_to_a_command_of_the_page(page, number, option):
    mentioned = commands_mentioned(page)
    # cheap ones first: nnunet_dro's own parsers, then nnU-Net's -h (a few seconds each)
    for command in sorted(mentioned, key=lambda c: c[0] != "nnunet_dro"):
        if option in options_of(command):
            return
    pytest.fail(f"{page.relative_to(ROOT)}:{number}: {option} is an option of none of "
                f"{[' '.join(c) for c in mentioned]}")


# ----------------------------------------------------------------------------- trainers, Python

TRAINERS = sorted({(page, name) for page in DOCS for _, span in inline_code(page)
                   for name in re.findall(r"^(nnUNetTrainer\w*)$", span)}
                  | {(c.page, c.argv[i + 1]) for c in ALL_COMMANDS for i, token in enumerate(c.argv[:-1])
                     if token == "-tr" and c.argv[i + 1].startswith("nnUNetTrainer")})


@pytest.mark.parametrize("page, name", TRAINERS, ids=[f"{p.name}: {n}" for p, n in TRAINERS])
def test_trainer_names_are_classes(page, name):
    training = importlib.import_module("nnunet_dro.training")
    budget = importlib.import_module("nnunet_dro.lab.budget")
    lab_variants = importlib.import_module("nnunet_dro.lab.variants")  # the ablation arms
    if name == "nnUNetTrainer":
        return
    assert any(hasattr(module, name) for module in (training, budget, lab_variants)), \
        f"{page.name}: no trainer class {name}"


PYTHON_BLOCKS = [b for page in DOCS for b in fenced_blocks(page) if b.language == "python"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"{b.page.name}:{b.line}" for b in PYTHON_BLOCKS])
def test_python_blocks_parse_and_their_imports_resolve(block):
    tree = ast.parse(block.text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            missing = [alias.name for alias in node.names if not hasattr(module, alias.name)]
            assert not missing, f"{block.page.name}:{block.line}: {node.module} has no {missing}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


# ------------------------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for _, line in prose(page) if re.match(r"#{1,6} ", line)}


LINKS = [(page, number, target) for page in DOCS for number, line in prose(page)
         for target in re.findall(r"\]\(([^)\s]+)\)", line) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page, number, target", LINKS,
                         ids=[f"{p.relative_to(ROOT)}:{n}: {t}" for p, n, t in LINKS])
def test_relative_links_resolve(page, number, target):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    where = f"{page.relative_to(ROOT)}:{number}"
    assert file.exists(), f"{where}: {target} does not exist"
    assert ROOT in file.parents or file == ROOT, f"{where}: {target} leaves the repository"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), f"{where}: {file.name} has no heading #{anchor}"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [page.name for page in DOCS[1:] if f"(docs/{page.name})" not in readme]
    assert not unlinked, f"README links no {unlinked}"


def test_ci_runs_the_test_command_the_readme_states():
    """.ci/run's first pytest target is the README's `make test` (the product's suite); the lab's
    tier, `make test-lab`, comes after it."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    assert ci, ".ci/run runs nothing"
    makefile = (ROOT / "Makefile").read_text()
    runs_pytest = [line for line in ci if line.startswith("make ")  # $(PYTEST) or a plain pytest
                   and re.search(rf"^{line.split()[-1]}:.*\n\t.*pytest", makefile, re.M | re.I)]
    readme_commands = {" ".join(c.argv) for c in commands_of(ROOT / "README.md")}
    assert runs_pytest == ["make test", "make test-lab"], f".ci/run runs the tests as {runs_pytest}"
    assert "make test" in readme_commands, f"the README states {readme_commands}"
