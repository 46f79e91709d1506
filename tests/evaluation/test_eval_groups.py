"""A subgroup table must describe the evaluated cases: an evaluated case without a row is an error
naming examples from both sides, unless ``--groups-partial`` (then the group '(not in table)')."""
from __future__ import annotations

import pandas as pd
import pytest

from eval_testdata import make_cohort, run_cli
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.groups import NOT_IN_TABLE, check_table_covers_cases

PREFIX = "nnunet_dro evaluate: error: "


@pytest.mark.parametrize("cases, rows, message", [
    (["case_000", "case_001"], ["case_000", "case_001"], None),
    (["case_000"], ["case_000", "case_001", "case_002"], None),  # rows for other cases (a test split): fine
    ([f"case_{i:03d}" for i in range(5)], [f"sub-{i:03d}" for i in range(5)],
     "5 of 5 evaluated cases have no row (e.g. case_000, case_001, case_002) and 5 rows match no case "
     "(e.g. sub-000, sub-001, sub-002)"),
    (["c1", "c2", "c10"], ["c1", "c2"], "1 of 3 evaluated cases has no row (e.g. c10) and every row matches a case"),
    (["c1"], ["C1"], "1 of 1 evaluated case has no row (e.g. c1) and 1 row matches no case (e.g. C1)"),
    (["c2", "c10", "c3", "c1"], ["x"], "4 of 4 evaluated cases have no row (e.g. c1, c2, c3)"),  # natural order
])
def test_table_must_cover_the_cases(cases, rows, message):
    if message is None:
        check_table_covers_cases("g.tsv", "case", cases, rows)
        return
    with pytest.raises(UserError) as caught:
        check_table_covers_cases("g.tsv", "case", cases, rows)
    text = str(caught.value)
    assert text.startswith(f"group table g.tsv: {message}"), text
    partial_hint = (", or pass --groups-partial to report the cases without a row as the group '(not in table)'"
                    if set(cases) & set(rows) else "")  # no case with a row: --groups-partial would be no report
    assert text.endswith(f"check the identifiers in column 'case' (--case-column){partial_hint}")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("groups")
    ref, preds = make_cohort(root, n_cases=4, methods=("A", "B"))
    return root, ref, preds


def _messages(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith(("Reading cases", "Report written to"))]


def test_identifiers_of_another_form_stop_the_run(cohort, tmp_path):
    """The trap of the issue: sub-000 vs case_000 used to give exit 0 and only the group 'all'."""
    root, ref, preds = cohort
    table = tmp_path / "participants.tsv"
    table.write_text("case\tcondition\n" + "".join(f"sub-{i:03d}\t{'sb' if i % 2 else 'control'}\n" for i in range(4)))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={preds['A']}", "-o", out, "-np", "1", "-groups", table)
    assert done.returncode == 2, done.stderr
    assert _messages(done.stderr) == [
        f"{PREFIX}group table {table}: 4 of 4 evaluated cases have no row (e.g. case_000, case_001, case_002) and "
        f"4 rows match no case (e.g. sub-000, sub-001, sub-002); check the identifiers in column 'case' "
        f"(--case-column)"]  # no --groups-partial hint: it would make every case '(not in table)'
    assert not out.exists()
    partial = run_cli("-ref", ref, "-pred", f"A={preds['A']}", "-o", out, "-np", "1", "-groups", table,
                      "--groups-partial")
    assert partial.returncode == 2 and _messages(partial.stderr) == _messages(done.stderr)
    assert not out.exists()


def test_a_case_without_row_stops_the_run_and_groups_partial_makes_it_a_group(cohort, tmp_path):
    root, ref, preds = cohort
    table = tmp_path / "groups.csv"
    table.write_text("case,condition\ncase_000,control\ncase_001,sb\ncase_002,control\ncase_999,sb\n")
    out = tmp_path / "report"
    args = ["-ref", ref, "-pred", f"A={preds['A']}", f"B={preds['B']}", "-o", out, "-np", "1", "-groups", table]
    done = run_cli(*args)
    assert done.returncode == 2
    assert _messages(done.stderr)[-1].startswith(
        f"{PREFIX}group table {table}: 1 of 4 evaluated cases has no row (e.g. case_003) and 1 row matches no case "
        f"(e.g. case_999)")
    assert not out.exists()

    partial = run_cli(*args, "--groups-partial")
    assert partial.returncode == 0, partial.stderr
    assert _messages(partial.stderr) == [
        f"warning: 1 case(s) missing from group table {table} form the group '(not in table)' of every group "
        f"column (--groups-partial): case_003",
        f"note: 1 row(s) of group table {table} have no reference file: case_999"]
    summary = pd.read_csv(out / "summary.csv")
    assert list(dict.fromkeys(summary.query("group_column == 'condition'")["group"])) == \
        ["control", "sb", NOT_IN_TABLE]
    assert (summary.query(f"group == '{NOT_IN_TABLE}'")["n"] == 1).all()
    assert f"| {NOT_IN_TABLE} | A |" in partial.stdout
    per_case = pd.read_csv(out / "per_case.csv")
    assert set(per_case.query("case == 'case_003'")["condition"]) == {NOT_IN_TABLE}


def test_rows_for_cases_not_evaluated_are_a_note(cohort, tmp_path):
    root, ref, preds = cohort
    table = tmp_path / "groups.tsv"
    table.write_text("case\tsite\n" + "".join(f"case_{i:03d}\t{'X' if i < 3 else 'Y'}\n" for i in range(6)))
    done = run_cli("-ref", ref, "-pred", f"A={preds['A']}", "-o", tmp_path / "r", "-np", "1", "-groups", table)
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == [
        f"note: 2 row(s) of group table {table} have no reference file: case_004, case_005"]
