"""The case-weight and subgroup tables of the cohort trainers: where they are found and every
way they can be wrong (each a one-line CaseTableError naming the file, before training starts)."""
from __future__ import annotations

import numpy as np
import pytest

from nnunet_dro.training.case_tables import (
    CASE_WEIGHTS_ENV,
    CaseTableError,
    find_case_table,
    read_case_groups,
    read_case_weights,
)

TRAIN = ["case_000", "case_001", "case_002"]
ALL = TRAIN + ["case_003"]  # case_003: a validation case of this fold


def _write(tmp_path, text, name="table.tsv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_case_weights_in_the_order_of_the_training_cases(tmp_path):
    path = _write(tmp_path, "case\tweight\ncase_002\t0\ncase_000\t1\ncase_003\t7\ncase_001\t2.5\n")
    np.testing.assert_array_equal(read_case_weights(path, TRAIN, ALL), [1.0, 2.5, 0.0])


BAD_WEIGHT_TABLES = {  # name -> (file content, message)
    "wrong header": ("id\tweight\ncase_000\t1\n", "the header must be 'case<TAB>weight'"),
    "comma separated": ("case,weight\ncase_000,1\n", "the header must be 'case<TAB>weight'"),
    "non-numeric weight": ("case\tweight\ncase_000\t1\ncase_001\theavy\ncase_002\t1\n",
                           "line 3 (case_001): weight 'heavy' is not a number"),
    "negative weight": ("case\tweight\ncase_000\t1\ncase_001\t-2\ncase_002\t1\n", "weight -2 must be a finite"),
    "infinite weight": ("case\tweight\ncase_000\tinf\ncase_001\t1\ncase_002\t1\n", "weight inf must be a finite"),
    "empty weight": ("case\tweight\ncase_000\t\ncase_001\t1\ncase_002\t1\n", "weight '' is not a number"),
    "duplicate case": ("case\tweight\ncase_000\t1\ncase_000\t2\ncase_001\t1\ncase_002\t1\n",
                       "duplicate rows for case_000"),
    "missing training case": ("case\tweight\ncase_000\t1\ncase_001\t1\n", "no row for 1 training case(s) of the fold: "
                                                                         "case_002"),
    "unknown case (typo)": ("case\tweight\ncase_000\t1\ncase_001\t1\ncase_002\t1\ncase_02\t1\n",
                            "1 case(s) not in the dataset: case_02"),
    "all training weights zero": ("case\tweight\ncase_000\t0\ncase_001\t0\ncase_002\t0\ncase_003\t5\n",
                                  "every training case of the fold has weight 0"),
    "empty file": ("", "cannot parse the case-weight table"),
}


@pytest.mark.parametrize("name", list(BAD_WEIGHT_TABLES))
def test_bad_case_weight_tables(tmp_path, name):
    text, message = BAD_WEIGHT_TABLES[name]
    path = _write(tmp_path, text)
    with pytest.raises(CaseTableError) as raised:
        read_case_weights(path, TRAIN, ALL)
    assert str(raised.value).startswith(str(path)) and message in str(raised.value)
    assert "\n" not in str(raised.value)


GROUPS_TEXT = "case\tcondition\tcentre\ncase_000\tcontrol\tA\ncase_001\tspina_bifida\tB\ncase_002\tcontrol\tB\n" \
              "case_040\tcontrol\tA\n"  # case_040: a test case (imagesTs) listed for the evaluation


def test_groups_from_the_first_column_or_a_named_one(tmp_path):
    path = _write(tmp_path, GROUPS_TEXT)
    assert read_case_groups(path, TRAIN) == ("condition", ["control", "spina_bifida", "control"])
    assert read_case_groups(path, TRAIN, "centre") == ("centre", ["A", "B", "B"])


BAD_GROUP_TABLES = {
    "no group column": ("case\ncase_000\ncase_001\ncase_002\n", None, "no group column besides 'case'"),
    "unknown column": (GROUPS_TEXT, "scanner", "no group column 'scanner'"),
    "missing training case": ("case\tcondition\ncase_000\tcontrol\ncase_001\tcontrol\n", None,
                              "no row for 1 training case(s) of the fold: case_002"),
    "empty group": ("case\tcondition\ncase_000\tcontrol\ncase_001\t\ncase_002\tn/a\n", None,
                    "column 'condition' is empty for 2 training case(s): case_001, case_002"),
    "duplicate case": ("case\tcondition\ncase_000\ta\ncase_000\tb\ncase_001\ta\ncase_002\ta\n", None, "duplicate"),
    "no case column": ("id\tcondition\ncase_000\ta\n", None, "no column 'case'"),
}


@pytest.mark.parametrize("name", list(BAD_GROUP_TABLES))
def test_bad_subgroup_tables(tmp_path, name):
    text, column, message = BAD_GROUP_TABLES[name]
    path = _write(tmp_path, text, "subgroups.tsv")
    with pytest.raises(CaseTableError) as raised:
        read_case_groups(path, TRAIN, column)
    assert str(path) in str(raised.value) and message in str(raised.value)


def test_search_order_env_then_preprocessed_then_raw(tmp_path, monkeypatch):
    monkeypatch.delenv(CASE_WEIGHTS_ENV, raising=False)
    pre, raw = tmp_path / "pre", tmp_path / "raw"
    where = dict(dataset_name="Dataset001_X", preprocessed_base=str(pre), raw_base=str(raw))
    with pytest.raises(CaseTableError, match="no case_weights.tsv found .*pre/Dataset001_X/case_weights.tsv.*"
                                             "raw/Dataset001_X/case_weights.tsv.*set nnUNet_dro_case_weights"):
        find_case_table("case_weights.tsv", CASE_WEIGHTS_ENV, **where)
    (raw / "Dataset001_X").mkdir(parents=True)
    (raw / "Dataset001_X" / "case_weights.tsv").write_text("x")
    assert find_case_table("case_weights.tsv", CASE_WEIGHTS_ENV, **where).parent.parent == raw
    (pre / "Dataset001_X").mkdir(parents=True)
    (pre / "Dataset001_X" / "case_weights.tsv").write_text("x")
    assert find_case_table("case_weights.tsv", CASE_WEIGHTS_ENV, **where).parent.parent == pre
    mine = _write(tmp_path, "x", "mine.tsv")
    monkeypatch.setenv(CASE_WEIGHTS_ENV, str(mine))
    assert find_case_table("case_weights.tsv", CASE_WEIGHTS_ENV, **where) == mine
    monkeypatch.setenv(CASE_WEIGHTS_ENV, str(tmp_path / "absent.tsv"))
    with pytest.raises(CaseTableError, match="nnUNet_dro_case_weights=.*absent.tsv: no such file"):
        find_case_table("case_weights.tsv", CASE_WEIGHTS_ENV, **where)
