r"""The one reader of case tables: one row per case, a case column and any number of other columns.

Subgroup tables (``subgroups.tsv`` beside a converted dataset, ``nnunet_dro evaluate -groups``,
``nnunet_dro ensemble -groups``; format in ``data_docs/subgroup_table.md``) and the FeTA condition
overrides are all read here. This module imports nothing of the package but :mod:`nnunet_dro.errors`,
so both the data layer (:mod:`nnunet_dro.data.subgroups`) and the evaluation
(:mod:`nnunet_dro.evaluation.groups`) use it without importing each other.

What every reader of a case table gets:

- the separator from the file ending: ``.csv`` commas, ``.tsv`` / ``.tab`` tabs (another ending is
  an error unless the caller names a ``default_separator``);
- the :mod:`csv` module, not pandas: a row with more fields than the header is an error naming its
  line, where pandas would silently turn the extra fields into an index;
- every cell as text with surrounding white space stripped, ``""``, ``n/a``, ``NA`` and ``N/A``
  as NaN (unknown), blank lines skipped, a UTF-8 byte-order mark ignored;
- a case column that exists, has no empty cell and no duplicate (after ``normalise_case``);
- errors as :class:`CaseTableError` (a :class:`~nnunet_dro.errors.UserError`: one line, exit 2).

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "groups.csv"
>>> _ = path.write_text("case,condition,ga\nb.nii.gz, control ,21\na,n/a,30.5\n")
>>> table = read_case_table(path, "case", normalise_case=lambda c: c.removesuffix(".nii.gz"))
>>> table["case"].tolist(), table["condition"].tolist(), table["ga"].tolist()
(['b', 'a'], ['control', nan], ['21', '30.5'])
>>> _ = path.write_text("case,condition\na,x\na,y\n")
>>> read_case_table(path, "case")
Traceback (most recent call last):
...
nnunet_dro.tables.DuplicateCases: subgroup table ...groups.csv: duplicate rows for case(s) a
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError

#: Cells meaning "unknown" (data_docs/subgroup_table.md): such a case is in no group of that column.
MISSING_VALUES = ("", "n/a", "NA", "N/A")

SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t"}


class CaseTableError(UserError):
    """A case table that cannot be used; the message names the file and, where it can, the line."""


class MissingCaseColumn(CaseTableError):
    """The header has no case column; ``columns`` is the header."""

    def __init__(self, message: str, columns: Sequence[str]):
        super().__init__(message)
        self.columns = list(columns)


class DuplicateCases(CaseTableError):
    """Several rows for one case; ``cases`` lists those cases, sorted."""

    def __init__(self, message: str, cases: Sequence[str]):
        super().__init__(message)
        self.cases = list(cases)


def read_case_table(path: str | os.PathLike, case_column: str, *, what: str = "subgroup table",
                    default_separator: Optional[str] = None,
                    normalise_case: Optional[Callable[[str], str]] = None,
                    case_column_hint: str = "check the separator", unique: bool = True) -> pd.DataFrame:
    """Read a case table; :class:`CaseTableError` if it is malformed.

    Args:
        path: the ``.csv`` / ``.tsv`` / ``.tab`` file.
        case_column: the column holding the case identifiers.
        what: how messages name the table (``"group table"`` in the evaluation).
        default_separator: separator for other file endings; None makes them an error.
        normalise_case: applied to every case identifier before the duplicate check (the
            evaluation strips file endings such as ``.nii.gz``).
        case_column_hint: advice appended when the case column is missing.
        unique: one row per case (a second row is :class:`DuplicateCases`); False for tables with
            several rows per case, such as a label audit's flags.

    Returns:
        the table with a default index, one row per case (per row with ``unique=False``) in file
        order, every cell a stripped string or NaN; the case column holds the (normalised)
        identifiers. A table with a header and no rows comes back empty: whether that is an error
        is the caller's choice.
    """
    path = Path(path)
    if not path.is_file():
        raise CaseTableError(f"{what} not found: {path}")
    separator = SEPARATORS.get(path.suffix.lower(), default_separator)
    if separator is None:
        raise CaseTableError(f"{what} {path}: expected a .csv or .tsv file")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = [(number, row) for number, row in enumerate(csv.reader(f, delimiter=separator), start=1)
                    if any(cell.strip() for cell in row)]
    except (UnicodeDecodeError, csv.Error) as e:
        raise CaseTableError(f"malformed {what} {path}: {e}") from None
    if not rows:
        raise CaseTableError(f"cannot parse {what} {path}: the file is empty")
    header = [cell.strip() for cell in rows[0][1]]
    for number, row in rows[1:]:
        if len(row) != len(header):
            raise CaseTableError(f"malformed {what} {path}: line {number} has {len(row)} fields, the header has "
                                 f"{len(header)}")
    if len(set(header)) != len(header) or "" in header:
        raise CaseTableError(f"malformed {what} {path}: empty or repeated column names in the header")
    if case_column not in header:
        raise MissingCaseColumn(f"{what} {path}: no case column {case_column!r} (columns: {', '.join(header)}; "
                                f"{case_column_hint})", header)
    table = pd.DataFrame([[cell.strip() for cell in row] for _, row in rows[1:]], columns=header, dtype=object)
    table = table.replace(list(MISSING_VALUES), np.nan)
    cases = table[case_column].fillna("")
    if (cases == "").any():
        line = rows[1:][int(np.flatnonzero((cases == "").to_numpy())[0])][0]
        raise CaseTableError(f"{what} {path}: empty case identifier in row {line}")
    if normalise_case is not None:
        cases = cases.map(normalise_case)
    duplicated = sorted(set(cases[cases.duplicated()])) if unique else []
    if duplicated:
        raise DuplicateCases(f"{what} {path}: duplicate rows for case(s) {', '.join(duplicated[:5])}"
                             f"{' ...' if len(duplicated) > 5 else ''}", duplicated)
    table[case_column] = cases.astype(object)
    return table


def table_separator(path: str | os.PathLike, option: str = "-o") -> str:
    r"""The separator a case table written to ``path`` gets, by its ending as :func:`read_case_table`
    reads it (``.csv`` commas, ``.tsv``/``.tab`` tabs); another ending is a :class:`CaseTableError`,
    so that what one command writes, the others read.

    >>> table_separator("audit.csv"), table_separator("audit.TSV")
    (',', '\t')
    """
    separator = SEPARATORS.get(Path(path).suffix.lower())
    if separator is None:
        raise CaseTableError(f"{option} {path}: name the table .tsv (tab-separated) or .csv (comma-separated)")
    return separator


def check_table_output(path: str | os.PathLike, option: str = "-o") -> str:
    """Check where a case table is to be written before any work: not a folder, its folder exists,
    a known ending. Returns the separator."""
    path = Path(path)
    if path.is_dir():
        raise CaseTableError(f"{option} {path}: is a folder; give a file name, e.g. {path / 'label_audit.tsv'}")
    if not path.parent.is_dir():
        raise CaseTableError(f"{option} {path}: folder {path.parent} does not exist")
    return table_separator(path, option)


def case_table_text(table: pd.DataFrame, path: str | os.PathLike) -> str:
    """``table`` as the text of a case table at ``path`` (the separator by its ending)."""
    return table.to_csv(sep=table_separator(path), index=False)


def numeric_columns(table: pd.DataFrame, skip: Sequence[str] = ()) -> pd.DataFrame:
    """``table`` with every column whose known cells all parse as numbers converted to numbers
    (as pandas' ``read_csv`` would type them); the columns in ``skip`` stay text.

    >>> typed = numeric_columns(pd.DataFrame({"case": ["1", "2"], "ga": ["21", np.nan], "c": ["a", "1"]}), ["case"])
    >>> typed["case"].tolist(), typed["ga"].tolist(), typed["c"].tolist()
    (['1', '2'], [21.0, nan], ['a', '1'])
    """
    table = table.copy()
    for column in table.columns:
        if column in skip:
            continue
        known = table[column].dropna()
        numbers = pd.to_numeric(known, errors="coerce")
        if len(known) and not numbers.isna().any():
            table[column] = pd.to_numeric(table[column])
    return table
