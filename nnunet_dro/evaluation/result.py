"""What an evaluation produced: the one object :mod:`~nnunet_dro.evaluation.api` returns and
:mod:`~nnunet_dro.evaluation.reports` writes (its own module, so neither imports the other for it)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from nnunet_dro.evaluation.gallery import GallerySource
from nnunet_dro.evaluation.regions import Region
from nnunet_dro.evaluation.runs import RunsReport


@dataclass
class EvaluationResult:
    """Everything that was written: per-case scores, summary statistics, comparisons, settings."""

    per_case: pd.DataFrame
    summary: pd.DataFrame
    comparison: pd.DataFrame | None
    settings: dict
    cases: dict
    regions: list[Region]
    group_columns: list[str] = field(default_factory=list)
    output_folder: str | None = None
    disparity: pd.DataFrame | None = None  # with a group table: gap between groups (evaluation.disparity)
    runs: RunsReport | None = None  # several runs per method: the statistics over runs (runs.py)
    gallery: GallerySource | None = None  # with images: the files of worst_<metric>.png (gallery.py)
