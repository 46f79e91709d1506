"""Cross-validation folds stratified by subgroup, written where nnU-Net reads them.

nnU-Net draws its 5 folds with an unstratified ``KFold`` (``generate_crossval_split``): with 10
"other" cases in 125 a fold can hold 0 or 4 of them in validation, so its training part would
have 6 to 10 rare cases depending on the draw. The converged regime (issue 78) trains fold 0 of a
split in which every fold holds each group in proportion (100 / 15 / 10 cases: 20 / 3 / 2 per
validation fold), written to ``splits_final.json`` before the first training, which nnU-Net then
reads instead of drawing its own.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.errors import UserError

SPLITS_FILENAME = "splits_final.json"


def stratified_folds(group_of: Mapping[str, str], n_folds: int = 5, seed: int = 12345) -> list[dict[str, list[str]]]:
    """nnU-Net's split format (a list of ``{"train": [...], "val": [...]}``), each fold's
    validation holding every group in proportion (scikit-learn's ``StratifiedKFold``, shuffled
    with ``seed``; 12345 is nnU-Net's own split seed).

    >>> groups = {f"c{i:03d}": "control" for i in range(8)} | {"r1": "other", "r2": "other"}
    >>> folds = stratified_folds(groups, n_folds=2)
    >>> [sorted(group for case, group in groups.items() if case in fold["val"]).count("other") for fold in folds]
    [1, 1]
    """
    cases = sorted(group_of)
    labels = [group_of[case] for case in cases]
    counts = {group: labels.count(group) for group in set(labels)}
    too_few = {group: count for group, count in counts.items() if count < n_folds}
    if too_few:
        raise UserError(f"groups {too_few}: fewer cases than the {n_folds} folds; each fold's validation needs one")
    splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    folds = []
    for train, val in splitter.split(np.zeros(len(cases)), labels):
        folds.append({"train": [cases[i] for i in train], "val": [cases[i] for i in val]})
    return folds


def write_splits(preprocessed_dataset: str | Path, folds: list[dict[str, list[str]]]) -> Path:
    """Write ``splits_final.json`` into the dataset's preprocessed folder (atomically); an existing
    different split is refused: nnU-Net's results of the earlier split would no longer match."""
    path = Path(preprocessed_dataset) / SPLITS_FILENAME
    if path.is_file():
        if json.loads(path.read_text()) == folds:
            return path
        raise UserError(f"{path}: holds another split; the trained folds were made with it (use a new folder)")
    write_text_atomic(path, json.dumps(folds, indent=1))
    return path
