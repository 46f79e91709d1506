"""What the arms' draws show, from each case-weighting run's hardness report (``dro_hardness.csv``,
:mod:`nnunet_dro.training.hardness_report`) joined with the training cases' groups: each group's
share of the draws, the noisy cases' share, how far a run concentrated on single cases, and how
well its stale losses single out the minorities. A run without a report (nnU-Net's uniform
sampling) counts as uniform where that is what it drew in expectation, and is NaN elsewhere."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from nnunet_dro.lab.arm_runs import ArmRuns
from nnunet_dro.lab.cohort_folder import GROUP_COLUMN, MINORITY_GROUPS, PLANS, CohortFolder


class DrawStatistics:
    """The draw statistics of the arms of one working folder."""

    def __init__(self, cohort_folder: CohortFolder, arms: ArmRuns):
        self.cohort_folder, self.arms = cohort_folder, arms

    def hardness_report_file(self, trainer: str, plans: str = PLANS) -> Path:
        """Where a case-weighting trainer's run keeps its ``dro_hardness.csv``."""
        return self.arms.fold_folder(trainer, plans) / "dro_hardness.csv"

    def _hardness_report(self, trainer: str, plans: str = PLANS) -> pd.DataFrame | None:
        """The run's ``dro_hardness.csv`` joined with the training cases' groups, if it has one."""
        report = self.hardness_report_file(trainer, plans)
        if not report.is_file():
            return None
        table = pd.read_csv(report, dtype={"case": str}).drop(columns=[GROUP_COLUMN, "group"], errors="ignore")
        return table.merge(self.cohort_folder.training_groups(), on="case")

    def draw_shares(self, trainer: str, finished: bool = False, plans: str = PLANS) -> dict[str, float]:
        """Share of the training draws that went to each group (condition): counted from the
        hardness report (``times_drawn``) of a case-weighting run; for a trainer without one
        (nnU-Net's ERM) each group's share of the training cases, what uniform sampling gives in
        expectation. Empty when the run's folder is gone, unless the caller knows the run
        ``finished`` (it read the run's stored result): a record keeps no checkpoint, and a
        case-weighting run always leaves its hardness report."""
        report = self._hardness_report(trainer, plans)
        if report is not None:
            counts = report.groupby(GROUP_COLUMN)["times_drawn"].sum()
        elif finished or (self.arms.fold_folder(trainer, plans) / "checkpoint_final.pth").is_file():
            counts = self.cohort_folder.training_groups().groupby(GROUP_COLUMN)["case"].size()
        else:
            return {}
        total = float(counts.sum())
        return {str(g): float(v) / total for g, v in counts.items()} if total > 0 else {}

    def noisy_draw_share(self, trainer: str, plans: str = PLANS) -> float:
        """Share of the training draws that went to the noisy cases (uniform sampling: their share of
        the training cases, which is also what a run without a hardness report gets); NaN without
        label noise."""
        noisy = set(self.cohort_folder.noisy_cases())
        if not noisy:
            return float("nan")
        report = self._hardness_report(trainer, plans)
        if report is None:
            return len(noisy) / self.cohort_folder.training_case_count()
        total = float(report["times_drawn"].sum())
        return float(report.loc[report["case"].isin(noisy), "times_drawn"].sum()) / total if total > 0 else float("nan")

    def busiest_case_draws(self, trainer: str, plans: str = PLANS) -> float:
        """How far a case-weighting run concentrated on single cases: the most-drawn training case's
        draws over what uniform sampling gives each case (``total / n``; 1 = no case favoured).
        NaN without a hardness report (nnU-Net's own uniform sampling keeps no counts)."""
        report = self._hardness_report(trainer, plans)
        if report is None or not len(report):
            return float("nan")
        counts = report["times_drawn"].to_numpy(dtype=np.float64)
        total = counts.sum()
        return float(counts.max() * len(counts) / total) if total > 0 else float("nan")

    def minority_hardness_auc(self, trainer: str, plans: str = PLANS) -> float:
        """How well the run's final stale losses single out the minority cases: the probability
        that a random minority case has a higher stale loss than a random control (Mann-Whitney
        AUC; 0.5: no better than chance). NaN without a hardness report."""
        report = self._hardness_report(trainer, plans)
        if report is None:
            return float("nan")
        from scipy.stats import mannwhitneyu

        minority = report[GROUP_COLUMN].isin(MINORITY_GROUPS).to_numpy()
        losses = report["stale_loss"].to_numpy(dtype=np.float64)
        if minority.all() or not minority.any():
            return float("nan")
        u = mannwhitneyu(losses[minority], losses[~minority]).statistic  # ties count one half
        return float(u) / (minority.sum() * (~minority).sum())
