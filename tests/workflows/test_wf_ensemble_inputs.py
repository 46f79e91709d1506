"""`nnunet_dro ensemble`: argument parsing and the checks made before any prediction starts."""
import subprocess
import sys

import pytest

from nnunet_dro.errors import UserError
from nnunet_dro.workflows.ensemble import (Member, check_folds, parse_combinations, parse_members,
                                           trained_model_folder)


@pytest.mark.parametrize("values,expected", [
    (["ERM=nnUNetTrainer"], [Member("ERM", "nnUNetTrainer")]),
    (["nnUNetTrainerDRO"], [Member("nnUNetTrainerDRO", "nnUNetTrainerDRO")]),
    (["A=nnUNetTrainer", "B=nnUNetTrainerDRO_beta10"],
     [Member("A", "nnUNetTrainer"), Member("B", "nnUNetTrainerDRO_beta10")]),
])
def test_parse_members(values, expected):
    assert parse_members(values) == expected


@pytest.mark.parametrize("values,match", [
    ([], "at least one"), (["A=x", "A=y"], "twice"), (["=nnUNetTrainer"], "NAME=TRAINER"),
    (["A=bad name"], "NAME=TRAINER"), (["A/B=x"], "NAME=TRAINER")])
def test_parse_members_rejects(values, match):
    with pytest.raises(UserError, match=match):
        parse_members(values)


def test_parse_combinations():
    members = parse_members(["ERM=nnUNetTrainer", "DRO=nnUNetTrainerDRO"])
    assert parse_combinations(["ERM+DRO"], members) == [["ERM", "DRO"]]
    for bad in ("ERM", "ERM+XYZ", "+"):
        with pytest.raises(UserError, match="--combine"):
            parse_combinations([bad], members)


def test_trained_model_and_fold_checks(tmp_path):
    with pytest.raises(UserError, match="no results for dataset 7"):
        trained_model_folder(tmp_path, 7, "nnUNetTrainer", "nnUNetPlans", "3d_fullres")
    (tmp_path / "Dataset007_X" / "nnUNetTrainer__nnUNetPlans__3d_fullres" / "fold_0").mkdir(parents=True)
    with pytest.raises(UserError, match="nnUNetTrainerDRO was not trained"):
        trained_model_folder(tmp_path, 7, "nnUNetTrainerDRO", "nnUNetPlans", "3d_fullres")
    model = trained_model_folder(tmp_path, 7, "nnUNetTrainer", "nnUNetPlans", "3d_fullres")
    (model / "fold_0" / "checkpoint_final.pth").write_bytes(b"")
    check_folds(model, ["0"], "checkpoint_final.pth")
    with pytest.raises(UserError, match=r"fold\(s\) 1, 2"):
        check_folds(model, ["0", "1", "2"], "checkpoint_final.pth")


def test_cli_reports_a_missing_model_in_one_line(tmp_path):
    images = tmp_path / "imagesTs"
    images.mkdir()
    env = {"nnUNet_raw": str(tmp_path), "nnUNet_preprocessed": str(tmp_path), "nnUNet_results": str(tmp_path),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "nnunet_dro", "ensemble", "-d", "5", "-i", str(images),
                           "-o", str(tmp_path / "out"), "-tr", "ERM=nnUNetTrainer"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"nnunet_dro ensemble: error: no results for dataset 5 in nnUNet_results={tmp_path}"
