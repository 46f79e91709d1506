"""What the option tables and command lists of the docs say about the command line (issue 80 item
12): the list of sub-commands in getting-started.md names every sub-command, and no data page
describes ``-d`` as the dataset a command writes (that is ``--id``; ``-d`` is the input dataset in
every command, a deprecated spelling only where it once meant the output)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from nnunet_dro.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_getting_started_lists_every_subcommand():
    text = (ROOT / "docs" / "getting-started.md").read_text()
    sentence = re.search(r"with the sub-commands(.*?)\(`nnunet_dro COMMAND -h`", text, re.S)
    assert sentence, "the sentence listing the sub-commands is gone"
    listed = set(re.findall(r"`([a-z0-9-]+)`", sentence.group(1)))
    assert listed == _subcommands(), (sorted(_subcommands() - listed), sorted(listed - _subcommands()))


@pytest.mark.parametrize("page", ["feta.md", "brats2019.md", "synthetic.md"])
def test_data_pages_name_id_for_the_dataset_written(page):
    text = (ROOT / "data_docs" / page).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `-d")]
    assert rows == [], rows  # an option row for -d as the dataset written
    assert "| `--id ID` |" in text
