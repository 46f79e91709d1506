"""The hardness weighted sampler (pure numpy; no nnU-Net import).

>>> from nnunet_dro.sampling import HardnessWeightedSampler
>>> with HardnessWeightedSampler(10, beta=100.0, seed=0) as s:
...     idx = s.sample(2)
...     s.update(idx, [0.5, 0.7])
"""
from nnunet_dro.sampling.distributed import all_gather_updates
from nnunet_dro.sampling.distributions import effective_sample_size, entropy, kl_dro_objective, kl_dro_probabilities
from nnunet_dro.sampling.hardness import NO_IMPORTANCE, HardnessWeightedSampler, ImportanceClip

__all__ = ["HardnessWeightedSampler", "ImportanceClip", "NO_IMPORTANCE", "all_gather_updates", "kl_dro_probabilities",
           "kl_dro_objective", "entropy", "effective_sample_size"]
