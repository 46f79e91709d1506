"""`nnunet_dro ensemble`: argument parsing and the checks made before any prediction starts."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from nnunet_dro.errors import UserError
from nnunet_dro.workflows.ensemble import (
    EnsemblePlan,
    Member,
    PredictionSettings,
    check_folds,
    parse_combinations,
    parse_members,
    trained_model_folder,
)


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


def test_prediction_settings_are_nnunet_predict_options():
    settings = PredictionSettings(folds=[0, 1], device="cpu", checkpoint="checkpoint_best.pth", npp=1, nps=2)
    assert settings.folds == ("0", "1") and hash(settings) == hash(PredictionSettings(**vars(settings)))
    assert settings.arguments() == ["-c", "3d_fullres", "-p", "nnUNetPlans", "-f", "0", "1", "-device", "cpu",
                                    "-chk", "checkpoint_best.pth", "-npp", "1", "-nps", "2", "--disable_progress_bar"]
    assert PredictionSettings(tta=False, save_probabilities=True).arguments()[-2:] == [
        "--save_probabilities", "--disable_tta"]
    with pytest.raises(AttributeError):
        settings.device = "cuda"  # frozen
    for options, match in [(dict(folds=()), "^-f: give at least one fold"), (dict(device="tpu"), "^-device 'tpu'"),
                           (dict(npp=-1), "^-npp -1"), (dict(nps=1.5), "^-nps 1.5"), (dict(plans=None), "^-p None"),
                           (dict(npp=0), r"^-npp 0 -nps 3: nnUNetv2_predict runs without worker processes only when"),
                           (dict(npp=2, nps=0), "^-npp 2 -nps 0:")]:
        with pytest.raises(UserError, match=match):
            PredictionSettings(**options)
    # both 0: nnU-Net's sequential prediction (nnUNetv2_predict's own rule), passed through as given
    sequential = PredictionSettings(npp=0, nps=0).arguments()
    start = sequential.index("-npp")
    assert sequential[start:start + 4] == ["-npp", "0", "-nps", "0"]


@pytest.mark.parametrize("given, variable, expected", [(2, "7", 2), (None, "0", 0), (None, " 5 ", 5), (None, "", 3),
                                                       (None, None, 3)])
def test_predict_processes_read_the_option_then_nnunets_variable(monkeypatch, given, variable, expected):
    from nnunet_dro.commands.ensemble import predict_processes

    if variable is None:
        monkeypatch.delenv("nnUNet_npp", raising=False)
    else:
        monkeypatch.setenv("nnUNet_npp", variable)
    assert predict_processes(given, "nnUNet_npp") == expected


@pytest.mark.parametrize("variable", ["three", "-1", "1.5"])
def test_a_bad_predict_processes_variable_is_named(monkeypatch, variable):
    from nnunet_dro.commands.ensemble import predict_processes

    monkeypatch.setenv("nnUNet_nps", variable)
    with pytest.raises(UserError, match=rf"^nnUNet_nps='{variable}': expected an integer >= 0"):
        predict_processes(None, "nnUNet_nps")


def test_ensemble_plan_names_and_checks():
    members = parse_members(["ERM=nnUNetTrainer", "DRO=nnUNetTrainerDRO"])
    plan = EnsemblePlan(members, PredictionSettings(folds=("0", "1")), combine=["ERM+DRO"], per_fold=True)
    assert plan.combine == (("ERM", "DRO"),)
    assert plan.names() == ["ERM", "DRO", "ERM_fold0", "ERM_fold1", "DRO_fold0", "DRO_fold1", "ERM+DRO"]
    assert EnsemblePlan(members, PredictionSettings(folds=("0",)), per_fold=True).names() == ["ERM", "DRO"]
    for options, match in [(dict(members=()), "at least one"), (dict(members=members * 2), "given twice"),
                           (dict(combine=[["ERM"]]), "--combine 'ERM'"), (dict(num_processes=0), "^-np 0")]:
        with pytest.raises(UserError, match=match):
            EnsemblePlan(**{"members": members, **options})


def test_each_prediction_gets_its_settings(tmp_path, monkeypatch):
    """Probabilities are saved for the members of a cross-trainer ensemble only; single folds are
    predicted with the plan's settings but one fold."""
    import nnunet_dro.workflows.ensemble as ensemble

    calls = []

    def record(kind):
        def run(env, *args, **kwargs):
            calls.append((kind, args))
            target = args[2] if kind == "predict" else args[1]
            target.mkdir()
            return target
        return run

    monkeypatch.setattr(ensemble, "predict", record("predict"))
    monkeypatch.setattr(ensemble, "ensemble", record("ensemble"))
    members = parse_members(["ERM=nnUNetTrainer", "DRO=nnUNetTrainerDRO", "GB=nnUNetTrainerGroupBalanced"])
    settings = PredictionSettings(folds=("0", "1"), device="cpu", tta=False)
    plan = EnsemblePlan(members, settings, combine=[["ERM", "DRO"]], per_fold=True, num_processes=3)
    folders = ensemble._predict_all({}, 990, "imgs", tmp_path, plan, log_file=None, echo=None)
    assert list(folders) == plan.names()
    predicted = {args[2].name: (args[3], args[4]) for kind, args in calls if kind == "predict"}
    assert predicted["ERM"] == ("nnUNetTrainer", PredictionSettings(folds=("0", "1"), device="cpu", tta=False,
                                                                    save_probabilities=True))
    assert predicted["GB"][1] == settings and predicted["DRO_fold1"][1] == PredictionSettings(
        folds=("1",), device="cpu", tta=False)
    assert calls[-1] == ("ensemble", ([tmp_path / "ERM", tmp_path / "DRO"], tmp_path / "ERM+DRO", 3))


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
    _write_nifti(images / "case_000_0000.nii.gz", np.zeros((4, 4, 4), np.float32))
    env = {"nnUNet_raw": str(tmp_path), "nnUNet_preprocessed": str(tmp_path), "nnUNet_results": str(tmp_path),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "nnunet_dro", "ensemble", "-d", "5", "-i", str(images),
                           "-o", str(tmp_path / "out"), "-tr", "ERM=nnUNetTrainer"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"nnunet_dro ensemble: error: no results for dataset 5 in nnUNet_results={tmp_path}"


def _write_nifti(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(sitk.GetImageFromArray(array), str(path))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two 'trained' trainers (fold 0 checkpoints; never loaded: every test fails before predicting),
    a folder of test images, reference labels and a subgroup table."""
    root = tmp_path_factory.mktemp("ensemble")
    for trainer, folds in (("nnUNetTrainer", (0, 1)), ("nnUNetTrainerDRO", (0,))):
        for fold in folds:
            checkpoint = root / "results" / "Dataset005_X" / f"{trainer}__nnUNetPlans__3d_fullres" / \
                f"fold_{fold}" / "checkpoint_final.pth"
            checkpoint.parent.mkdir(parents=True)
            checkpoint.write_bytes(b"")
    for case in ("case_000", "case_001"):
        _write_nifti(root / "imagesTs" / f"{case}_0000.nii.gz", np.zeros((4, 4, 4), np.float32))
        _write_nifti(root / "labelsTs" / f"{case}.nii.gz", np.ones((4, 4, 4), np.uint8))
    (root / "groups.tsv").write_text("case\tsite\ncase_000\tA\ncase_001\tB\n")
    (root / "a_file").write_text("mine\n")
    (root / "out_with_bad_report" / "evaluation" / "summary.json").mkdir(parents=True)
    return root


def _ensemble(root: Path, *args, **variables: str) -> subprocess.CompletedProcess:
    env = {"nnUNet_raw": str(root), "nnUNet_preprocessed": str(root), "nnUNet_results": str(root / "results"),
           "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", **variables}
    return subprocess.run([sys.executable, "-m", "nnunet_dro", "ensemble", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


BAD_ENSEMBLE_ARGUMENTS = {  # name -> (arguments replacing the defaults, expected message after "error: ")
    "-o is a file": ({"-o": "{root}/a_file"}, "-o {root}/a_file: exists and is not a folder"),
    "-o below a file": ({"-o": "{root}/a_file/out"}, "-o {root}/a_file/out: {root}/a_file is a file, not a folder"),
    "-o/evaluation holds a folder named like a report file": (
        {"-o": "{root}/out_with_bad_report"},
        "-o {root}/out_with_bad_report/evaluation: {root}/out_with_bad_report/evaluation/summary.json is a folder, "
        "but the report writes a file of that name; rename or remove it"),
    "missing -ref folder": ({"-ref": "{root}/labelsTr"}, "reference folder does not exist: {root}/labelsTr"),
    "unknown -regions preset": ({"-regions": "fetal"}, "unknown region preset 'fetal'"),
    "malformed -regions": ({"-regions": "WT=1,x"}, "-regions region 'WT': label values must be integers"),
    "unknown --group-by column": ({"-groups": "{root}/groups.tsv", "--group-by": "centre"},
                                  "no group column 'centre'"),
    "missing -groups table": ({"-groups": "{root}/nope.tsv"}, "nope.tsv"),
    "fold missing for the second trainer": ({"-f": "0 1"}, "nnUNetTrainerDRO__nnUNetPlans__3d_fullres: no "
                                                           "checkpoint_final.pth for fold(s) 1"),
    "image folder without images": ({"-i": "{root}/labelsTs"},
                                    "input image folder {root}/labelsTs holds no images named like nnU-Net's "
                                    "CASE_0000.nii.gz"),
    "-np 0": ({"-np": "0"}, "argument -np: 0 is not a positive integer"),
    "-npp 0 without -nps 0": ({"-npp": "0"}, "-npp 0 -nps 3: nnUNetv2_predict runs without worker processes only "
                                             "when both are 0"),
    "-nps -1": ({"-nps": "-1"}, "argument -nps: -1 is not an integer >= 0"),
    "-d 1000": ({"-d": "1000"}, "argument -d: 1000 is not a dataset ID (1-999)"),
}


@pytest.mark.parametrize("name", list(BAD_ENSEMBLE_ARGUMENTS))
def test_cli_checks_every_argument_before_predicting_and_creates_nothing(trained, name):
    """Each of these used to surface after hours of prediction, as a traceback, or left an empty
    predictions/ folder behind."""
    changes, message = BAD_ENSEMBLE_ARGUMENTS[name]
    arguments = {"-d": "5", "-i": "{root}/imagesTs", "-o": "{root}/out", "-tr": "ERM=nnUNetTrainer DRO=nnUNetTrainerDRO",
                 "-f": "0", "-device": "cpu", "-ref": "{root}/labelsTs", **changes}
    args = [part.format(root=trained) for option, value in arguments.items() for part in [option, *value.split()]]
    before = sorted(str(p) for p in trained.rglob("*"))
    done = _ensemble(trained, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("nnunet_dro ensemble: error: ") and message.format(root=trained) in last, last
    assert "Traceback" not in done.stderr and "[ensemble] predicting" not in done.stdout
    if not message.startswith("argument "):  # argparse errors print the usage first; ours are one line
        assert done.stderr.strip().splitlines() == [last], done.stderr
    assert sorted(str(p) for p in trained.rglob("*")) == before  # nothing created (no predictions/ folder)


def test_cli_names_a_bad_nnunet_nps_variable_and_creates_nothing(trained):
    before = sorted(str(p) for p in trained.rglob("*"))
    done = _ensemble(trained, "-d", "5", "-i", trained / "imagesTs", "-o", trained / "out", "-tr", "ERM=nnUNetTrainer",
                     "-f", "0", "-device", "cpu", nnUNet_nps="three")
    assert done.returncode == 2
    assert done.stderr.strip() == "nnunet_dro ensemble: error: nnUNet_nps='three': expected an integer >= 0 (or unset: 3)"
    assert sorted(str(p) for p in trained.rglob("*")) == before
