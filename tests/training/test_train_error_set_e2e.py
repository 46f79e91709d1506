"""JTT's error set inside one training through nnU-Net's real CLIs (``nnUNetv2_train -tr``, two
data-augmentation workers): the set is fixed when the ERM phase ends and drawn with the fixed
weights after it; a SIGKILL of the whole training and ``--c`` keep the set; the refresh variant
chooses it once more at 70 % of the epochs; the model exported to stock nnU-Net predicts
identically."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
import torch
from test_train_export import TrainedModel, predict_args, read_prediction, run_in, stock_only_env

from nnunet_dro.weighting.error_set import error_set_probabilities
from train_helpers import BIN, run_cli, train_env, wait_for_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TRAINER = "nnUNetTrainerDROAdaptive_errorSet_e2eTest"  # the test trainers of train_helpers.TEST_TRAINER_MODULE
REFRESH = "nnUNetTrainerDROAdaptive_errorSet_refresh70_e2eTest"


def load(path):
    return torch.load(str(path), map_location="cpu", weights_only=False)


def log_text(folder):
    return "".join(p.read_text() for p in sorted(folder.glob("training_log_*.txt")))


def check_fixed_after_the_erm_phase(folder, state, final=True):
    """The set in the checkpoint, the log and dro_hardness.csv agree; epoch 0 drew uniformly, the
    epochs after it with the fixed weights. ``final``: the training ended (after a kill, the report
    may be an epoch ahead of the checkpoint, and the end-of-training line is not written)."""
    record, ids = state["error_set"], state["case_ids"]
    n, chosen = len(ids), record["cases"]
    assert record["choices"][0]["epoch"] == 0 and record["choices"][0]["cases"] == chosen or len(record["choices"]) > 1
    assert 1 <= len(chosen) < n and record["upweight"] == 5.0 and record["error_fraction"] == 0.2
    weighting = state["weighting"]
    assert weighting["held_uniform"] is False and [ids[i] for i in weighting["error_set"]] == chosen
    log = log_text(folder)
    line = next(l for l in log.splitlines() if "DRO error set: every structure's pseudo-Dice >= 0 at epoch 0" in l)
    assert f"{len(record['choices'][0]['cases'])} of {n} cases, drawn 5 times as often as the others from epoch 1 on" \
        in line and all(c in line for c in record["choices"][0]["cases"])
    max_p = state["history"]["max_probability"]
    assert max_p[0] == pytest.approx(1 / n)  # epoch 0: the ERM phase, uniform
    fixed = error_set_probabilities(n, weighting["error_set"], 5.0).max()
    assert max_p[-1] == pytest.approx(fixed)  # after it: the fixed weights (no back-off in these runs)
    log = log_text(folder)
    if not final:
        return log
    table = pd.read_csv(folder / "dro_hardness.csv")
    assert list(table.columns) == ["case", "stale_loss", "probability", "times_drawn", "in_error_set",
                                   "error_set_epoch", "draws_since_fixed", "draw_share"]
    assert (table["error_set_epoch"] == record["fixed_at_epoch"]).all()
    assert sorted(table.loc[table["in_error_set"] == 1, "case"]) == chosen
    assert table["draw_share"].sum() == pytest.approx(1.0)
    assert np.allclose(table.loc[table["in_error_set"] == 1, "probability"], fixed)
    shares = table.set_index("case")["draw_share"].to_dict()
    assert shares == pytest.approx(record["draw_share"])
    assert "share of the" in log and "draws since then" in log
    return log


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_the_set_is_fixed_after_the_erm_phase_and_kept_through_a_kill_and_resume(label_dataset, test_trainer_dir):
    ds = label_dataset
    folder = ds.results / ds.folder_name / f"{TRAINER}__nnUNetPlans__3d_fullres" / "fold_0"
    cmd = [str(BIN / "nnUNetv2_train"), str(ds.dataset_id), "3d_fullres", "0", "-tr", TRAINER, "-device", "cpu"]
    proc = subprocess.Popen(cmd, env=train_env(ds, test_trainer_dir, "200x6"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    latest = folder / "checkpoint_latest.pth"
    try:
        wait_for_checkpoint(proc, latest, epoch=2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    for _ in range(50):
        if not _group_alive(proc.pid):
            break
        time.sleep(0.2)
    run_cli([BIN / "nnunet_dro", "cleanup-shm"], ds.env)
    saved = load(latest)
    before = saved["dro_state"]
    check_fixed_after_the_erm_phase(folder, before, final=False)
    assert len(before["error_set"]["choices"]) == 1

    # --c: the same set, chosen at the same epoch, drawn with the same weights; no new choice
    run_cli(cmd + ["--c"], train_env(ds, test_trainer_dir, f"{saved['current_epoch'] + 1}x6"))
    after = load(folder / "checkpoint_final.pth")["dro_state"]
    assert after["error_set"]["cases"] == before["error_set"]["cases"]
    assert after["error_set"]["choices"] == before["error_set"]["choices"]
    assert after["weighting"]["error_set"] == before["weighting"]["error_set"]
    assert np.asarray(after["weighting"]["draws_since_fixed"]).sum() > np.asarray(
        before["weighting"]["draws_since_fixed"]).sum()
    log = check_fixed_after_the_erm_phase(folder, after)
    assert "DRO error set: restored, chosen at epoch 0: " + ", ".join(before["error_set"]["cases"]) in log


def test_the_refresh_variant_chooses_again_at_70_percent_and_exports_to_stock_nnunet(label_dataset, test_trainer_dir,
                                                                                     tmp_path):
    ds = label_dataset
    results = tmp_path / "results"
    results.mkdir()
    env = train_env(ds, test_trainer_dir, "4x6")  # nnU-Net's final validation: test_train_export's
    env["nnUNet_results"] = str(results)
    run_in([BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", 0, "-tr", REFRESH, "-device", "cpu"], env, tmp_path)
    model_folder = results / ds.folder_name / f"{REFRESH}__nnUNetPlans__3d_fullres"
    state = load(model_folder / "fold_0" / "checkpoint_final.pth")["dro_state"]
    # 4 epochs: the ERM phase ends after epoch 0; 70 % is epoch ceil(2.8) = 3, chosen from epoch 2's losses
    assert [c["epoch"] for c in state["error_set"]["choices"]] == [0, 2]
    assert state["error_set"]["fixed_at_epoch"] == 2 and state["config"]["refresh_at"] == 0.7
    log = check_fixed_after_the_erm_phase(model_folder / "fold_0", state)
    assert "DRO error set: 70 % of the 4 epochs reached (refresh): the hardest 20 % by stale loss" in log

    # exported as nnUNetTrainer, stock nnU-Net (nnunet_dro not importable) predicts identically (both
    # in nnU-Net's sequential mode; its worker pools are test_train_export's)
    predictions = tmp_path / "predictions_original"
    run_in(predict_args(ds, predictions, REFRESH, processes=0), env, tmp_path)
    zip_path = tmp_path / "exported.zip"
    run_in([BIN / "nnunet_dro", "export", "-d", ds.dataset_id, "-o", zip_path, "-c", "3d_fullres", "-tr", REFRESH,
            "-f", 0], env, tmp_path)
    model = TrainedModel(ds, env, results, predictions, tmp_path)
    stock_results = tmp_path / "results_stock"
    stock_results.mkdir()
    stock = stock_only_env(model, stock_results)
    run_in([BIN / "nnUNetv2_install_pretrained_model_from_zip", zip_path], stock, tmp_path)
    out = tmp_path / "predictions_stock"
    run_in(predict_args(ds, out, "nnUNetTrainer", processes=0), stock, tmp_path)
    seg, affine, probabilities = read_prediction(out)
    seg0, affine0, probabilities0 = read_prediction(predictions)
    assert np.array_equal(seg, seg0) and np.array_equal(affine, affine0)
    assert float(np.abs(probabilities.astype(np.float64) - probabilities0).max()) == 0.0
    assert np.ptp(probabilities0[1]) > 1e-3
