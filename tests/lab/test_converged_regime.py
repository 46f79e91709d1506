"""The converged regime's pieces (issue 78): stratified folds nnU-Net reads, the 2D cohort that keeps
both kinds of hidden stratification, and a budget twin that keeps nnU-Net's final validation and
copies of its network part-way, run for real through ``nnUNetv2_train``."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.synthetic_common import write_cohort
from nnunet_dro.data.synthetic_fetal import (
    CEREBELLUM,
    FETA_LABELS,
    VENTRICLES,
    generate_fetal_cohort,
)
from nnunet_dro.errors import UserError
from nnunet_dro.lab.budget import KEEP_CHECKPOINTS_ENV, checkpoint_name, kept_checkpoint_epochs
from nnunet_dro.lab.cohort2d import PLANE_SIZE, plane_cases, plane_index
from nnunet_dro.lab.ext_trainers import lab_trainer_dirs
from nnunet_dro.lab.splits import stratified_folds, write_splits
from nnunet_dro.workflows.nnunet_commands import nnunet_environment


def v2_groups() -> dict[str, str]:
    """The v2 cohort's training pool: 100 / 15 / 10."""
    counts = {"control": 100, "spina_bifida": 15, "other": 10}
    return {f"{group}_{i:03d}": group for group, n in counts.items() for i in range(n)}


def test_stratified_folds_put_every_group_in_every_fold_in_proportion():
    groups = v2_groups()
    folds = stratified_folds(groups, seed=40)
    assert len(folds) == 5
    for fold in folds:
        assert Counter(groups[c] for c in fold["val"]) == {"control": 20, "spina_bifida": 3, "other": 2}
        assert Counter(groups[c] for c in fold["train"]) == {"control": 80, "spina_bifida": 12, "other": 8}
        assert not set(fold["train"]) & set(fold["val"])
    assert sorted(c for fold in folds for c in fold["val"]) == sorted(groups)  # each case validated once
    assert stratified_folds(groups, seed=40) == folds and stratified_folds(groups, seed=41) != folds


def test_a_group_smaller_than_the_folds_is_refused():
    with pytest.raises(UserError, match="other.*fewer cases than the 5 folds"):
        stratified_folds({**{f"c{i}": "control" for i in range(20)}, "r1": "other", "r2": "other"})


def test_splits_file_is_written_once_and_another_split_is_refused(tmp_path):
    folds = stratified_folds(v2_groups(), seed=1)
    path = write_splits(tmp_path, folds)
    assert json.loads(path.read_text()) == folds and path.name == "splits_final.json"
    assert write_splits(tmp_path, folds) == path  # the same split again: nothing to do
    with pytest.raises(UserError, match="holds another split"):
        write_splits(tmp_path, stratified_folds(v2_groups(), seed=2))
    assert json.loads(path.read_text()) == folds


@pytest.mark.parametrize("text, epochs, expected", [("50,75", 800, (400, 600)), ("12.5", 1600, (200,)),
                                                     ("100", 10, ()), ("1", 10, (1,)), (" ", 10, ())])
def test_kept_checkpoint_epochs(text, epochs, expected):
    assert kept_checkpoint_epochs(text, epochs) == expected


@pytest.mark.parametrize("text", ["0", "150", "half", "-5"])
def test_kept_checkpoints_refuse_what_is_not_a_percentage(text):
    with pytest.raises(RuntimeError, match=KEEP_CHECKPOINTS_ENV):
        kept_checkpoint_epochs(text, 100)


def test_the_plane_is_the_volumes_column_and_keeps_groups_and_sites():
    volumes = generate_fetal_cohort(n_train=6, n_test=3, size=32, seed=3)
    planes = plane_cases(volumes)
    k = plane_index(32)
    for volume, plane in zip(volumes, planes):
        assert plane.label.shape == (1, 32, 32)
        np.testing.assert_array_equal(plane.label[0], volume.label[:, :, k])
        np.testing.assert_array_equal(plane.channels[0][0], volume.channels[0][:, :, k])
        assert (plane.case, plane.split, plane.groups) == (volume.case, volume.split, volume.groups)


