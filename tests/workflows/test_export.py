"""`nnunet_dro export`: argument checks (one line, exit code 2, nothing written) and the choice of
files, on real folders without a trained model. The round trip through nnU-Net's CLIs (train,
export, install, predict without nnunet_dro) is tests/training/test_train_export.py."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nnunet_dro import cli
from nnunet_dro.errors import UserError
from nnunet_dro.workflows.ensemble import PredictionSettings
from nnunet_dro.workflows.export import (
    ExportRequest,
    collect_model,
    ensemble_files,
    exported_checkpoint,
    foreign_modules,
    plan_export,
    renamed_ensemble,
    weights_mismatch,
)

DATASET = "Dataset977_ExportTest"
SOURCE = "nnUNetTrainerDRO__nnUNetPlans__3d_fullres"
TARGET = "nnUNetTrainer__nnUNetPlans__3d_fullres"


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """An nnUNet_results with a model folder of nnUNetTrainerDRO (files, no real checkpoint)."""
    root = tmp_path / "results"
    folder = root / DATASET / SOURCE
    (folder / "fold_0" / "validation").mkdir(parents=True)
    for name in ("plans.json", "dataset.json", "dataset_fingerprint.json"):
        (folder / name).write_text("{}")
    for name in ("checkpoint_final.pth", "progress.png", "debug.json", "dro_hardness.csv", "dro_progress.png",
                 "training_log_2024.txt"):
        (folder / "fold_0" / name).write_text(name)
    (folder / "fold_0" / "validation" / "summary.json").write_text("{}")
    (folder / "fold_0" / "validation" / "case_000.nii.gz").write_text("seg")
    (folder / "fold_0" / "validation" / "case_000.npz").write_text("probabilities")
    for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_extTrainer"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("nnUNet_results", str(root))
    return root


def run_export(capsys, *argv):
    code = cli.main(["export", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def expect_one_line_error(capsys, argv, match, output):
    code, _, err = run_export(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("nnunet_dro export: error: ") and match in lines[0], lines[0]
    assert not Path(output).exists()


@pytest.mark.parametrize("extra,match", [
    (["-d", "977", "-tr", "a/b"], "-tr 'a/b': expected letters"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "-p", "x__y"], "-p 'x__y'"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "-f", "x"], "-f 'x': a fold is an integer >= 0 or 'all'"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "-chk", "../checkpoint.pth"], "-chk '../checkpoint.pth'"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "--as-trainer", "nnUNetTrainerDRO"],
     "--as-trainer nnUNetTrainerDRO: not a trainer of nnunetv2"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "--as-trainer", "NoSuchTrainer"], "not a trainer of nnunetv2"),
    (["-d", "abc", "-tr", "nnUNetTrainerDRO"], "-d 'abc': expected a dataset ID (1-999) or name"),
    (["-d", "5", "-tr", "nnUNetTrainerDRO"], "-d 5: Could not find a dataset with the ID 5"),
    (["-d", "Dataset005_Nothing", "-tr", "nnUNetTrainerDRO"], "no trained models of Dataset005_Nothing"),
    (["-d", "977", "-tr", "nnUNetTrainerDROAdaptive"], "no model of nnUNetTrainerDROAdaptive with nnUNetPlans"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "-c", "2d"], "was not trained in configuration(s) 2d"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "-f", "0", "1"], "fold(s) 1 not trained (no fold_1 in"),
    (["-d", "977", "-tr", "nnUNetTrainerDRO", "-f", "0", "-chk", "checkpoint_best.pth"],
     "checkpoint(s) missing: fold_0/checkpoint_best.pth"),
])
def test_bad_arguments(results, tmp_path, capsys, extra, match):
    output = tmp_path / "new" / "model.zip"
    expect_one_line_error(capsys, ["-o", output, *extra], match, output)
    assert not output.parent.exists()


def test_unknown_dataset_lists_the_folders_nnunet_looked_in(results, tmp_path, capsys):
    """nnU-Net's message ends with the folders it searched; the one-line error keeps them."""
    code, _, err = run_export(capsys, "-o", tmp_path / "m.zip", "-d", "5", "-tr", "nnUNetTrainerDRO")
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith("nnunet_dro export: error: -d 5: Could not find a dataset with the ID 5.")
    assert (f"Here are your currently defined folders: nnUNet_preprocessed=None nnUNet_results={results} "
            f"nnUNet_raw=None If something is not right, adapt your environment variables.") in line


