"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_f25(nnUNetTrainerDROAdaptive):
    dro_fraction = 0.25
    dro_importance_sampling = True
    dro_max_weight = None
