"""The converged regime's exclusion test (issue 78), fixed before any of its runs: a seed counts in
the decision only where **both** of ERM's runs on it pass, and the test reads ERM's runs only, on
nnU-Net's validation cases only (a fold's ``validation/summary.json`` and its checkpoint's log),
never the reported test cases and never another arm's run, so that no arm's result can decide
which seeds count.

A run passes when (i) every control region's mean Dice over the validation set's controls is at
least ``CONVERGED_DICE`` (80: the benchmark's check that ERM learned the majority) and (ii) the
first epoch at whose end every structure's pseudo-Dice was at least 0.2 lies in the first half of
the schedule (``all_learned_epoch``; nnU-Net computes the pseudo-Dice on validation batches).
The journal's pre-registration (December 6, 2026) states the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.io import load_nnunet_summary
from nnunet_dro.evaluation.regions import PRESETS
from nnunet_dro.lab.budget import arm_name, epoch_at
from nnunet_dro.lab.cohort_folder import GROUP_COLUMN, MAJORITY_GROUP
from nnunet_dro.lab.run_summary import CONVERGED_DICE, majority_learned
from nnunet_dro.training.stability import all_learned_epoch

#: the control regions the decision's majority statistics use (FeTA's white matter, intra-axial CSF,
#: cerebellum), by their labels in nnU-Net's summary
REGIONS = {region.name: frozenset(region.labels) for region in PRESETS["feta"].regions}


@dataclass(frozen=True)
class RunCheck:
    """One ERM run's calibration test: the validation controls' mean Dice per region, the epoch every
    structure was learned, the schedule's length, and why it fails (empty when it passes)."""

    fold_dir: Path
    control_means: dict[str, float]
    learned_epoch: int | None
    epochs: int
    reasons: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.reasons


def _erm_fold(fold_dir: Path) -> None:
    """Refuse what is not an ERM run's held-out fold: the test reads ERM's runs only."""
    trainer = fold_dir.parent.name.split("__")[0]
    if arm_name(trainer) != "ERM":
        raise UserError(f"{fold_dir}: the calibration test reads ERM's runs only, not {trainer}'s")
    if fold_dir.name == "fold_all":
        raise UserError(f"{fold_dir}: fold 'all' has no held-out validation cases; the regime trains fold 0")


def dice_per_epoch(fold_dir: Path) -> list[list[float]]:
    """nnU-Net's pseudo-Dice per epoch and structure, from the run's final checkpoint."""
    import torch

    checkpoint = fold_dir / "checkpoint_final.pth"
    if not checkpoint.is_file():
        raise UserError(f"{checkpoint}: no final checkpoint (is the ERM run finished?)")
    logging = torch.load(str(checkpoint), map_location="cpu", weights_only=False).get("logging", {})
    return [list(map(float, d)) for d in logging.get("dice_per_class_or_region", [])]


def check_erm_run(fold_dir: str | Path, subgroups: pd.DataFrame, epochs: int) -> RunCheck:
    """The calibration test on one ERM run (``fold_dir``: its ``fold_0`` folder) over a schedule of
    ``epochs``; ``subgroups``: the cohort's subgroup table (``case``, ``condition``, ``split``)."""
    fold_dir = Path(fold_dir)
    _erm_fold(fold_dir)
    summary_file = fold_dir / "validation" / "summary.json"
    if not summary_file.is_file():
        raise UserError(f"{summary_file}: missing (the ERM run must end with nnU-Net's own validation)")
    per_case = load_nnunet_summary(str(summary_file))
    table = subgroups.set_index("case")
    unknown = sorted(set(per_case) - set(table.index))
    if unknown:
        raise UserError(f"{summary_file}: case {unknown[0]} is not in the subgroup table")
    if "split" in table.columns:
        tested = sorted(c for c in per_case if table.loc[c, "split"] == "test")
        if tested:
            raise UserError(f"{summary_file}: case {tested[0]} is a test case; the test reads validation cases only")
    controls = [c for c in per_case if table.loc[c, GROUP_COLUMN] == MAJORITY_GROUP]
    if not controls:
        raise UserError(f"{summary_file}: no control case among the validation cases")
    means = {}
    for name, labels in REGIONS.items():
        values = [per_case[c][labels].dice for c in controls if labels in per_case[c]]
        if not values:
            raise UserError(f"{summary_file}: no Dice of region {name} (labels {sorted(labels)})")
        # nnU-Net writes NaN where a structure is absent from both masks: no evidence either way
        means[name] = float(100 * np.nanmean(values)) if not all(map(math.isnan, values)) else float("nan")
    learned = all_learned_epoch(dice_per_epoch(fold_dir))
    reasons = []
    if not majority_learned(means):
        low = ", ".join(f"{r} {v:.1f}" for r, v in means.items() if not v >= CONVERGED_DICE)
        reasons.append(f"controls' validation mean Dice below {CONVERGED_DICE:g}: {low}")
    if learned is None:
        reasons.append("some structure never reached a pseudo-Dice of 0.2")
    elif learned >= epochs / 2:
        reasons.append(f"every structure learned only at epoch {learned} of {epochs} (not in the first half)")
    return RunCheck(fold_dir, means, learned, epochs, tuple(reasons))


