"""Find training labels that may be wrong before a hardness-weighted sampler chases them.

A case whose reference is wrong keeps a high loss however well the network learns, so hardness
weighted sampling draws it more often than the others (docs/choosing-robustness.md). The outlier
trim of ``nnUNetTrainerDROAdaptive_trim5`` catches the cases with the very highest losses (in our
benchmark: shifted masks, swapped labels), not a case with one structure missing, whose loss is
high enough to be chased and too low to be trimmed. This audit looks at the labels alone, per
structure and case:

- ``missing``: the structure has no voxel in this case, while at least ``presence`` of the *other*
  cases have it (a structure erased, or never drawn). The case itself is not counted, so that one
  case of 8 without it (7 of 7 others have it) is flagged; counting it, 7/8 = 0.875 stayed under
  0.9 and no cohort of fewer than 10 cases could flag anything;
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
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.processes import map_in_processes

#: fewest cases (with the structure) for a volume fence: quartiles of fewer say little
MIN_CASES_FOR_FENCES = 8
#: the fences lie at least this factor beyond the quartiles: a group whose volumes barely vary
#: (an interquartile range near 0) would otherwise flag any case a few voxels off
MIN_FENCE_FACTOR = 1.5
FLAG_COLUMNS = ["case", "label", "flag", "volume_ml", "median_ml", "low_fence_ml", "high_fence_ml", "group",
                "judged_by"]


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
                  num_processes: int = 1, progress: bool = False) -> pd.DataFrame:
    """One row per label file of ``labels_dir``: the case and each label's volume in mL
    (``progress``: a progress bar on stderr, as ``nnunet_dro evaluate`` shows)."""
    from tqdm import tqdm

    files = sorted(Path(labels_dir).glob(f"*{file_ending}"))
    if not files:
        raise UserError(f"{labels_dir}: no label files ending in {file_ending}")
    jobs = [(f.name[:-len(file_ending)], str(f), labels) for f in files]
    with tqdm(total=len(jobs), desc="Reading labels", unit="case", file=sys.stderr, disable=not progress,
              leave=False) as bar:
        if num_processes > 1 and len(jobs) > 1:
            rows = map_in_processes(_case_volumes, jobs, [job[0] for job in jobs], min(num_processes, len(jobs)),
                                    on_result=lambda row: bar.update(),
                                    preload=[__name__, "nnunet_dro.data.nifti", "nnunet_dro.data.raw_dataset"])
        else:
            rows = []
            for job in jobs:
                rows.append(_case_volumes(job))
                bar.update()
    return pd.DataFrame(rows, columns=["case", *labels])


def audit_volumes(volumes: pd.DataFrame, presence: float = 0.9, fence: float = 3.0,
                  groups: pd.Series | None = None) -> pd.DataFrame:
    """Flag the (case, label) pairs of a :func:`label_volumes` table, as the module docstring says;
    one row per flag, sorted by case and label (columns :data:`FLAG_COLUMNS`; ``group`` is
    ``all`` without ``groups``).

    ``groups`` (case -> group, e.g. a subgroup table's ``condition``): fences are taken within each
    group, so that a group's real anatomy (enlarged ventricles in ventriculomegaly) is not flagged
    against the majority's; every case of ``volumes`` must have a group. A structure absent from a
    case is judged against its group *and* the cohort: flagged when at least ``presence`` of the
    other cases of its group have it, or when at least ``presence`` of the other cases of the
    cohort have it and its group is not without it (some other case of the group has it, or the
    group is this case alone). So a structure erased in 1 of the 3 cases of a small group is
    flagged where the rest of the cohort has it, and a structure that a whole group lacks is not.
    ``judged_by`` says which rule flagged (``cohort``, ``group``, ``group and cohort``);
    :func:`group_detection` says per group what can be flagged.

    >>> ventricles = [5.0, 5.4, 4.8, 5.1, 5.3, 4.9, 5.2, 5.0, 4.7, 5.5] * 3 + [20.0, 22, 18, 21, 25, 19, 23, 2]
    >>> volumes = pd.DataFrame({"case": [f"c{i:02d}" for i in range(38)], "ventricles": ventricles})
    >>> audit_volumes(volumes)[["case", "flag"]].values.tolist()  # one cohort: the rare group's anatomy
    [['c30', 'large'], ['c31', 'large'], ['c32', 'large'], ['c33', 'large'], ['c34', 'large'], ['c35', 'large'], ['c36', 'large'], ['c37', 'small']]
    >>> by_condition = pd.Series(["control"] * 30 + ["other"] * 8, index=volumes["case"])
    >>> audit_volumes(volumes, groups=by_condition)[["case", "flag", "group"]].values.tolist()
    [['c37', 'small', 'other']]
    >>> cerebellum = pd.DataFrame({"case": [f"c{i:02d}" for i in range(40)], "cerebellum": [10.0] * 36 + [0.0, 10, 10, 0]})
    >>> small = pd.Series(["control"] * 37 + ["other"] * 3, index=cerebellum["case"])  # 'other': 2 of 3 have it
    >>> audit_volumes(cerebellum, groups=small)[["case", "group", "judged_by"]].values.tolist()
    [['c36', 'control', 'group and cohort'], ['c39', 'other', 'group and cohort']]
    >>> cerebellum["cerebellum"] = [10.0] * 36 + [0.0, 0, 0, 10]  # 'other': 1 of 3 has it
    >>> audit_volumes(cerebellum, groups=small)[["case", "group", "judged_by"]].values.tolist()
    [['c36', 'control', 'group and cohort'], ['c37', 'other', 'cohort'], ['c38', 'other', 'cohort']]
    >>> cerebellum["cerebellum"] = [10.0] * 37 + [0.0, 0, 0]  # every case of 'other' lacks it: its anatomy
    >>> audit_volumes(cerebellum, groups=small).empty
    True
    """
    if not 0 <= presence <= 1:
        raise UserError(f"presence {presence}: must be in [0, 1]")
    if fence <= 0:
        raise UserError(f"fence {fence}: must be positive")
    cohort_missing = _missing_flags(volumes, presence)
    if groups is None:
        flags = _audit_cohort(volumes, presence, fence, cohort_missing, "cohort").assign(group="all")
    else:
        missing = sorted(set(volumes["case"]) - set(groups.dropna().index))
        if missing:
            raise UserError(f"no group for {len(missing)} case(s), e.g. {', '.join(missing[:3])}")
        by_case = volumes["case"].map(groups)
        parts = []
        for group in sorted(by_case.unique(), key=str):
            members = volumes[by_case == group]
            within = _missing_flags(members, presence)
            judged = {}
            for key in set(within) | set(cohort_missing):
                label = key[1]
                others_have = (members[label].astype(float) > 0).sum() > 0 or len(members) == 1
                if key in within and key in cohort_missing:
                    judged[key] = "group and cohort"
                elif key in within:
                    judged[key] = "group"
                elif key[0] in set(members["case"]) and others_have:
                    judged[key] = "cohort"
            parts.append(_audit_cohort(members, presence, fence, judged, "group").assign(group=group))
        flags = pd.concat(parts, ignore_index=True)
    return flags[FLAG_COLUMNS].sort_values(["case", "label"], ignore_index=True)


def _missing_flags(volumes: pd.DataFrame, presence: float) -> set[tuple[str, str]]:
    """(case, label) pairs of a structure absent from the case while at least ``presence`` of the
    other cases have it."""
    out = set()
    others = len(volumes) - 1
    for label in volumes.columns.drop("case"):
        present = volumes[label].astype(float) > 0
        if others < 1:
            continue
        share = present.sum() / others  # the case itself lacks it: every present case is another case
        if share >= presence:
            out.update((case, label) for case in volumes.loc[~present, "case"])
    return out


def largest_detectable(n_cases: int, presence: float) -> int:
    """How many of ``n_cases`` may lack a structure and each still be flagged against the others:
    the largest k with ``(n - k) / (n - 1) >= presence`` (0 for a single case).

    >>> [largest_detectable(n, 0.9) for n in (1, 2, 3, 5, 8, 40)]
    [0, 1, 1, 1, 1, 4]
    """
    if n_cases < 2:
        return 0
    return max(k for k in range(n_cases) if (n_cases - k) >= presence * (n_cases - 1) - 1e-9)


def group_detection(n_cases: int, presence: float) -> str:
    """One line on what the audit of a group of ``n_cases`` can and cannot flag.

    >>> group_detection(3, 0.9)
    'missing: up to 1 of its 3 cases within the group, more only against the cohort; volumes: no fences (fewer than 8 cases), not judged'
    """
    k = largest_detectable(n_cases, presence)
    missing = (f"up to {k} of its {n_cases} cases within the group, more only against the cohort" if k
               else "only against the cohort (a single case)")
    volumes = ("fences within the group" if n_cases >= MIN_CASES_FOR_FENCES
               else f"no fences (fewer than {MIN_CASES_FOR_FENCES} cases), not judged")
    return f"missing: {missing}; volumes: {volumes}"


def _audit_cohort(volumes: pd.DataFrame, presence: float, fence: float, missing: dict | set,
                  judged_by: str) -> pd.DataFrame:
    """Volume flags within ``volumes``; ``missing``: the (case, label) pairs flagged as missing
    (a dict gives each its ``judged_by``)."""
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
            by = judged_by
            if not has:
                flag = "missing" if (case, label) in missing else None
                if isinstance(missing, dict) and flag:
                    by = missing[(case, label)]
            else:
                flag = "small" if np.log(value) < log_low else "large" if np.log(value) > log_high else None
            if flag:
                rows.append({"case": case, "label": label, "flag": flag, "volume_ml": float(value),
                             "median_ml": median, "low_fence_ml": low, "high_fence_ml": high, "judged_by": by})
    return pd.DataFrame(rows, columns=[c for c in FLAG_COLUMNS if c != "group"])
