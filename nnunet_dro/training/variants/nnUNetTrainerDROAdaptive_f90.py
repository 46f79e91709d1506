"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_f90(nnUNetTrainerDROAdaptive):
    dro_fraction = 0.9
    dro_importance_sampling = True
    dro_max_weight = None
