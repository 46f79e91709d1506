"""Re-exports for nnU-Net's ``nnUNet_extTrainer`` lookup (imported as a top-level module)."""
from nnunet_dro.training import *  # noqa: F401,F403
from nnunet_dro.training import __all__  # noqa: F401
