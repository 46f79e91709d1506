"""nnU-Net v2 trainers with hardness weighted sampling (distributionally robust training).

>>> from nnunet_dro.training import nnUNetTrainerDRO
>>> nnUNetTrainerDRO.dro_beta, nnUNetTrainerDRO.dro_importance_sampling, nnUNetTrainerDRO.dro_clip
(100.0, True, (0.1, 10.0))

Use them with nnU-Net's own commands::

    export nnUNet_extTrainer=$(nnunet_dro trainer-dir)
    nnUNetv2_train DATASET 3d_fullres 0 -tr nnUNetTrainerDRO
"""
from nnunet_dro.training.cohort import nnUNetTrainerCaseWeights, nnUNetTrainerGroupBalanced, nnUNetTrainerGroupDRO
from nnunet_dro.training.related import (nnUNetTrainerDRO_warmup, nnUNetTrainerDROChi2,
                                         nnUNetTrainerDROChi2_noWarmup, nnUNetTrainerDROReweight, nnUNetTrainerL2RW)
from nnunet_dro.training.trainer import (DRO_STATE_KEY, nnUNetTrainerCaseWeighting, nnUNetTrainerConfigurableSGD,
                                         nnUNetTrainerDRO, nnUNetTrainerDROAdaptive, nnUNetTrainerPerSampleLoss)
from nnunet_dro.training.variants import (nnUNetTrainer_SGDnoMomentum, nnUNetTrainerDRO_beta10,
                                          nnUNetTrainerDRO_beta10_noIS, nnUNetTrainerDRO_beta1000,
                                          nnUNetTrainerDRO_beta1000_noIS, nnUNetTrainerDRO_noIS,
                                          nnUNetTrainerDRO_SGDnoMomentum, nnUNetTrainerDROAdaptive_f25,
                                          nnUNetTrainerDROAdaptive_f50, nnUNetTrainerDROAdaptive_f75,
                                          nnUNetTrainerDROAdaptive_f90, nnUNetTrainerDROAdaptive_kappa1,
                                          nnUNetTrainerDROAdaptive_noIS, nnUNetTrainerDROAdaptive_warm50,
                                          nnUNetTrainerDROAdaptive_f25_noIS, nnUNetTrainerDROAdaptive_f75_noIS,
                                          nnUNetTrainerDROAdaptive_noIS_smooth25, nnUNetTrainerDROAdaptive_f90_noIS,
                                          nnUNetTrainerDROAdaptive_warm50_noIS, nnUNetTrainerDROAdaptive_noIS_cap5)
from nnunet_dro.training.budget import (nnUNetTrainer_CPUBudget, nnUNetTrainerDRO_CPUBudget,
                                        nnUNetTrainerDROAdaptive_CPUBudget, nnUNetTrainerDROAdaptive_f25_CPUBudget,
                                        nnUNetTrainerDROAdaptive_f50_CPUBudget,
                                        nnUNetTrainerDROAdaptive_f75_CPUBudget, nnUNetTrainerDROAdaptive_f90_CPUBudget,
                                        nnUNetTrainerDROAdaptive_kappa1_CPUBudget, nnUNetTrainerDROAdaptive_noIS_CPUBudget,
                                        nnUNetTrainerDROAdaptive_warm50_CPUBudget,
                                        nnUNetTrainerDROAdaptive_warm50_noIS_CPUBudget,
                                        nnUNetTrainerDROAdaptive_f25_noIS_CPUBudget,
                                        nnUNetTrainerDROAdaptive_noIS_smooth25_CPUBudget,
                                        nnUNetTrainerDROAdaptive_noIS_cap5_CPUBudget,
                                        nnUNetTrainerDROAdaptive_f75_noIS_CPUBudget,
                                        nnUNetTrainerDROAdaptive_f90_noIS_CPUBudget,
                                        nnUNetTrainerGroupBalanced_CPUBudget, nnUNetTrainerGroupDRO_CPUBudget,
                                        nnUNetTrainer_CPUBudget_repeat)

__all__ = [
    "DRO_STATE_KEY",
    "nnUNetTrainerCaseWeighting",
    "nnUNetTrainerCaseWeights",
    "nnUNetTrainerGroupBalanced",
    "nnUNetTrainerGroupDRO",
    "nnUNetTrainerDROAdaptive",
    "nnUNetTrainerDROAdaptive_f25",
    "nnUNetTrainerDROAdaptive_f50",
    "nnUNetTrainerDROAdaptive_f75",
    "nnUNetTrainerDROAdaptive_f90",
    "nnUNetTrainerDROAdaptive_noIS",
    "nnUNetTrainerDROAdaptive_f25_noIS",
    "nnUNetTrainerDROAdaptive_noIS_smooth25",
    "nnUNetTrainerDROAdaptive_noIS_cap5",
    "nnUNetTrainerDROAdaptive_f75_noIS",
    "nnUNetTrainerDROAdaptive_f90_noIS",
    "nnUNetTrainerDROAdaptive_kappa1",
    "nnUNetTrainerDROAdaptive_warm50",
    "nnUNetTrainerDROAdaptive_warm50_noIS",
    "nnUNetTrainer_CPUBudget",
    "nnUNetTrainer_CPUBudget_repeat",
    "nnUNetTrainerDRO_CPUBudget",
    "nnUNetTrainerDROAdaptive_CPUBudget",
    "nnUNetTrainerDROAdaptive_f25_CPUBudget",
    "nnUNetTrainerDROAdaptive_f50_CPUBudget",
    "nnUNetTrainerDROAdaptive_f75_CPUBudget",
    "nnUNetTrainerDROAdaptive_f90_CPUBudget",
    "nnUNetTrainerDROAdaptive_noIS_CPUBudget",
    "nnUNetTrainerDROAdaptive_f25_noIS_CPUBudget",
    "nnUNetTrainerDROAdaptive_noIS_smooth25_CPUBudget",
    "nnUNetTrainerDROAdaptive_noIS_cap5_CPUBudget",
    "nnUNetTrainerDROAdaptive_f75_noIS_CPUBudget",
    "nnUNetTrainerDROAdaptive_f90_noIS_CPUBudget",
    "nnUNetTrainerGroupBalanced_CPUBudget",
    "nnUNetTrainerGroupDRO_CPUBudget",
    "nnUNetTrainerDROAdaptive_kappa1_CPUBudget",
    "nnUNetTrainerDROAdaptive_warm50_CPUBudget",
    "nnUNetTrainerDROAdaptive_warm50_noIS_CPUBudget",
    "nnUNetTrainerConfigurableSGD",
    "nnUNetTrainerDRO",
    "nnUNetTrainerDRO_beta10",
    "nnUNetTrainerDRO_beta1000",
    "nnUNetTrainerDRO_noIS",
    "nnUNetTrainerDRO_beta10_noIS",
    "nnUNetTrainerDRO_beta1000_noIS",
    "nnUNetTrainerDRO_SGDnoMomentum",
    "nnUNetTrainer_SGDnoMomentum",
    "nnUNetTrainerPerSampleLoss",
    "nnUNetTrainerDROChi2",
    "nnUNetTrainerDROChi2_noWarmup",
    "nnUNetTrainerDRO_warmup",
    "nnUNetTrainerDROReweight",
    "nnUNetTrainerL2RW",
]
