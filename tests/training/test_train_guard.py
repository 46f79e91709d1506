"""The stability guard of nnUNetTrainerDROAdaptive through nnU-Net's real ``nnUNetv2_train``, with
two data-augmentation workers: a scripted pseudo-Dice makes a learned structure 'lost', and the
weighting must back off to uniform sampling, return once it is recovered, escalate f at a second
back-off, and be in the same state after ``--c`` as a run that never stopped."""
from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
from test_train_e2e import fold_folder, load, train, train_env

from nnunet_dro.weighting.hardness import UNIFORM_BETA

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TRAINER = "nnUNetTrainerDROAdaptive_guard_e2eTest"
# epoch:        0    1    2    3    4    5
FORCED_DICE = "0.9;0.0;0.9;0.01;0.8;0.9"
# lost at 1 -> epoch 2 uniform; recovered at 2 -> epoch 3 robust (f 0.5); lost again at 3 (second
# back-off) -> epoch 4 uniform; recovered at 4 -> epoch 5 robust with f 0.75
BACKED_OFF = [False, False, True, False, True, False]
FRACTION = [0.5, 0.5, 0.5, 0.5, 0.75, 0.75]


def guard_env(ds, test_trainer_dir, num_epochs):
    env = train_env(ds, test_trainer_dir, num_epochs)
    env["DRO_TEST_FORCED_DICE"] = FORCED_DICE
    return env


def check_history(history, epochs):
    assert history["epoch"] == list(range(epochs))
    assert history["backed_off"] == BACKED_OFF[:epochs]
    assert history["fraction"] == pytest.approx(FRACTION[:epochs])
    for epoch, beta in enumerate(history["beta"]):
        if BACKED_OFF[epoch]:
            assert beta == pytest.approx(UNIFORM_BETA), f"epoch {epoch} was not sampled uniformly"
        else:
            assert beta > 1e-6, f"epoch {epoch} did not return to robust weighting"


