"""docs/training.md's variant tables checked against the classes: every trainer a row names
exists, the settings a row states are the class's, and every discovered variant is named on the
page (a new variant file without its line in the docs fails here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import nnunet_dro.training as training
from nnunet_dro.training.variants import VARIANTS
from nnunet_dro.weighting.settings import AdaptiveHardnessSettings, ErrorSetSettings, HardnessSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "training.md"
TEXT = PAGE.read_text()


def table_rows(header: str) -> list[list[str]]:
    """The cells of each row of the table whose header line starts with ``header``."""
    lines = TEXT.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def row_trainers(cell: str) -> list[str]:
    """``nnUNetTrainerX`` / ``_a`` / ``_b`` -> the full names (a ``_suffix`` replaces the first
    name's last suffix group: ``nnUNetTrainerDROAdaptive_f25`` / ``_f50`` -> ..._f50)."""
    names = re.findall(r"`([^`]+)`", cell)
    first = names[0]
    stem = re.match(r"(nnUNetTrainer[A-Za-z]*)", first).group(1)
    return [first] + [stem + n for n in names[1:]]


def numbers(cell: str) -> list[float]:
    head = re.match(r"[\d. /]+", cell)
    return [float(v) for v in head.group(0).split("/") if v.strip()] if head else []


def test_the_fixed_beta_table_states_each_trainers_beta_and_importance_sampling():
    rows = table_rows("| trainer | beta | importance sampling |")
    assert len(rows) >= 7
    for trainer, beta, importance, _ in rows:
        (name,) = row_trainers(trainer)
        cls = getattr(training, name)
        if beta.startswith("ERM"):
            assert not hasattr(cls, "dro_settings"), name
            continue
        settings = cls.dro_settings
        assert type(settings) is HardnessSettings, name
        assert settings.beta == float(beta) and settings.importance.enabled == importance.startswith("on"), name


def test_the_scale_free_table_states_each_trainers_fraction_importance_weights_and_cap():
    rows = table_rows("| trainer | f | importance weights |")
    assert len(rows) >= 4
    for trainer, fraction, importance, cap in rows:
        names = row_trainers(trainer)
        fractions = numbers(fraction)
        assert len(fractions) == len(names), (names, fraction)
        for name, f in zip(names, fractions):
            settings = getattr(training, name).dro_settings
            assert type(settings) is AdaptiveHardnessSettings, name
            assert settings.fraction == f, name
            assert settings.importance.enabled == importance.startswith("on"), name
            assert settings.max_weight == (None if cap.startswith("no cap") else numbers(cap)[0]), name


def test_the_error_set_table_states_each_trainers_fraction_upweight_and_refresh():
    rows = table_rows("| trainer | error set | drawn | chosen |")
    assert len(rows) == 2
    for trainer, fraction, drawn, chosen in rows:
        (name,) = row_trainers(trainer)
        settings = getattr(training, name).dro_settings
        assert type(settings) is ErrorSetSettings, name
        assert settings.error_fraction == numbers(fraction)[0], name
        assert settings.upweight == numbers(drawn)[0], name
        refresh = re.search(r"once more at ([\d.]+) of the epochs", chosen)
        assert settings.refresh_at == (float(refresh.group(1)) if refresh else None), name
        assert "end of the ERM phase" in chosen and settings.uniform_until_learned == 0.2, name


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_is_on_the_page(name):
    named = set(re.findall(r"nnUNetTrainer\w+", TEXT))
    for cell in re.findall(r"^\|([^|]+)\|", TEXT, re.M):
        if "`" in cell and "nnUNetTrainer" in cell:
            named.update(row_trainers(cell))
    assert name in named, f"{PAGE.name} does not name the variant {name}"


def test_every_trainer_the_tables_name_exists():
    for cell in re.findall(r"^\|([^|]+)\|", TEXT, re.M):
        if "`nnUNetTrainer" in cell:
            for name in row_trainers(cell):
                assert name in training.TRAINERS or name == "nnUNetTrainer", name
