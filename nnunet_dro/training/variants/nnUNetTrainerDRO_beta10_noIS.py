"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerDRO


class nnUNetTrainerDRO_beta10_noIS(nnUNetTrainerDRO):
    dro_beta = 10.0
    dro_importance_sampling = False
