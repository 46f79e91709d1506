"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_fromStart import nnUNetTrainerDROAdaptive_fromStart


class nnUNetTrainerDROAdaptive_kappa1(nnUNetTrainerDROAdaptive_fromStart):
    """The paper's rule of thumb (beta of the order of 1 / std of the stale losses) as the scale-free
    rule: ``beta_t = 1 / std(L)``, capped at 100; the comparison arm for the perplexity rule (the
    default's other settings: no importance weights)."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings, rule="spread", kappa=1.0, max_weight=None)
