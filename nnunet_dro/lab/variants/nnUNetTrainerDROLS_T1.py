"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.training.gils import nnUNetTrainerDROLS


class nnUNetTrainerDROLS_T1(nnUNetTrainerDROLS):
    gils_settings = replace(nnUNetTrainerDROLS.gils_settings, steps=1)
