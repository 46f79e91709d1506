"""Case weighting: which training cases are drawn and how much each counts in the step.

One interface (:class:`CaseWeighting`: ``sample_with_beta``, ``weights``, ``update``,
``epoch_stats``, ``state_dict``) and one class per scheme; nothing here knows nnU-Net.

| class                          | draws                         | step weights                            |
|--------------------------------|-------------------------------|-----------------------------------------|
| ``HardnessWeighting``          | ``softmax(beta L)``, fixed beta | importance weights (Algorithm 1)       |
| ``AdaptiveHardnessWeighting``  | ``softmax(beta_t L)``, beta_t scale-free | importance weights at draw-time beta |
| ``Chi2HardnessWeighting``      | clipped linear (chi-square DRO) | ratio of chi-square probabilities     |
| ``KLReweighting``              | uniform                       | ``exp(l / r) / u``                        |
| ``FixedWeighting``             | fixed, proportional to user weights | 1                                 |
| ``GroupBalancedWeighting``     | each group equally often      | 1                                         |
| ``GroupDROWeighting``          | each group equally often      | ``G q_g``, online group DRO               |
| ``ErrorSetWeighting``          | uniform, then JTT's error set ``lambda`` times as often, fixed | 1 |

>>> from nnunet_dro.weighting import AdaptiveHardnessWeighting, ImportanceWeights
>>> scheme = AdaptiveHardnessWeighting(10, fraction=0.5, seed=0,
...                                    importance=ImportanceWeights(first_draw_one=True, self_normalise=True))
>>> idx, beta = scheme.sample_with_beta(2)
>>> w = scheme.weights(idx, [0.4, 0.9], beta)
>>> scheme.update(idx, [0.4, 0.9], beta)
>>> scheme.close()

Each scheme's settings are one frozen dataclass of :mod:`nnunet_dro.weighting.settings`
(``HardnessSettings`` ... ``GroupDROSettings``, one to one with the classes above; ``build``
makes the weighting), which is what a trainer holds as ``dro_settings``.

The arithmetic cores of the schemes that weight without sampling live here too:
:class:`~nnunet_dro.weighting.kl_reweighter.KLReweighter` (KL-DRO by multiplicative weights) and
:func:`~nnunet_dro.weighting.learning_to_reweight.learning_to_reweight` (imports torch).
"""
from nnunet_dro.weighting.base import CaseWeighting, ImportanceWeights
from nnunet_dro.weighting.error_set import ErrorSetWeighting, choose_error_set
from nnunet_dro.weighting.groups import FixedWeighting, GroupBalancedWeighting, GroupDROWeighting
from nnunet_dro.weighting.hardness import AdaptiveHardnessWeighting, Chi2HardnessWeighting, HardnessWeighting
from nnunet_dro.weighting.reweighting import KLReweighting
from nnunet_dro.weighting.settings import (
                                           SETTINGS_CLASSES,
                                           AdaptiveHardnessSettings,
                                           Chi2HardnessSettings,
                                           ErrorSetSettings,
                                           FixedWeightSettings,
                                           GroupBalancedSettings,
                                           GroupDROSettings,
                                           HardnessSettings,
                                           ImportanceSettings,
                                           KLReweightSettings,
                                           WeightingSettings,
)

__all__ = ["CaseWeighting", "ImportanceWeights", "HardnessWeighting", "AdaptiveHardnessWeighting",
           "Chi2HardnessWeighting", "KLReweighting", "FixedWeighting", "GroupBalancedWeighting", "GroupDROWeighting",
           "WeightingSettings", "HardnessSettings", "AdaptiveHardnessSettings", "Chi2HardnessSettings",
           "KLReweightSettings", "FixedWeightSettings", "GroupBalancedSettings", "GroupDROSettings",
           "ImportanceSettings", "SETTINGS_CLASSES", "ErrorSetWeighting", "ErrorSetSettings", "choose_error_set"]
