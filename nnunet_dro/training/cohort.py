"""Trainers that use what users know about their cohort: fixed per-case sampling weights,
group-balanced sampling and group DRO.

Hardness weighted sampling needs no labels. When the groups are known (scanner, centre,
condition: the ``subgroups.tsv`` our converters write and our evaluation reads), or when some
cases should simply be seen more often, these trainers draw cases accordingly, with the same
data loader (nnU-Net's foreground oversampling, cropping and augmentation unchanged), the same
training step, the same checkpoint state (``--c``), hardness report and DDP handling as the DRO
trainers. The tables and where the trainers find them: :mod:`nnunet_dro.training.case_tables`.

    nnUNetv2_train DATASET 3d_fullres 0 -tr nnUNetTrainerCaseWeights     # case_weights.tsv
    nnUNetv2_train DATASET 3d_fullres 0 -tr nnUNetTrainerGroupBalanced   # subgroups.tsv
    nnUNetv2_train DATASET 3d_fullres 0 -tr nnUNetTrainerGroupDRO        # subgroups.tsv

Another grouping column than the first: ``export nnUNet_dro_group_column=centre``, or a one-line
subclass: ``dro_settings = replace(nnUNetTrainerGroupDRO.dro_settings, column="centre")``.
"""
from __future__ import annotations

from nnunet_dro.training.trainer import nnUNetTrainerCaseWeighting
from nnunet_dro.weighting.settings import FixedWeightSettings, GroupBalancedSettings, GroupDROSettings


class nnUNetTrainerCaseWeights(nnUNetTrainerCaseWeighting):
    """Cases drawn with probability proportional to the user's ``case_weights.tsv``; step weights 1."""

    dro_settings = FixedWeightSettings()


class nnUNetTrainerGroupBalanced(nnUNetTrainerCaseWeighting):
    """Each group of ``subgroups.tsv`` drawn equally often (cases uniformly within a group); step weights 1."""

    dro_settings = GroupBalancedSettings(column=None)


class nnUNetTrainerGroupDRO(nnUNetTrainerCaseWeighting):
    """Group-balanced draws and online group DRO weights ``q`` in the step (Sagawa et al., "Distributionally
    Robust Neural Networks for Group Shifts", ICLR 2020, arXiv:1911.08731): ``q_g <- q_g exp(eta * loss_g)``
    with ``eta = dro_settings.eta`` (0.01, their setting); case ``i`` weighs ``G q_g(i)``."""

    dro_settings = GroupDROSettings(column=None, eta=0.01)
