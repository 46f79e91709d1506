"""Every trainer of this package, found rather than listed.

The trainers are the ``nnUNetTrainer*`` classes defined in the modules of :data:`MODULES` and the
variants of :mod:`nnunet_dro.training.variants` (one class per file, found by scanning that
folder). From this one mapping come the product's trainers, :data:`PRODUCT_TRAINERS` (every one
but the bases others build on and :data:`LAB_ONLY`): the names :mod:`nnunet_dro.training` exports
and so what ``nnUNetv2_train -tr`` finds through ``nnunet_dro trainer-dir``. In the lab, the
CPU-budget twins and the arms of the robustness benchmark (:mod:`nnunet_dro.lab.budget`) come from
all of :data:`TRAINERS` and the lab's own variants (:mod:`nnunet_dro.lab.variants`): a class that
exists is reachable, and a name cannot be forgotten in a list.

>>> "nnUNetTrainerDROAdaptive" in PRODUCT_TRAINERS and "nnUNetTrainerCaseWeighting" not in PRODUCT_TRAINERS
True
"""
from __future__ import annotations

from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunet_dro.training import cohort, error_set, gils, related, trainer
from nnunet_dro.training.variants import VARIANTS

#: the modules whose nnUNetTrainer* classes are trainers of this package (besides the variants)
MODULES = (trainer, cohort, related, gils, error_set)
PREFIX = "nnUNetTrainer"


def _defined_in(module) -> dict[str, type]:
    return {name: obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, nnUNetTrainer) and name.startswith(PREFIX)
            and obj.__module__ == module.__name__}


def _collect() -> dict[str, type]:
    found: dict[str, type] = {}
    for module in MODULES:
        found.update(_defined_in(module))
    clash = sorted(set(found) & set(VARIANTS))
    if clash:
        raise ImportError(f"trainer names defined twice (a module and a variant file): {clash}")
    found.update(VARIANTS)
    return dict(sorted(found.items()))


#: every trainer by class name (the bases included)
TRAINERS: dict[str, type] = _collect()
#: the bases the trainers build on: the product's classes, not trainers a user picks with ``-tr``
BASES = ("nnUNetTrainerConfigurableSGD", "nnUNetTrainerPerSampleLoss", "nnUNetTrainerCaseWeighting")
#: trainers of the product's modules that only the lab trains: GI-LS on nnU-Net's uniform draws
#: (the record's arm ``DROLS``; its name says DRO, it draws as nnU-Net does, so users are offered
#: ``nnUNetTrainerDROLS_DRO``, GI-LS on the default's hardness weighted sampling, instead)
LAB_ONLY = ("nnUNetTrainerDROLS",)
#: the trainers a user trains: ``nnunet_dro trainer-dir``'s, the table of docs/training.md
PRODUCT_TRAINERS: dict[str, type] = {name: cls for name, cls in TRAINERS.items() if name not in BASES + LAB_ONLY}