def seed_counts(erm_fold_dirs: Sequence[str | Path], subgroups: pd.DataFrame,
                epochs: int) -> tuple[bool, list[RunCheck]]:
    """Whether a seed counts: both of its ERM runs (``ERM`` and ``ERM_repeat``) pass."""
    if len(erm_fold_dirs) != 2:
        raise UserError(f"the calibration test needs a seed's two ERM runs, got {len(erm_fold_dirs)}")
    checks = [check_erm_run(d, subgroups, epochs) for d in erm_fold_dirs]
    return all(c.passed for c in checks), checks


#: the two ERM runs of a seed the exclusion test reads (the noise floor's pair)
ERM_RUNS = ("ERM", "ERM_repeat")


def counting_seeds(checks: pd.DataFrame) -> tuple[list[int], dict[int, str]]:
    """The exclusion test read from a record's ``calibration_checks.csv`` (one row per ERM run:
    ``seed``, ``arm``, ``passed``): the seeds that count (both ERM runs stored and passed) and, for
    every other seed, why not. A run without a stored verdict never counts: the verdict is written
    while its fold folder exists and cannot be re-made from the record.

    >>> checks = pd.DataFrame({"seed": [50, 50, 51, 51, 52], "arm": ["ERM", "ERM_repeat"] * 2 + ["ERM"],
    ...                        "passed": [True, True, True, False, True]})
    >>> counting_seeds(checks)
    ([50], {51: 'ERM_repeat failed the test', 52: 'ERM_repeat has no stored verdict'})
    """
    kept, excluded = [], {}
    for seed in sorted(int(s) for s in set(checks["seed"])):
        runs = checks[checks["seed"] == seed].set_index("arm")["passed"]
        missing = [arm for arm in ERM_RUNS if arm not in runs.index or pd.isna(runs[arm])]
        failed = [arm for arm in ERM_RUNS if arm not in missing and not bool(runs[arm])]
        if missing:
            excluded[seed] = f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no stored verdict"
        elif failed:
            excluded[seed] = f"{', '.join(failed)} failed the test"
        else:
            kept.append(seed)
    return kept, excluded


def calibration_row(verdict: dict) -> dict:
    """A stored verdict (``arms/<ARM>/calibration_check.json``) as one flat table row.

    >>> calibration_row({"passed": False, "reasons": ["late", "low"], "learned_epoch": 500, "epochs": 800,
    ...                  "control_means": {"white_matter": 99.0}})
    {'passed': False, 'learned_epoch': 500, 'epochs': 800, 'reasons': 'late; low', 'control_white_matter': 99.0}
    """
    return {"passed": bool(verdict["passed"]), "learned_epoch": verdict.get("learned_epoch"),
            "epochs": verdict.get("epochs"), "reasons": "; ".join(verdict.get("reasons", [])),
            **{f"control_{region}": value for region, value in verdict.get("control_means", {}).items()}}


#: (i) of the calibration: ERM's training-set Dice on the rare group rises by less than this over
#: the schedule's last quarter (points of Dice)
PLATEAU_RISE = 1.0


