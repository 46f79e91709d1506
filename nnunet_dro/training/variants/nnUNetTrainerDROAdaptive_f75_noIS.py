"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.variants.nnUNetTrainerDROAdaptive_noIS import nnUNetTrainerDROAdaptive_noIS


class nnUNetTrainerDROAdaptive_f75_noIS(nnUNetTrainerDROAdaptive_noIS):
    dro_fraction = 0.75
