"""DRO with label smoothing (GI-LS; Wang et al., "Generalizing Few Data to Unseen Domains Flexibly
Based on Label Smoothing Integrated with Distributionally Robust Optimization", arXiv:2408.05082)
as nnU-Net trainers: the features entering each segmentation head are moved to the worst case in a
Wasserstein ball (its Lagrangian penalty ``gamma / 2 ||z - z0||^2``) before the loss is taken.

Per iteration (docs/methods.md#dro-with-label-smoothing-gi-ls):

1. nnU-Net's forward pass; forward hooks (:func:`~nnunet_dro.training.nnunet_compat.captured_head_inputs`)
   keep the input ``z0`` of every segmentation head (one 1x1x1 convolution per deep-supervision scale).
2. The inner stage, per scale with a non-zero deep-supervision weight: ``steps`` gradient-ascent
   steps of size ``step_size`` on the detached ``z0`` through that head alone
   (:func:`~nnunet_dro.training.feature_ascent.ascend_features`, float32, per voxel), on the
   per-sample loss with label-smoothed CE (``alpha``) plus nnU-Net's unsmoothed Dice
   (``ascent_dice``; the smoothed CE alone, the paper's loss, in ``nnUNetTrainerDROLS_ceAscent``).
3. The outer stage: the same loss at the perturbed features ``head(z0 + delta)`` (the gradient reaches
   the body through ``z0`` and the head through its weights), averaged with the loss at the clean
   features with weight ``clean_weight`` (the paper trains on both), with nnU-Net's
   deep-supervision weights; nnU-Net's step (GradScaler on CUDA, clipping at 12).

Per-sample losses throughout, so the same step serves the hardness weighted sampler:
``nnUNetTrainerDROLS_DRO`` draws the cases as ``nnUNetTrainerDROAdaptive`` does and perturbs their
features. Validation (nnU-Net's loss, pseudo-Dice), inference and checkpoints are nnU-Net's; the
networks train eager (torch.compile off: the hooks need the eager module). The hyper-parameters
are one frozen dataclass, ``gils_settings`` (:class:`~nnunet_dro.training.feature_ascent.GILSSettings`);
variants replace fields::

    from dataclasses import replace
    from nnunet_dro.training import nnUNetTrainerDROLS

    class nnUNetTrainerDROLS_T5(nnUNetTrainerDROLS):
        gils_settings = replace(nnUNetTrainerDROLS.gils_settings, steps=5)
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
from nnunetv2.utilities.helpers import dummy_context
from torch import autocast, nn

from nnunet_dro.training.feature_ascent import GILSSettings, ascend_features
from nnunet_dro.training.losses import PerSampleDCandCELoss, PerSampleDeepSupervisionLoss
from nnunet_dro.training.nnunet_compat import captured_head_inputs, segmentation_heads
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive, nnUNetTrainerPerSampleLoss


class FeaturePerturbation:
    """The GI-LS step for a per-sample-loss trainer (a mixin: put it before the trainer base).

    The hyper-parameters: ``gils_settings``, a :class:`~nnunet_dro.training.feature_ascent.GILSSettings`
    (validated when it is made).
    """

    gils_settings: GILSSettings = GILSSettings()

    def initialize(self):
        if not isinstance(self.gils_settings, GILSSettings):
            raise RuntimeError(f"{type(self).__name__}.gils_settings = {self.gils_settings!r}: expected a GILSSettings")
        if self.is_ddp:
            # the ascent re-runs the segmentation heads outside DDP's forward, where DDP neither
            # prepares its gradient reduction nor sees those parameters used
            raise RuntimeError(f"{type(self).__name__} does not run under DDP (nnUNetv2_train -num_gpus > 1): GI-LS "
                               f"calls the segmentation heads outside DDP's forward; train it on one GPU")
        super().initialize()
        segmentation_heads(self.network)  # a clear error now for an architecture without heads
        g = self.gils_settings
        self.print_to_log_file(
            f"GI-LS: {g.steps} ascent step(s) of size {g.step_size:g} on the features entering the "
            f"segmentation heads on the {'smoothed CE + Dice' if g.ascent_dice else 'smoothed CE alone'}, "
            f"gamma {g.gamma:g}, CE label smoothing {g.alpha:g} (Dice unsmoothed), "
            f"clean-feature loss weight {g.clean_weight:g}; torch.compile off")

    def _do_i_compile(self):
        # the capture hooks and the re-run heads need the eager network
        return False

    def _build_per_sample_loss(self, nnunet_loss: nn.Module) -> nn.Module:
        per_sample = super()._build_per_sample_loss(nnunet_loss)
        deep = isinstance(per_sample, PerSampleDeepSupervisionLoss)
        inner = per_sample.loss if deep else per_sample
        if not isinstance(inner, PerSampleDCandCELoss):
            raise RuntimeError(f"{type(self).__name__}: GI-LS smooths the softmax cross-entropy of label maps; this "
                               f"configuration trains regions with sigmoid BCE ({type(inner).__name__}), which it "
                               f"does not support")
        g = self.gils_settings
        inner.label_smoothing = float(g.alpha)
        if g.ascent_dice:
            self._gils_ascent_loss = inner
        elif inner.weight_ce == 0:
            raise RuntimeError(f"{type(self).__name__}: gils_settings.ascent_dice is False (the ascent on the CE "
                               f"alone) but this loss has no CE term (weight_ce 0): the ascent would not move")
        else:
            # the paper's ascent: the smoothed CE alone, so each voxel is moved by its own loss and not by
            # the Dice ratio over the patch (what that changes: docs/methods.md, GI-LS)
            self._gils_ascent_loss = PerSampleDCandCELoss(
                inner.dc, weight_ce=inner.weight_ce, weight_dice=0.0, ignore_label=inner.ignore_label,
                ce_weight=inner.ce_weight, label_smoothing=float(g.alpha))
        self._gils_weights = per_sample.weight_factors if deep else (1.0,)
        return per_sample

    def on_train_epoch_start(self):
        super().on_train_epoch_start()
        self._gils_epoch = {"shift": [], "perturbed": [], "clean": []}

    def _forward_per_sample(self, data: torch.Tensor, target) -> torch.Tensor:
        with captured_head_inputs(self.network) as captured:
            output = self.network(data)
        deep = isinstance(output, (list, tuple))
        outputs = list(output) if deep else [output]
        targets = list(target) if isinstance(target, (list, tuple)) else [target]
        if len(captured) != len(outputs):
            raise RuntimeError(f"GI-LS: {len(captured)} segmentation-head calls for {len(outputs)} network outputs")
        perturbed_outputs: List[torch.Tensor] = []
        shift: Optional[torch.Tensor] = None
        g = self.gils_settings
        for (head, z0), out, tgt, weight in zip(captured, outputs, targets, self._gils_weights):
            if weight == 0:  # skipped by the loss, as by nnU-Net's
                perturbed_outputs.append(out)
                continue
            delta = ascend_features(z0, head, lambda o, t=tgt: self._gils_ascent_loss(o, t), g.steps,
                                    g.step_size, g.gamma, scale=float(z0[0, 0].numel()))
            if shift is None:  # the finest scale, for the log
                shift = delta.flatten(1).norm(dim=1) / z0.detach().float().flatten(1).norm(dim=1).clamp_min(1e-12)
            perturbed_outputs.append(head(z0 + delta.to(z0.dtype)))
        perturbed = self.per_sample_loss(perturbed_outputs if deep else perturbed_outputs[0], target)
        c = float(g.clean_weight)
        clean = self.per_sample_loss(output, target) if c > 0 else None
        stats = getattr(self, "_gils_epoch", None)
        if stats is not None:
            stats["perturbed"].append(float(perturbed.detach().float().mean()))
            if clean is not None:
                stats["clean"].append(float(clean.detach().float().mean()))
            if shift is not None:
                stats["shift"].append(float(shift.mean()))
        return perturbed if clean is None else (1 - c) * perturbed + c * clean

    def on_train_epoch_end(self, train_outputs):
        super().on_train_epoch_end(train_outputs)
        stats = getattr(self, "_gils_epoch", None)
        if stats and stats["perturbed"]:
            clean = f", at the clean features {np.mean(stats['clean']):.4f}" if stats["clean"] else ""
            shift = f"{np.mean(stats['shift']):.3f}" if stats["shift"] else "n/a"
            self.print_to_log_file(f"GI-LS: feature shift ||delta|| / ||z0|| at the finest scale {shift} (mean); "
                                   f"training loss at the perturbed features {np.mean(stats['perturbed']):.4f}{clean}")


class nnUNetTrainerDROLS(FeaturePerturbation, nnUNetTrainerPerSampleLoss):
    """GI-LS on nnU-Net's uniform sampling: the step minimises the batch mean of the per-sample GI-LS
    loss (:class:`FeaturePerturbation` holds the attributes)."""

    def train_step(self, batch: dict) -> dict:
        data, target = self._to_device(batch)
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device.type, enabled=True) if self.device.type == 'cuda' else dummy_context():
            l = self._forward_per_sample(data, target).mean()
        self._optimizer_step(l)
        return {'loss': l.detach().cpu().numpy()}


class nnUNetTrainerDROLS_DRO(FeaturePerturbation, nnUNetTrainerDROAdaptive):
    """GI-LS on hardness weighted sampling: the cases are drawn and weighted as by
    ``nnUNetTrainerDROAdaptive`` (its ERM phase, cap and guard included) from their per-sample GI-LS
    losses, and their features are perturbed as by ``nnUNetTrainerDROLS``."""
