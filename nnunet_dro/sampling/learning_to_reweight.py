"""Deprecated: moved to :mod:`nnunet_dro.weighting.learning_to_reweight` (it weights examples; it does not sample).

This alias is kept for one release.
"""
import warnings

from nnunet_dro.weighting.learning_to_reweight import *  # noqa: F401,F403
from nnunet_dro.weighting.learning_to_reweight import __all__  # noqa: F401

warnings.warn("nnunet_dro.sampling.learning_to_reweight moved to nnunet_dro.weighting.learning_to_reweight", DeprecationWarning, stacklevel=2)
