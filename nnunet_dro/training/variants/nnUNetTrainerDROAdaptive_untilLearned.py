"""One trainer variant, attributes only: found by the discovery of ``nnunet_dro.training.variants``."""
from nnunet_dro.training.stability import ALL_LEARNED
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive


class nnUNetTrainerDROAdaptive_untilLearned(nnUNetTrainerDROAdaptive):
    """The default (f = 0.5, no importance weights, no case above 5 / n) after an ERM phase that
    lasts until every structure is learned: uniform sampling until the first epoch at whose end
    every structure's pseudo-Dice is at least 0.2, robust weighting from the next epoch on.
    Drawing hard cases more means fewer draws for what every case still lacks, so a structure
    nnU-Net learns late may not be learned at all under robust weighting. A run that learns its last
    structure late thus gets little DRO, and a run that never learns it trains exactly as ERM.
    Why 0.2 and not 0.5: a small structure (deep grey matter) can stay below 0.5 in a converged ERM
    run, while every structure passes 0.2 within a few epochs of leaving 0 (the benchmark journal)."""
    dro_uniform_until_learned = ALL_LEARNED
