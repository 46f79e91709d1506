"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from dataclasses import replace

from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_trim5(nnUNetTrainerDROAdaptive):
    """The default with an outlier trim: the hardest 5 % of the training cases by stale loss (rounded
    up) leave the hardness distribution and are drawn at the uniform rate, so that cases with wrong
    or partial labels, whose loss stays the highest however well the network learns, are not drawn at
    the cap for the whole training (the idea of DORO, Zhai et al., ICML 2021). For cohorts whose
    labels may be dirty; not measured to keep the default's gains on clean labels."""
    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, trim_fraction=0.05)