def test_nnunet_results_must_be_set(results, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("nnUNet_results")
    expect_one_line_error(capsys, ["-o", tmp_path / "m.zip", "-d", "977", "-tr", "nnUNetTrainerDRO"],
                          "nnUNet_results is not set", tmp_path / "m.zip")
    monkeypatch.setenv("nnUNet_results", str(tmp_path / "missing"))
    expect_one_line_error(capsys, ["-o", tmp_path / "m.zip", "-d", "977", "-tr", "nnUNetTrainerDRO"],
                          "is not a folder", tmp_path / "m.zip")


def test_output_in_a_bad_place(results, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    args = ["-d", "977", "-tr", "nnUNetTrainerDRO", "-f", "0"]
    expect_one_line_error(capsys, ["-o", blocker / "sub" / "m.zip", *args], f"{blocker} is a file, not a folder",
                          blocker / "sub" / "m.zip")
    expect_one_line_error(capsys, ["-o", tmp_path, *args], "is a folder; give the name of the zip file",
                          tmp_path / "m.zip")
    assert blocker.read_text() == "x"


def test_missing_plans_json(results, tmp_path, capsys):
    (results / DATASET / SOURCE / "plans.json").unlink()
    expect_one_line_error(capsys, ["-o", tmp_path / "m.zip", "-d", DATASET, "-tr", "nnUNetTrainerDRO", "-f", "0"],
                          "plans.json missing", tmp_path / "m.zip")


def test_a_broken_checkpoint_is_refused_and_nothing_is_left_behind(results, tmp_path, capsys):
    """The checks that need the network run while the zip is written under a temporary name."""
    folder = results / DATASET / SOURCE
    plans = {"dataset_name": DATASET, "plans_name": "nnUNetPlans", "original_median_spacing_after_transp": [1, 1, 1],
             "original_median_shape_after_transp": [8, 8, 8], "image_reader_writer": "SimpleITKIO",
             "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2],
             "configurations": {"3d_fullres": {
                 "data_identifier": "nnUNetPlans_3d_fullres", "preprocessor_name": "DefaultPreprocessor",
                 "batch_size": 2, "patch_size": [8, 8, 8], "median_image_size_in_voxels": [8, 8, 8],
                 "spacing": [1, 1, 1], "normalization_schemes": ["ZScoreNormalization"], "use_mask_for_norm": [False],
                 "resampling_fn_data": "resample_data_or_seg_to_shape",
                 "resampling_fn_seg": "resample_data_or_seg_to_shape",
                 "resampling_fn_data_kwargs": {}, "resampling_fn_seg_kwargs": {},
                 "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
                 "resampling_fn_probabilities_kwargs": {}, "batch_dice": False,
                 "architecture": {
                     "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
                     "arch_kwargs": {"n_stages": 2, "features_per_stage": [4, 8],
                                     "conv_op": "torch.nn.modules.conv.Conv3d",
                                     "kernel_sizes": [[3, 3, 3], [3, 3, 3]], "strides": [[1, 1, 1], [2, 2, 2]],
                                     "n_conv_per_stage": [1, 1], "n_conv_per_stage_decoder": [1], "conv_bias": True,
                                     "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
                                     "norm_op_kwargs": {"eps": 1e-05, "affine": True}, "dropout_op": None,
                                     "dropout_op_kwargs": None, "nonlin": "torch.nn.LeakyReLU",
                                     "nonlin_kwargs": {"inplace": True}},
                     "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"]}}},
             "experiment_planner_used": "ExperimentPlanner", "label_manager": "LabelManager",
             "foreground_intensity_properties_per_channel": {}}
    (folder / "plans.json").write_text(json.dumps(plans))
    (folder / "dataset.json").write_text(json.dumps({"channel_names": {"0": "MRI"}, "labels": {"background": 0, "a": 1},
                                                     "numTraining": 2, "file_ending": ".nii.gz"}))
    output = tmp_path / "out" / "m.zip"
    expect_one_line_error(capsys, ["-o", output, "-d", "977", "-tr", "nnUNetTrainerDRO", "-f", "0"],
                          "checkpoint_final.pth: cannot be read as a checkpoint", output)
    assert not output.parent.exists()  # the folder -o created, the temporary zip and scratch files: gone


def test_files_taken_as_nnunet_export_takes_them(results):
    dataset_dir = results / DATASET
    crossval = dataset_dir / SOURCE / "crossval_results_folds_0"
    crossval.mkdir()
    for name in ("summary.json", "postprocessing.pkl", "postprocessing.json", "case_000.nii.gz"):
        (crossval / name).write_text(name)

    def names(model):
        return sorted(name for _, name in model.files)

    request = ExportRequest(DATASET, "m.zip", "nnUNetTrainerDRO", plans="nnUNetPlans", folds=["0"],
                            checkpoints=["checkpoint_final.pth"], as_trainer="nnUNetTrainer")
    model = collect_model(dataset_dir, request, "3d_fullres")
    prefix = f"{DATASET}/{TARGET}"
    assert [name for _, name in model.checkpoints] == [f"{prefix}/fold_0/checkpoint_final.pth"]
    assert names(model) == sorted(f"{prefix}/{n}" for n in (
        "fold_0/debug.json", "fold_0/progress.png", "fold_0/dro_hardness.csv", "fold_0/dro_progress.png",
        "fold_0/validation/summary.json", "crossval_results_folds_0/summary.json",
        "crossval_results_folds_0/postprocessing.pkl", "crossval_results_folds_0/postprocessing.json",
        "plans.json", "dataset.json", "dataset_fingerprint.json"))
    dropped = collect_model(dataset_dir, replace(request, drop_state=True, crossval_predictions=True), "3d_fullres")
    assert not [n for n in names(dropped) if "/dro_" in n]
    assert f"{prefix}/fold_0/validation/case_000.nii.gz" in names(dropped)
    assert f"{prefix}/crossval_results_folds_0/case_000.nii.gz" in names(dropped)
    assert not [n for n in names(dropped) if n.endswith(".npz") and "/validation/" in n]


def test_ensembles_of_exported_configurations_are_renamed(results):
    dataset_dir = results / DATASET
    ensembles = dataset_dir / "ensembles"
    mine = "ensemble___nnUNetTrainerDRO__nnUNetPlans__2d___nnUNetTrainerDRO__nnUNetPlans__3d_fullres___0_1_2_3_4"
    other = "ensemble___nnUNetTrainer__nnUNetPlans__2d___nnUNetTrainerDRO__nnUNetPlans__3d_fullres___0_1_2_3_4"
    for name in (mine, other):
        (ensembles / name).mkdir(parents=True)
        (ensembles / name / "summary.json").write_text("{}")
    files = ensemble_files(dataset_dir, "nnUNetTrainerDRO", "nnUNetTrainer", "nnUNetPlans", ["2d", "3d_fullres"],
                           crossval_predictions=False)
    assert [name for _, name in files] == [
        f"{DATASET}/ensembles/ensemble___nnUNetTrainer__nnUNetPlans__2d___nnUNetTrainer__nnUNetPlans__3d_fullres"
        f"___0_1_2_3_4/summary.json"]
    assert ensemble_files(dataset_dir, "nnUNetTrainerDRO", "nnUNetTrainer", "nnUNetPlans", ["3d_fullres"], False) == []
    assert renamed_ensemble("not_an_ensemble", "a", "b", "p", ["2d"]) is None


def test_checkpoint_helpers():
    import torch

    checkpoint = {"network_weights": {"w": torch.ones(2)}, "trainer_name": "nnUNetTrainerDRO", "init_args": {},
                  "current_epoch": 3, "dro_state": {"losses": [1.0]}}
    kept = exported_checkpoint(checkpoint, "nnUNetTrainer", drop_state=False)
    assert kept["trainer_name"] == "nnUNetTrainer" and kept["dro_state"] == {"losses": [1.0]}
    assert checkpoint["trainer_name"] == "nnUNetTrainerDRO"  # the original is not modified
    assert "dro_state" not in exported_checkpoint(checkpoint, "nnUNetTrainer", drop_state=True)
    assert weights_mismatch({"w": torch.ones(2)}, {"w": (2,)}) is None
    assert "missing (v)" in weights_mismatch({"w": torch.ones(2)}, {"w": (2,), "v": (1,)})
    assert foreign_modules(["numpy.core.multiarray._reconstruct", "__main__.Thing"]) == ["__main__.Thing"]


def test_the_subcommand_is_registered():
    parser = cli.build_parser()
    args = parser.parse_args(["export", "-d", "1", "-o", "m.zip", "-tr", "nnUNetTrainerDRO"])
    assert (args.as_trainer, args.folds, args.checkpoints, args.plans, args.configurations, args.drop_state) == (
        "nnUNetTrainer", ["0", "1", "2", "3", "4"], ["checkpoint_final.pth"], "nnUNetPlans", None, False)
    with pytest.raises(UserError):
        from nnunet_dro.workflows.export import check_name
        check_name("a__b", "-tr")


def test_the_request_checks_and_normalises_its_options():
    request = ExportRequest(977, "m.zip", "nnUNetTrainerDRO", configurations=["3d_fullres"], folds=[1, "0", "1"],
                            checkpoints=["checkpoint_best.pth", "checkpoint_best.pth"])
    assert (request.folds, request.checkpoints, request.configurations) == (
        ("1", "0"), ("checkpoint_best.pth",), ("3d_fullres",))
    with pytest.raises(AttributeError):
        request.plans = "other"  # frozen
    for options, match in [(dict(trainer="a__b"), "^-tr 'a__b'"), (dict(as_trainer="x y"), "^--as-trainer"),
                           (dict(configurations=["2d", "../x"]), "^-c '../x'"), (dict(folds=["0", "-1"]), "^-f '-1'"),
                           (dict(checkpoints=["a/b.pth"]), "^-chk 'a/b.pth'")]:
        with pytest.raises(UserError, match=match):
            replace(request, **options)
    settings = PredictionSettings(configuration="2d", plans="P", folds=("0", "2"), checkpoint="checkpoint_best.pth")
    same = ExportRequest.of_prediction(settings, "977", "m.zip", "nnUNetTrainerDRO", drop_state=True)
    assert (same.configurations, same.plans, same.folds, same.checkpoints, same.drop_state) == (
        ("2d",), "P", ("0", "2"), ("checkpoint_best.pth",), True)


def test_the_plan_finds_every_file_and_writes_nothing(results, tmp_path):
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    plan = plan_export(ExportRequest("977", tmp_path / "out" / "m.zip", "nnUNetTrainerDRO", folds=["0"]))
    assert plan.configurations == ("3d_fullres",) and plan.dataset_dir == results / DATASET
    assert [m.target_identifier for m in plan.models] == [TARGET] and plan.output == tmp_path / "out" / "m.zip"
    assert plan.stock_class.__name__ == "nnUNetTrainer" and plan.notes == ()
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
