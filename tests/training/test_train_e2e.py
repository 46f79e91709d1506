"""End to end through nnU-Net's real CLIs: train with test-sized nnUNetTrainerDRO and
nnUNetTrainerDROAdaptive subclasses (data-augmentation workers on), resume with --c, validate with
--val --npz, predict; label-based and region-based datasets."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nnunet_dro.training import nnUNetTrainerDROAdaptive
from train_helpers import BIN, run_cli, train_env, wait_for_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TRAINER = "nnUNetTrainerDRO_e2eTest"


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
                 "DRO: hardest cases:", "DRO stability:", "DRO: every structure's pseudo-Dice >= 0.2 "):
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

    # 4) inference with nnU-Net's predictor, which looks the trainer class up by name (in its own
    # process: -npp 0 -nps 0 is nnU-Net's sequential mode; the worker pools run in test_train_export)
    out = tmp_path / "predictions"
    run_cli([BIN / "nnUNetv2_predict", "-i", ds.test_images, "-o", out, "-d", ds.dataset_id, "-c", "3d_fullres",
             "-f", 0, "-tr", TRAINER, "-device", "cpu", "-npp", 0, "-nps", 0, "--disable_tta"],
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
    """The default's robust phase (nnUNetTrainerDROAdaptive_fromStart: the default without its ERM
    phase) through nnUNetv2_train with two data-augmentation workers: the beta
    follows the losses, the state (losses, beta, running mean of the weights) goes into the
    checkpoint, and --c starts the workers from exactly that state."""
    ds = label_dataset
    trainer = "nnUNetTrainerDROAdaptive_e2eTest"
    folder = fold_folder(ds, trainer)
    env = train_env(ds, test_trainer_dir, num_epochs=1)
    assert env["nnUNet_n_proc_DA"] == "2"
    train(ds, env, trainer=trainer)
    first = load(folder / "checkpoint_final.pth")["dro_state"]
    # the default setting: f 0.5, no importance weights, no case above 5 / n of the probability
    fraction, cap = nnUNetTrainerDROAdaptive.dro_settings.fraction, nnUNetTrainerDROAdaptive.dro_settings.max_weight
    assert first["scheme"] == "kl_adaptive" and first["config"]["fraction"] == fraction == 0.5
    assert first["config"]["settings"] == "AdaptiveHardnessSettings" and first["config"]["max_weight"] == cap == 5.0
    weighting = first["weighting"]
    beta = weighting["adaptive_beta"]
    assert 0 < beta <= 100.0 and np.isfinite(weighting["weight_scale"])
    # the saved beta is the capped perplexity solution for the saved losses (or beta_max); with 4-5
    # training cases 5 / n >= 1, so the cap cannot bind and it is the uncapped solution as well
    from nnunet_dro.sampling.temperature import perplexity, solve_beta_for_perplexity, solve_capped_beta_for_perplexity
    losses = np.asarray(weighting["sampler"]["losses"])
    assert beta == pytest.approx(solve_capped_beta_for_perplexity(losses, fraction, 100.0, cap)[0], rel=1e-6)
    assert beta == pytest.approx(solve_beta_for_perplexity(losses, fraction, 100.0), rel=1e-6)
    assert perplexity(losses, beta) >= fraction * losses.size * (1 - 1e-6)
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "scale-free hardness weighted sampling (kl)" in log and "importance weights off" in log
    assert "perplexity >= 0.5 n" in log
    assert "DRO stability:" in log and first["history"]["beta"][0] == pytest.approx(beta)

    train(ds, train_env(ds, test_trainer_dir, num_epochs=2), "--c", trainer=trainer)
    np.testing.assert_array_equal(np.load(folder / "dro_losses_at_start.npy"), losses)
    assert float(np.load(folder / "dro_beta_at_start.npy")) == beta
    second = load(folder / "checkpoint_final.pth")["dro_state"]
    assert second["history"]["epoch"] == [0, 1]
    assert np.asarray(second["weighting"]["sampler"]["draw_counts"]).sum() > np.asarray(
        weighting["sampler"]["draw_counts"]).sum()
    check_hardness_report(folder, losses.size)


def test_until_learned_trainer_releases_robust_weighting_with_workers(label_dataset, test_trainer_dir):
    """The default's ERM phase through nnUNetv2_train with two data-augmentation workers (threshold
    0 in the test class, so the first epoch's pseudo-Dice releases it): epoch 0
    draws uniformly, epoch 1 under the solved beta, and the checkpoint says the phase is over."""
    ds = label_dataset
    trainer = "nnUNetTrainerDROAdaptive_untilLearned_e2eTest"
    folder = fold_folder(ds, trainer)
    train(ds, train_env(ds, test_trainer_dir, num_epochs=2), trainer=trainer)
    state = load(folder / "checkpoint_final.pth")["dro_state"]
    assert state["config"]["uniform_until_learned"] == 0.0
    assert state["weighting"]["held_uniform"] is False
    beta = state["history"]["beta"]
    assert beta[0] == pytest.approx(1e-12) and beta[1] > 1e-6
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "uniform sampling (ERM) until released" in log
    assert "every structure's pseudo-Dice >= 0 at epoch 0: robust weighting from epoch 1 on" in log
    assert log.count("; uniform sampling (ERM phase): no robust weighting yet") == 1  # epoch 0's statistics only
    assert "DRO: ERM phase (uniform sampling) in epochs 0, robust weighting from epoch 1 on" in log
    assert "never left its ERM phase" not in log


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # ended meanwhile
        return ""


def _processes_in_group(pgid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    found.append(int(entry))
            except ProcessLookupError:
                pass
    return found


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="Linux: /proc and /dev/shm")
def test_sigkill_of_the_whole_training_then_resume(label_dataset, test_trainer_dir, tmp_path):
    """A scheduler cancels the job: SIGKILL to the whole process group (trainer, data-augmentation
    workers and Python's resource tracker) after a checkpoint. Nothing survives; the orphan
    shared-memory block is removed; --c resumes from exactly the checkpoint's sampler state."""
    import signal
    import subprocess
    import time

    ds = label_dataset
    trainer = "nnUNetTrainerDRO_e2eTest"
    folder = ds.results / ds.folder_name / f"{trainer}__nnUNetPlans__3d_fullres" / "fold_1"
    env = train_env(ds, test_trainer_dir, num_epochs=200)
    assert env["nnUNet_n_proc_DA"] == "2"
    cmd = [str(BIN / "nnUNetv2_train"), str(ds.dataset_id), "3d_fullres", "1", "-tr", trainer, "-device", "cpu"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    latest = folder / "checkpoint_latest.pth"
    try:
        wait_for_checkpoint(proc, latest, epoch=2)
        ours = [p.name for p in Path("/dev/shm").glob(f"nnunet_dro_{proc.pid}_*")]
        assert ours, "the trainer's shared sampler block is not named after its pid"
        # the resource tracker, which would unlink the block if it outlived the trainer, is in the
        # group the kill reaches (checked directly: another test process creating a shared sampler
        # may sweep the orphan block at any moment after the kill, so its presence proves nothing)
        assert any("resource_tracker" in _cmdline(pid) for pid in _processes_in_group(proc.pid)), \
            "no resource tracker in the training's process group: the kill would not take it along"
        # hold each block under a name no sweep matches, to put back what another process sweeps
        held = {name: Path("/dev/shm") / f"test_hold_{name}" for name in ours}
        for name, hold in held.items():
            os.link(Path("/dev/shm") / name, hold)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    for _ in range(50):  # the kernel reaps the group's members shortly after the leader
        if not _processes_in_group(proc.pid):
            break
        time.sleep(0.2)
    assert not _processes_in_group(proc.pid), "a data-augmentation worker or the resource tracker survived the kill"
    # cleanup-shm lists and removes the orphans; retried (at most 20 times) only when another process
    # swept one first, which the held link puts back (as tests/sampling/test_sampler_processes.py does)
    for _ in range(20):
        for name, hold in held.items():
            if not (Path("/dev/shm") / name).exists():
                os.link(hold, Path("/dev/shm") / name)
        cleaned = run_cli([BIN / "nnunet_dro", "cleanup-shm"], env)
        if all(f"/dev/shm/{name}" in cleaned.stdout for name in ours):
            break
    for hold in held.values():
        hold.unlink()
    assert all(f"/dev/shm/{name}" in cleaned.stdout for name in ours)
    assert not any((Path("/dev/shm") / name).exists() for name in ours)

    saved = load(latest)  # whatever the kill left: the atomic write means it is a whole checkpoint
    sampler_state = saved["dro_state"]["weighting"]["sampler"]
    env = train_env(ds, test_trainer_dir, num_epochs=saved["current_epoch"] + 1)
    run_cli(cmd + ["--c"], env)
    np.testing.assert_array_equal(np.load(folder / "dro_losses_at_start.npy"), sampler_state["losses"])
    np.testing.assert_array_equal(np.load(folder / "dro_counts_at_start.npy"), sampler_state["draw_counts"])
    final = load(folder / "checkpoint_final.pth")
    assert final["current_epoch"] == saved["current_epoch"] + 1
    assert final["dro_state"]["history"]["epoch"][-1] == saved["current_epoch"]
    assert not list(Path("/dev/shm").glob(f"nnunet_dro_{proc.pid}_*"))
