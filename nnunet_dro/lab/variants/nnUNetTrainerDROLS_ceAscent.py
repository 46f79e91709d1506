"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.training.gils import nnUNetTrainerDROLS


class nnUNetTrainerDROLS_ceAscent(nnUNetTrainerDROLS):
    gils_settings = replace(nnUNetTrainerDROLS.gils_settings, ascent_dice=False)
