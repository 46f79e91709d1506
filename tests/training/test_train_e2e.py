"""End to end through nnU-Net's real CLIs: train with test-sized nnUNetTrainerDRO and
nnUNetTrainerDROAdaptive subclasses (data-augmentation workers on), resume with --c, validate with
--val --npz, predict; label-based and region-based datasets."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from train_helpers import BIN, run_cli

from nnunet_dro.ext_trainers import TRAINER_DIR

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TRAINER = "nnUNetTrainerDRO_e2eTest"


def train_env(ds, test_trainer_dir, num_epochs, skip_final_validation=True):
    env = dict(ds.env)
    env["DRO_TEST_SKIP_FINAL_VALIDATION"] = "1" if skip_final_validation else "0"
    env["nnUNet_extTrainer"] = os.pathsep.join([TRAINER_DIR, str(test_trainer_dir)])
    env["DRO_TEST_NUM_EPOCHS"] = str(num_epochs)
    return env


def fold_folder(ds, trainer=TRAINER):
    return ds.results / ds.folder_name / f"{trainer}__nnUNetPlans__3d_fullres" / "fold_0"


def train(ds, env, *extra, trainer=TRAINER):
    return run_cli([BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", 0, "-tr", trainer, "-device", "cpu", *extra],
                   env)


def load(path):
    return torch.load(str(path), map_location="cpu", weights_only=False)


def check_hardness_report(folder, num_train_cases):
    table = pd.read_csv(folder / "dro_hardness.csv")
    assert list(table.columns) == ["case", "stale_loss", "probability", "times_drawn"]
    assert len(table) == num_train_cases and table["case"].is_unique
    assert np.isclose(table["probability"].sum(), 1.0)
    assert table["stale_loss"].is_monotonic_decreasing  # hardest first
    png = (folder / "dro_progress.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    return table


def test_label_dataset_train_resume_validate_predict(label_dataset, test_trainer_dir, tmp_path):
    ds = label_dataset
    folder = fold_folder(ds)

    # 1) one epoch, then the run ends (checkpoint_final.pth)
    train(ds, train_env(ds, test_trainer_dir, num_epochs=1))
    first = load(folder / "checkpoint_final.pth")
    state = first["dro_state"]
    assert first["trainer_name"] == TRAINER and first["current_epoch"] == 1
    num_cases = len(state["case_ids"])
    batch_size = first["init_args"]["plans"]["configurations"]["3d_fullres"]["batch_size"]
    # only trained batches update the sampler: 3 iterations per epoch
    assert state["scheme"] == "kl" and state["weighting"]["sampler"]["draw_counts"].sum() == 3 * batch_size
    assert state["history"]["epoch"] == [0]
    shutil.copy(folder / "checkpoint_final.pth", tmp_path / "after_epoch_0.pth")
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    for text in ("DRO: beta 100, perplexity", "effective sample size", "max p", "importance weights",
                 "DRO: hardest cases:", "DRO stability:"):
        assert text in log
    table = check_hardness_report(folder, num_cases)
    assert table["times_drawn"].sum() == 3 * batch_size

    # 2) --c with one more epoch: the loaders start from the checkpoint's loss vector
    train(ds, train_env(ds, test_trainer_dir, num_epochs=2), "--c")
    np.testing.assert_array_equal(np.load(folder / "dro_losses_at_start.npy"),
                                  state["weighting"]["sampler"]["losses"])
    second = load(folder / "checkpoint_final.pth")["dro_state"]
    assert second["history"]["epoch"] == [0, 1]
    assert second["weighting"]["sampler"]["draw_counts"].sum() == 2 * 3 * batch_size
    assert second["case_ids"] == state["case_ids"]
    check_hardness_report(folder, num_cases)

    # 3) validation only, exporting probabilities
    run_cli([BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", 0, "-tr", TRAINER, "-device", "cpu",
             "--val", "--npz"], train_env(ds, test_trainer_dir, num_epochs=2, skip_final_validation=False))
    assert list((folder / "validation").glob("*.npz")) and (folder / "validation" / "summary.json").is_file()
    run_cli([BIN / "nnUNetv2_find_best_configuration", ds.dataset_id, "-c", "3d_fullres", "-tr", TRAINER,
             "-f", 0, "--disable_ensembling", "-np", 1], train_env(ds, test_trainer_dir, num_epochs=2))
    assert (ds.results / ds.folder_name / "inference_information.json").is_file()

    # 4) inference with nnU-Net's predictor, which looks the trainer class up by name
    out = tmp_path / "predictions"
    run_cli([BIN / "nnUNetv2_predict", "-i", ds.test_images, "-o", out, "-d", ds.dataset_id, "-c", "3d_fullres",
             "-f", 0, "-tr", TRAINER, "-device", "cpu", "-npp", 1, "-nps", 1, "--disable_tta"],
            train_env(ds, test_trainer_dir, num_epochs=2))
    assert (out / "test_000.nii.gz").is_file()


def test_region_dataset_trains_with_per_sample_dice_and_bce(region_dataset, test_trainer_dir):
    ds = region_dataset
    folder = fold_folder(ds)
    train(ds, train_env(ds, test_trainer_dir, num_epochs=1))
    checkpoint = load(folder / "checkpoint_final.pth")
    losses = checkpoint["dro_state"]["weighting"]["sampler"]["losses"]
    assert np.all(np.isfinite(losses))
    table = check_hardness_report(folder, len(losses))
    drawn = table[table["times_drawn"] > 0]
    # fresh losses replaced the initial value L_init of the drawn cases
    from nnunet_dro.training.trainer import DEFAULT_INIT_LOSS
    assert len(drawn) >= 1 and (drawn["stale_loss"] < 0.5 * DEFAULT_INIT_LOSS).all()


def test_adaptive_trainer_trains_with_workers_and_resumes_its_beta(label_dataset, test_trainer_dir):
    """nnUNetTrainerDROAdaptive through nnUNetv2_train with two data-augmentation workers: the beta
    follows the losses, the state (losses, beta, running mean of the weights) goes into the
    checkpoint, and --c starts the workers from exactly that state."""
    ds = label_dataset
    trainer = "nnUNetTrainerDROAdaptive_e2eTest"
    folder = fold_folder(ds, trainer)
    env = train_env(ds, test_trainer_dir, num_epochs=1)
    assert env["nnUNet_n_proc_DA"] == "2"
    train(ds, env, trainer=trainer)
    first = load(folder / "checkpoint_final.pth")["dro_state"]
    assert first["scheme"] == "kl_adaptive" and first["config"]["dro_fraction"] == 0.5
    weighting = first["weighting"]
    beta = weighting["adaptive_beta"]
    assert 0 < beta <= 100.0 and np.isfinite(weighting["weight_scale"])
    # the saved beta is the perplexity solution for the saved losses (or the cap)
    from nnunet_dro.sampling.temperature import perplexity, solve_beta_for_perplexity
    losses = np.asarray(weighting["sampler"]["losses"])
    assert beta == pytest.approx(solve_beta_for_perplexity(losses, 0.5, 100.0), rel=1e-6)
    assert perplexity(losses, beta) >= 0.5 * losses.size * (1 - 1e-6)
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "scale-free hardness weighted sampling (kl)" in log and "first draw 1, self-normalised" in log
    assert "DRO stability:" in log and first["history"]["beta"][0] == pytest.approx(beta)

    train(ds, train_env(ds, test_trainer_dir, num_epochs=2), "--c", trainer=trainer)
    np.testing.assert_array_equal(np.load(folder / "dro_losses_at_start.npy"), losses)
    assert float(np.load(folder / "dro_beta_at_start.npy")) == beta
    second = load(folder / "checkpoint_final.pth")["dro_state"]
    assert second["history"]["epoch"] == [0, 1]
    assert np.asarray(second["weighting"]["sampler"]["draw_counts"]).sum() > np.asarray(
        weighting["sampler"]["draw_counts"]).sum()
    check_hardness_report(folder, losses.size)
