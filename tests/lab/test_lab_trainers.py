"""The lab's CPU-budget trainers: a twin of every product trainer and of nnU-Net's alternatives,
found by nnU-Net's own ``-tr`` lookup through the lab's trainer folders, and the arms named after
them (the record's arm names kept)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nnunet_dro.training as training
from nnunet_dro.lab import budget
from nnunet_dro.lab.arm_runs import ARM_PLANS, ARM_TRAINERS, arm_run
from nnunet_dro.lab.cohort_folder import PLANS
from nnunet_dro.lab.ext_trainers import lab_trainer_dirs
from script_modules import load_script


def test_every_trainer_has_its_budget_twin_and_arm():
    for name, cls in training.TRAINERS.items():
        twin = budget.BUDGET_TRAINERS[name + "_CPUBudget"]
        assert issubclass(twin, cls) and twin.__mro__[1] is budget.CPUBudget
        assert ARM_TRAINERS[name[len("nnUNetTrainer"):].lstrip("_")] == twin.__name__


@pytest.mark.parametrize("arm, base", [("DiceTopK10", "nnUNetTrainerDiceTopK10Loss"), ("TopK10", "nnUNetTrainerTopk10Loss"),
                                       ("Oversample033", "nnUNetTrainer_probabilisticOversampling_033")])
def test_nnunet_alternatives_have_budget_twins_and_arms(arm, base):
    """nnU-Net's own hard-example losses and oversampling, unchanged but for the CPU budget."""
    twin = budget.BUDGET_TRAINERS[ARM_TRAINERS[arm]]
    first_of_nnunet = next(c for c in twin.__mro__ if c.__module__.startswith("nnunetv2."))
    assert first_of_nnunet.__name__ == base and twin.__mro__[1] is budget.CPUBudget
    assert twin.__name__ == base + "_CPUBudget" and twin.__name__ not in training.__all__


def test_nnunet_finds_the_twins_through_the_lab_trainer_folders():
    """nnU-Net 2.8 reads several folders from nnUNet_extTrainer: the lab's first, then the product's."""
    names = ["nnUNetTrainer_CPUBudget", "nnUNetTrainerDROAdaptive_CPUBudget", "nnUNetTrainerDROAdaptive"]
    code = ("import sys\n"
            "from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name as find\n"
            "for name in sys.argv[1:]:\n"
            "    cls = find(name)\n"
            "    assert cls.__name__ == name and cls.__module__.startswith('nnunet_dro.'), cls\n"
            "    print('FOUND', name)\n")
    env = {**os.environ, "nnUNet_extTrainer": os.pathsep.join(lab_trainer_dirs())}
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [l for l in proc.stdout.splitlines() if l.startswith("FOUND")] == [f"FOUND {n}" for n in names]


def test_a_repeat_is_a_results_folder_not_a_class():
    """The record's ERM_repeat, DROAdaptive_repeat and JTT arms train an existing twin under a plans
    copy of their own; no class exists for them."""
    assert not [n for n in budget.BUDGET_TRAINERS if n.endswith(("_repeat", "_JTT"))]
    for arm, first in (("ERM_repeat", "ERM"), ("DROAdaptive_repeat", "DROAdaptive"), ("JTT", "CaseWeights")):
        assert ARM_TRAINERS[arm] == ARM_TRAINERS[first] and ARM_PLANS[arm] != PLANS
        assert arm_run(arm) == (ARM_TRAINERS[first], ARM_PLANS[arm]) and arm_run(first) == (ARM_TRAINERS[first], PLANS)
    assert len(set(ARM_PLANS.values()) | {PLANS}) == 3


RECORD = Path(__file__).resolve().parents[2] / "data_docs" / "benchmark_record"
#: every arm the stored record holds runs of (scripts/migrate_record_arms.py renamed the old ones)
RECORD_ARMS = sorted({p.name for p in RECORD.glob("*/runs/seed_*/arms/*") if p.is_dir()})


@pytest.mark.parametrize("arm", RECORD_ARMS)
def test_the_records_arm_names_stay_arms(arm):
    """The record reads with today's arm names alone: no alias, no fallback."""
    assert ARM_TRAINERS[arm] in budget.BUDGET_TRAINERS


def test_the_record_keeps_no_arm_of_the_unreleased_version():
    migrate = load_script("migrate_record_arms")
    assert len(RECORD_ARMS) >= 10 and not set(RECORD_ARMS) & set(migrate.RENAMES)
    assert set(migrate.RENAMES.values()) <= set(ARM_TRAINERS)


def test_the_budget_draws_progress_png_every_tenth_epoch_and_the_last():
    """The pacing itself is ShortRun's (tests/training/test_train_short_run.py); the budget sets it
    to every tenth epoch and the last, and keeps its kept-checkpoint step in front of it."""
    assert budget.CPUBudget.short_plot_every == 10
    assert "on_epoch_end" in vars(budget.CPUBudget) and "budget_plot_every" not in vars(budget.CPUBudget)
