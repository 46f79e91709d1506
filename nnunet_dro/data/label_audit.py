"""Find training labels that may be wrong before a hardness-weighted sampler chases them.

A case whose reference is wrong keeps a high loss however well the network learns, so hardness
weighted sampling draws it more often than the others (docs/choosing-robustness.md). The outlier
trim of ``nnUNetTrainerDROAdaptive_trim5`` catches the cases with the very highest losses (in our
benchmark: shifted masks, swapped labels), not a case with one structure missing, whose loss is
high enough to be chased and too low to be trimmed. This audit looks at the labels alone, per
structure and case:

- ``missing``: the structure has no voxel in this case, while at least ``presence`` of the cases
  have it (a structure erased, or never drawn);
- ``small`` / ``large``: its volume (in mL, so that cases of different spacings compare) lies
  beyond Tukey's far-out fences of the cohort, ``fence`` interquartile ranges below the first or
  above the third quartile of log volumes (and at least a factor 1.5 beyond them), among the cases
  that have it (two labels swapped, a structure half drawn, another structure's label spilled
  into it).

It flags; it does not judge: a case with a resected structure, or a tumour without an enhancing
part, is flagged rightly and labelled rightly. Open the flagged cases.

>>> import pandas as pd
>>> volumes = pd.DataFrame({"case": [f"c{i}" for i in range(10)],
...                         "cerebellum": [10.0, 11, 9, 10, 12, 10, 11, 9, 10, 0.0],
...                         "csf": [5.0, 5, 6, 5, 4, 5, 6, 5, 40.0, 5]})
>>> flags = audit_volumes(volumes)
>>> flags[["case", "label", "flag"]].values.tolist()
[['c8', 'csf', 'large'], ['c9', 'cerebellum', 'missing']]
"""
from __future__ import annotations

import json
import os
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError

#: fewest cases (with the structure) for a volume fence: quartiles of fewer say little
MIN_CASES_FOR_FENCES = 8
#: the fences lie at least this factor beyond the quartiles: a group whose volumes barely vary
#: (an interquartile range near 0) would otherwise flag any case a few voxels off
MIN_FENCE_FACTOR = 1.5
FLAG_COLUMNS = ["case", "label", "flag", "volume_ml", "median_ml", "low_fence_ml", "high_fence_ml", "group"]


