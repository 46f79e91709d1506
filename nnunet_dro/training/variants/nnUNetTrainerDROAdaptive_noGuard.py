"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_noGuard(nnUNetTrainerDROAdaptive):
    """The default without its stability guard (``dro_guard = False``): robust weighting goes on
    while a learned structure is lost. The measurement arm of the guard (docs/evidence.md)."""
    dro_guard = False