def test_the_2d_cohort_keeps_both_kinds_of_hidden_stratification():
    """Rare because under-fitted: "other" has the larger intra-axial CSF; hard because faint: the
    spina bifida cerebellum is smaller and closer to its surroundings' grey level than the controls'."""
    planes = plane_cases(generate_fetal_cohort(n_train=60, n_test=30, size=PLANE_SIZE, seed=40,
                                               train_fractions={"control": 1 / 3, "spina_bifida": 1 / 3,
                                                                "other": 1 / 3}))
    by_group: dict[str, list] = {}
    for case in planes:
        label, image = case.label[0], case.channels[0][0]
        cerebellum = label == CEREBELLUM
        contrast = (abs(float(image[cerebellum].mean()) - float(image[label == 3].mean()))
                    if cerebellum.any() else np.nan)
        by_group.setdefault(case.groups["condition"], []).append(
            ((label == VENTRICLES).sum(), cerebellum.sum(), contrast))
    mean = {group: np.nanmean(np.array(rows, dtype=float), axis=0) for group, rows in by_group.items()}
    assert mean["other"][0] > 1.8 * mean["control"][0]
    assert mean["spina_bifida"][1] < 0.5 * mean["control"][1]
    assert mean["spina_bifida"][2] < mean["control"][2]
    for group, rows in by_group.items():  # the scored regions are in (almost) every plane
        present = np.array([[r[0] > 0, r[1] > 0] for r in rows])
        assert present.mean(axis=0).min() >= 0.85, group


def test_budget_twin_keeps_its_final_validation_and_networks_part_way(tmp_path, monkeypatch):
    """A real 2D training of 4 epochs through nnUNetv2_train: the network after epoch 2 is kept
    (nnU-Net's files record 2 epochs trained), and nnU-Net's final validation runs and scores fold 0."""
    env = nnunet_environment(tmp_path, extra_trainer_dirs=lab_trainer_dirs(), overrides={
        "nnUNet_def_n_proc": "1", "nnUNet_n_proc_DA": "1", "nnUNet_compile": "f",
        "nnUNet_dro_short_run": "4x2", "nnUNet_dro_torch_threads": "1", "nnUNet_dro_seed": "5",
        "nnUNet_dro_final_validation": "1", KEEP_CHECKPOINTS_ENV: "50"})
    monkeypatch.setenv("nnUNet_raw", env["nnUNet_raw"])
    write_cohort(plane_cases(generate_fetal_cohort(n_train=10, n_test=2, size=24, seed=5,
                                                   train_fractions={"control": 0.5, "spina_bifida": 0.5})),
                 DatasetTarget(977, "Plane"), channel_names={0: "T2"}, labels=FETA_LABELS, spacing_mm=4.0,
                 description="test")
    bin_dir = Path(sys.executable).parent

    def run(tool: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / tool), *args], env=env, capture_output=True, text=True, timeout=600)

    planned = run("nnUNetv2_plan_and_preprocess", "-d", "977", "-c", "2d", "-np", "1")
    assert planned.returncode == 0, planned.stderr[-2000:]
    trained = run("nnUNetv2_train", "977", "2d", "0", "-tr", "nnUNetTrainer_CPUBudget", "-device", "cpu")
    assert trained.returncode == 0, trained.stderr[-3000:]
    fold = next((tmp_path / "nnUNet_results").glob("Dataset977_Plane/nnUNetTrainer_CPUBudget__*__2d/fold_0"))
    kept = torch.load(fold / checkpoint_name(2), map_location="cpu", weights_only=False)
    final = torch.load(fold / "checkpoint_final.pth", map_location="cpu", weights_only=False)
    assert kept["current_epoch"] == 2 and final["current_epoch"] == 4
    assert sorted(p.name for p in fold.glob("checkpoint_epoch_*.pth")) == [checkpoint_name(2)]
    assert any(not torch.equal(kept["network_weights"][k], final["network_weights"][k]) for k in kept["network_weights"])
    summary = json.loads((fold / "validation" / "summary.json").read_text())
    assert len(summary["metric_per_case"]) == 2  # fold 0 of 10 cases


