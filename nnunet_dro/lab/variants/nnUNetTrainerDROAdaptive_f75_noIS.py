"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_noIS import nnUNetTrainerDROAdaptive_noIS


class nnUNetTrainerDROAdaptive_f75_noIS(nnUNetTrainerDROAdaptive_noIS):
    dro_settings = replace(nnUNetTrainerDROAdaptive_noIS.dro_settings, fraction=0.75)
