"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from dataclasses import replace

from nnunet_dro.training.error_set import nnUNetTrainerDROAdaptive_errorSet


class nnUNetTrainerDROAdaptive_errorSet_refresh70(nnUNetTrainerDROAdaptive_errorSet):
    """JTT's error set inside one training, chosen once more at 70 % of the schedule (from the stale
    losses then), so that "fixed once" and "fixed twice" can be told apart at the same cost."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_errorSet.dro_settings, refresh_at=0.7)
