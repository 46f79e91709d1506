"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_fromStart import nnUNetTrainerDROAdaptive_fromStart


class nnUNetTrainerDROAdaptive_noIS(nnUNetTrainerDROAdaptive_fromStart):
    """f = 0.5 without importance weights and without the probability cap (the benchmark arm
    Adaptive_f50_noIS; the default until the held-out seeds of the paper-sized cohort)."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings, fraction=0.5, max_weight=None,
                           importance=replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings.importance, enabled=False))
