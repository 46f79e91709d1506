"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_fromStart import nnUNetTrainerDROAdaptive_fromStart


class nnUNetTrainerDROAdaptive_noGuard(nnUNetTrainerDROAdaptive_fromStart):
    """The default before its ERM phase (``_fromStart``) without its stability guard (``dro_guard = False``): robust weighting goes on
    while a learned structure is lost. The measurement arm of the guard (docs/evidence.md)."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings, guard=False)
