"""Subgroup table: which group each case belongs to, per stratification column.

The table (``-groups``, ``.csv`` or ``.tsv``) has one row per case: a case column (``--case-column``,
default ``case``; values are nnU-Net case identifiers, a file ending such as ``.nii.gz`` is
stripped) and any number of group columns. ``--group-by`` names the columns to stratify by, each
on its own (default: every column except numeric ones and ``split``, each left out with a note;
the rule does not depend on the number of cases). A numeric column can be binned with ``COLUMN:EDGES``:

- ``gestational_age:19,25,30,35,41`` -> bins ``[19,25)``, ``[25,30)``, ``[30,35)``, ``[35,41)``;
  values below the first edge go to ``<19``, values at or above the last to ``>=41``.

Every result also has the group ``all`` (group column ``all``). The table must describe the
evaluated cases: an evaluated case without a row is an error naming examples from both sides
(an identifier mismatch such as ``sub-000`` vs ``case_000`` would otherwise leave only ``all``),
unless ``partial=True`` (``--groups-partial``), where those cases form the group
``(not in table)`` of every group column. Cases with an empty (or ``n/a``, ``NA``, ``N/A``)
cell in a group column count in ``all`` only; they and table rows without a reference file are
reported.

>>> parse_group_by(["condition", "gestational_age:19,25,30"])
[GroupColumn(column='condition', edges=None), GroupColumn(column='gestational_age', edges=(19.0, 25.0, 30.0))]
>>> GroupColumn("ga", (19.0, 25.0)).bin_label(24.9), GroupColumn("ga", (19.0, 25.0)).bin_label(25)
('[19,25)', '>=25')
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.io import split_case_id
from nnunet_dro.tables import read_case_table

ALL = "all"


def groupings(group_columns, group_orders):
    """(group_column, group, case filter column or None) in display order, ``all`` first.

    >>> list(groupings(["site"], {"site": ["A", "B"]}))
    [('all', 'all', None), ('site', 'A', 'site'), ('site', 'B', 'site')]
    """
    yield ALL, ALL, None
    for column in group_columns:
        for group in group_orders[column]:
            yield column, group, column
NOT_IN_TABLE = "(not in table)"
EXAMPLES = 3


@dataclass(frozen=True)
class GroupColumn:
    """A stratification column, optionally binned at ``edges`` (left-closed bins)."""

    column: str
    edges: tuple[float, ...] | None = None

    def bin_label(self, value: float) -> str:
        edges = self.edges
        if value < edges[0]:
            return f"<{edges[0]:g}"
        if value >= edges[-1]:
            return f">={edges[-1]:g}"
        i = int(np.searchsorted(edges, value, side="right")) - 1
        return f"[{edges[i]:g},{edges[i + 1]:g})"

    def bin_order(self) -> list[str]:
        edges = self.edges
        return ([f"<{edges[0]:g}"] + [f"[{a:g},{b:g})" for a, b in zip(edges[:-1], edges[1:])]
                + [f">={edges[-1]:g}"])


def parse_group_by(items: list[str] | None, table_columns: list[str] | None = None) -> list[GroupColumn]:
    """Parse ``--group-by`` values (``COL`` or ``COL:e1,e2,...``). A column whose real name contains
    ``:`` is taken as is when ``table_columns`` lists it."""
    result = []
    for item in items or []:
        if table_columns is not None and item in table_columns or ":" not in item:
            result.append(GroupColumn(item))
            continue
        column, _, edges_text = item.rpartition(":")
        try:
            edges = tuple(float(e) for e in edges_text.split(","))
        except ValueError:
            raise UserError(f"--group-by {item!r}: bin edges must be numbers, e.g. {column}:19,25,30,35,41") from None
        if len(edges) < 2 or any(b <= a for a, b in zip(edges[:-1], edges[1:])) or not np.all(np.isfinite(edges)):
            raise UserError(f"--group-by {item!r}: give at least two finite, increasing bin edges")
        result.append(GroupColumn(column, edges))
    names = [g.column for g in result]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(f"--group-by: column {duplicates[0]!r} given twice")
    return result


@dataclass
class GroupAssignment:
    """Group label of every case per stratification column (``None``: not in any group)."""

    columns: list[GroupColumn]
    labels: dict[str, dict[str, str | None]]  # column -> case -> group label
    order: dict[str, list[str]]  # column -> group labels in display order
    cases_not_in_table: list[str] = field(default_factory=list)
    rows_without_reference: list[str] = field(default_factory=list)
    cases_without_value: dict[str, list[str]] = field(default_factory=dict)
    skipped_continuous_columns: list[str] = field(default_factory=list)
    missing_markers: dict[str, list[str]] = field(default_factory=dict)  # column -> markers read as no value

    @property
    def column_names(self) -> list[str]:
        return [g.column for g in self.columns]

    def report(self) -> dict:
        return {"cases_not_in_group_table": self.cases_not_in_table,
                "group_table_rows_without_reference": self.rows_without_reference,
                "cases_without_group_value": self.cases_without_value,
                "continuous_columns_not_grouped": self.skipped_continuous_columns}


def read_group_table(path: str, case_column: str) -> pd.DataFrame:
    """Read the table (all cells as text) with the package's one case-table reader
    (:func:`nnunet_dro.tables.read_case_table`): the case column checked, file endings stripped
    from the case identifiers, duplicate rows refused. Indexed by case."""
    table = read_case_table(path, case_column, what="group table", normalise_case=_case_id,
                            case_column_hint="use --case-column, or check the separator")
    if table.empty:
        raise UserError(f"group table {path} has no rows")
    return table.set_index(case_column, drop=False)


def _case_id(name: str) -> str:
    """``case_001.nii.gz`` -> ``case_001``; a name without a known ending stays as it is."""
    split = split_case_id(name)
    return split[0] if split else name


#: Cell texts that mean "no value" in tables written by pandas, R, spreadsheets or by hand (compared
#: without case): read as such, they would each become a group of the cases that lack a value.
MISSING_MARKERS = frozenset({"nan", "na", "n/a", "none", "null", "-", "--", "?", "#n/a"})


def assign_groups(path: str, case_column: str, group_by: list[str] | None, cases: list[str],
                  partial: bool = False) -> GroupAssignment:
    """Group label per case and column for the evaluated ``cases``.

    Without ``--group-by`` every column except the case column is used as a categorical group,
    except (:func:`default_skip_reason`) numeric columns (reported; bin them with ``COL:EDGES``)
    and the dataset's ``split`` column.
    An evaluated case without a row is a UserError (see :func:`check_table_covers_cases`), or with
    ``partial`` a member of the group :data:`NOT_IN_TABLE` of every column.
    """
    table = read_group_table(path, case_column)
    other_columns = [c for c in table.columns if c != case_column]
    skipped: list[str] = []
    if group_by:
        columns = parse_group_by(group_by, list(table.columns))
    else:
        skipped = [c for c in other_columns if default_skip_reason(c, table[c])]
        columns = [GroupColumn(c) for c in other_columns if c not in skipped]
    if not columns:
        raise UserError(f"group table {path}: no group column besides {case_column!r}"
                        + (f" that is grouped by default ({skipped[0]}: {default_skip_reason(skipped[0], table[skipped[0]])}"
                           f"; name it in --group-by, binned as {skipped[0]}:EDGES if numeric)" if skipped else ""))
    for g in columns:
        if g.column not in table.columns or g.column == case_column:
            raise UserError(f"group table {path}: no group column {g.column!r} (columns: {', '.join(other_columns)})")
        if g.column == ALL:
            raise UserError(f"group table {path}: a group column cannot be named {ALL!r} (reserved)")
    known = set(table.index)
    evaluated = set(cases)
    if not partial or not known & evaluated:  # no row at all: '(not in table)' for every case is no report
        check_table_covers_cases(path, case_column, cases, list(table.index))
    labels: dict[str, dict[str, str | None]] = {}
    order: dict[str, list[str]] = {}
    without_value: dict[str, list[str]] = {}
    markers: dict[str, list[str]] = {}
    for g in columns:
        per_case: dict[str, str | None] = {}
        for case in cases:
            if case not in known:
                per_case[case] = NOT_IN_TABLE
                continue
            raw = table.at[case, g.column]
            marker = raw is not None and str(raw).strip().lower() in MISSING_MARKERS
            if marker and str(raw).strip() not in markers.setdefault(g.column, []):
                markers[g.column].append(str(raw).strip())
            if raw is None or (isinstance(raw, float) and np.isnan(raw)) or str(raw).strip() == "" or marker:
                if case in known:
                    without_value.setdefault(g.column, []).append(case)
                per_case[case] = None
                continue
            raw = str(raw).strip()
            if g.edges is None:
                per_case[case] = raw
                continue
            try:
                value = float(raw)
            except ValueError:
                raise UserError(f"group table {path}: column {g.column!r} is binned but case {case!r} has "
                                f"the non-numeric value {raw!r}") from None
            if not np.isfinite(value):
                raise UserError(f"group table {path}: case {case!r} has the value {raw!r} in column {g.column!r}")
            per_case[case] = g.bin_label(value)
        present = {v for v in per_case.values() if v is not None and v != NOT_IN_TABLE}
        order[g.column] = ([b for b in g.bin_order() if b in present] if g.edges is not None
                           else sorted(present, key=_natural_key))
        if NOT_IN_TABLE in per_case.values():
            order[g.column].append(NOT_IN_TABLE)
        labels[g.column] = per_case
    return GroupAssignment(columns=columns, labels=labels, order=order,
                           cases_not_in_table=sorted(evaluated - known),
                           rows_without_reference=sorted(known - evaluated),
                           cases_without_value=without_value, skipped_continuous_columns=skipped,
                           missing_markers={c: m for c, m in markers.items() if m})


def check_table_covers_cases(path: str, case_column: str, cases: list[str], rows: list[str]) -> None:
    """UserError if an evaluated case has no row: the counts and examples of both sides.

    >>> check_table_covers_cases("g.tsv", "case", ["case_000", "case_001"], ["sub-000", "sub-001"])
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: group table g.tsv: 2 of 2 evaluated cases have no row (e.g. case_000, case_001) and 2 rows match no case (e.g. sub-000, sub-001); check the identifiers in column 'case' (--case-column)
    """
    without_row = sorted(set(cases) - set(rows), key=_natural_key)
    if not without_row:
        return
    unmatched = sorted(set(rows) - set(cases), key=_natural_key)
    rows_text = (f"{len(unmatched)} row{'s' if len(unmatched) != 1 else ''} match{'' if len(unmatched) != 1 else 'es'} "
                 f"no case (e.g. {', '.join(unmatched[:EXAMPLES])})" if unmatched else "every row matches a case")
    # --groups-partial is offered only when some case has a row: with none, it would report every
    # case as '(not in table)', a report without subgroups that looks like one
    partial_hint = (f", or pass --groups-partial to report the cases without a row as the group {NOT_IN_TABLE!r}"
                    if len(without_row) < len(set(cases)) else "")
    raise UserError(f"group table {path}: {len(without_row)} of {len(cases)} evaluated case"
                    f"{'s' if len(cases) != 1 else ''} {'have' if len(without_row) != 1 else 'has'} no row "
                    f"(e.g. {', '.join(without_row[:EXAMPLES])}) and {rows_text}; check the identifiers in column "
                    f"{case_column!r} (--case-column){partial_hint}")


#: the column converters and ``make-synthetic`` write for the dataset's train/test partition: it
#: tells where a case went, not which subgroup it is in
SPLIT_COLUMN = "split"


def default_skip_reason(column: str, values: pd.Series) -> str | None:
    """Why the default grouping (no ``--group-by``) leaves a column out, or None.

    A numeric column (gestational age, a score) is continuous: one group per value says nothing,
    and whether it looked so used to depend on how many cases there were (12 cases: skipped,
    8 cases: 8 groups of one). It is left out whatever the number of cases; bin it with
    ``COL:EDGES`` or name it in ``--group-by`` to group by each value. ``split`` is the dataset's
    train/test partition.

    >>> default_skip_reason("ga", pd.Series(["21", "27.5", None])), default_skip_reason("condition", pd.Series(["a"]))
    ('numeric', None)
    >>> default_skip_reason("split", pd.Series(["test", "test"]))
    "the dataset's train/test split"
    """
    if column == SPLIT_COLUMN:
        return "the dataset's train/test split"
    present = values.dropna()
    numeric = pd.to_numeric(present, errors="coerce")
    return "numeric" if len(present) and not numeric.isna().any() else None


def _natural_key(text: str):
    # "case2" before "case10"; numbers before words.
    import re
    return [(0, int(t), "") if t.isdigit() else (1, 0, t.lower()) for t in re.split(r"(\d+)", text) if t]
