"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.variants.nnUNetTrainerDROAdaptive_fromStart import nnUNetTrainerDROAdaptive_fromStart


class nnUNetTrainerDROAdaptive_f50(nnUNetTrainerDROAdaptive_fromStart):
    dro_fraction = 0.5
    dro_importance_sampling = True
    dro_max_weight = None
