"""``nnunet_dro jtt``: Just Train Twice's case-weight table from a finished ERM training, through the
real CLI on a fake cross-validation (no training), and the table read by the trainers' own reader."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_eval_crossval import CASES, TRAINER, _truth, make_world

from eval_testdata import write_label_map
from nnunet_dro.training.case_tables import read_case_weights
from nnunet_dro.workflows.jtt import case_scores, case_weight_table, error_set

BIN = Path(sys.executable).parent


def jtt(*args, env=None):
    return subprocess.run([str(BIN / "nnunet_dro"), "jtt", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture
def world(tmp_path, monkeypatch):
    raw, folders = make_world(tmp_path)
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    folder = folders[TRAINER]
    # case_004 misses its cerebellum entirely (its worst region 0), case_001 is shifted further
    write_label_map(folder / "fold_1" / "validation" / "case_004.nii.gz", np.zeros((8, 8, 8), np.uint8))
    write_label_map(folder / "fold_0" / "validation" / "case_001.nii.gz", np.roll(_truth(1), 2, axis=2))  # Dice 60
    return tmp_path, raw, folder


def test_jtt_writes_the_error_set_from_the_cross_validation(world):
    root, raw, folder = world
    out = root / "case_weights.tsv"
    done = jtt("-pred", folder, "-o", out, "--fraction", "0.2", "--upweight", "4", "-np", "1")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out, sep="\t", dtype={"case": str})
    assert list(table.columns) == ["case", "weight", "score"] and sorted(table["case"]) == CASES
    heavy = table.loc[table["weight"] == 4.0, "case"].tolist()
    assert len(heavy) == 2 and "case_004" in heavy  # ceil(0.2 * 6) = 2; the empty prediction scores 0
    assert (table.loc[table["weight"] == 1.0, "score"] >= table.loc[table["weight"] == 4.0, "score"].max()).all()
    weights = read_case_weights(out, sorted(CASES), sorted(CASES))  # what nnUNetTrainerCaseWeights reads
    assert weights[CASES.index("case_004")] == 4.0 and weights.sum() == 4 * 2 + 4
    assert "error set (worst-dice, worst 0.2): 2 of 6 cases" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--fraction", "0"], "--fraction 0.0: must lie strictly between 0 and 1"),
    (["--fraction", "1.5"], "--fraction 1.5: must lie strictly between 0 and 1"),
    (["--upweight", "0.5"], "--upweight 0.5: must be a finite number >= 1"),
])
def test_bad_options_are_one_line_errors_and_write_nothing(world, args, message):
    root, raw, folder = world
    out = root / "case_weights.tsv"
    done = jtt("-pred", folder, "-o", out, "-np", "1", *args)
    assert done.returncode == 2 and message in done.stderr and not out.exists()
    assert len([line for line in done.stderr.splitlines() if "error" in line]) == 1


def test_output_must_be_a_tsv_in_an_existing_folder(world):
    root, raw, folder = world
    for out, message in ((root / "weights.csv", "name it case_weights.tsv"), (root / "no" / "case_weights.tsv", "does not exist")):
        done = jtt("-pred", folder, "-o", out, "-np", "1")
        assert done.returncode == 2 and message in done.stderr


# (per-case Dice rows, fraction, rule, expected error set)
RULE_CASES = {
    "worst region decides": ([("a", 95, 5), ("b", 50, 50), ("c", 90, 90)], 0.33, "worst-dice", ["a"]),
    "mean decides": ([("a", 95, 5), ("b", 40, 40), ("c", 90, 90)], 0.33, "mean-dice", ["b"]),
    "a tie at the boundary: both in": ([("b", 50, 50), ("a", 50, 50), ("c", 90, 90)], 0.33, "worst-dice", ["a", "b"]),
    "three at 0, two asked: all three in": ([("a", 0, 0), ("b", 0, 0), ("c", 0, 0), ("d", 80, 80), ("e", 90, 90),
                                             ("f", 95, 95), ("g", 96, 96), ("h", 97, 97), ("i", 98, 98),
                                             ("j", 99, 99)], 0.2, "worst-dice", ["a", "b", "c"]),
    "a tie above the boundary changes nothing": ([("a", 10, 10), ("b", 50, 50), ("c", 50, 50)], 0.33, "worst-dice",
                                                 ["a"]),
    "rounded up": ([("a", 10, 10), ("b", 20, 20), ("c", 30, 30)], 0.5, "worst-dice", ["a", "b"]),
    "NaN region ignored": ([("a", 10, float("nan")), ("b", 20, 5), ("c", 30, 30)], 0.33, "worst-dice", ["b"]),
}


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_error_set_rules(name):
    rows, fraction, rule, expected = RULE_CASES[name]
    per_case = pd.DataFrame([(c, r, v) for c, x, y in rows for r, v in (("x", x), ("y", y))],
                            columns=["case", "region", "value"])
    assert error_set(per_case, fraction, rule) == expected
    assert list(case_scores(per_case, rule).index) == sorted(c for c, _, _ in rows)


def test_weight_table_keeps_every_case():
    table = case_weight_table(["c", "a", "b"], ["b"], 3.0)
    assert table.to_dict("list") == {"case": ["a", "b", "c"], "weight": [1.0, 3.0, 1.0]}


def test_ties_at_the_boundary_are_stated_and_all_in(world):
    """Issue 65: three cases at Dice 0, two upweighted by their names, silently."""
    root, raw, folder = world
    for case in ("case_001", "case_002"):  # with case_004: three validation predictions empty, Dice 0
        fold = next(f for f in folder.glob("fold_*") if (f / "validation" / f"{case}.nii.gz").exists())
        write_label_map(fold / "validation" / f"{case}.nii.gz", np.zeros((8, 8, 8), np.uint8))
    out = root / "case_weights.tsv"
    done = jtt("-pred", folder, "-o", out, "--fraction", "0.2", "-np", "1")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out, sep="\t", dtype={"case": str})
    assert sorted(table.loc[table["weight"] == 5.0, "case"]) == ["case_001", "case_002", "case_004"]
    assert ("note: 3 cases tie at the boundary score 0 (case_001, case_002, case_004): all are in the error set, "
            "3 cases instead of the 2 that --fraction 0.2 asks for") in done.stdout
    for fold in folder.glob("fold_*"):  # every prediction empty: every case ties, no error set
        for file in (fold / "validation").glob("*.nii.gz"):
            write_label_map(file, np.zeros((8, 8, 8), np.uint8))
    out.unlink()
    done = jtt("-pred", folder, "-o", out, "--fraction", "0.2", "-np", "1")
    assert done.returncode == 2 and "6 of the 6 cases tie at score 0" in done.stderr and not out.exists()


def test_predictions_of_test_cases_are_refused(world):
    root, raw, folder = world
    dataset = raw  # the raw dataset folder (dataset.json, labelsTr)
    (dataset / "labelsTs").mkdir(exist_ok=True)
    for case in ("case_100", "case_101"):
        write_label_map(dataset / "labelsTs" / f"{case}.nii.gz", np.ones((8, 8, 8), np.uint8))
        write_label_map(root / "pred_ts" / f"{case}.nii.gz", np.ones((8, 8, 8), np.uint8))
    out = root / "case_weights.tsv"
    done = jtt("-pred", root / "pred_ts", "-ref", dataset / "labelsTs", "-o", out, "-np", "1")
    assert done.returncode == 2 and "holds the dataset's test cases" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()


def test_some_folds_only_is_refused_before_a_table_no_second_training_can_use(world):
    """``jtt -f 0`` wrote the weights of fold 0's validation cases only: nnUNetTrainerCaseWeights
    then stopped at its start (no row for the other training cases). Issue 80 item 13."""
    root, raw, folder = world
    out = root / "case_weights.tsv"
    done = jtt("-pred", folder, "-o", out, "-np", "1", "-f", "0")
    assert done.returncode == 2, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
    assert ("3 of the 6 training cases of Dataset201_FeTA3 have no score (-f 0 validates only these folds' cases): "
            "case_003, case_004, case_005; the second training (nnUNetTrainerCaseWeights) needs a weight for every "
            "training case") in done.stderr, done.stderr
    done = jtt("-pred", folder, "-o", out, "-np", "1", "-f", "0", "1")  # every fold: the table is whole
    assert done.returncode == 0, done.stderr
    assert read_case_weights(out, sorted(CASES), sorted(CASES)).size == len(CASES)


# ---------------------------------------------------------------- issue 80 items 8, 11, 12 and 13
def test_missing_predictions_suggest_what_jtt_accepts_and_name_the_training(world):
    """jtt suggested --missing worst/skip, which it does not accept, and called the first training ERM."""
    root, raw, folder = world
    next(folder.glob("fold_1/validation/*.nii.gz")).unlink()
    out = root / "case_weights.tsv"
    done = jtt("-pred", folder, "-o", out, "-np", "1")
    assert done.returncode == 2 and not out.exists(), done.stderr
    assert f"{folder.name} has no prediction for 1 case(s)" in done.stderr
    assert "--missing" not in done.stderr and "ERM" not in done.stderr and "--val" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    named = jtt("-pred", f"first={folder}", "-o", out, "-np", "1")
    assert "first has no prediction" in named.stderr
    usage = jtt("-pred", folder, "-o", out, "--missing", "worst")
    assert usage.returncode == 2 and "unrecognized arguments: --missing" in usage.stderr


def test_some_folds_only_is_refused_not_a_table_no_training_can_use(world):
    """``jtt -f 0`` wrote the weights of fold 0's cases only; nnUNetTrainerCaseWeights then stops."""
    root, raw, folder = world
    out = root / "case_weights.tsv"
    done = jtt("-pred", folder, "-o", out, "-f", "0", "-np", "1")
    assert done.returncode == 2 and not out.exists(), done.stderr
    assert "training cases of" in done.stderr and "(-f 0 validates only these folds' cases)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert jtt("-pred", folder, "-o", out, "-f", "0", "1", "-np", "1").returncode == 0  # every fold: fine


def test_help_states_the_fraction_bounds_it_enforces():
    text = jtt("--help").stdout
    assert "0-1" not in text and "strictly between 0 and 1" in " ".join(text.split())


def test_progress_bar_while_the_first_training_is_scored(world, capfd):
    from nnunet_dro.workflows.jtt import write_jtt_table

    root, raw, folder = world
    write_jtt_table(str(folder), root / "case_weights.tsv", num_processes=1, progress=True)
    assert "Reading cases" in capfd.readouterr().err
