"""Re-exports of the CPU-budget twins for nnU-Net's ``nnUNet_extTrainer`` lookup (imported as a
top-level module)."""
from nnunet_dro.lab.budget import BUDGET_TRAINERS

globals().update(BUDGET_TRAINERS)
__all__ = list(BUDGET_TRAINERS)
