"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.training.trainer import nnUNetTrainerDRO


class nnUNetTrainerDRO_warmup(nnUNetTrainerDRO):
    """:class:`nnUNetTrainerDRO` (KL, beta 100, importance sampling) with Fidon et al. 2020's uniform warm-up
    pass first (importance weights are 1 during it)."""
    dro_settings = replace(nnUNetTrainerDRO.dro_settings, warmup=True)
