"""Re-exports for nnU-Net's ``nnUNet_extTrainer`` lookup (imported as a top-level module): the
CPU-budget twins, the lab's variants and the product's lab-only trainers at nnU-Net's own budget."""
from nnunet_dro.lab.budget import BUDGET_TRAINERS
from nnunet_dro.lab.variants import LAB_VARIANTS
from nnunet_dro.training.registry import LAB_ONLY, TRAINERS

LAB_TRAINERS = {**BUDGET_TRAINERS, **LAB_VARIANTS, **{name: TRAINERS[name] for name in LAB_ONLY}}
globals().update(LAB_TRAINERS)
__all__ = list(LAB_TRAINERS)
