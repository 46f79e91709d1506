"""The product's trainer variants, named the nnU-Net way (hyper-parameters in the class name), one
class in one file, attributes only: a variant is its base's name plus one token per setting it
changes (tests/training/test_train_trainer_dir.py checks the tokens against ``dro_settings``). The
benchmark's ablation arms are the lab's, one file each in :mod:`nnunet_dro.lab.variants`, found the
same way (:func:`discover`). Adding one means adding one file here: this package finds every module in
its folder (as nnU-Net finds its own variants by scanning a folder), and from the class it holds
come the exported name of :mod:`nnunet_dro.training`, the ``-tr`` lookup through ``nnunet_dro
trainer-dir``, the ``<name>_CPUBudget`` twin and the benchmark arm (the name without
``nnUNetTrainer``); see docs/development.md.

A variant sets ``dro_settings`` with :func:`dataclasses.replace` of its base's settings::

    from dataclasses import replace
    from nnunet_dro.training.trainer import nnUNetTrainerDRO

    class nnUNetTrainerDRO_beta10(nnUNetTrainerDRO):
        dro_settings = replace(nnUNetTrainerDRO.dro_settings, beta=10.0)

What each variant sets, and what it was measured to do: the tables of docs/training.md (checked
against these classes by tests/training/test_train_variant_tables.py) and docs/evidence.md.

Every class inherits the constructor of its base unchanged: nnU-Net records the constructor's
arguments by name for checkpoints, so subclasses must not define ``__init__(*args, **kwargs)``.
"""
from __future__ import annotations

import importlib
import pkgutil

from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


def discover(package: str, path) -> dict[str, type]:
    """Import every module of the folder ``path`` of ``package``; each must define exactly the
    trainer class it is named after (a misnamed file is an error at import, not a trainer that
    ``-tr`` silently lacks)."""
    found = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        module = importlib.import_module(f"{package}.{info.name}")
        cls = getattr(module, info.name, None)
        if not (isinstance(cls, type) and issubclass(cls, nnUNetTrainer)):
            raise ImportError(f"{module.__file__}: a variant file must define the nnU-Net trainer class "
                              f"{info.name!r} it is named after")
        found[info.name] = cls
    return found


#: every variant by name, in name order
VARIANTS: dict[str, type] = discover(__name__, __path__)
globals().update(VARIANTS)
__all__ = ["VARIANTS", *VARIANTS]
