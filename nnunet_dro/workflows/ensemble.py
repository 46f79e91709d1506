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
from dataclasses import dataclass, replace
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


_DEVICES = ("cuda", "cpu", "mps")


@dataclass(frozen=True)
class PredictionSettings:
    """How ``nnUNetv2_predict`` runs a trained model, the same for every trainer it is given.

    ``configuration``, ``plans``, ``folds`` and ``checkpoint`` pick the model files
    (``-c -p -f -chk``; the folds' probabilities are averaged); ``device``, ``tta`` (False:
    ``--disable_tta``, no mirroring: about 8x faster in 3D, slightly less accurate), ``npp`` and
    ``nps`` (pre-processing and export processes; both 0: nnU-Net's sequential prediction in one
    process, which ``nnUNetv2_predict`` runs when it is given ``-npp 0 -nps 0``, and never with one
    of them 0) say how it runs; ``save_probabilities`` keeps the
    ``.npz`` files (and ``plans.json``/``dataset.json``) that ``nnUNetv2_ensemble`` averages. Folds
    are stored as strings, as nnU-Net's ``-f`` takes them; a variant is ``dataclasses.replace``.

    >>> settings = PredictionSettings(folds=[0, "all"], device="cpu", tta=False)
    >>> settings.folds, settings.arguments()[-2:]
    (('0', 'all'), ['--disable_progress_bar', '--disable_tta'])
    >>> replace(settings, folds=("1",)).folds
    ('1',)
    >>> PredictionSettings(npp=0, nps=0).arguments()[-3:]
    ['-nps', '0', '--disable_progress_bar']
    >>> PredictionSettings(npp=0)
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: -npp 0 -nps 3: nnUNetv2_predict runs without worker processes only when both are 0
    """

    configuration: str = "3d_fullres"
    plans: str = "nnUNetPlans"
    folds: tuple[str, ...] = ("0", "1", "2", "3", "4")
    checkpoint: str = "checkpoint_final.pth"
    device: str = "cuda"
    tta: bool = True
    npp: int = 3
    nps: int = 3
    save_probabilities: bool = False

    def __post_init__(self) -> None:
        # frozen: the folds are normalised once, here, through object.__setattr__
        folds = (self.folds,) if isinstance(self.folds, (str, int)) else self.folds
        object.__setattr__(self, "folds", tuple(str(f) for f in folds))
        # a fold or name that is not trained is left to check_folds/trained_model_folder, which name the
        # model folder they looked in; here only what the command line cannot produce
        if not self.folds:
            raise UserError("-f: give at least one fold")
        for option, value in (("-c", self.configuration), ("-p", self.plans), ("-chk", self.checkpoint)):
            if not isinstance(value, str):
                raise UserError(f"{option} {value!r}: expected a name")
        if self.device not in _DEVICES:
            raise UserError(f"-device {self.device!r}: choose one of {', '.join(_DEVICES)}")
        for option, value in (("-npp", self.npp), ("-nps", self.nps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{option} {value!r}: expected an integer >= 0")
        # nnU-Net predicts in one process only with both 0; with one of them 0 it starts the worker
        # pools anyway and fails after loading the model (-npp 0: an assertion in
        # nnunetv2.inference.data_iterators; -nps 0: multiprocessing's Pool(0) ValueError)
        if (self.npp == 0) != (self.nps == 0):
            raise UserError(f"-npp {self.npp} -nps {self.nps}: nnUNetv2_predict runs without worker processes "
                            "only when both are 0")

    def arguments(self) -> list[str]:
        """The options of ``nnUNetv2_predict`` these settings stand for (no ``-i -o -d -tr``)."""
        args = ["-c", self.configuration, "-p", self.plans, "-f", *self.folds, "-device", self.device,
                "-chk", self.checkpoint, "-npp", str(self.npp), "-nps", str(self.nps), "--disable_progress_bar"]
        if self.save_probabilities:
            args.append("--save_probabilities")
        if not self.tta:
            args.append("--disable_tta")
        return args


@dataclass(frozen=True)
class EnsemblePlan:
    """What ``run_ensemble`` makes: each member's fold ensemble (``settings``), with ``per_fold``
    also every fold on its own, and the cross-trainer ensembles ``combine`` (lists of member names)
    averaged by ``nnUNetv2_ensemble`` with ``num_processes`` processes (also the evaluation's).

    >>> plan = EnsemblePlan(parse_members(["ERM=nnUNetTrainer", "DRO=nnUNetTrainerDRO"]), combine=[["ERM", "DRO"]],
    ...                     settings=PredictionSettings(folds=("0", "1")), per_fold=True)
    >>> plan.names()
    ['ERM', 'DRO', 'ERM_fold0', 'ERM_fold1', 'DRO_fold0', 'DRO_fold1', 'ERM+DRO']
    >>> EnsemblePlan(plan.members, combine=[["ERM", "JTT"]])
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: --combine 'ERM+JTT': expected two or more of ['DRO', 'ERM'] joined by '+'
    """

    members: tuple[Member, ...]
    settings: PredictionSettings = PredictionSettings()
    combine: tuple[tuple[str, ...], ...] = ()
    per_fold: bool = False
    num_processes: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "combine", tuple(tuple(combo.split("+") if isinstance(combo, str) else combo)
                                                  for combo in self.combine))
        if not self.members:
            raise UserError("give at least one trainer (-tr)")
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise UserError(f"-tr: name {next(n for n in names if names.count(n) > 1)!r} given twice")
        for combo in self.combine:
            if len(combo) < 2 or not set(combo) <= set(names):
                raise UserError(f"--combine {'+'.join(combo)!r}: expected two or more of {sorted(names)} "
                                f"joined by '+'")
        if isinstance(self.num_processes, bool) or not isinstance(self.num_processes, int) or self.num_processes < 1:
            raise UserError(f"-np {self.num_processes!r}: need at least 1 process")

    def names(self) -> list[str]:
        """Every prediction folder (and evaluated method), in the order they are made."""
        return method_names(self.members, self.settings.folds, self.combine, self.per_fold)


def predict(env: Mapping[str, str], dataset_id: int, images: str, target: Path, trainer: str,
            settings: PredictionSettings = PredictionSettings(), *,
            echo: Callable[[str], None] | None = print, log_file: str | None = None) -> Path:
    """``nnUNetv2_predict`` of one trainer (its folds averaged) into ``target``, as ``settings`` say."""
    model = settings.arguments()  # "-c CONFIGURATION" first: -tr after it, in the order the log always had
    args = ["-i", images, "-d", str(dataset_id), *model[:2], "-tr", trainer, *model[2:]]
    return _finished_folder(target, lambda tmp: run_nnunet("nnUNetv2_predict", ["-o", str(tmp), *args],
                                                           env, echo=echo, log_file=log_file))


def ensemble(env: Mapping[str, str], folders: Sequence[Path], target: Path, num_processes: int = 2,
             echo: Callable[[str], None] | None = print, log_file: str | None = None) -> Path:
    """``nnUNetv2_ensemble``: average the saved probabilities of ``folders`` into ``target``."""
    args = ["-i", *map(str, folders), "-np", str(num_processes)]
    return _finished_folder(target, lambda tmp: run_nnunet("nnUNetv2_ensemble", [*args, "-o", str(tmp)],
                                                           env, echo=echo, log_file=log_file))


def run_ensemble(env: Mapping[str, str], dataset_id: int, images: str, output: str | os.PathLike,
                 plan: EnsemblePlan, *, reference: str | None = None, evaluation: EvaluationOptions | None = None,
                 echo: Callable[[str], None] | None = print):
    """Predict every member of ``plan`` (fold ensemble, optionally single folds), build its
    cross-trainer ensembles and, given a ``reference`` folder, evaluate them all against it with
    :func:`nnunet_dro.evaluation.api.evaluate` and the options ``evaluation`` (None: the defaults;
    its ``num_processes`` is replaced by the plan's).

    Returns ``(folders, result)``: method name -> prediction folder, and the evaluation result
    (or None).
    """
    output = Path(output)
    check_ensemble_inputs(env, dataset_id, images, output, plan, reference=reference, evaluation=evaluation)
    predictions = output / "predictions"
    created = [p for p in (output, predictions) if not p.exists()]
    predictions.mkdir(parents=True, exist_ok=True)
    try:
        folders = _predict_all(env, dataset_id, images, predictions, plan,
                               log_file=str(output / "nnunet_commands.log"), echo=echo)
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
                          str(output / "evaluation"), evaluation, num_processes=plan.num_processes)
    return folders, result


