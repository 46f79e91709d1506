"""The subgroup table writer and reader shared by the converters and synthetic cohorts."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.data.subgroups import read_subgroups, write_subgroups
from nnunet_dro.errors import UserError


def test_subgroups_round_trip_sorted_with_case_first(tmp_path):
    table = pd.DataFrame({"condition": ["other", "control", "spina_bifida"],
                          "case": ["c", "a", "b"], "gestational_age": [30.25, 21.0, np.nan]})
    path = tmp_path / "subgroups.tsv"
    write_subgroups(path, table)
    assert path.read_text().splitlines() == [
        "case\tcondition\tgestational_age", "a\tcontrol\t21", "b\tspina_bifida\t", "c\tother\t30.25"]
    back = read_subgroups(path)
    assert back["case"].tolist() == ["a", "b", "c"]
    assert back["gestational_age"].isna().tolist() == [False, True, False]
    assert back["gestational_age"].dtype.kind == "f"


def test_subgroups_reads_csv_and_renames_case_column(tmp_path):
    path = tmp_path / "groups.csv"
    path.write_text("participant_id,condition\nsub-001,control\nsub-002,n/a\n")
    table = read_subgroups(path, case_column="participant_id")
    assert table["case"].tolist() == ["sub-001", "sub-002"]
    assert table["condition"].isna().tolist() == [False, True]


@pytest.mark.parametrize("text, message", [
    ("condition\ncontrol\n", "no column 'case'"),
    ("case\tcondition\na\tcontrol\na\tother\n", "duplicate case rows ['a']"),
    ("case\tcondition\na\tcontrol\n\tother\n", "empty case identifier in row 3"),
    ("", "cannot parse subgroup table"),
])
def test_subgroups_malformed_tables(tmp_path, text, message):
    path = tmp_path / "subgroups.tsv"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_subgroups(path)


def test_subgroups_missing_file(tmp_path):
    with pytest.raises(UserError, match="subgroup table not found"):
        read_subgroups(tmp_path / "nope.tsv")
