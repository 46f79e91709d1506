"""The lab's folder for nnU-Net's ``nnUNet_extTrainer`` lookup: the CPU-budget twins.

nnU-Net 2.8 reads ``nnUNet_extTrainer`` as a list of folders (joined with ``os.pathsep``) and
imports each file of each folder as a *top-level* module while it looks for the ``-tr`` class, so
the module here has a name of its own (``nnunet_dro_lab_trainers``, not the product's
``nnunet_dro_trainers``) and only re-exports :mod:`nnunet_dro.lab.budget`.

>>> from nnunet_dro.ext_trainers import TRAINER_DIR
>>> lab_trainer_dirs()[1] == TRAINER_DIR and lab_trainer_dirs()[0].endswith("ext_trainers")
True
"""
from __future__ import annotations

from pathlib import Path

from nnunet_dro.ext_trainers import TRAINER_DIR

#: Absolute path of this folder.
LAB_TRAINER_DIR = str(Path(__file__).resolve().parent)


def lab_trainer_dirs() -> list[str]:
    """The folders the lab's runs put in ``nnUNet_extTrainer``: this one (the twins), then the
    product's (:func:`nnunet_dro.workflows.nnunet_commands.nnunet_environment` adds it too)."""
    return [LAB_TRAINER_DIR, TRAINER_DIR]
