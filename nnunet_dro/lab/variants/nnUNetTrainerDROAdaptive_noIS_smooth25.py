"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_noIS import nnUNetTrainerDROAdaptive_noIS


class nnUNetTrainerDROAdaptive_noIS_smooth25(nnUNetTrainerDROAdaptive_noIS):
    """f = 0.5 without importance weights, each stale loss an exponential average of the case's
    fresh losses (``L <- L + 0.25 (l - L)``, about its last 4-7 draws): one noisy patch loss no
    longer moves the case's probability by itself, so p drifts more slowly."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_noIS.dro_settings, loss_smoothing=0.25)
