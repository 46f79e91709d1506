"""One command-line convention, nnU-Net's where nnU-Net has one (docs/getting-started.md, "Command-line
conventions"), checked on every sub-command's ``--help`` as a user reads it:

- ``-d`` is the *input* dataset, an ID or a name (as ``nnUNetv2_train`` / ``nnUNetv2_predict``); the
  dataset a command writes is ``--id``;
- ``-i`` is an input folder, ``-o`` the output; ``-tr``, ``-c``, ``-p``, ``-f``, ``-chk`` as nnU-Net;
- ``-np`` is a positive number of processes with one default everywhere (``nnUNet_def_n_proc`` or 8);
- every option the help text mentions exists in that command (``exclude-cases -h`` used to mention a
  ``--kind`` it lacks).
"""
from __future__ import annotations

import argparse
import re

import pytest

from nnunet_dro.cli import build_parser
from nnunet_dro.commands.arg_types import positive_int

NNUNET_DESTS = {"-tr": ("trainer", "trainers"), "-c": ("configuration", "configurations"), "-p": ("plans",),
                "-f": ("folds",), "-chk": ("checkpoint", "checkpoints")}
# options of other programs that a help text may name (nnU-Net's, another sub-command's)
FOREIGN = re.compile(r"(nnUNetv2_\w+|audit-labels|exclude-cases|evaluate|nnunet_dro \w[\w-]*)\s[^;()]*$")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


COMMANDS = sorted(subparsers())


@pytest.mark.parametrize("command", COMMANDS)
def test_help_follows_the_convention(command):
    parser = subparsers()[command]
    help_text = parser.format_help()
    options = parser._option_string_actions
    if "-d" in options:
        action = options["-d"]
        assert action.metavar == "DATASET" and "ID or name" in action.help, (command, action.help)
    if "--id" in options:
        assert "of the dataset written" in options["--id"].help
    if "-i" in options:
        action = options["-i"]
        assert action.metavar.endswith(("_DIR", "IMAGES")) and "folder" in action.help, (command, action.metavar)
    if "-np" in options:
        action = options["-np"]
        assert action.type is positive_int and action.default is None and action.metavar == "N", command
        assert action.help.endswith("Default: nnUNet_def_n_proc or 8"), (command, action.help)
    for option, dests in NNUNET_DESTS.items():
        if option in options:
            assert options[option].dest in dests, (command, option, options[option].dest)
    mentioned = set()
    for line in help_text.splitlines():
        for match in re.finditer(r"(?<![\w$/-])(--?[a-z][a-z0-9_-]*[a-z0-9])\b", line):
            before = line[:match.start()]
            if not FOREIGN.search(before):
                mentioned.add(match.group(1))
    unknown = sorted(m for m in mentioned if m not in options)
    assert not unknown, f"{command} -h mentions options it lacks: {unknown}"


def test_every_np_has_one_default(monkeypatch):
    defaults = {c: p._option_string_actions["-np"].default for c, p in subparsers().items()
                if "-np" in p._option_string_actions}
    assert set(defaults) >= {"evaluate", "ensemble", "audit-labels", "jtt"} and set(defaults.values()) == {None}


@pytest.mark.parametrize("command", [["make-synthetic", "-d", "990"], ["convert-feta", "feta", "-d", "201"],
                                     ["convert-brats19", "brats", "-d", "219"]])
def test_the_dataset_written_is_named_by_id_only(capsys, command):
    """``-d`` names an input dataset; a command that writes one takes its ID as ``--id`` only."""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(command)
    assert stop.value.code == 2 and "required: --id" in capsys.readouterr().err
    assert build_parser().parse_args([c if c != "-d" else "--id" for c in command]).dataset_id == int(command[-1])


def test_input_dataset_accepts_id_or_name():
    for value in ("990", "Dataset990_FeTA"):
        args = build_parser().parse_args(["ensemble", "-d", value, "-i", "imgs", "-o", "out", "-tr", "nnUNetTrainer"])
        assert args.dataset_id == 990
    assert build_parser().parse_args(["jtt", "-pred", "ERM=folder", "-o", "w.tsv"]).pred == "ERM=folder"