def dataset_labels(dataset_json: str | os.PathLike) -> dict[str, list[int]]:
    """The foreground labels of an nnU-Net ``dataset.json`` as name -> label values (a region of a
    region-based dataset, such as BraTS's whole tumour, is the union of its values); background and
    the ignore label are left out."""
    path = Path(dataset_json)
    try:
        labels = json.loads(path.read_text())["labels"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path}: cannot read its 'labels' ({type(error).__name__}: {error})") from None
    out = {}
    for name, value in labels.items():
        values = [value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else None
        if values is None or not all(isinstance(v, int) for v in values):
            raise UserError(f"{path}: label {name!r} has value {value!r}, not an integer or a list of integers")
        if name != "ignore" and values != [0]:
            out[name] = values
    if not out:
        raise UserError(f"{path}: no foreground label in 'labels'")
    return out


def _case_volumes(job: tuple[str, str, dict[str, list[int]]]) -> dict:
    from nnunet_dro.data.nifti import check_complete_nifti, is_nifti
    from nnunet_dro.data.raw_dataset import read_label_array

    case, path, labels = job
    if is_nifti(path):  # SimpleITK reads a truncated NIfTI file as zeros: a structure would look erased
        check_complete_nifti(path)
    image, array = read_label_array(path)
    voxel_ml = float(np.prod(image.GetSpacing())) / 1000.0
    counts = dict(zip(*np.unique(array, return_counts=True)))
    return {"case": case, **{name: voxel_ml * sum(int(counts.get(v, 0)) for v in values)
                             for name, values in labels.items()}}


def label_volumes(labels_dir: str | os.PathLike, labels: dict[str, list[int]], file_ending: str = ".nii.gz",
                  num_processes: int = 1) -> pd.DataFrame:
    """One row per label file of ``labels_dir``: the case and each label's volume in mL."""
    files = sorted(Path(labels_dir).glob(f"*{file_ending}"))
    if not files:
        raise UserError(f"{labels_dir}: no label files ending in {file_ending}")
    jobs = [(f.name[:-len(file_ending)], str(f), labels) for f in files]
    if num_processes > 1 and len(jobs) > 1:
        with Pool(min(num_processes, len(jobs))) as pool:
            rows = pool.map(_case_volumes, jobs)
    else:
        rows = [_case_volumes(job) for job in jobs]
    return pd.DataFrame(rows, columns=["case", *labels])


def audit_volumes(volumes: pd.DataFrame, presence: float = 0.9, fence: float = 3.0,
                  groups: pd.Series | None = None) -> pd.DataFrame:
    """Flag the (case, label) pairs of a :func:`label_volumes` table, as the module docstring says;
    one row per flag, sorted by case and label (columns :data:`FLAG_COLUMNS`; ``group`` is
    ``all`` without ``groups``).

    ``groups`` (case -> group, e.g. a subgroup table's ``condition``): presence and fences are taken
    within each group, so that a group's real anatomy (enlarged ventricles in ventriculomegaly) is
    not flagged against the majority's; every case of ``volumes`` must have a group.

    >>> ventricles = [5.0, 5.4, 4.8, 5.1, 5.3, 4.9, 5.2, 5.0, 4.7, 5.5] * 3 + [20.0, 22, 18, 21, 25, 19, 23, 2]
    >>> volumes = pd.DataFrame({"case": [f"c{i:02d}" for i in range(38)], "ventricles": ventricles})
    >>> audit_volumes(volumes)[["case", "flag"]].values.tolist()  # one cohort: the rare group's anatomy
    [['c30', 'large'], ['c31', 'large'], ['c32', 'large'], ['c33', 'large'], ['c34', 'large'], ['c35', 'large'], ['c36', 'large'], ['c37', 'small']]
    >>> by_condition = pd.Series(["control"] * 30 + ["other"] * 8, index=volumes["case"])
    >>> audit_volumes(volumes, groups=by_condition)[["case", "flag", "group"]].values.tolist()
    [['c37', 'small', 'other']]
    """
    if not 0 <= presence <= 1:
        raise UserError(f"presence {presence}: must be in [0, 1]")
    if fence <= 0:
        raise UserError(f"fence {fence}: must be positive")
    if groups is None:
        flags = _audit_cohort(volumes, presence, fence).assign(group="all")
    else:
        missing = sorted(set(volumes["case"]) - set(groups.dropna().index))
        if missing:
            raise UserError(f"no group for {len(missing)} case(s), e.g. {', '.join(missing[:3])}")
        by_case = volumes["case"].map(groups)
        flags = pd.concat([_audit_cohort(volumes[by_case == group], presence, fence).assign(group=group)
                           for group in sorted(by_case.unique(), key=str)], ignore_index=True)
    return flags.sort_values(["case", "label"], ignore_index=True)


def _audit_cohort(volumes: pd.DataFrame, presence: float, fence: float) -> pd.DataFrame:
    rows = []
    for label in volumes.columns.drop("case"):
        volume = volumes[label].astype(float)
        present = volume > 0
        median = float(volume[present].median()) if present.any() else 0.0
        log_low = log_high = float("nan")  # compared in log space: equal volumes are never beyond a fence
        if present.sum() >= MIN_CASES_FOR_FENCES:
            q1, q3 = np.percentile(np.log(volume[present]), [25, 75])
            width = max(fence * (q3 - q1), np.log(MIN_FENCE_FACTOR))
            log_low, log_high = q1 - width, q3 + width
        low, high = float(np.exp(log_low)), float(np.exp(log_high))
        for case, value, has in zip(volumes["case"], volume, present):
            if not has:
                flag = "missing" if present.mean() >= presence else None
            else:
                flag = "small" if np.log(value) < log_low else "large" if np.log(value) > log_high else None
            if flag:
                rows.append({"case": case, "label": label, "flag": flag, "volume_ml": float(value),
                             "median_ml": median, "low_fence_ml": low, "high_fence_ml": high})
    return pd.DataFrame(rows, columns=FLAG_COLUMNS[:-1])