def test_guard_backs_off_returns_escalates_and_resumes(label_dataset, test_trainer_dir):
    ds = label_dataset
    folder = fold_folder(ds, TRAINER)
    shutil.rmtree(folder, ignore_errors=True)
    # 1) four epochs: the first back-off and return, then the second back-off decided at epoch 3
    train(ds, guard_env(ds, test_trainer_dir, num_epochs=4), trainer=TRAINER)
    first = load(folder / "checkpoint_final.pth")["dro_state"]
    assert first["config"]["guard"] is True
    check_history(first["history"], 4)
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert ("DRO guard: learned structure lost at epoch 1: sphere (pseudo-Dice 0.000, best 0.900); back-off 1: "
            "uniform sampling (ERM) from epoch 2") in log
    assert "DRO guard: recovered at epoch 2: sphere (pseudo-Dice 0.900, best 0.900); robust weighting again " \
           "from epoch 3 with f = 0.5" in log
    assert "DRO guard: learned structure lost at epoch 3: sphere (pseudo-Dice 0.010, best 0.900); back-off 2" in log

    # 2) --c for two more epochs: the resumed run starts epoch 4 backed off, as one that never stopped
    train(ds, guard_env(ds, test_trainer_dir, num_epochs=6), "--c", trainer=TRAINER)
    assert float(np.load(folder / "dro_beta_at_start.npy")) == pytest.approx(UNIFORM_BETA)
    final = load(folder / "checkpoint_final.pth")["dro_state"]
    check_history(final["history"], 6)
    assert final["weighting"]["backed_off"] is False and final["weighting"]["fraction"] == 0.75
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "robust weighting again from epoch 5 with f = 0.75" in log
    assert "DRO guard: 2 back-off(s) to uniform sampling, 2 of 6 epochs sampled uniformly (epochs 2, 4)" in log
    png = (folder / "dro_progress.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_guard_stays_quiet_when_nothing_is_lost(label_dataset, test_trainer_dir):
    """A pseudo-Dice that dips but never below 0.05 after being learned: no back-off at all."""
    ds = label_dataset
    folder = fold_folder(ds, TRAINER)
    env = guard_env(ds, test_trainer_dir, num_epochs=3)
    env["DRO_TEST_FORCED_DICE"] = "0.9;0.06;0.9"
    shutil.rmtree(folder, ignore_errors=True)  # the other test's run of the same trainer and fold
    train(ds, env, trainer=TRAINER)
    state = load(folder / "checkpoint_final.pth")["dro_state"]
    assert state["history"]["backed_off"] == [False, False, False]
    assert all(b > 1e-6 for b in state["history"]["beta"])
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "learned structure lost" not in log
    assert "DRO guard: 0 back-off(s) to uniform sampling, 0 of 3 epochs sampled uniformly" in log


def test_guard_inside_the_erm_phase_leaves_sampling_uniform(label_dataset, test_trainer_dir):
    """A structure lost and recovered before the ERM phase ends: the log must not announce robust
    weighting, and every epoch is sampled uniformly."""
    ds = label_dataset
    trainer = "nnUNetTrainerDROAdaptive_guardInErmPhase_e2eTest"
    folder = fold_folder(ds, trainer)
    env = guard_env(ds, test_trainer_dir, num_epochs=3)
    env["DRO_TEST_FORCED_DICE"] = "0.9;0.0;0.9"
    shutil.rmtree(folder, ignore_errors=True)
    train(ds, env, trainer=trainer)
    state = load(folder / "checkpoint_final.pth")["dro_state"]
    assert state["history"]["backed_off"] == [False, False, True]
    assert state["history"]["beta"] == pytest.approx([UNIFORM_BETA] * 3)
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "DRO guard: learned structure lost at epoch 1" in log
    assert ("DRO guard: recovered at epoch 2: sphere (pseudo-Dice 0.900, best 0.900); still in the ERM phase "
            "(uniform until every structure's pseudo-Dice >= 0.95), robust weighting then with f = 0.5") in log
    assert "robust weighting again" not in log
    # issue 80 item 6: a run that never left its ERM phase reads as one, in every line
    assert "back-off 1, inside the ERM phase: sampling stays uniform" in log
    assert log.count("; uniform sampling (ERM phase): no robust weighting yet") == 3  # each epoch's statistics
    assert ("DRO: the run never left its ERM phase: all 3 epochs sampled uniformly, as nnUNetTrainer samples; no "
            "robust weighting ran (it starts after the first epoch at whose end every structure's pseudo-Dice "
            ">= 0.95)") in log
    assert "DRO guard: 1 back-off(s) to uniform sampling, 3 of 3 epochs sampled uniformly (epochs 0-2, the ERM " \
           "phase's included)" in log
    assert "robust weighting draws hard cases more" not in log  # advice about what never ran


def test_a_run_that_never_leaves_the_erm_phase_says_so_and_gives_no_robust_weighting_advice(label_dataset,
                                                                                              test_trainer_dir):
    """Issue 80 item 6: one epoch, nothing learned: the run trained as ERM, and its end-of-training
    lines must say so (it read "0 of 1 epochs sampled uniformly" with advice about robust weighting)."""
    ds = label_dataset
    trainer = "nnUNetTrainerDROAdaptive_guardInErmPhase_e2eTest"
    folder = fold_folder(ds, trainer)
    env = guard_env(ds, test_trainer_dir, num_epochs=1)
    env["DRO_TEST_FORCED_DICE"] = "0.1"
    shutil.rmtree(folder, ignore_errors=True)
    train(ds, env, trainer=trainer)
    state = load(folder / "checkpoint_final.pth")["dro_state"]
    assert state["weighting"]["held_uniform"] is True
    log = "".join(p.read_text() for p in folder.glob("training_log_*.txt"))
    assert "DRO: the run never left its ERM phase: all 1 epochs sampled uniformly" in log
    assert "DRO guard: 0 back-off(s) to uniform sampling, 1 of 1 epochs sampled uniformly (epochs 0, the ERM " \
           "phase's included)" in log
    assert ("every structure's pseudo-Dice >= 0.2 in no epoch of 1: the budget is tight for this run; this run never "
            "left its ERM phase and so trained as nnUNetTrainer does: consider more epochs") in log
    assert "robust weighting draws hard cases more" not in log and "0 of 1 epochs" not in log
    table = pd.read_csv(folder / "dro_hardness.csv")  # the distribution in force: uniform
    np.testing.assert_allclose(table["probability"], 1 / len(table))