def method_names(members: Sequence[Member], folds: Sequence[str], combine: Sequence[Sequence[str]],
                 per_fold: bool) -> list[str]:
    """The names of every prediction folder (and evaluated method), in the order they are made."""
    names = [m.name for m in members]
    if per_fold and len(folds) > 1:
        names += [f"{m.name}_fold{fold}" for m in members for fold in folds]
    return names + ["+".join(combo) for combo in combine]


_IMAGE_FILE = re.compile(r"_\d{4}\.[A-Za-z.]+$")


def check_ensemble_inputs(env: Mapping[str, str], dataset_id: int, images: str, output: Path, plan: EnsemblePlan, *,
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
    settings = plan.settings
    models = {}
    for member in plan.members:
        models[member.name] = trained_model_folder(env["nnUNet_results"], dataset_id, member.trainer,
                                                   settings.plans, settings.configuration)
        check_folds(models[member.name], settings.folds, settings.checkpoint)
    if reference is not None:
        from nnunet_dro.evaluation.api import check_inputs

        check_inputs(reference, plan.names(), str(output / "evaluation"), evaluation,
                     num_processes=plan.num_processes)
    return models


def _predict_all(env: Mapping[str, str], dataset_id: int, images: str, predictions: Path, plan: EnsemblePlan, *,
                 log_file: str | None, echo: Callable[[str], None] | None) -> dict[str, Path]:
    say = echo or (lambda _: None)
    settings, folds = plan.settings, plan.settings.folds
    needs_probabilities = {name for combo in plan.combine for name in combo}
    folders: dict[str, Path] = {}
    for member in plan.members:
        say(f"[ensemble] predicting {member.name} ({member.trainer}, folds {' '.join(folds)})")
        folders[member.name] = predict(
            env, dataset_id, images, predictions / member.name, member.trainer,
            replace(settings, save_probabilities=member.name in needs_probabilities), echo=None, log_file=log_file)
    if plan.per_fold and len(folds) > 1:
        for member in plan.members:
            for fold in folds:
                name = f"{member.name}_fold{fold}"
                say(f"[ensemble] predicting {name}")
                folders[name] = predict(env, dataset_id, images, predictions / name, member.trainer,
                                        replace(settings, folds=(fold,), save_probabilities=False),
                                        echo=None, log_file=log_file)
    for combo in plan.combine:
        name = "+".join(combo)
        say(f"[ensemble] averaging probabilities of {name}")
        folders[name] = ensemble(env, [folders[m] for m in combo], predictions / name,
                                 plan.num_processes, echo=None, log_file=log_file)
    return folders