def last_quarter_rise(curve: dict[int, float], epochs: int) -> float:
    """How much a training-fit curve (epochs trained -> Dice, from the networks kept part-way and
    the final one) rises over the schedule's last quarter: the final value minus the value at 75 %
    of ``epochs`` (a kept network must be there: the regime keeps one every 12.5 %).

    >>> last_quarter_rise({400: 70.0, 600: 78.5, 800: 79.0}, 800)
    0.5
    """
    if epochs not in curve:
        raise UserError(f"training-fit curve: no value at the final epoch {epochs} (epochs held: {sorted(curve)})")
    three_quarters = epoch_at(75, epochs)  # where the regime keeps a network
    if three_quarters not in curve:
        raise UserError(f"training-fit curve: no network kept at epoch {three_quarters} (75 % of {epochs}); "
                        f"epochs held: {sorted(curve)}")
    return float(curve[epochs] - curve[three_quarters])


def has_plateaued(curve: dict[int, float], epochs: int) -> bool:
    """(i): the rise over the last quarter is below :data:`PLATEAU_RISE` (NaN never passes).

    >>> has_plateaued({600: 78.5, 800: 79.0}, 800), has_plateaued({600: 70.0, 800: 79.0}, 800)
    (True, False)
    """
    rise = last_quarter_rise(curve, epochs)
    return bool(rise < PLATEAU_RISE)


#: the group and structure of the plateau test (i): the rare group's hardest structure (the primary's)
PLATEAU_GROUP, PLATEAU_REGION = "other", "intra_axial_csf"


def plateau_rows(curve: pd.DataFrame, epochs: int) -> list[dict]:
    """(i) for every ERM run (``ERM``, ``ERM_repeat``) of a training-fit curve table
    (:func:`~nnunet_dro.lab.benchmark_analysis.training_fit_curve`: ``method``, ``seed``,
    ``epoch``, ``group``, ``region``, ``mean``): the rare group's training-set Dice at 75 % and at
    the end, the rise and whether it plateaued; runs without those two networks are left out.

    >>> curve = pd.DataFrame({"method": "ERM", "seed": 40, "epoch": [600, 800], "group": "other",
    ...                       "region": "intra_axial_csf", "mean": [98.3, 98.8]})
    >>> plateau_rows(curve, 800)
    [{'seed': 40, 'arm': 'ERM', 'fit_at_75': 98.3, 'fit_at_end': 98.8, 'rise_last_quarter': 0.5, 'plateaued': True}]
    """
    part = curve[(curve["group"] == PLATEAU_GROUP) & (curve["region"] == PLATEAU_REGION)
                 & curve["method"].isin(ERM_RUNS)]
    rows = []
    for (arm, seed), run in part.groupby(["method", "seed"], sort=True):
        fit = dict(zip(run["epoch"].astype(int), run["mean"].astype(float)))
        if epochs not in fit or epoch_at(75, epochs) not in fit:
            continue
        rise = last_quarter_rise(fit, epochs)
        rows.append({"seed": int(seed), "arm": arm, "fit_at_75": fit[epoch_at(75, epochs)], "fit_at_end": fit[epochs],
                     "rise_last_quarter": round(rise, 6), "plateaued": bool(rise < PLATEAU_RISE)})
    return rows


def dose_response_reading(gains_1x: Sequence[float], gains_2x: Sequence[float]) -> str:
    """The journal's reading rule of the dose-response runs (a direction on 4 seeds, no interval):
    a gain *holds* where its mean at 2x the budget is at least half its mean at 1x, *shrinks* where
    it lies between 0 and half, *vanishes* where it is at most 0; with no gain at 1x (mean <= 0) there
    is nothing to hold. The two lists are the same seeds' gains, in the same order.

    >>> dose_response_reading([10, 8], [6, 4]), dose_response_reading([10, 8], [2, 1])
    ('holds', 'shrinks')
    >>> dose_response_reading([10, 8], [-1, 0.5]), dose_response_reading([-2, 1], [3, 3])
    ('vanishes', 'no gain at 1x')
    """
    if len(gains_1x) != len(gains_2x) or not len(gains_1x):
        raise UserError(f"dose response: {len(gains_1x)} gains at 1x and {len(gains_2x)} at 2x; the same seeds are needed")
    at_1x, at_2x = float(np.mean(gains_1x)), float(np.mean(gains_2x))
    if not at_1x > 0:
        return "no gain at 1x"
    if at_2x <= 0:
        return "vanishes"
    return "holds" if at_2x >= at_1x / 2 else "shrinks"
