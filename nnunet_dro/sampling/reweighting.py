"""Deprecated: moved to :mod:`nnunet_dro.weighting.kl_reweighter` (it weights examples; it does not sample).

This alias is kept for one release.
"""
import warnings

from nnunet_dro.weighting.kl_reweighter import *  # noqa: F401,F403
from nnunet_dro.weighting.kl_reweighter import __all__  # noqa: F401

warnings.warn("nnunet_dro.sampling.reweighting moved to nnunet_dro.weighting.kl_reweighter", DeprecationWarning, stacklevel=2)
