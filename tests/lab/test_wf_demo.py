"""`nnunet_dro demo` end to end with a tiny budget: make-synthetic -> nnUNetv2_plan_and_preprocess
-> nnUNetv2_train (ERM and adaptive DRO) -> nnUNetv2_predict -> nnunet_dro evaluate, all real CLIs."""
import os
import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.slow
def test_demo_runs_the_whole_pipeline_and_reuses_finished_steps(tmp_path):
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("nnUNet_")}
    env.update(OMP_NUM_THREADS="1", nnUNet_n_proc_DA="0")
    command = [sys.executable, "-m", "nnunet_dro", "demo", "-o", str(out), "--epochs", "1", "--iterations", "2",
               "--n-train", "8", "--n-test", "6", "--size", "24"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for step in range(1, 6):
        assert f"[demo {step}/5" in done.stdout
    assert "| group | method | region |" in done.stdout  # the stratified table
    assert "Hardest training cases for DRO" in done.stdout
    assert "Convergence and stability of each run" in done.stdout and "controls' mean Dice" in done.stdout
    # one epoch learns nothing: both runs report the budget as tight, in the summary and in their logs
    convergence = [line for line in done.stdout.splitlines() if "controls' mean Dice" in line]
    assert len(convergence) == 2
    assert all("every structure's pseudo-Dice >= 0.2 in no epoch of 1: the budget is tight for this run" in line
               for line in convergence)
    # ... and the last line says plainly what such a run can show
    assert done.stdout.strip().splitlines()[-1].startswith(
        "what this run shows: nnU-Net had not learned every structure by half of its 1 epochs (never)")
    logs = {p.parent.parent.name.split("__")[0]: p.read_text()
            for p in (out / "nnunet" / "nnUNet_results").rglob("training_log_*.txt")}
    assert len(logs) == 2
    for trainer, log in logs.items():
        line = "every structure's pseudo-Dice >= 0.2 in no epoch of 1: the budget is tight for this run"
        assert line in log
        assert ("consider more epochs" in log) == ("DRO" in trainer)  # only DRO trainers give the advice
    summary = pd.read_csv(out / "evaluation" / "summary.csv")
    assert set(summary["method"]) == {"ERM", "DRO"}
    assert set(summary["region"]) == {"white_matter", "intra_axial_csf", "cerebellum"}
    assert set(summary.loc[summary["group_column"] == "condition", "group"]) <= {"control", "spina_bifida", "other"}
    assert (out / "evaluation" / "boxplots_dice.png").is_file()
    # nnU-Net's own predictions of the raw dataset's labelsTs, imagesTs beside it: the gallery and report.html
    assert (out / "evaluation" / "worst_dice.png").is_file() and (out / "evaluation" / "report.html").is_file()
    assert (out / "evaluation" / "comparison.csv").is_file()
    # the DRO arm wrote its hardness report into nnU-Net's fold folder
    reports = list((out / "nnunet" / "nnUNet_results").rglob("dro_hardness.csv"))
    assert len(reports) == 1 and len(pd.read_csv(reports[0])) == 8
    # a second run reuses the dataset, the plans and both trained models
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already finished, reusing") == 2
