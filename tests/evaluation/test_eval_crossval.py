"""nnU-Net's own cross-validation: ``-pred NAME=$nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG``
gathers every ``fold_N/validation`` prediction; without ``-ref`` the references are the dataset's
labelsTr under ``$nnUNet_raw`` and the regions its dataset.json. A fake trainer folder (no training)
and a fake raw dataset, through the real CLI."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from eval_testdata import run_cli, write_label_map

PREFIX = "nnunet_dro evaluate: error: "
DATASET = "Dataset201_FeTA3"
TRAINER = "nnUNetTrainer__nnUNetPlans__3d_fullres"
LABELS = {"background": 0, "white_matter": 1, "intra_axial_csf": 2, "cerebellum": 3}
CASES = [f"case_{i:03d}" for i in range(6)]
FOLD_OF = {case: i // 3 for i, case in enumerate(CASES)}  # fold 0: case_000-002, fold 1: case_003-005


def _truth(i: int) -> np.ndarray:
    array = np.zeros((8, 8, 8), np.uint8)
    for label in (1, 2, 3):
        array[label + i % 2, 1:6, 1:6] = label
    return array


def make_world(root, trainers=(TRAINER,), shift=1):
    """``root/raw/DATASET/{dataset.json, labelsTr}`` and ``root/results/DATASET/<trainer>/fold_{0,1}/validation``."""
    raw = root / "raw" / DATASET
    raw.mkdir(parents=True)
    (raw / "dataset.json").write_text(json.dumps({"channel_names": {"0": "T2"}, "labels": LABELS,
                                                  "numTraining": len(CASES), "file_ending": ".nii.gz"}))
    for i, case in enumerate(CASES):
        write_label_map(raw / "labelsTr" / f"{case}.nii.gz", _truth(i))
    folders = {}
    for k, trainer in enumerate(trainers):
        folder = root / "results" / DATASET / trainer
        for i, case in enumerate(CASES):
            write_label_map(folder / f"fold_{FOLD_OF[case]}" / "validation" / f"{case}.nii.gz",
                            np.roll(_truth(i), shift + k * (i % 3), axis=2))
        (folder / "fold_0" / "checkpoint_final.pth").write_bytes(b"")  # what else a fold folder holds
        (folder / "fold_0" / "validation" / "case_000.npz").write_bytes(b"")
        (folder / "dataset.json").write_text((raw / "dataset.json").read_text())
        folders[trainer] = folder
    return raw, folders


@pytest.fixture
def world(tmp_path, monkeypatch):
    raw, folders = make_world(tmp_path, trainers=(TRAINER, "nnUNetTrainerDRO__nnUNetPlans__3d_fullres"))
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    return tmp_path, raw, folders


def _messages(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith(("Reading cases", "Report written to"))]


def test_cross_validation_without_ref_reads_every_fold_and_labelstr(world):
    root, raw, folders = world
    erm, dro = folders.values()
    out = root / "report"
    done = run_cli("-pred", f"ERM={erm}", f"DRO={dro}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == []
    per_case = pd.read_csv(out / "per_case.csv")
    assert sorted(set(per_case["case"])) == CASES
    assert list(dict.fromkeys(per_case["region"])) == ["white_matter", "intra_axial_csf", "cerebellum"]
    content = json.loads((out / "summary.json").read_text())
    settings, cases = content["settings"], content["cases"]
    assert settings["reference"] == str(raw / "labelsTr")
    assert settings["cross_validation"]["ERM"]["folds"] == [0, 1] and settings["cross_validation"]["ERM"]["cases"] == 6
    assert settings["prediction_kinds"] == {"ERM": "cross-validation", "DRO": "cross-validation"}
    assert cases["methods"]["ERM"]["fold_of_case"] == FOLD_OF
    line = f"Cross-validation: ERM = fold_N/validation of {TRAINER}, folds 0, 1 (6 cases)."
    assert line in (out / "table.md").read_text() and line in done.stdout
    assert "paired difference to ERM" in done.stdout

    # the same numbers as -ref labelsTr and one flat folder of the same predictions
    flat = root / "flat"
    flat.mkdir()
    for case in CASES:
        shutil.copy(erm / f"fold_{FOLD_OF[case]}" / "validation" / f"{case}.nii.gz", flat)
    again = run_cli("-ref", raw / "labelsTr", "-pred", f"ERM={flat}", "-o", root / "flat_report", "-np", "1")
    assert again.returncode == 0, again.stderr
    flat_scores = pd.read_csv(root / "flat_report" / "per_case.csv")
    np.testing.assert_array_equal(flat_scores["value"], per_case.query("method == 'ERM'")["value"])


def test_folds_option_reads_those_folds_and_their_cases_only(world):
    root, raw, folders = world
    erm = folders[TRAINER]
    out = root / "report"
    done = run_cli("-pred", f"ERM={erm}", "-o", out, "-np", "1", "--folds", "1")
    assert done.returncode == 0, done.stderr
    assert sorted(set(pd.read_csv(out / "per_case.csv")["case"])) == CASES[3:]
    assert f"Cross-validation: ERM = fold_N/validation of {TRAINER}, fold 1 (3 cases)." in done.stdout


def test_test_split_with_a_trainer_folder_beside_it_is_unchanged(world):
    """-ref labelsTs -pred NAME=folder (a plain prediction folder) works as before."""
    root, raw, folders = world
    for i, case in enumerate(CASES[:2]):
        write_label_map(raw / "labelsTs" / f"{case}.nii.gz", _truth(i))
        write_label_map(root / "pred_ts" / f"{case}.nii.gz", _truth(i))
    done = run_cli("-ref", raw / "labelsTs", "-pred", f"A={root / 'pred_ts'}", "-o", root / "r", "-np", "1")
    assert done.returncode == 0, done.stderr
    assert json.loads((root / "r" / "summary.json").read_text())["settings"]["cross_validation"] is None


def _break(kind: str, root, raw, folder):
    """Make one fault; return (extra arguments, expected message)."""
    fold1 = folder / "fold_1" / "validation"
    if kind == "case in two folds":
        shutil.copy(folder / "fold_0" / "validation" / "case_001.nii.gz", fold1)
        return [], (f"-pred CV={folder}: case 'case_001' is in the validation of fold_0 and of fold_1 (folds of "
                    f"different splits in one folder?)")
    if kind == "fold without validation":
        (folder / "fold_2").mkdir()
        (folder / "fold_2" / "checkpoint_latest.pth").write_bytes(b"")
        return [], (f"-pred CV={folder}: fold_2/validation holds no validation predictions (is fold 2 finished? "
                    f"choose the folds with --folds)")
    if kind == "case not in the dataset":
        shutil.copy(fold1 / "case_003.nii.gz", fold1 / "case_999.nii.gz")
        return [], (f"-pred CV={folder}: validation predictions of 1 case(s) not in the reference folder "
                    f"{raw / 'labelsTr'} (fold_1): case_999")
    if kind == "trainer folder with -ref labelsTs":
        (raw / "labelsTs").mkdir()
        for case in CASES[:2]:
            shutil.copy(raw / "labelsTr" / f"{case}.nii.gz", raw / "labelsTs")
        return ["-ref", raw / "labelsTs"], (f"-pred CV={folder}: validation predictions of 4 case(s) not in the "
                                            f"reference folder {raw / 'labelsTs'} (fold_0, fold_1): case_002, "
                                            f"case_003, case_004, ...")
    if kind == "requested fold absent":
        return ["--folds", "0", "3"], f"--folds: {folder} has no fold_3 (fold_N folders present: 0, 1)"
    if kind == "a fold's case missing":
        (fold1 / "case_004.nii.gz").unlink()
        return [], ("CV has no prediction for 1 case(s) in the validation of fold 0, 1 (is every fold finished? "
                    "a fold's validation is written at the end of its training): case_004")
    if kind == "summary.json lists a case without file":
        (fold1 / "summary.json").write_text(json.dumps({"metric_per_case": [
            {"reference_file": f"/gt/{c}.nii.gz", "prediction_file": f"/p/{c}.nii.gz", "metrics": {"1": {"Dice": 1}}}
            for c in ("case_003", "case_004", "case_005")]}))
        (fold1 / "case_005.nii.gz").unlink()
        return ["--folds", "1"], (f"-pred CV={folder}: fold_1/validation/summary.json lists 1 case(s) without a "
                                  f"prediction file there: case_005")
    if kind == "only fold_all":
        shutil.rmtree(folder / "fold_1")
        (folder / "fold_0").rename(folder / "fold_all")
        return [], (f"-pred CV={folder}: no fold_N folder in {folder} (fold_all is trained on every case and has no "
                    f"cross-validation predictions)")
    if kind == "nnUNet_raw unset":
        return ["ENV-", "nnUNet_raw"], (f"-ref not given and environment variable nnUNet_raw is not set: export "
                                        f"nnUNet_raw (its {DATASET}/labelsTr holds the references) or give -ref")
    if kind == "no labelsTr":
        shutil.rmtree(raw / "labelsTr")
        return [], (f"-ref not given: the references of {DATASET} would be {raw / 'labelsTr'}, which does not "
                    f"exist; check nnUNet_raw or give -ref")
    if kind == "parent not a dataset":
        moved = root / "elsewhere" / TRAINER
        moved.parent.mkdir()
        folder.rename(moved)
        return ["PRED", moved], (f"-pred CV={moved}: without -ref the dataset is the trainer folder's parent, but "
                                 f"'elsewhere' is not named DatasetXXX_Name; give -ref")
    if kind == "folds without trainer folder":
        return ["PRED", raw / "labelsTr", "--folds", "0"], (
            "--folds applies to nnU-Net trainer folders (TRAINER__PLANS__CONFIG with fold_N subfolders) given to "
            "-pred, and none was given")
    if kind == "no -ref, plain folder":
        return ["PRED", raw / "labelsTr"], (
            "-ref (the folder of reference segmentations) is required unless -pred names an nnU-Net trainer folder "
            "(TRAINER__PLANS__CONFIG with fold_N/validation), whose dataset's labelsTr under nnUNet_raw is the default")
    raise AssertionError(kind)


FAULTS = ["case in two folds", "fold without validation", "case not in the dataset", "trainer folder with -ref labelsTs",
          "requested fold absent", "a fold's case missing", "summary.json lists a case without file", "only fold_all",
          "nnUNet_raw unset", "no labelsTr", "parent not a dataset", "folds without trainer folder",
          "no -ref, plain folder"]


@pytest.mark.parametrize("kind", FAULTS)
def test_cross_validation_faults_are_one_line_exit_2_nothing_written(tmp_path, monkeypatch, kind):
    raw, folders = make_world(tmp_path)
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    folder = folders[TRAINER]
    args, message = _break(kind, tmp_path, raw, folder)
    if args[:1] == ["ENV-"]:
        monkeypatch.delenv(args[1])
        args = []
    pred = folder
    if args[:1] == ["PRED"]:
        pred, args = args[1], args[2:]
    out = tmp_path / "report"
    done = run_cli("-pred", f"CV={pred}", "-o", out, "-np", "1", *args)
    assert done.returncode == 2, (kind, done.stdout, done.stderr)
    assert _messages(done.stderr) == [PREFIX + message], kind
    assert not out.exists()
