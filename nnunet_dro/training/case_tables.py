"""The tables through which users tell the trainers what they know about their cases.

**Where the trainer looks** (first found wins), nnU-Net style:

1. the path in an environment variable (``nnUNet_dro_case_weights``, ``nnUNet_dro_subgroups``);
2. beside ``dataset.json`` in ``nnUNet_preprocessed/DatasetXXX_Name/``;
3. beside ``dataset.json`` in ``nnUNet_raw/DatasetXXX_Name/`` (where our converters write
   ``subgroups.tsv``).

**Case weights** (``case_weights.tsv``): tab-separated, a header row with the columns ``case``
and ``weight``; one row per case; weights are finite numbers ``>= 0`` (0: never drawn). Every
training case of the fold needs a row; rows of cases outside the fold (validation cases) are
allowed, rows naming no case of the dataset are an error (a typo would otherwise silently drop a
case)::

    case	weight
    case_000	1
    case_001	4.5

**Subgroup table** (``subgroups.tsv``, the format of ``data_docs/subgroup_table.md``): column
``case`` plus group columns. The grouping column is ``nnUNet_dro_group_column`` if set, else the
trainer's ``dro_group_column`` attribute, else the first group column. Every training case needs a
non-empty group; rows of other cases (the test cases our converters list too) are ignored.

Every problem is found before training starts and raised as one :class:`CaseTableError` naming
the file and the offending rows.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.data.subgroups import CASE_COLUMN, SUBGROUPS_FILENAME, read_subgroups
from nnunet_dro.errors import UserError

CASE_WEIGHTS_FILENAME = "case_weights.tsv"
CASE_WEIGHTS_ENV = "nnUNet_dro_case_weights"
SUBGROUPS_ENV = "nnUNet_dro_subgroups"
GROUP_COLUMN_ENV = "nnUNet_dro_group_column"


class CaseTableError(RuntimeError):
    """A case-weight or subgroup table the trainer cannot use (raised before training starts)."""


def _shown(cases: Sequence[str], limit: int = 5) -> str:
    cases = list(cases)
    return ", ".join(cases[:limit]) + (f" and {len(cases) - limit} more" if len(cases) > limit else "")


def find_case_table(filename: str, env_var: str, dataset_name: str, preprocessed_base: Optional[str],
                    raw_base: Optional[str]) -> Path:
    """The table's path by the search order of the module docstring; :class:`CaseTableError` if none."""
    explicit = os.environ.get(env_var)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise CaseTableError(f"{env_var}={explicit}: no such file")
        return path
    candidates = [Path(base) / dataset_name / filename for base in (preprocessed_base, raw_base) if base]
    for path in candidates:
        if path.is_file():
            return path
    raise CaseTableError(f"no {filename} found (looked at {', '.join(map(str, candidates)) or 'nothing'}); "
                         f"put it beside dataset.json or set {env_var} to its path")


def _check_cases(path: Path, table_cases: Sequence[str], training_cases: Sequence[str],
                 all_cases: Optional[Sequence[str]]) -> None:
    unknown = sorted(set(table_cases) - set(all_cases)) if all_cases is not None else []
    if unknown:
        raise CaseTableError(f"{path}: {len(unknown)} case(s) not in the dataset: {_shown(unknown)}")
    missing = sorted(set(training_cases) - set(table_cases))
    if missing:
        raise CaseTableError(f"{path}: no row for {len(missing)} training case(s) of the fold: {_shown(missing)}")


def read_case_weights(path: Path, training_cases: Sequence[str], all_cases: Sequence[str]) -> np.ndarray:
    """The weight of every training case (in the order of ``training_cases``), validated."""
    try:
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise CaseTableError(f"{path}: cannot parse the case-weight table ({str(e).splitlines()[0]})") from None
    if list(table.columns[:2]) != [CASE_COLUMN, "weight"]:
        raise CaseTableError(f"{path}: the header must be 'case<TAB>weight', found {list(table.columns)}")
    cases = table[CASE_COLUMN].str.strip()
    duplicated = sorted(set(cases[cases.duplicated()]))
    if duplicated:
        raise CaseTableError(f"{path}: duplicate rows for {_shown(duplicated)}")
    values = []
    for row, (case, text) in enumerate(zip(cases, table["weight"]), start=2):
        try:
            value = float(text)
        except ValueError:
            raise CaseTableError(f"{path}: line {row} ({case}): weight {text!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise CaseTableError(f"{path}: line {row} ({case}): weight {text} must be a finite number >= 0")
        values.append(value)
    _check_cases(path, cases.tolist(), training_cases, all_cases)
    weight_of = dict(zip(cases, values))
    weights = np.array([weight_of[c] for c in training_cases], dtype=np.float64)
    if not weights.max() > 0:
        raise CaseTableError(f"{path}: every training case of the fold has weight 0")
    return weights


def read_case_groups(path: Path, training_cases: Sequence[str], column: Optional[str] = None) -> tuple[str, list[str]]:
    """``(grouping column, group of every training case)`` from a subgroup table, validated.

    Rows of other cases are allowed: the converters' table also lists the test cases (``imagesTs``)
    for the evaluation."""
    try:
        table = read_subgroups(path)
    except UserError as e:
        raise CaseTableError(str(e)) from None
    group_columns = [c for c in table.columns if c != CASE_COLUMN]
    if not group_columns:
        raise CaseTableError(f"{path}: no group column besides {CASE_COLUMN!r}")
    column = column or group_columns[0]
    if column not in group_columns:
        raise CaseTableError(f"{path}: no group column {column!r} (columns: {group_columns})")
    cases = table[CASE_COLUMN].astype(str).str.strip()
    _check_cases(path, cases.tolist(), training_cases, None)
    group_of = dict(zip(cases, table[column]))
    empty = [c for c in training_cases if pd.isna(group_of[c]) or str(group_of[c]).strip() == ""]
    if empty:
        raise CaseTableError(f"{path}: column {column!r} is empty for {len(empty)} training case(s): {_shown(empty)}")
    return column, [str(group_of[c]) for c in training_cases]


__all__ = ["CASE_WEIGHTS_FILENAME", "SUBGROUPS_FILENAME", "CASE_WEIGHTS_ENV", "SUBGROUPS_ENV", "GROUP_COLUMN_ENV",
           "CaseTableError", "find_case_table", "read_case_weights", "read_case_groups"]
