"""Folder for nnU-Net's ``nnUNet_extTrainer`` lookup: ``export nnUNet_extTrainer=$(nnunet_dro trainer-dir)``.

nnU-Net puts this folder on ``sys.path`` and imports each file in it as a *top-level* module
while it searches for the class named by ``-tr``. The modules therefore only re-export the
trainers of :mod:`nnunet_dro.training`; all logic lives there. Keep them trivial.
"""
from pathlib import Path

#: Absolute path of this folder (what ``nnunet_dro trainer-dir`` prints).
TRAINER_DIR = str(Path(__file__).resolve().parent)
