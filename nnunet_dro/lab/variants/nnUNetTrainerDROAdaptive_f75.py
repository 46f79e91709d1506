"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_fromStart import nnUNetTrainerDROAdaptive_fromStart


class nnUNetTrainerDROAdaptive_f75(nnUNetTrainerDROAdaptive_fromStart):
    dro_settings = replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings, fraction=0.75, max_weight=None,
                           importance=replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings.importance, enabled=True))
