"""The converged regime's exclusion test (nnunet_dro.lab.calibration): it passes or fails a seed
from ERM's runs alone, on nnU-Net's validation cases alone. Each run here is a real fold folder: a
``validation/summary.json`` written by nnU-Net's own ``compute_metrics_on_folder`` from NIfTI masks,
and a ``checkpoint_final.pth`` holding nnU-Net's logging of the pseudo-Dice per epoch."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk
import torch

from nnunet_dro.errors import UserError
from nnunet_dro.lab.calibration import check_erm_run, seed_counts

CONTROLS = [f"fetal_{i:03d}" for i in range(1, 5)]
OTHER = "fetal_005"
SUBGROUPS = pd.DataFrame({"case": [*CONTROLS, OTHER, "fetal_006"],
                          "condition": ["control"] * 4 + ["other", "control"],
                          "split": ["train"] * 5 + ["test"]})
EPOCHS = 40


def mask() -> np.ndarray:
    """White matter (3), intra-axial CSF (4) and cerebellum (5): a 4^3 block each."""
    label = np.zeros((12, 12, 12), dtype=np.uint8)
    label[1:5, 1:5, 1:5], label[6:10, 1:5, 1:5], label[1:5, 6:10, 6:10] = 3, 4, 5
    return label


def write(array: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(sitk.GetImageFromArray(array), str(path))


#: scored validation folders by (CSF voxels erased, cases): nnU-Net's scoring starts a process pool,
#: so each distinct folder is scored once and copied into the runs that share it
_SCORED: dict[tuple, Path] = {}


def scored_validation(root: Path, csf_erased: int, cases: tuple[str, ...]) -> Path:
    from nnunetv2.evaluation.evaluate_predictions import compute_metrics_on_folder
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO

    key = (csf_erased, cases)
    if key not in _SCORED:
        folder = root / f"scored_{csf_erased}_{len(cases)}_{len(_SCORED)}"
        for case in cases:
            reference = mask()
            prediction = reference.copy()
            if case in CONTROLS:
                csf = np.argwhere(prediction == 4)[:csf_erased]
                prediction[tuple(csf.T)] = 0
            write(reference, folder / "ref" / f"{case}.nii.gz")
            write(prediction, folder / "validation" / f"{case}.nii.gz")
        compute_metrics_on_folder(str(folder / "ref"), str(folder / "validation"),
                                  str(folder / "validation" / "summary.json"), SimpleITKIO(), ".nii.gz", [3, 4, 5],
                                  num_processes=1)
        _SCORED[key] = folder / "validation"
    return _SCORED[key]


def erm_run(root: Path, csf_erased: int, learned_at: int | None, trainer: str = "nnUNetTrainer_CPUBudget",
            plans: str = "nnUNetPlans", fold: str = "fold_0", cases=(*CONTROLS, OTHER)) -> Path:
    """One ERM run's fold folder: every validation control's CSF prediction misses ``csf_erased`` of
    its 64 voxels (Dice 2 (64 - k) / (128 - k)), scored by nnU-Net; every structure's pseudo-Dice
    reaches 0.2 at ``learned_at`` (None: never)."""
    fold_dir = root / f"{trainer}__{plans}__3d_fullres" / fold
    shutil.copytree(scored_validation(root.parent, csf_erased, tuple(cases)), fold_dir / "validation")
    dice = [[0.1] * 7 if learned_at is None or epoch < learned_at else [0.9] * 7 for epoch in range(EPOCHS)]
    torch.save({"logging": {"dice_per_class_or_region": dice}}, fold_dir / "checkpoint_final.pth")
    return fold_dir


def test_a_converged_erm_run_passes_and_the_majority_bound_is_80(tmp_path):
    """21 of 64 CSF voxels missed: Dice 80.4, passes; 23 missed: 78.1, fails on the CSF alone."""
    passing = check_erm_run(erm_run(tmp_path / "a", 21, learned_at=12), SUBGROUPS, EPOCHS)
    assert passing.passed and passing.learned_epoch == 12
    assert passing.control_means["intra_axial_csf"] == pytest.approx(100 * 86 / 107)
    assert passing.control_means["white_matter"] == pytest.approx(100.0)
    failing = check_erm_run(erm_run(tmp_path / "b", 23, learned_at=12), SUBGROUPS, EPOCHS)
    assert not failing.passed and failing.control_means["intra_axial_csf"] == pytest.approx(100 * 82 / 105)
    assert failing.reasons == ("controls' validation mean Dice below 80: intra_axial_csf 78.1",)


def test_every_structure_must_be_learned_in_the_first_half(tmp_path):
    assert check_erm_run(erm_run(tmp_path / "a", 0, learned_at=19), SUBGROUPS, EPOCHS).passed
    late = check_erm_run(erm_run(tmp_path / "b", 0, learned_at=20), SUBGROUPS, EPOCHS)
    assert late.reasons == ("every structure learned only at epoch 20 of 40 (not in the first half)",)
    never = check_erm_run(erm_run(tmp_path / "c", 0, learned_at=None), SUBGROUPS, EPOCHS)
    assert never.reasons == ("some structure never reached a pseudo-Dice of 0.2",)


def test_a_seed_counts_only_where_both_erm_runs_pass(tmp_path):
    good = erm_run(tmp_path / "a", 0, learned_at=5)
    repeat_good = erm_run(tmp_path / "b", 0, learned_at=8, plans="nnUNetPlans_repeat")
    repeat_bad = erm_run(tmp_path / "c", 30, learned_at=8, plans="nnUNetPlans_repeat")
    assert seed_counts([good, repeat_good], SUBGROUPS, EPOCHS)[0]
    counts, checks = seed_counts([good, repeat_bad], SUBGROUPS, EPOCHS)
    assert not counts and [c.passed for c in checks] == [True, False]
    with pytest.raises(UserError, match="two ERM runs, got 1"):
        seed_counts([good], SUBGROUPS, EPOCHS)


def test_it_reads_erm_validation_cases_only(tmp_path):
    """Another arm's run, fold 'all' (no held-out cases), a test case among the validation cases and
    a missing summary are refused in one line."""
    with pytest.raises(UserError, match="reads ERM's runs only, not nnUNetTrainerDROAdaptive_CPUBudget's"):
        check_erm_run(erm_run(tmp_path / "a", 0, 5, trainer="nnUNetTrainerDROAdaptive_CPUBudget"), SUBGROUPS, EPOCHS)
    with pytest.raises(UserError, match="fold 'all' has no held-out validation cases"):
        check_erm_run(erm_run(tmp_path / "b", 0, 5, fold="fold_all"), SUBGROUPS, EPOCHS)
    with pytest.raises(UserError, match="case fetal_006 is a test case"):
        check_erm_run(erm_run(tmp_path / "c", 0, 5, cases=(*CONTROLS, "fetal_006")), SUBGROUPS, EPOCHS)
    with pytest.raises(UserError, match="summary.json: missing"):
        check_erm_run(tmp_path / "d" / "nnUNetTrainer_CPUBudget__nnUNetPlans__3d_fullres" / "fold_0", SUBGROUPS, EPOCHS)


# --- (i) the plateau of the training fit, and the dose-response reading rule (journal, December 6) ---

def test_plateau_is_the_rise_over_the_last_quarter_below_one_point():
    from nnunet_dro.lab.calibration import has_plateaued, last_quarter_rise

    curve = {200: 40.0, 400: 60.0, 600: 75.0, 800: 75.99}
    assert last_quarter_rise(curve, 800) == pytest.approx(0.99) and has_plateaued(curve, 800)
    assert not has_plateaued({**curve, 800: 76.0}, 800)  # exactly 1 point is not below 1
    assert not has_plateaued({600: float("nan"), 800: 80.0}, 800)
    assert has_plateaued({600: 80.0, 800: 70.0}, 800)  # a fall is no rise


@pytest.mark.parametrize("curve, match", [({600: 1.0}, "final epoch 800"), ({400: 1.0, 800: 2.0}, "epoch 600")])
def test_plateau_needs_the_final_and_the_three_quarter_networks(curve, match):
    from nnunet_dro.lab.calibration import has_plateaued

    with pytest.raises(UserError, match=match):
        has_plateaued(curve, 800)


@pytest.mark.parametrize("g1, g2, reading", [
    ([10, 10, 10, 10], [5, 5, 5, 5], "holds"),          # exactly half holds
    ([10, 10, 10, 10], [4.9, 5, 5, 5], "shrinks"),
    ([10, 10, 10, 10], [0, 0, 0, 0], "vanishes"),       # 0 is no gain
    ([10, 10, 10, 10], [12, 14, 10, 10], "holds"),      # a larger gain holds
    ([0, 0, 0, 0], [5, 5, 5, 5], "no gain at 1x"),
])
def test_dose_response_reading_rule(g1, g2, reading):
    from nnunet_dro.lab.calibration import dose_response_reading

    assert dose_response_reading(g1, g2) == reading


def test_dose_response_needs_the_same_seeds():
    from nnunet_dro.lab.calibration import dose_response_reading

    with pytest.raises(UserError, match="same seeds"):
        dose_response_reading([1, 2, 3], [1, 2])
