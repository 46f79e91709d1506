"""Export a model trained with one of our trainers as a model of a stock nnU-Net trainer.

``nnUNetv2_predict`` finds the trainer class by the name stored in the checkpoint
(``trainer_name``) and asks it for the network (``build_network_architecture``). DRO changes
training only; the network is nnU-Net's. So a DRO model is a stock model once its checkpoints name
a stock trainer and it sits in that trainer's folder. :func:`export_model` writes such a zip, in
the layout of ``nnUNetv2_export_model_to_zip``, which ``nnUNetv2_install_pretrained_model_from_zip``
unpacks into ``$nnUNet_results``::

    DatasetXXX_Name/<AS_TRAINER>__<PLANS>__<CONFIG>/
        plans.json  dataset.json  dataset_fingerprint.json      (as nnU-Net's export)
        nnunet_dro_export.json                                  (where the model came from)
        crossval_results_folds_<F>/summary.json, postprocessing.pkl/.json   (if present)
        fold_N/<checkpoint>          trainer_name = AS_TRAINER, network weights unchanged
        fold_N/progress.png, debug.json, network_architecture.pdf, validation/summary.json (if present)
        fold_N/dro_hardness.csv, dro_progress.png              (if present; not with drop_state)
    DatasetXXX_Name/ensembles/ensemble___<AS_TRAINER>__...     (ensembles of exported configurations)

Every checkpoint keeps all keys of nnU-Net's (optimizer state, logging, ``init_args``, mirroring
axes), so the stock trainer also resumes or validates from it (``nnUNetv2_train --c`` / ``--val``).
Keys nnU-Net does not write (our ``'dro_state'``) are kept — nnU-Net reads its checkpoints key by
key and never looks at others — unless ``drop_state``. File contents other than the checkpoints
are copied unchanged (summaries keep the file paths of the training site).
``inference_information.json`` of the dataset is left out: it compares *all* trainers of the
dataset under their training names, and installing it would overwrite the recipient's own.

Refused, before anything is written (one-line :class:`~nnunet_dro.errors.UserError`):

- a target that is not a trainer class of nnunetv2 itself (found without ``nnUNet_extTrainer``);
- a checkpoint whose ``network_weights`` differ in names or shapes from the network the stock
  trainer builds from the model's ``plans.json`` and ``dataset.json`` — what ``nnUNetv2_predict``
  will build — e.g. the narrower networks of the ``*_CPUBudget`` trainers; and, where the source
  trainer class can be imported, a source network whose modules differ from the stock one (same
  weights, other layers, e.g. another non-linearity);
- ``init_args`` that the stock trainer's constructor does not take;
- a checkpoint that stock nnU-Net could not unpickle (it refers to ``nnunet_dro`` or to a module
  of an ``nnUNet_extTrainer`` folder).
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import os
import pickletools
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from nnunet_dro.atomic import atomic_path, check_output_folder
from nnunet_dro.errors import UserError
from nnunet_dro.workflows.ensemble import PredictionSettings

#: Provenance file written into every exported model folder (stock nnU-Net ignores it).
EXPORT_INFO = "nnunet_dro_export.json"
#: Per-fold files nnU-Net's export takes when they exist (``progress.png`` it requires).
FOLD_FILES = ("debug.json", "progress.png", "network_architecture.pdf")
#: Per-model files of nnU-Net's export; the first two are required (prediction reads them).
MODEL_FILES = ("plans.json", "dataset.json", "dataset_fingerprint.json")
REQUIRED_MODEL_FILES = ("plans.json", "dataset.json")
#: Files of ``crossval_results_folds_*`` and ``ensembles/*`` that nnU-Net's export takes.
SUMMARY_FILES = ("summary.json", "postprocessing.pkl", "postprocessing.json")

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_FOLD = re.compile(r"^(all|[0-9]+)$")
_PY_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _print_err(message: str) -> None:
    print(message, file=sys.stderr)


# ---------------------------------------------------------------------------------------- names
def check_name(value: str, option: str) -> str:
    """A trainer, plans or configuration name: letters, digits, ``_ . -``, no ``__`` (nnU-Net
    joins them with ``__`` into folder names).

    >>> check_name("nnUNetTrainerDRO", "-tr")
    'nnUNetTrainerDRO'
    >>> check_name("a/b", "-p")
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: -p 'a/b': expected letters, digits, _ . - (no '__')
    """
    if not _NAME.match(value) or "__" in value:
        raise UserError(f"{option} {value!r}: expected letters, digits, _ . - (no '__')")
    return value


def fold_folder_name(fold: str) -> str:
    """nnU-Net's fold folder: ``"0"`` -> ``fold_0``, ``"all"`` -> ``fold_all``.

    >>> fold_folder_name("3"), fold_folder_name("all")
    ('fold_3', 'fold_all')
    """
    if not _FOLD.match(str(fold)):
        raise UserError(f"-f {fold!r}: a fold is an integer >= 0 or 'all'")
    return f"fold_{fold}"


def model_identifier(trainer: str, plans: str, configuration: str) -> str:
    """nnU-Net's model folder name (``convert_trainer_plans_config_to_identifier``).

    >>> model_identifier("nnUNetTrainer", "nnUNetPlans", "3d_fullres")
    'nnUNetTrainer__nnUNetPlans__3d_fullres'
    """
    from nnunet_dro.training.nnunet_compat import convert_trainer_plans_config_to_identifier

    return convert_trainer_plans_config_to_identifier(trainer, plans, configuration)


def renamed_ensemble(folder_name: str, source: str, target: str, plans: str,
                     configurations: Sequence[str]) -> Optional[str]:
    """The name of an ``ensembles/`` folder with ``source`` replaced by ``target``, if all its
    members are exported models (``source``/``plans``/one of ``configurations``), else None.

    >>> renamed_ensemble("ensemble___A__P__2d___A__P__3d_fullres___0_1", "A", "B", "P", ["2d", "3d_fullres"])
    'ensemble___B__P__2d___B__P__3d_fullres___0_1'
    >>> renamed_ensemble("ensemble___A__P__2d___C__P__3d_fullres___0_1", "A", "B", "P", ["2d", "3d_fullres"]) is None
    True
    """
    from nnunet_dro.training.nnunet_compat import (
        convert_ensemble_folder_to_model_identifiers_and_folds,
        convert_identifier_to_trainer_plans_config,
    )

    if not folder_name.startswith("ensemble___"):
        return None
    identifiers, folds = convert_ensemble_folder_to_model_identifiers_and_folds(folder_name)
    renamed = []
    for identifier in identifiers:
        parts = convert_identifier_to_trainer_plans_config(identifier)
        if len(parts) != 3:
            return None
        trainer, plan, configuration = parts
        if trainer != source or plan != plans or configuration not in configurations:
            return None
        renamed.append(model_identifier(target, plan, configuration))
    if not renamed:
        return None
    return "___".join(["ensemble", *renamed, folds])


# ------------------------------------------------------------------------------ trainer classes
def stock_trainer_class(name: str) -> type:
    """The trainer class ``name`` of nnunetv2 itself, as ``nnUNetv2_predict`` finds it where
    ``nnUNet_extTrainer`` is unset. UserError if nnunetv2 has no such trainer."""
    from nnunet_dro.training.nnunet_compat import find_trainer_class, nnUNetTrainer

    if not _PY_NAME.match(name):
        raise UserError(f"--as-trainer {name!r}: not a Python class name")
    found = find_trainer_class(name)
    if found is None or not (isinstance(found, type) and issubclass(found, nnUNetTrainer)):
        raise UserError(f"--as-trainer {name}: not a trainer of nnunetv2 (stock nnU-Net must find it without "
                        f"nnUNet_extTrainer), e.g. nnUNetTrainer")
    return found


def source_trainer_class(name: str) -> Optional[type]:
    """The class of the trainer that trained the model, searched like ``nnUNetv2_predict`` does
    (nnunetv2, then this package's trainer folder and ``$nnUNet_extTrainer``); None if not found."""
    from nnunet_dro.ext_trainers import TRAINER_DIR
    from nnunet_dro.training.nnunet_compat import find_trainer_class

    if not _PY_NAME.match(name):
        return None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            found = find_trainer_class(name)
            if found is not None:
                return found
            for folder in dict.fromkeys([TRAINER_DIR, *os.environ.get("nnUNet_extTrainer", "").split(os.pathsep)]):
                if folder.strip() and os.path.isdir(folder):
                    found = find_trainer_class(name, folder)
                    if found is not None:
                        return found
        except Exception:  # a broken module in someone's trainer folder: compare weights only
            return None
    return None


def build_network(trainer_class: type, plans: dict, dataset_json: dict, configuration: str):
    """The network ``nnUNetv2_predict`` builds for ``trainer_class`` from a model folder's plans
    and dataset.json (no deep supervision, as in inference)."""
    from nnunet_dro.training.nnunet_compat import inference_network_inputs

    plans_manager, configuration_manager, num_inputs, num_outputs = inference_network_inputs(
        plans, dataset_json, configuration)
    build = trainer_class.build_network_architecture
    if "plans_manager" in inspect.signature(build).parameters:
        return build(plans_manager, configuration_manager, num_inputs, num_outputs, enable_deep_supervision=False)
    return build(configuration_manager.network_arch_class_name, configuration_manager.network_arch_init_kwargs,
                 configuration_manager.network_arch_init_kwargs_req_import, num_inputs, num_outputs,
                 enable_deep_supervision=False)


def weights_mismatch(weights: Mapping[str, Any], expected: Mapping[str, Sequence[int]]) -> Optional[str]:
    """How the checkpoint's ``weights`` (name -> tensor) differ from ``expected`` (name -> shape)
    of the stock network; None if names and shapes agree.

    >>> import torch
    >>> weights_mismatch({"a": torch.zeros(2, 3)}, {"a": (2, 3)}) is None
    True
    >>> weights_mismatch({"a": torch.zeros(1, 3), "b": torch.zeros(1)}, {"a": (2, 3), "c": (1,)})
    '1 tensor(s) of other shape (a: (1, 3) here, (2, 3) in the stock network), 1 missing (c), 1 unknown (b)'
    """
    different = [(k, tuple(v.shape), tuple(expected[k])) for k, v in weights.items()
                 if k in expected and tuple(v.shape) != tuple(expected[k])]
    missing = [k for k in expected if k not in weights]
    unknown = [k for k in weights if k not in expected]
    parts = []
    if different:
        k, here, stock = different[0]
        parts.append(f"{len(different)} tensor(s) of other shape ({k}: {here} here, {stock} in the stock network)")
    if missing:
        parts.append(f"{len(missing)} missing ({missing[0]}{', ...' if len(missing) > 1 else ''})")
    if unknown:
        parts.append(f"{len(unknown)} unknown ({unknown[0]}{', ...' if len(unknown) > 1 else ''})")
    return ", ".join(parts) or None


def pickle_globals(data: bytes) -> List[str]:
    """The ``module.name`` of every class or function a pickle refers to (GLOBAL and, for
    protocols >= 4, STACK_GLOBAL opcodes).

    >>> import pickle, collections
    >>> pickle_globals(pickle.dumps(collections.OrderedDict(), protocol=2))
    ['collections.OrderedDict']
    >>> pickle_globals(pickle.dumps(collections.OrderedDict(), protocol=4))
    ['collections.OrderedDict']
    """
    found: List[str] = []
    strings: List[str] = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "GLOBAL":
            module, name = arg.split(" ", 1)
            found.append(f"{module}.{name}")
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.append(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str) and "UNICODE" in opcode.name:
            strings.append(arg)
    return list(dict.fromkeys(found))


def checkpoint_pickle(path: str | os.PathLike) -> bytes:
    """The pickle (``data.pkl``) inside a ``torch.save`` file."""
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if not names:
            raise UserError(f"{path}: no data.pkl inside (not a torch.save file?)")
        return archive.read(names[0])


def foreign_modules(references: Iterable[str]) -> List[str]:
    """The references that a process with only nnunetv2 (no nnunet_dro, no ``nnUNet_extTrainer``)
    cannot import: our package, ``__main__``, trainer folders, unknown modules.

    >>> foreign_modules(["collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
    ...                  "nnunet_dro.weighting.CaseWeighting", "no_such_module_xyz.Thing"])
    ['nnunet_dro.weighting.CaseWeighting', 'no_such_module_xyz.Thing']
    """
    from nnunet_dro.ext_trainers import TRAINER_DIR

    folders = [os.path.realpath(f) for f in [TRAINER_DIR, *os.environ.get("nnUNet_extTrainer", "").split(os.pathsep)]
               if f.strip()]
    foreign = []
    for reference in references:
        top = reference.split(".", 1)[0]
        if top in ("nnunet_dro", "__main__"):  # __main__: the script that saved it, gone elsewhere
            foreign.append(reference)
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else ""
        if spec is None or any(origin.startswith(f.rstrip(os.sep) + os.sep) for f in folders):
            foreign.append(reference)
    return foreign


# --------------------------------------------------------------------------------- the export
@dataclass
class SourceModel:
    """One trained configuration to export."""
    configuration: str
    folder: Path                   # $nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG
    target_identifier: str         # AS_TRAINER__PLANS__CONFIG
    files: List[Tuple[Path, str]] = field(default_factory=list)   # (source, zip name) copied unchanged
    checkpoints: List[Tuple[Path, str]] = field(default_factory=list)


@dataclass(frozen=True)
class ExportRequest:
    """What ``nnunet_dro export`` is asked for, its options checked and normalised.

    ``trainer``'s models of dataset ``dataset`` (ID or name) with ``plans`` in ``configurations``
    (None: every one trained), their ``folds`` and ``checkpoints``, zipped into ``output`` under
    the stock trainer ``as_trainer``; ``drop_state`` leaves out our extra checkpoint state and
    files, ``crossval_predictions`` adds the validation predictions. Folds and checkpoints are
    de-duplicated in order; a bad name is a one-line UserError naming its option, in the order
    the command always checked them (files are only looked at by :func:`plan_export`).

    >>> request = ExportRequest("990", "model.zip", "nnUNetTrainerDRO", folds=[0, "0", 1])
    >>> request.folds, request.checkpoints
    (('0', '1'), ('checkpoint_final.pth',))
    >>> ExportRequest("990", "model.zip", "nnUNetTrainerDRO", plans="a/b")
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: -p 'a/b': expected letters, digits, _ . - (no '__')
    """

    dataset: str
    output: str | os.PathLike
    trainer: str
    configurations: Optional[Tuple[str, ...]] = None
    plans: str = "nnUNetPlans"
    folds: Tuple[str, ...] = ("0", "1", "2", "3", "4")
    checkpoints: Tuple[str, ...] = ("checkpoint_final.pth",)
    as_trainer: str = "nnUNetTrainer"
    drop_state: bool = False
    crossval_predictions: bool = False

    def __post_init__(self) -> None:
        check_name(self.trainer, "-tr")
        check_name(self.plans, "-p")
        check_name(self.as_trainer, "--as-trainer")
        if self.configurations is not None:
            object.__setattr__(self, "configurations", tuple(self.configurations))
        for configuration in self.configurations or ():
            check_name(configuration, "-c")
        for name in self.checkpoints:
            if not _NAME.match(name):
                raise UserError(f"-chk {name!r}: expected a file name in the fold folder")
        # frozen: the normalised folds and checkpoints are set once, here
        object.__setattr__(self, "folds", tuple(dict.fromkeys(str(f) for f in self.folds)))
        for fold in self.folds:
            fold_folder_name(fold)
        object.__setattr__(self, "checkpoints", tuple(dict.fromkeys(self.checkpoints)))

    @classmethod
    def of_prediction(cls, settings: PredictionSettings, dataset: str, output: str | os.PathLike, trainer: str,
                      **options: Any) -> ExportRequest:
        """The export of the model that ``predict`` runs with ``settings`` (its configuration, plans,
        folds and checkpoint); ``options``: ``as_trainer``, ``drop_state``, ``crossval_predictions``.

        >>> from nnunet_dro.workflows.ensemble import PredictionSettings
        >>> ExportRequest.of_prediction(PredictionSettings(folds=("0",)), "990", "m.zip", "nnUNetTrainerDRO").folds
        ('0',)
        """
        return cls(dataset, output, trainer, configurations=(settings.configuration,), plans=settings.plans,
                   folds=settings.folds, checkpoints=(settings.checkpoint,), **options)


@dataclass(frozen=True)
class ExportPlan:
    """Everything :func:`plan_export` found and checked before a byte is written: the zip's path,
    the dataset folder's name, the configurations, the files of each model and of the ensembles,
    the stock (and, if importable, the source) trainer class, and the notes to print afterwards."""
    request: ExportRequest
    output: Path
    dataset_dir: Path
    configurations: Tuple[str, ...]
    models: Tuple[SourceModel, ...]
    ensembles: Tuple[Tuple[Path, str], ...]
    stock_class: type
    source_class: Optional[type]
    notes: Tuple[str, ...]


def results_folder() -> Path:
    value = os.environ.get("nnUNet_results")
    if not value:
        raise UserError("environment variable nnUNet_results is not set (the trained models live there)")
    folder = Path(value)
    if not folder.is_dir():
        raise UserError(f"nnUNet_results={value} is not a folder")
    return folder


def dataset_folder_name(dataset: str, results: Path) -> str:
    """``DatasetXXX_Name`` for a dataset name or ID, as nnU-Net resolves it; the dataset must have
    trained models in ``results``."""
    from nnunet_dro.training.nnunet_compat import maybe_convert_to_dataset_name

    if not dataset.startswith("Dataset"):
        try:
            number = int(dataset)
        except ValueError:
            raise UserError(f"-d {dataset!r}: expected a dataset ID (1-999) or name (DatasetXXX_Name)") from None
        if not 1 <= number <= 999:
            raise UserError(f"-d {dataset}: expected a dataset ID (1-999) or name (DatasetXXX_Name)")
        dataset = number
    try:
        name = maybe_convert_to_dataset_name(dataset)
    except (RuntimeError, ValueError) as e:
        # nnU-Net's message lists the folders it looked in on the lines after the first: keep them, on one line
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise UserError(f"-d {dataset}: {text}") from None
    if not _NAME.match(name) or not (results / name).is_dir():
        raise UserError(f"-d {dataset}: no trained models of {name} in nnUNet_results={results}")
    return name


def _configurations(dataset_dir: Path, trainer: str, plans: str, configurations: Optional[Sequence[str]]) -> List[str]:
    prefix = f"{trainer}__{plans}__"
    if configurations:
        missing = [c for c in configurations if not (dataset_dir / f"{prefix}{c}").is_dir()]
        if missing:
            raise UserError(f"{dataset_dir.name}: {trainer} with {plans} was not trained in configuration(s) "
                            f"{', '.join(missing)} (no {prefix}{missing[0]} in {dataset_dir})")
        return list(dict.fromkeys(configurations))
    found = sorted(p.name[len(prefix):] for p in dataset_dir.glob(f"{prefix}*") if p.is_dir())
    if not found:
        raise UserError(f"{dataset_dir.name}: no model of {trainer} with {plans} in {dataset_dir}")
    return found


def collect_model(dataset_dir: Path, request: ExportRequest, configuration: str) -> SourceModel:
    """The files to export of one configuration; UserError naming what is missing."""
    from nnunet_dro.training.hardness_report import HARDNESS_CSV, PROGRESS_PNG
    from nnunet_dro.training.nnunet_compat import folds_tuple_to_string

    plans, folds, checkpoints = request.plans, request.folds, request.checkpoints
    drop_state, crossval_predictions = request.drop_state, request.crossval_predictions
    folder = dataset_dir / model_identifier(request.trainer, plans, configuration)
    target = model_identifier(request.as_trainer, plans, configuration)
    model = SourceModel(configuration, folder, target)
    prefix = f"{dataset_dir.name}/{target}"

    missing = [f for f in REQUIRED_MODEL_FILES if not (folder / f).is_file()]
    if missing:
        raise UserError(f"{folder}: {', '.join(missing)} missing (not a complete nnU-Net model folder)")
    fold_names = [fold_folder_name(f) for f in folds]
    missing = [f for f in fold_names if not (folder / f).is_dir()]
    if missing:
        raise UserError(f"{folder.name}: fold(s) {', '.join(m[len('fold_'):] for m in missing)} not trained "
                        f"(no {missing[0]} in {folder}); pick folds with -f")
    missing = [f"{f}/{c}" for f in fold_names for c in checkpoints if not (folder / f / c).is_file()]
    if missing:
        raise UserError(f"{folder.name}: checkpoint(s) missing: {', '.join(missing)}")

    for fold in fold_names:
        for name in FOLD_FILES + (() if drop_state else (HARDNESS_CSV, PROGRESS_PNG)):
            if (folder / fold / name).is_file():
                model.files.append((folder / fold / name, f"{prefix}/{fold}/{name}"))
        for name in checkpoints:
            model.checkpoints.append((folder / fold / name, f"{prefix}/{fold}/{name}"))
        validation = folder / fold / "validation"
        if crossval_predictions and validation.is_dir():
            for path in sorted(validation.iterdir()):
                if path.is_file() and not path.name.endswith((".npz", ".pkl")):
                    model.files.append((path, f"{prefix}/{fold}/validation/{path.name}"))
        elif (validation / "summary.json").is_file():
            model.files.append((validation / "summary.json", f"{prefix}/{fold}/validation/summary.json"))

    crossval = folder / f"crossval_results_folds_{folds_tuple_to_string(list(folds))}"
    if crossval.is_dir():
        names = sorted(p.name for p in crossval.iterdir() if p.is_file()) if crossval_predictions else SUMMARY_FILES
        for name in names:
            if (crossval / name).is_file():
                model.files.append((crossval / name, f"{prefix}/{crossval.name}/{name}"))
    for name in MODEL_FILES:
        if (folder / name).is_file():
            model.files.append((folder / name, f"{prefix}/{name}"))
    return model


def ensemble_files(dataset_dir: Path, trainer: str, as_trainer: str, plans: str, configurations: Sequence[str],
                   crossval_predictions: bool) -> List[Tuple[Path, str]]:
    """``ensembles/`` folders whose members are all exported, renamed (as nnU-Net's export
    takes the ensembles of the exported trainer)."""
    files: List[Tuple[Path, str]] = []
    ensembles = dataset_dir / "ensembles"
    if not ensembles.is_dir():
        return files
    for folder in sorted(p for p in ensembles.iterdir() if p.is_dir()):
        renamed = renamed_ensemble(folder.name, trainer, as_trainer, plans, configurations)
        if renamed is None:
            continue
        names = sorted(p.name for p in folder.iterdir() if p.is_file()) if crossval_predictions else SUMMARY_FILES
        for name in names:
            if (folder / name).is_file():
                files.append((folder / name, f"{dataset_dir.name}/ensembles/{renamed}/{name}"))
    return files


def read_checkpoint_file(path: Path) -> Dict[str, Any]:
    """``torch.load`` onto the CPU, as ``nnUNetv2_predict`` loads it; UserError if it is not an
    nnU-Net checkpoint."""
    import torch

    try:
        checkpoint = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file: name it, no traceback
        raise UserError(f"{path}: cannot be read as a checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(checkpoint, dict):
        raise UserError(f"{path}: not an nnU-Net checkpoint (no dict)")
    from nnunet_dro.training.nnunet_compat import NNUNET_CHECKPOINT_KEYS

    required = ("network_weights", "init_args", "trainer_name")
    missing = [k for k in required if k not in checkpoint]
    if missing:
        raise UserError(f"{path}: not an nnU-Net checkpoint (no {', '.join(missing)})")
    missing = [k for k in NNUNET_CHECKPOINT_KEYS if k not in checkpoint]
    if missing:
        _print_err(f"nnunet_dro export: warning: {path} lacks {', '.join(missing)}; the stock trainer can predict "
                   f"with it but not resume from it")
    return checkpoint


def exported_checkpoint(checkpoint: Mapping[str, Any], as_trainer: str, drop_state: bool) -> Dict[str, Any]:
    """The checkpoint dict of the stock trainer: ``trainer_name`` replaced, everything else kept
    (with ``drop_state``, only the keys nnU-Net writes).

    >>> exported_checkpoint({"network_weights": {}, "trainer_name": "nnUNetTrainerDRO", "dro_state": {}},
    ...                     "nnUNetTrainer", drop_state=True)
    {'network_weights': {}, 'trainer_name': 'nnUNetTrainer'}
    """
    from nnunet_dro.training.nnunet_compat import NNUNET_CHECKPOINT_KEYS

    result = {k: v for k, v in checkpoint.items() if not drop_state or k in NNUNET_CHECKPOINT_KEYS}
    result["trainer_name"] = as_trainer
    return result


def extra_keys(checkpoint: Mapping[str, Any]) -> List[str]:
    """Keys that nnU-Net's ``save_checkpoint`` does not write (ours: ``'dro_state'``).

    >>> extra_keys({"network_weights": {}, "init_args": {}, "dro_state": {}})
    ['dro_state']
    """
    from nnunet_dro.training.nnunet_compat import NNUNET_CHECKPOINT_KEYS

    return [k for k in checkpoint if k not in NNUNET_CHECKPOINT_KEYS]


class ModelChecker:
    """Checks the checkpoints of one configuration against the stock trainer (network built once)."""

    def __init__(self, model: SourceModel, source_trainer: str, stock_class: type,
                 source_class: Optional[type]) -> None:
        self.model = model
        self.stock_class = stock_class
        self.source_class = source_class
        self.source_trainer = source_trainer
        plans = json.loads((model.folder / "plans.json").read_text())
        dataset_json = json.loads((model.folder / "dataset.json").read_text())
        if model.configuration not in plans.get("configurations", {}):
            raise UserError(f"{model.folder}/plans.json has no configuration {model.configuration}")
        try:
            network = build_network(stock_class, plans, dataset_json, model.configuration)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"{model.folder.name}: {stock_class.__name__} cannot build a network from this "
                            f"plans.json ({type(e).__name__}: {e})") from None
        self.shapes = {k: tuple(v.shape) for k, v in network.state_dict().items()}
        self.stock_modules = repr(network)
        self.init_parameters = [p for p in inspect.signature(stock_class.__init__).parameters if p != "self"]
        self.plans, self.dataset_json = plans, dataset_json
        self.compared_modules = False
        self._modules_checked = source_class is None or source_class is stock_class

    def _check_modules(self) -> None:
        """Where the source class can be imported: its network must have the stock network's
        modules (same weights but, say, another non-linearity would predict differently)."""
        self._modules_checked = True
        try:
            network = build_network(self.source_class, self.plans, self.dataset_json, self.model.configuration)
        except Exception:
            return  # weights already match; nothing more to compare
        self.compared_modules = True
        if repr(network) != self.stock_modules:
            stock = self.stock_class.__name__
            raise UserError(f"{self.model.folder.name}: {self.source_trainer} builds a network with other modules "
                            f"than {stock}'s (same weights, different layers); it cannot be exported as {stock}")

    def check(self, path: Path, checkpoint: Mapping[str, Any]) -> None:
        stock = self.stock_class.__name__
        where = f"{self.model.folder.name}/{path.parent.name}/{path.name}"
        mismatch = weights_mismatch(checkpoint["network_weights"], self.shapes)
        if mismatch:
            raise UserError(f"{where}: the network differs from {stock}'s ({mismatch}); only a model with "
                            f"nnU-Net's network can be exported as {stock}")
        init_args = checkpoint["init_args"]
        if not isinstance(init_args, Mapping) or sorted(init_args) != sorted(self.init_parameters):
            keys = sorted(init_args) if isinstance(init_args, Mapping) else type(init_args).__name__
            raise UserError(f"{where}: init_args {keys} do not fit {stock}.__init__"
                            f"({', '.join(self.init_parameters)})")
        if init_args.get("configuration") != self.model.configuration:
            raise UserError(f"{where}: init_args configuration {init_args.get('configuration')!r} is not the "
                            f"folder's {self.model.configuration!r}")
        if not self._modules_checked:
            self._check_modules()


def _provenance(request: ExportRequest, model: SourceModel, kept: Sequence[str], trainer_names: Sequence[str],
                compared_modules: bool) -> str:
    from importlib.metadata import PackageNotFoundError, version

    from nnunet_dro import __version__

    try:
        nnunet_version = version("nnunetv2")
    except PackageNotFoundError:
        nnunet_version = None
    info = {
        "exported_by": f"nnunet_dro {__version__}",
        "nnunetv2_version": nnunet_version,
        "source_trainer": request.trainer,
        "source_trainer_names_in_checkpoints": sorted(set(trainer_names)),
        "source_folder": model.folder.name,
        "as_trainer": request.as_trainer,
        "plans": request.plans,
        "configuration": model.configuration,
        "folds": list(request.folds),
        "checkpoints": list(request.checkpoints),
        "extra_checkpoint_keys_kept": list(kept),
        "network_check": "weight names and shapes" + (" and modules" if compared_modules else ""),
    }
    return json.dumps(info, indent=2) + "\n"


def check_output_file(output: str | os.PathLike) -> Path:
    """``-o`` must name a file that can be written (not a folder, not below a file)."""
    path = Path(output)
    if str(output).endswith(os.sep) or path.is_dir():
        raise UserError(f"-o {output}: is a folder; give the name of the zip file to write")
    if path.exists() and not path.is_file():
        raise UserError(f"-o {output}: exists and is not a regular file")
    check_output_folder(path.absolute().parent, f"-o {output}: folder")
    return path


def plan_export(request: ExportRequest) -> ExportPlan:
    """Every check :func:`export_model` can make before writing (the output file, the stock class,
    ``nnUNet_results``, the dataset, the configurations, each model's folds and files); the
    checkpoints themselves are read while writing. Creates nothing."""
    trainer, as_trainer, plans = request.trainer, request.as_trainer, request.plans
    output = check_output_file(request.output)
    stock_class = stock_trainer_class(as_trainer)
    results = results_folder()
    dataset_dir = results / dataset_folder_name(str(request.dataset), results)
    configurations = _configurations(dataset_dir, trainer, plans, request.configurations)
    models = [collect_model(dataset_dir, request, c) for c in configurations]
    ensembles = ensemble_files(dataset_dir, trainer, as_trainer, plans, configurations, request.crossval_predictions)
    source_class = source_trainer_class(trainer) if trainer != as_trainer else stock_class
    notes = []  # printed once the zip is written (an error stays the only line on stderr)
    if source_class is None:
        notes.append(f"nnunet_dro export: note: {trainer} cannot be imported here; its network was compared "
                     f"with {as_trainer}'s by weight names and shapes only")
    if trainer != as_trainer:
        for model in models:
            installed = dataset_dir / model.target_identifier
            if installed.exists():
                notes.append(f"nnunet_dro export: warning: {installed} exists: installing this zip into this "
                             f"nnUNet_results (nnUNetv2_install_pretrained_model_from_zip) overwrites that "
                             f"{as_trainer} model's files")
    return ExportPlan(request, output, dataset_dir, tuple(configurations), tuple(models), tuple(ensembles),
                      stock_class, source_class, tuple(notes))


def write_export(plan: ExportPlan, *, echo: Callable[[str], None] | None = print,
                 warn: Callable[[str], None] = _print_err) -> Dict[str, Any]:
    """Write the zip of ``plan`` under a temporary name, checking each checkpoint (network,
    init_args, pickled classes) as it goes; it appears at ``plan.output`` only when complete.
    ``echo`` gets one progress line per checkpoint; ``warn`` the plan's notes, after the zip is
    written. Returns the summary of :func:`export_model`."""
    import torch

    request, dataset_name = plan.request, plan.dataset_dir.name
    entries: List[str] = []
    kept: Dict[str, List[str]] = {}
    with atomic_path(plan.output) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        scratch = Path(tempfile.mkdtemp(prefix=".nnunet_dro_export.", dir=tmp.parent))  # rewritten checkpoints
        try:
            for model in plan.models:
                checker = ModelChecker(model, request.trainer, plan.stock_class, plan.source_class)
                trainer_names, model_kept = [], []
                for path, name in model.checkpoints:
                    if echo:
                        echo(f"{model.folder.name}/{path.parent.name}/{path.name} -> {name}")
                    checkpoint = read_checkpoint_file(path)
                    checker.check(path, checkpoint)
                    trainer_names.append(str(checkpoint["trainer_name"]))
                    new = exported_checkpoint(checkpoint, request.as_trainer, request.drop_state)
                    model_kept.extend(k for k in extra_keys(new) if k not in model_kept)
                    written = scratch / "checkpoint.pth"
                    torch.save(new, str(written))
                    del checkpoint, new
                    foreign = foreign_modules(pickle_globals(checkpoint_pickle(written)))
                    if foreign:
                        hint = "" if request.drop_state else " (--drop-state leaves out our extra state)"
                        raise UserError(f"{path}: refers to {', '.join(foreign[:3])}, which a process with "
                                        f"only nnunetv2 cannot import{hint}")
                    archive.write(written, name)
                    entries.append(name)
                    written.unlink()
                for path, name in model.files:
                    archive.write(path, name)
                    entries.append(name)
                info = f"{dataset_name}/{model.target_identifier}/{EXPORT_INFO}"
                archive.writestr(info, _provenance(request, model, model_kept, trainer_names,
                                                   checker.compared_modules))
                entries.append(info)
                kept[model.configuration] = model_kept
            for path, name in plan.ensembles:
                archive.write(path, name)
                entries.append(name)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    for note in plan.notes:
        warn(note)
    return {"dataset": dataset_name, "configurations": list(plan.configurations), "entries": entries, "kept": kept,
            "output": plan.output,
            "target_folders": [f"{dataset_name}/{m.target_identifier}" for m in plan.models]}


def export_model(request: ExportRequest, *, echo: Callable[[str], None] | None = print,
                 warn: Callable[[str], None] = _print_err) -> Dict[str, Any]:
    """Write ``request.output``, a zip of ``request.trainer``'s models that installs as
    ``request.as_trainer``'s: :func:`plan_export`, then :func:`write_export`.

    Everything is checked (folders, files, stock class, networks, init_args, pickled classes)
    while the zip is written under a temporary name; it appears at the output only when complete.
    ``echo`` gets one progress line per checkpoint; ``warn`` the warnings and notes, after the zip
    is written (a failure raises UserError and warns nothing). Returns a summary: dataset,
    configurations, zip entries, extra keys kept, target folders.
    """
    return write_export(plan_export(request), echo=echo, warn=warn)
