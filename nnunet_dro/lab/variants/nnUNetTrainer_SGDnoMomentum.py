"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from nnunet_dro.training.trainer import nnUNetTrainerConfigurableSGD


class nnUNetTrainer_SGDnoMomentum(nnUNetTrainerConfigurableSGD):
    """ERM baseline for nnUNetTrainerDRO_SGDnoMomentum: nnU-Net's trainer with plain SGD."""
    sgd_momentum = 0.0
    sgd_nesterov = False
