"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_f75(nnUNetTrainerDROAdaptive):
    dro_fraction = 0.75
    dro_importance_sampling = True
    dro_max_weight = None
