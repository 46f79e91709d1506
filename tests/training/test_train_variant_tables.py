"""The trainer tables checked against the classes: docs/training.md's one table of the product's
trainers (every one, nothing else, each row's base), and the lab's variant tables of
docs/development.md (every trainer a row names exists, the settings a row states are the class's);
every discovered variant is named on its page (a new variant file without its line fails here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import nnunet_dro.training as training
from nnunet_dro.lab.variants import LAB_VARIANTS
from nnunet_dro.training.variants import VARIANTS
from nnunet_dro.weighting.settings import AdaptiveHardnessSettings, ErrorSetSettings, HardnessSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "training.md"
TEXT = PAGE.read_text()
#: the lab's variant tables
LAB_PAGE = DOCS / "development.md"
LAB_TEXT = LAB_PAGE.read_text()
#: every trainer class by name: the product's and the lab's variants
EVERY = {**training.TRAINERS, **LAB_VARIANTS}


def table_rows(header: str, text: str = LAB_TEXT) -> list[list[str]]:
    """The cells of each row of the table whose header line starts with ``header``."""
    lines = text.splitlines()
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
        cls = EVERY[name]
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
            settings = EVERY[name].dro_settings
            assert type(settings) is AdaptiveHardnessSettings, name
            assert settings.fraction == f, name
            assert settings.importance.enabled == importance.startswith("on"), name
            assert settings.max_weight == (None if cap.startswith("no cap") else numbers(cap)[0]), name


def test_the_error_set_table_states_each_trainers_fraction_upweight_and_refresh():
    rows = table_rows("| error-set trainer | error set | drawn | chosen |", TEXT)
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


def test_training_md_has_one_table_of_the_product_trainers_and_their_bases():
    rows = table_rows("| trainer | builds on | what it sets |", TEXT)
    named = [row_trainers(row[0])[0] for row in rows]
    assert sorted(named) == sorted(training.PRODUCT_TRAINERS) and len(named) == len(set(named))
    for row in rows:
        (name,) = row_trainers(row[0])
        parent = next((c.__name__ for c in training.PRODUCT_TRAINERS[name].__mro__[1:]
                       if c.__name__ in training.PRODUCT_TRAINERS), "nnU-Net's trainer")
        assert row[1].strip("`") == parent, (name, row[1])
    tables = [line for line in TEXT.splitlines() if line.startswith("| trainer ")]
    assert len(tables) == 1, f"{PAGE.name} has {len(tables)} trainer tables: {tables}"


@pytest.mark.parametrize("name", sorted(VARIANTS) + sorted(LAB_VARIANTS))
def test_every_variant_is_on_the_page(name):
    text = TEXT if name in VARIANTS else LAB_TEXT
    named = set(re.findall(r"nnUNetTrainer\w+", text))
    for cell in re.findall(r"^\|([^|]+)\|", text, re.M):
        if "`" in cell and "nnUNetTrainer" in cell:
            named.update(row_trainers(cell))
    assert name in named, f"{(PAGE if name in VARIANTS else LAB_PAGE).name} does not name the variant {name}"


@pytest.mark.parametrize("text", [TEXT, LAB_TEXT], ids=[PAGE.name, LAB_PAGE.name])
def test_every_trainer_the_tables_name_exists(text):
    for cell in re.findall(r"^\|([^|]+)\|", text, re.M):
        if "`nnUNetTrainer" in cell:
            for name in row_trainers(cell):
                assert name in EVERY or name == "nnUNetTrainer", name
