"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerDRO


class nnUNetTrainerDRO_SGDnoMomentum(nnUNetTrainerDRO):
    """The paper's plain-SGD comparison (Table 3), with nnU-Net's learning rate and schedule."""
    sgd_momentum = 0.0
    sgd_nesterov = False
