"""nnU-Net's own cross-validation as a method of ``nnunet_dro evaluate``.

``-pred NAME=$nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG`` names a trainer output
folder (recognised by its ``fold_*`` subfolders, the layout of
:func:`nnunet_dro.workflows.ensemble.trained_model_folder`). Its predictions are the
``fold_N/validation/CASE.nii.gz`` files that ``nnUNetv2_train`` writes at the end of each fold:
every case once, predicted by the fold that did not train on it. ``--folds`` restricts the folds
read (default: every ``fold_N`` folder present; ``fold_all`` trains on every case and has no
cross-validation). Without ``-ref`` the references are the dataset's ``labelsTr`` under
``$nnUNet_raw`` (the dataset named by the trainer folder's parent), so the regions default to its
``dataset.json``.

Refused with a one-line UserError naming the folder: a case in the validation of two folds, a
fold folder without validation predictions, a fold's ``validation/summary.json`` listing a case
whose prediction file is missing, validation predictions of cases the reference folder lacks, a
requested fold that is not there, a case validated by another fold than nnU-Net's
``splits_final.json`` says (the trainer folder's copy, else ``$nnUNet_preprocessed/DatasetXXX_Name/``),
and a case validated by different folds in two trainer folders (their "paired" comparison would
pair predictions of models that saw different training cases).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.io import list_segmentations, load_nnunet_summary, split_case_id

FOLD_FOLDER = re.compile(r"^fold_(\d+)$")
DATASET_FOLDER = re.compile(r"^Dataset\d{3}_.+$")


@dataclass
class CrossValidation:
    """The validation predictions of one trainer folder: case -> file, and the fold of each case."""

    name: str
    folder: Path
    folds: list[int]
    files: dict[str, str] = field(default_factory=dict)
    fold_of_case: dict[str, int] = field(default_factory=dict)
    folds_given: bool = False

    def describe(self) -> str:
        return (f"{self.name} = fold_N/validation of {self.folder.name}, fold{'s' if len(self.folds) > 1 else ''} "
                f"{', '.join(map(str, self.folds))} ({len(self.files)} cases)")


def is_trainer_folder(path: str | os.PathLike) -> bool:
    """A folder with ``fold_*`` subfolders (``fold_0`` ... or ``fold_all``): an nnU-Net trainer output."""
    folder = Path(path)
    if not folder.is_dir():
        return False
    return any(child.name.startswith("fold_") and child.is_dir() for child in folder.iterdir())


def _fold_folders(option: str, folder: Path, folds: Sequence[int] | None) -> dict[int, Path]:
    present = {int(m.group(1)): child for child in folder.iterdir()
               if child.is_dir() and (m := FOLD_FOLDER.match(child.name))}
    if folds is None:
        if not present:
            raise UserError(f"{option}: no fold_N folder in {folder} (fold_all is trained on every case and has no "
                            f"cross-validation predictions)")
        return dict(sorted(present.items()))
    missing = [f for f in folds if f not in present]
    if missing:
        have = ", ".join(map(str, sorted(present))) or "none"
        raise UserError(f"--folds: {folder} has no fold_{missing[0]} (fold_N folders present: {have})")
    return {f: present[f] for f in sorted(set(folds))}


def gather_validation(name: str, folder: str | os.PathLike, folds: Sequence[int] | None = None) -> CrossValidation:
    """Every ``fold_N/validation`` prediction of the trainer folder (``folds``: only those)."""
    folder = Path(folder)
    option = f"-pred {name}={folder}"
    cv = CrossValidation(name, folder, [], folds_given=folds is not None)
    for fold, path in _fold_folders(option, folder, folds).items():
        validation = path / "validation"
        has_files = validation.is_dir() and any(split_case_id(p) for p in os.listdir(validation))
        if not has_files:
            raise UserError(f"{option}: {path.name}/validation holds no validation predictions (is fold {fold} "
                            f"finished? choose the folds with --folds)")
        files = list_segmentations(str(validation), f"validation folder of {name}")
        _check_against_summary(option, validation, files)
        for case, file in files.items():
            if case in cv.files:
                raise UserError(f"{option}: case {case!r} is in the validation of fold_{cv.fold_of_case[case]} and of "
                                f"{path.name} (folds of different splits in one folder?)")
            cv.files[case] = file
            cv.fold_of_case[case] = fold
        cv.folds.append(fold)
    check_against_splits(cv)
    return cv


SPLITS_FILE = "splits_final.json"


def splits_file(folder: Path) -> Path | None:
    """nnU-Net's ``splits_final.json`` for a trainer folder: the folder's own copy, else the one in
    ``$nnUNet_preprocessed/DatasetXXX_Name/`` (the dataset named by the folder's parent); None if
    neither exists."""
    own = folder / SPLITS_FILE
    if own.is_file():
        return own
    preprocessed = os.environ.get("nnUNet_preprocessed")
    dataset = folder.resolve().parent.name
    if preprocessed and DATASET_FOLDER.match(dataset):
        candidate = Path(preprocessed) / dataset / SPLITS_FILE
        if candidate.is_file():
            return candidate
    return None


def read_splits(path: Path) -> dict[str, int]:
    """case -> the fold whose validation holds it, from a ``splits_final.json``
    (a list of ``{"train": [...], "val": [...]}``, one per fold)."""
    try:
        splits = json.loads(path.read_text())
        fold_of_case: dict[str, int] = {}
        for fold, split in enumerate(splits):
            for case in split["val"]:
                fold_of_case.setdefault(str(case), fold)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise UserError(f"{path}: not an nnU-Net splits file (a list of {{'train': [...], 'val': [...]}}; "
                        f"{type(error).__name__}: {error})") from None
    return fold_of_case


def check_against_splits(cv: CrossValidation) -> None:
    """Each validation prediction must sit in the fold that ``splits_final.json`` validates it in,
    and each fold read must hold every case that file validates in it: a fold whose validation
    folder is only partly written (a training still running, or stopped while exporting) was
    scored as complete, "fold 3 (4 cases)" of the 8 it validates."""
    path = splits_file(cv.folder)
    if path is None:
        return
    split_fold = read_splits(path)
    for fold in cv.folds:
        expected = sorted(case for case, f in split_fold.items() if f == fold)
        unwritten = [case for case in expected if case not in cv.files]
        if unwritten:
            complete = [f for f in cv.folds if f != fold and
                        all(c in cv.files for c, g in split_fold.items() if g == f)]
            hint = (f" or evaluate the complete folds only with --folds {' '.join(map(str, complete))}"
                    if complete else "")
            raise UserError(f"-pred {cv.name}={cv.folder}: fold_{fold}/validation holds "
                            f"{len(expected) - len(unwritten)} of the {len(expected)} cases that {path} validates "
                            f"in fold {fold}; no prediction for {', '.join(unwritten[:3])}"
                            f"{', ...' if len(unwritten) > 3 else ''} (is fold {fold} finished? its validation "
                            f"is written at the end of its training{hint})")
    wrong = sorted((case, fold) for case, fold in cv.fold_of_case.items() if split_fold.get(case) != fold)
    if wrong:
        case, fold = wrong[0]
        where = (f"fold {split_fold[case]}" if case in split_fold else "no fold")
        raise UserError(f"-pred {cv.name}={cv.folder}: {len(wrong)} case(s) validated in another fold than {path} "
                        f"says, e.g. {case!r} in fold_{fold}/validation, in the validation of {where} there "
                        f"(a prediction from another split?)")


def check_same_folds(cross_validations: Sequence[CrossValidation]) -> None:
    """Two trainer folders compared case by case must have validated each case in the same fold."""
    first = cross_validations[0] if cross_validations else None
    for other in cross_validations[1:]:
        differ = sorted(c for c in set(first.fold_of_case) & set(other.fold_of_case)
                        if first.fold_of_case[c] != other.fold_of_case[c])
        if differ:
            case = differ[0]
            raise UserError(f"-pred {other.name}: {len(differ)} case(s) validated in another fold than in "
                            f"{first.name}, e.g. {case!r} in fold_{other.fold_of_case[case]} of {other.folder.name} "
                            f"and fold_{first.fold_of_case[case]} of {first.folder.name}: the trainings used different "
                            f"splits, so their paired comparison would not compare like with like")


def describe_non_trainer_folder(path: str | os.PathLike) -> str | None:
    """What a folder given as predictions is when it is a dataset folder rather than predictions or
    a trainer folder (None otherwise): a dataset of ``nnUNet_results`` holding trainer folders, or
    an ``nnUNet_raw`` dataset."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    trainers = sorted(child.name for child in folder.iterdir() if child.is_dir() and is_trainer_folder(child))
    if trainers:
        return (f"a dataset folder of nnUNet_results holding the trainer folder(s) {', '.join(trainers[:3])}; "
                f"give one of them, e.g. {folder / trainers[0]}")
    if (folder / "dataset.json").is_file() and any((folder / sub).is_dir() for sub in ("imagesTr", "labelsTr")):
        return ("an nnU-Net raw dataset folder (dataset.json, imagesTr, labelsTr), not predictions: give a folder "
                "of predictions or a trainer folder $nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG")
    return None


def _check_against_summary(option: str, validation: Path, files: Mapping[str, str]) -> None:
    """nnU-Net's ``validation/summary.json`` lists the cases the fold validated: each needs its file."""
    summary = validation / "summary.json"
    if not summary.is_file():
        return
    try:
        listed = load_nnunet_summary(str(summary))
    except UserError:
        return  # not ours to judge; the prediction files are what is evaluated
    lacking = sorted(set(listed) - set(files))
    if lacking:
        raise UserError(f"{option}: {validation.parent.name}/validation/summary.json lists {len(lacking)} case(s) "
                        f"without a prediction file there: {', '.join(lacking[:3])}"
                        f"{', ...' if len(lacking) > 3 else ''}")


def dataset_labels_folder(cross_validations: Sequence[CrossValidation]) -> Path:
    """``$nnUNet_raw/DatasetXXX_Name/labelsTr`` of the dataset the trainer folders belong to (the
    reference folder when ``-ref`` is left out)."""
    from nnunetv2.paths import nnUNet_raw

    names = {cv.name: cv.folder.resolve().parent.name for cv in cross_validations}
    first = cross_validations[0]
    dataset = names[first.name]
    if not DATASET_FOLDER.match(dataset):
        raise UserError(f"-pred {first.name}={first.folder}: without -ref the dataset is the trainer folder's parent, "
                        f"but {dataset!r} is not named DatasetXXX_Name; give -ref")
    for name, other in names.items():
        if other != dataset:
            raise UserError(f"-pred {name}: trainer folder of {other}, but {first.name} is of {dataset}; give -ref")
    if not nnUNet_raw.is_set() or not nnUNet_raw.get():
        raise UserError(f"-ref not given and environment variable nnUNet_raw is not set: export nnUNet_raw (its "
                        f"{dataset}/labelsTr holds the references) or give -ref")
    labels = Path(nnUNet_raw.get()) / dataset / "labelsTr"
    if not labels.is_dir():
        raise UserError(f"-ref not given: the references of {dataset} would be {labels}, which does not exist; "
                        f"check nnUNet_raw or give -ref")
    return labels


def check_cases_in_reference(cross_validations: Sequence[CrossValidation], reference: str,
                             reference_cases: set[str]) -> None:
    """Validation predictions of cases the reference folder lacks: another dataset, or a wrong -ref."""
    for cv in cross_validations:
        extra = sorted(set(cv.files) - reference_cases)
        if extra:
            folds = sorted({cv.fold_of_case[c] for c in extra})
            raise UserError(f"-pred {cv.name}={cv.folder}: validation predictions of {len(extra)} case(s) not in the "
                            f"reference folder {reference} (fold_{', fold_'.join(map(str, folds))}): "
                            f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}")
