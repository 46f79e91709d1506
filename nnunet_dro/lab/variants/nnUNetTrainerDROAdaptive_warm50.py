"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_f50 import nnUNetTrainerDROAdaptive_f50


class nnUNetTrainerDROAdaptive_warm50(nnUNetTrainerDROAdaptive_f50):
    """ERM (uniform sampling, stale losses refreshed) for the first half of the epochs, then
    scale-free DRO with f = 0.5 and importance weights."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_f50.dro_settings, uniform_until=0.5)
