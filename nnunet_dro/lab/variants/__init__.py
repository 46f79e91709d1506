"""The lab's trainer variants: the benchmark's ablation arms, one class in one file, attributes
only, found as the product's variants are (:func:`nnunet_dro.training.variants.discover`). They are
not in ``nnunet_dro trainer-dir``; the lab trains their CPU-budget twins (:mod:`nnunet_dro.lab.budget`,
found through :func:`nnunet_dro.lab.ext_trainers.lab_trainer_dirs`) under the arm names of the
record (a trainer's name without ``nnUNetTrainer``).

Their names are read against the base each file names (``_f25`` derives from ``_fromStart`` and
also turns importance weights on; docs/training.md's lab table says what each one sets).
"""
from __future__ import annotations

from nnunet_dro.training.variants import discover

#: every lab variant by name, in name order
LAB_VARIANTS: dict[str, type] = discover(__name__, __path__)
globals().update(LAB_VARIANTS)
__all__ = ["LAB_VARIANTS", *LAB_VARIANTS]
