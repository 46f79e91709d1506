"""The cohort trainers through nnU-Net's real CLIs: group DRO trains with workers on, writes q
and the draws per group, resumes with --c; case weights exclude a weight-0 case; a bad table
stops nnUNetv2_train before the first epoch."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
import torch
from test_train_e2e import train_env

from train_helpers import BIN, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _fold(ds, trainer, fold):
    return ds.results / ds.folder_name / f"{trainer}__nnUNetPlans__3d_fullres" / f"fold_{fold}"


def _train(ds, env, trainer, fold, *extra, check=True):
    cmd = [BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", fold, "-tr", trainer, "-device", "cpu", *extra]
    if check:
        return run_cli(cmd, env)
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=600)


def test_group_dro_trains_reports_groups_and_resumes(label_dataset, test_trainer_dir, tmp_path):
    ds, trainer = label_dataset, "nnUNetTrainerGroupDRO_e2eTest"
    table = tmp_path / "subgroups.tsv"
    rows = [f"case_{i:03d}\t{'rare' if i == 5 else 'common'}\t{'A' if i % 2 else 'B'}" for i in range(6)]
    table.write_text("case\tcondition\tcentre\n" + "\n".join(rows) + "\ntest_000\tcommon\tA\n")
    env = train_env(ds, test_trainer_dir, num_epochs=1)
    env.update({"nnUNet_dro_subgroups": str(table), "nnUNet_dro_group_column": "centre"})
    assert env["nnUNet_n_proc_DA"] == "2"
    _train(ds, env, trainer, 2)
    folder = _fold(ds, trainer, 2)
    state = torch.load(str(folder / "checkpoint_final.pth"), map_location="cpu", weights_only=False)["dro_state"]
    assert state["scheme"] == "group_dro" and state["weighting"]["group_names"] == ["A", "B"]
    q = np.exp(state["weighting"]["log_q"])
    assert q.sum() == pytest.approx(1.0) and not np.allclose(q, 0.5)  # eta 0.5 moved q
    groups = pd.read_csv(folder / "dro_groups.csv")
    assert groups["group"].tolist() == ["A", "B"] and groups["q"].to_numpy() == pytest.approx(q)
    assert groups["probability"].to_numpy() == pytest.approx([0.5, 0.5])
    cases = pd.read_csv(folder / "dro_hardness.csv")
    assert set(cases["group"]) == {"A", "B"} and cases["times_drawn"].sum() == groups["times_drawn"].sum() > 0
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "groups from column 'centre'" in log and "draws per group this epoch: A " in log

    env["nnUNet_dro_short_run"] = "2"
    _train(ds, env, trainer, 2, "--c")
    np.testing.assert_array_equal(np.load(folder / "dro_counts_at_start.npy"),
                                  state["weighting"]["draw_counts"])
    resumed = torch.load(str(folder / "checkpoint_final.pth"), map_location="cpu", weights_only=False)["dro_state"]
    assert resumed["history"]["epoch"] == [0, 1]


def test_case_weights_exclude_a_weight_zero_case_and_a_bad_table_stops_before_training(
        label_dataset, test_trainer_dir, tmp_path):
    ds, trainer = label_dataset, "nnUNetTrainerCaseWeights_e2eTest"
    table = tmp_path / "case_weights.tsv"
    table.write_text("case\tweight\n" + "".join(f"case_{i:03d}\t{0 if i == 1 else 1}\n" for i in range(6)))
    env = train_env(ds, test_trainer_dir, num_epochs=1)
    env["nnUNet_dro_case_weights"] = str(table)
    _train(ds, env, trainer, 3)
    folder = _fold(ds, trainer, 3)
    cases = pd.read_csv(folder / "dro_hardness.csv").set_index("case")
    training = json.loads((ds.preprocessed / ds.folder_name / "splits_final.json").read_text())[3]["train"]
    assert sorted(cases.index) == sorted(training)
    zero = cases.loc[cases.index == "case_001"]  # empty when case_001 is a validation case of fold 3
    assert (zero["times_drawn"] == 0).all() and (zero["probability"] == 0).all()
    assert cases["times_drawn"].sum() > 0 and cases["probability"].sum() == pytest.approx(1.0)

    table.write_text("case\tweight\n" + "".join(f"case_{i:03d}\t{-1 if i == 4 else 1}\n" for i in range(6)))
    folder = _fold(ds, trainer, 4)
    done = _train(ds, env, trainer, 4, check=False)
    assert done.returncode != 0
    assert "line 6 (case_004): weight -1 must be a finite number >= 0" in done.stderr.strip().splitlines()[-1]
    assert not list(folder.glob("checkpoint_*.pth"))
