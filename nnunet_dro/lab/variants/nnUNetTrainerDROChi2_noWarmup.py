"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.training.related import nnUNetTrainerDROChi2


class nnUNetTrainerDROChi2_noWarmup(nnUNetTrainerDROChi2):
    """:class:`nnUNetTrainerDROChi2` without the warm-up pass (stale losses start at the initial value)."""
    dro_settings = replace(nnUNetTrainerDROChi2.dro_settings, warmup=False)
