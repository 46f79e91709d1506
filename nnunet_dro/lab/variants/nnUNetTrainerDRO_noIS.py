"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.training.trainer import nnUNetTrainerDRO


class nnUNetTrainerDRO_noIS(nnUNetTrainerDRO):
    dro_settings = replace(nnUNetTrainerDRO.dro_settings,
                           importance=replace(nnUNetTrainerDRO.dro_settings.importance, enabled=False))
