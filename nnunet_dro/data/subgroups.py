r"""The subgroup table: one row per case, column ``case`` plus group columns (``subgroups.tsv``).

Format (documented in ``data_docs/subgroup_table.md``): tab-separated UTF-8 text with a header
row; the first column is ``case``, the nnU-Net case identifier (the file name of the label without
``.nii.gz``); every other column is a grouping variable, categorical (``condition``, ``centre``,
``grade``, ``split``) or numeric (``gestational_age`` in weeks). Unknown values are empty cells
(the reader also accepts ``n/a``, ``NA`` and ``N/A``). Rows are sorted by case. Reading goes
through :mod:`nnunet_dro.tables`, the reader the evaluation uses too.

>>> import pandas as pd, tempfile, pathlib
>>> table = pd.DataFrame({"case": ["b", "a"], "condition": ["control", "spina_bifida"]})
>>> path = pathlib.Path(tempfile.mkdtemp()) / "subgroups.tsv"
>>> write_subgroups(path, table)
>>> path.read_text().splitlines()
['case\tcondition', 'a\tspina_bifida', 'b\tcontrol']
>>> read_subgroups(path)["condition"].tolist()
['spina_bifida', 'control']
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.errors import UserError
from nnunet_dro.tables import CaseTableError, DuplicateCases, MissingCaseColumn, numeric_columns, read_case_table

SUBGROUPS_FILENAME = "subgroups.tsv"
CASE_COLUMN = "case"


def write_subgroups(path: str | os.PathLike, table: pd.DataFrame) -> None:
    """Write ``table`` (must have a ``case`` column with unique values) as TSV, atomically."""
    _validate(table, Path(path))
    columns = [CASE_COLUMN] + [c for c in table.columns if c != CASE_COLUMN]
    ordered = table[columns].sort_values(CASE_COLUMN, kind="stable")
    text = ordered.to_csv(sep="\t", index=False, na_rep="", lineterminator="\n",
                          float_format="%.4g")
    write_text_atomic(path, text)


def read_subgroups(path: str | os.PathLike, case_column: str = CASE_COLUMN) -> pd.DataFrame:
    """Read a subgroup table (``.tsv``, or ``.csv`` with commas) with the package's one case-table
    reader (:func:`nnunet_dro.tables.read_case_table`); UserError if it is malformed.

    Returns a DataFrame with column ``case`` (renamed from ``case_column``) as strings; numeric
    group columns come back as numbers, ``n/a`` and empty cells as NaN.
    """
    try:
        table = read_case_table(path, case_column, what="subgroup table", default_separator="\t")
    except MissingCaseColumn as e:
        raise CaseTableError(f"{path}: no column {case_column!r} (columns: {e.columns})") from None
    except DuplicateCases as e:
        raise CaseTableError(f"{path}: duplicate case rows {e.cases[:5]}") from None
    table = table.rename(columns={case_column: CASE_COLUMN})
    return numeric_columns(table, skip=[CASE_COLUMN])


def _validate(table: pd.DataFrame, path: Path) -> None:
    if CASE_COLUMN not in table.columns:
        raise UserError(f"{path}: subgroup table needs a {CASE_COLUMN!r} column")
    cases = table[CASE_COLUMN]
    empty = (cases.isna() | (cases.astype(str).str.strip() == "")).to_numpy()
    if empty.any():
        # +2: one for the header line, one because file rows count from 1.
        raise UserError(f"{path}: empty case identifier in row {int(empty.argmax()) + 2}")
    duplicated = cases[cases.duplicated()].unique().tolist()
    if duplicated:
        raise UserError(f"{path}: duplicate case rows {duplicated[:5]}")
