"""Fold ensembles, cross-trainer ensembles and their evaluation, with nnU-Net's own tools.

The paper's fetal results are 5-fold ensembles: ``nnUNetv2_predict -f 0 1 2 3 4`` averages the
softmax probabilities of the folds. Ensembles across trainers (ERM + DRO) average the saved
probabilities with ``nnUNetv2_ensemble``, which needs ``.npz`` files plus ``plans.json`` and
``dataset.json`` beside them: ``nnUNetv2_predict --save_probabilities`` writes all three, so this
module asks for them whenever a cross-trainer ensemble is requested.

Output layout (``OUT``)::

    OUT/predictions/<NAME>/            fold ensemble of one trainer (NAME=TRAINER on the command line)
    OUT/predictions/<NAME>_fold<k>/    single folds, with --per-fold
    OUT/predictions/<A>+<B>/           cross-trainer ensemble, with --combine A+B
    OUT/evaluation/                    `nnunet_dro evaluate` report of all of the above, with -ref

Every prediction folder is written under a temporary name and renamed when complete, so an
interrupted run never leaves a folder that looks finished.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from nnunet_dro.atomic import check_output_folder
from nnunet_dro.errors import UserError
from nnunet_dro.workflows.nnunet_commands import run_nnunet

if TYPE_CHECKING:
    from nnunet_dro.evaluation.options import EvaluationOptions

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Member:
    """One trainer's fold ensemble: ``name`` in tables, ``trainer`` class name for nnU-Net."""
    name: str
    trainer: str


def parse_members(values: Sequence[str]) -> list[Member]:
    """``["ERM=nnUNetTrainer", "nnUNetTrainerDRO"]`` -> members (a bare trainer names itself).

    >>> parse_members(["ERM=nnUNetTrainer", "nnUNetTrainerDRO"])[1]
    Member(name='nnUNetTrainerDRO', trainer='nnUNetTrainerDRO')
    """
    members: list[Member] = []
    for value in values:
        name, sep, trainer = value.partition("=")
        if not sep:
            name = trainer = value
        if not _NAME.match(name) or not _NAME.match(trainer):
            raise UserError(f"-tr {value!r}: expected NAME=TRAINER or TRAINER (letters, digits, _ . -)")
        if any(m.name == name for m in members):
            raise UserError(f"-tr: name {name!r} given twice")
        members.append(Member(name, trainer))
    if not members:
        raise UserError("give at least one trainer (-tr)")
    return members


def parse_combinations(values: Sequence[str], members: Sequence[Member]) -> list[list[str]]:
    """``["ERM+DRO"]`` -> ``[["ERM", "DRO"]]``, checked against the member names."""
    names = {m.name for m in members}
    combos = []
    for value in values:
        parts = [p for p in value.split("+") if p]
        unknown = [p for p in parts if p not in names]
        if len(parts) < 2 or unknown:
            raise UserError(f"--combine {value!r}: expected two or more of {sorted(names)} joined by '+'")
        combos.append(parts)
    return combos


def trained_model_folder(results_root: str | os.PathLike, dataset_id: int, trainer: str, plans: str,
                         configuration: str) -> Path:
    """``$nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG`` (must exist)."""
    root = Path(results_root)
    matches = sorted(root.glob(f"Dataset{dataset_id:03d}_*")) if root.is_dir() else []
    if not matches:
        raise UserError(f"no results for dataset {dataset_id} in nnUNet_results={root}")
    folder = matches[0] / f"{trainer}__{plans}__{configuration}"
    if not folder.is_dir():
        raise UserError(f"{trainer} was not trained on {matches[0].name} with {plans}/{configuration}: "
                        f"{folder} does not exist")
    return folder


def check_folds(model_folder: Path, folds: Sequence[str], checkpoint: str) -> None:
    missing = [f for f in folds if not (model_folder / f"fold_{f}" / checkpoint).is_file()]
    if missing:
        raise UserError(f"{model_folder.name}: no {checkpoint} for fold(s) {', '.join(missing)} "
                        f"(train them first, or pick folds with -f)")


