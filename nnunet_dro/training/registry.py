"""Every trainer of this package, found rather than listed.

The trainers are the ``nnUNetTrainer*`` classes defined in the modules of :data:`MODULES` and the
variants of :mod:`nnunet_dro.training.variants` (one class per file, found by scanning that
folder). From this one mapping come the names :mod:`nnunet_dro.training` exports (and so what
``nnUNetv2_train -tr`` finds through ``nnunet_dro trainer-dir``), and in the lab the CPU-budget
twins and the arms of the robustness benchmark (:mod:`nnunet_dro.lab.budget`): a class that exists
is reachable everywhere, and a name cannot be forgotten in a list.

>>> "nnUNetTrainerDROAdaptive" in TRAINERS and "nnUNetTrainerDROAdaptive_noGuard" in TRAINERS
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


#: every trainer by class name
TRAINERS: dict[str, type] = _collect()

