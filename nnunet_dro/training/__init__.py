"""nnU-Net v2 trainers with hardness weighted sampling (distributionally robust training).

>>> from nnunet_dro.training import nnUNetTrainerDRO
>>> s = nnUNetTrainerDRO.dro_settings
>>> type(s).__name__, s.beta, s.importance.enabled, s.importance.clip
('HardnessSettings', 100.0, True, (0.1, 10.0))

Use them with nnU-Net's own commands::

    export nnUNet_extTrainer=$(nnunet_dro trainer-dir)
    nnUNetv2_train DATASET 3d_fullres 0 -tr nnUNetTrainerDRO

Every trainer (:mod:`nnunet_dro.training.registry`) is importable under its class name; ``__all__``
holds the product's (:data:`~nnunet_dro.training.registry.PRODUCT_TRAINERS`), so the ``-tr`` lookup
(which star-imports this package) finds those and no base class. The benchmark's ablation arms and
CPU-budget twins live in the lab (:mod:`nnunet_dro.lab.variants`, :mod:`nnunet_dro.lab.budget`).
"""
from nnunet_dro.training.registry import PRODUCT_TRAINERS, TRAINERS
from nnunet_dro.training.trainer import DRO_STATE_KEY

globals().update(TRAINERS)

__all__ = ["DRO_STATE_KEY", "TRAINERS", "PRODUCT_TRAINERS", *PRODUCT_TRAINERS]