def _finished_folder(target: Path, make: Callable[[Path], None]) -> Path:
    """Run ``make(tmp)`` and rename ``tmp`` onto ``target`` only if it succeeds."""
    tmp = target.with_name(f".{target.name}.incomplete")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        make(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target


def predict(env: Mapping[str, str], dataset_id: int, configuration: str, images: str, target: Path,
            trainer: str, folds: Sequence[str], plans: str = "nnUNetPlans", device: str = "cuda",
            save_probabilities: bool = False, checkpoint: str = "checkpoint_final.pth",
            npp: int = 3, nps: int = 3, echo: Callable[[str], None] | None = print,
            log_file: str | None = None, tta: bool = True) -> Path:
    """``nnUNetv2_predict`` of one trainer (its folds averaged) into ``target``; ``tta=False``
    passes ``--disable_tta`` (no mirroring: about 8x faster in 3D, slightly less accurate)."""
    args = ["-i", images, "-d", str(dataset_id), "-c", configuration, "-tr", trainer, "-p", plans,
            "-f", *folds, "-device", device, "-chk", checkpoint, "-npp", str(npp), "-nps", str(nps),
            "--disable_progress_bar"]
    if save_probabilities:
        args.append("--save_probabilities")
    if not tta:
        args.append("--disable_tta")
    return _finished_folder(target, lambda tmp: run_nnunet("nnUNetv2_predict", ["-o", str(tmp), *args],
                                                           env, echo=echo, log_file=log_file))


def ensemble(env: Mapping[str, str], folders: Sequence[Path], target: Path, num_processes: int = 2,
             echo: Callable[[str], None] | None = print, log_file: str | None = None) -> Path:
    """``nnUNetv2_ensemble``: average the saved probabilities of ``folders`` into ``target``."""
    args = ["-i", *map(str, folders), "-np", str(num_processes)]
    return _finished_folder(target, lambda tmp: run_nnunet("nnUNetv2_ensemble", [*args, "-o", str(tmp)],
                                                           env, echo=echo, log_file=log_file))


def run_ensemble(env: Mapping[str, str], dataset_id: int, images: str, output: str | os.PathLike,
                 members: Sequence[Member], *, configuration: str = "3d_fullres",
                 plans: str = "nnUNetPlans", folds: Sequence[str] = ("0", "1", "2", "3", "4"),
                 combine: Sequence[Sequence[str]] = (), per_fold: bool = False, device: str = "cuda",
                 checkpoint: str = "checkpoint_final.pth", npp: int = 3, nps: int = 3,
                 num_processes: int = 2, reference: str | None = None,
                 evaluation: EvaluationOptions | None = None, tta: bool = True,
                 echo: Callable[[str], None] | None = print):
    """Predict every member (fold ensemble, optionally single folds), build the requested
    cross-trainer ensembles and, given a ``reference`` folder, evaluate them all against it with
    :func:`nnunet_dro.evaluation.api.evaluate` and the options ``evaluation`` (None: the defaults;
    its ``num_processes`` is replaced by ``num_processes``).

    Returns ``(folders, result)``: method name -> prediction folder, and the evaluation result
    (or None).
    """
    output = Path(output)
    names = method_names(members, folds, combine, per_fold)
    check_ensemble_inputs(env, dataset_id, images, output, members, configuration=configuration,
                                   plans=plans, folds=folds, checkpoint=checkpoint, names=names,
                                   num_processes=num_processes, reference=reference, evaluation=evaluation)
    predictions = output / "predictions"
    created = [p for p in (output, predictions) if not p.exists()]
    predictions.mkdir(parents=True, exist_ok=True)
    try:
        folders = _predict_all(env, dataset_id, images, predictions, members, configuration=configuration,
                               plans=plans, folds=folds, combine=combine, per_fold=per_fold, device=device,
                               checkpoint=checkpoint, npp=npp, nps=nps, num_processes=num_processes,
                               log_file=str(output / "nnunet_commands.log"), tta=tta, echo=echo)
    except BaseException:
        for folder in reversed(created):  # no empty folders from a failed run (the log is kept)
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    say = echo or (lambda _: None)
    result = None
    if reference is not None:
        from nnunet_dro.evaluation.api import evaluate

        say("[ensemble] evaluating " + ", ".join(folders))
        result = evaluate(reference, {name: str(folder) for name, folder in folders.items()},
                          str(output / "evaluation"), evaluation, num_processes=num_processes)
    return folders, result


def method_names(members: Sequence[Member], folds: Sequence[str], combine: Sequence[Sequence[str]],
                 per_fold: bool) -> list[str]:
    """The names of every prediction folder (and evaluated method), in the order they are made."""
    names = [m.name for m in members]
    if per_fold and len(folds) > 1:
        names += [f"{m.name}_fold{fold}" for m in members for fold in folds]
    return names + ["+".join(combo) for combo in combine]


_IMAGE_FILE = re.compile(r"_\d{4}\.[A-Za-z.]+$")


def check_ensemble_inputs(env: Mapping[str, str], dataset_id: int, images: str, output: Path,
                          members: Sequence[Member], *, configuration: str, plans: str, folds: Sequence[str],
                          checkpoint: str, names: Sequence[str], num_processes: int,
                          reference: str | None = None,
                          evaluation: EvaluationOptions | None = None) -> dict[str, Path]:
    """Everything ``run_ensemble`` can check before the first prediction; creates nothing.

    The image folder, the output folder (``-o``: not a file, not below one, writable; its
    ``predictions`` a folder; its ``evaluation`` report folder usable), every trained model and
    fold checkpoint, and, given a ``reference``, the evaluation (``-ref``, ``-regions``, ``-groups`` ...)
    as ``nnunet_dro evaluate`` checks it. Returns each member's model folder.
    """
    if not Path(images).is_dir():
        raise UserError(f"input image folder {images} does not exist")
    if not any(_IMAGE_FILE.search(p.name) for p in Path(images).iterdir() if p.is_file()):
        raise UserError(f"input image folder {images} holds no images named like nnU-Net's CASE_0000.nii.gz")
    check_output_folder(output)
    for entry, kind in ((output / "predictions", "a folder"), (output / "nnunet_commands.log", "a file")):
        if entry.exists() and entry.is_dir() != (kind == "a folder"):
            raise UserError(f"-o {output}: {entry} exists and is not {kind}")
    models = {}
    for member in members:
        models[member.name] = trained_model_folder(env["nnUNet_results"], dataset_id, member.trainer, plans,
                                                   configuration)
        check_folds(models[member.name], folds, checkpoint)
    if reference is not None:
        from nnunet_dro.evaluation.api import check_inputs

        check_inputs(reference, names, str(output / "evaluation"), evaluation, num_processes=num_processes)
    return models


def _predict_all(env, dataset_id, images, predictions: Path, members, *, configuration, plans, folds,
                 combine, per_fold, device, checkpoint, npp, nps, num_processes, log_file, tta, echo) -> dict:
    say = echo or (lambda _: None)
    needs_probabilities = {name for combo in combine for name in combo}
    folders: dict[str, Path] = {}
    for member in members:
        say(f"[ensemble] predicting {member.name} ({member.trainer}, folds {' '.join(folds)})")
        folders[member.name] = predict(
            env, dataset_id, configuration, images, predictions / member.name, member.trainer,
            folds, plans, device, member.name in needs_probabilities, checkpoint, npp, nps,
            echo=None, log_file=log_file, tta=tta)
    if per_fold and len(folds) > 1:
        for member in members:
            for fold in folds:
                name = f"{member.name}_fold{fold}"
                say(f"[ensemble] predicting {name}")
                folders[name] = predict(env, dataset_id, configuration, images, predictions / name,
                                        member.trainer, [fold], plans, device, False, checkpoint, npp, nps,
                                        echo=None, log_file=log_file, tta=tta)
    for combo in combine:
        name = "+".join(combo)
        say(f"[ensemble] averaging probabilities of {name}")
        folders[name] = ensemble(env, [folders[m] for m in combo], predictions / name,
                                 num_processes, echo=None, log_file=log_file)
    return folders
