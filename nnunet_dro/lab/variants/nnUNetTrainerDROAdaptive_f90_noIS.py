"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_noIS import nnUNetTrainerDROAdaptive_noIS


class nnUNetTrainerDROAdaptive_f90_noIS(nnUNetTrainerDROAdaptive_noIS):
    """The mildest constraint measured (the default in the 40-case benchmark, where it was the
    least harmful setting)."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_noIS.dro_settings, fraction=0.9)
