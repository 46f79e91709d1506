"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_noIS import nnUNetTrainerDROAdaptive_noIS


class nnUNetTrainerDROAdaptive_warm50_noIS(nnUNetTrainerDROAdaptive_noIS):
    """ERM for the first half of the epochs, then scale-free DRO with f = 0.5 and no importance
    weights: every structure is learned under uniform sampling before the draws concentrate on
    hard cases (at the benchmark budget ERM learns its last structures late, and DRO from the
    start slows exactly those)."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_noIS.dro_settings, uniform_until=0.5)
