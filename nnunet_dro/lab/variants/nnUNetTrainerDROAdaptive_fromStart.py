"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_fromStart(nnUNetTrainerDROAdaptive):
    """The default without its ERM phase: robust weighting from the first epoch (f = 0.5, no
    importance weights, no case above 5 / n, the stability guard on). This was the default of the
    177-case benchmark's headline table; on a 40-case cohort it kept two structures from being
    learned at all in one run of four (docs/evidence.md). Every other ``nnUNetTrainerDROAdaptive_*``
    variant but ``_trim5`` and ``_f25_ermPhase`` derives from it, so that each keeps the setting it was
    measured with."""
    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, uniform_until_learned=None)
