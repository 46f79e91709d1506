"""The experiment pipeline shared by ``nnunet_dro demo`` and ``scripts/benchmark_robustness.py``:
synthetic cohort -> ``nnUNetv2_plan_and_preprocess`` -> ``nnUNetv2_train`` of each arm ->
``nnUNetv2_predict`` of the test images -> ``nnunet_dro evaluate`` by condition and region.

Every step runs nnU-Net's real command in a subprocess inside one working folder (its own
``nnUNet_raw``/``_preprocessed``/``_results``), and every finished step is kept: an arm's result
(``arms/<ARM>/result.json`` + ``per_case.csv``) is written atomically when it is complete, and a
later call with the same folder skips it. So a long benchmark can be built in pieces.

A :class:`Workspace` is that folder's three collaborators: :class:`~nnunet_dro.lab.cohort_folder.CohortFolder`
(the cohort, its label noise and audit, nnU-Net's preprocessing, the further test sets),
:class:`~nnunet_dro.lab.arm_runs.ArmRuns` (each arm trained, predicted, scored and stored) and
:class:`~nnunet_dro.lab.draw_statistics.DrawStatistics` (what the arms' draws show).
"""
from __future__ import annotations

import os
from typing import Callable

from nnunet_dro.lab.arm_runs import ArmRuns
from nnunet_dro.lab.cohort_folder import Cohort, CohortFolder
from nnunet_dro.lab.draw_statistics import DrawStatistics


class Workspace:
    """One working folder: its cohort, the arms trained on it, and their draw statistics."""

    def __init__(self, folder: str | os.PathLike, dataset_id: int, dataset_name: str, cohort: Cohort,
                 echo: Callable[[str], None] = print, torch_threads: int | None = None):
        """``torch_threads``: torch's threads in each training (None: nnU-Net's choice, every core)."""
        self.cohort_folder = CohortFolder(folder, dataset_id, dataset_name, cohort, echo, torch_threads)
        self.arms = ArmRuns(self.cohort_folder)
        self.draws = DrawStatistics(self.cohort_folder, self.arms)
