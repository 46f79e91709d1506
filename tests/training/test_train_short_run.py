"""One short-run mechanism: every test-sized or budget trainer of the repository is a ``ShortRun``
(``nnunet_dro.training.short_run``), sized by the one variable ``nnUNet_dro_short_run``; no other
code sets a trainer's epochs or iterations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from nnunet_dro.training.short_run import SHORT_RUN_ENV, short_run_sizes, short_run_value

ROOT = Path(__file__).resolve().parents[2]


def test_no_other_code_sets_a_trainers_epochs_or_iterations():
    files = [p for part in ("nnunet_dro", "scripts", "tests") for p in (ROOT / part).rglob("*.py")]
    setting = re.compile(r"\bself\.num_(epochs|iterations_per_epoch|val_iterations_per_epoch)\s*=")
    found = sorted(str(p.relative_to(ROOT)) for p in files if setting.search(p.read_text()))
    assert found == ["nnunet_dro/training/short_run.py"], found


@pytest.mark.parametrize("epochs, iterations, validation", [(1, None, None), (None, 4, None), (3, 2, 1)])
def test_the_value_reads_back_as_written(epochs, iterations, validation):
    defaults = (7, 8, 9)
    expected = tuple(d if v is None else v for v, d in zip((epochs, iterations, validation), defaults))
    assert short_run_sizes(short_run_value(epochs, iterations, validation), defaults) == expected


@pytest.mark.parametrize("text", ["a", "1x2x3x4", "-1", "1x0", "1.5"])
def test_a_bad_value_names_the_variable(text):
    with pytest.raises(RuntimeError, match=SHORT_RUN_ENV):
        short_run_sizes(text, (1, 1, 1))