def test_the_plane_cohort_command_writes_the_generators_cases_cut_at_the_plane(tmp_path, monkeypatch):
    import SimpleITK as sitk

    monkeypatch.setenv("nnUNet_raw", str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "nnunet_dro.lab.cohort2d", "--id", "978", "-n", "Planes",
                           "--n-train", "4", "--n-test", "3", "--size", "24", "--seed", "7"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    volumes = generate_fetal_cohort(n_train=4, n_test=3, size=24, seed=7)
    folder = tmp_path / "Dataset978_Planes"
    for volume in volumes:
        split = "Tr" if volume.split == "train" else "Ts"
        label = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / f"labels{split}" / f"{volume.case}.nii.gz")))
        assert label.shape == (1, 24, 24)
        np.testing.assert_array_equal(label[0], volume.label[:, :, plane_index(24)])
    bad = subprocess.run([sys.executable, "-m", "nnunet_dro.lab.cohort2d", "--id", "979", "--plane", "1.0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--plane 1.0" in bad.stderr
    assert not (tmp_path / "Dataset979_SyntheticFetalPlanes").exists()


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_converged_regimes_benchmark_run_end_to_end(tmp_path, monkeypatch):
    """The benchmark on the 2D cohort with fold 0 of a stratified split, networks kept at 50 % and 75 %, the
    training fit scored on every kept network: ERM and Just Train Twice, one seed, a tiny budget."""
    import contextlib
    import io

    import pandas as pd

    from nnunet_dro.lab import arm_runs, benchmark
    from nnunet_dro.lab.calibration import check_erm_run

    out, record = tmp_path / "bench", tmp_path / "record"
    monkeypatch.setitem(arm_runs.JTT_SETTINGS, "rule", "mean-dice")  # 4 epochs of 2 iterations: worst-dice ties
    monkeypatch.setenv("nnUNet_n_proc_DA", "0")
    args = ["--seeds", "1,", "--epochs", "4", "--iterations", "2", "--n-train", "63", "--n-test", "6", "--size", "24",
            "--plane", "0.11", "--validation-fold", "--keep-checkpoints", "50,75", "--training-fit", "--large-test", "3",
            "--torch-threads", "1", "--arms", "ERM,JTT", "-o", str(out), "--export-record", str(record)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = benchmark.main(args)
    assert code == 0, printed.getvalue()[-3000:]
    seed = out / "runs" / "seed_1"
    results = seed / "nnunet" / "nnUNet_results"
    splits = json.loads(next((seed / "nnunet" / "nnUNet_preprocessed").glob("Dataset*/splits_final.json")).read_text())
    groups = pd.read_csv(next((seed / "nnunet" / "nnUNet_raw").glob("Dataset*/subgroups.tsv")), sep="\t")
    condition = dict(zip(groups["case"].astype(str), groups["condition"]))
    assert Counter(condition[c] for c in splits[0]["val"])["other"] == 1  # 5 "other" cases: one per fold
    trained = set(splits[0]["train"])
    for trainer, plans in (("nnUNetTrainer_CPUBudget", "nnUNetPlans"), ("nnUNetTrainerCaseWeights_CPUBudget",
                                                                       "nnUNetPlans_JTT")):
        fold = next(results.glob(f"Dataset*/{trainer}__{plans}__2d/fold_0"))
        assert (fold / checkpoint_name(2)).is_file() and (fold / "validation" / "summary.json").is_file()
    error_set = pd.read_csv(seed / "arms" / "JTT" / "case_weights.tsv", sep="\t", dtype={"case": str})
    assert set(error_set["case"]) == trained  # the error set is chosen among the cases ERM trained on
    curve = pd.read_csv(out / "training_fit_curve.csv")
    assert sorted(set(curve["epoch"])) == [2, 3, 4] and set(curve["method"]) == {"ERM", "JTT"}
    counts = curve[(curve["method"] == "ERM") & (curve["epoch"] == 2)].groupby("group")["n"].max().to_dict()
    assert counts["other"] == sum(condition[c] == "other" for c in trained) == 4
    assert (record / "runs" / "seed_1" / "arms" / "ERM" / "per_case_training_epoch_2.csv").is_file()
    check = check_erm_run(next(results.glob("Dataset*/nnUNetTrainer_CPUBudget__nnUNetPlans__2d/fold_0")),
                          groups.astype({"case": str}), epochs=4)
    assert set(check.control_means) == {"white_matter", "intra_axial_csf", "cerebellum"} and check.epochs == 4
    # the registered secondary: HD95 on the larger test set, per arm in the record, its worst tenth per seed
    for arm in ("ERM", "JTT"):
        hd95 = pd.read_csv(record / "runs" / "seed_1" / "arms" / arm / "per_case_large_test_hd95.csv")
        dice = pd.read_csv(record / "runs" / "seed_1" / "arms" / arm / "per_case_large_test.csv")
        assert set(hd95["metric"]) == {"hd95"} and set(dice["metric"]) == {"dice"}
        assert len(hd95) == len(dice) == 3 * 3 * len(set(dice["region"]))  # 3 cases per group
        assert (hd95["value"].dropna() >= 0).all()
    worst = pd.read_csv(out / "hd95_large_test.csv")
    assert {"seed", "method", "group", "region", "n", "mean", "median", "p90"} <= set(worst.columns)
    assert set(worst["group"]) >= {"control", "other"}
    # ERM's exclusion test kept in the record (its fold folder is not): the same verdict as on the folder
    stored = json.loads((record / "runs" / "seed_1" / "arms" / "ERM" / "calibration_check.json").read_text())
    assert stored["passed"] == check.passed and stored["learned_epoch"] == check.learned_epoch
    assert stored["control_means"] == pytest.approx(check.control_means, nan_ok=True)
    assert not (record / "runs" / "seed_1" / "arms" / "JTT" / "calibration_check.json").exists()  # ERM's runs only
    checks = pd.read_csv(out / "calibration_checks.csv")  # (ii) beside (i), the plateau at 2 -> 4 epochs
    assert checks[["seed", "arm"]].values.tolist() == [[1, "ERM"]]
    assert bool(checks.loc[0, "passed"]) == check.passed
    rise = checks.loc[0, "fit_at_end"] - checks.loc[0, "fit_at_75"]  # stored to 6 decimals
    assert checks.loc[0, "rise_last_quarter"] == pytest.approx(rise, abs=1e-5, nan_ok=True)


def test_a_run_restored_from_the_record_reads_its_stored_training_curve(tmp_path):
    """A working folder lost between sessions is restored from the record (results and scorings,
    no run folder): the next batch on that seed reads the ERM arm's stored curve instead of asking
    for a checkpoint that is gone (seed 40's batch of December 7 stopped on it)."""
    import pandas as pd

    from nnunet_dro.lab.arm_runs import ArmRuns
    from nnunet_dro.lab.cohort_folder import Cohort, CohortFolder

    arms = ArmRuns(CohortFolder(tmp_path, 991, "SyntheticFetalBenchmark", Cohort(8, 2, 16, 40),
                                echo=lambda text: None))
    folder = arms.arm_folder("ERM")
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"epochs": 800}))
    row = {"method": "ERM", "case": "fetal_001", "region": "intra_axial_csf", "metric": "dice", "condition": "other"}
    for name, value in (("per_case_training.csv", 98.8), ("per_case_training_epoch_600.csv", 98.3)):
        pd.DataFrame([{**row, "value": value}]).to_csv(folder / name, index=False)
    curve = arms.score_training_curve("ERM", "nnUNetTrainer_CPUBudget")
    assert dict(zip(curve["epoch"], curve["value"])) == {600: 98.3, 800: 98.8}
    (folder / "per_case_training_epoch_600.csv").unlink()  # the final scoring alone is no curve
    with pytest.raises(UserError, match="no checkpoint_final.pth and no stored training-fit curve"):
        arms.score_training_curve("ERM", "nnUNetTrainer_CPUBudget")
