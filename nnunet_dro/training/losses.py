"""Per-sample versions of nnU-Net's training losses (Dice + CE, Dice + BCE, deep supervision).

Hardness weighted sampling needs one loss per volume in the batch. nnU-Net's losses return a
single number; the modules here return a vector ``(b,)`` whose **mean equals nnU-Net's value**
whenever nnU-Net's loss is separable (``batch_dice=False``), including the ignore-label and
region (BraTS-style) cases, and whose gradient is then nnU-Net's gradient. They are built from
the trainer's own nnU-Net loss object (:func:`per_sample_loss_from_nnunet`), so the Dice/CE
weights, the ignore label, the smoothing, ``do_bg`` and the deep-supervision weights are read
from it and cannot drift from what nnU-Net would use.

How each term is split across the batch:

- Dice: the soft Dice of each sample and class (nnU-Net's ``MemoryEfficientSoftDiceLoss``
  formula with ``batch_dice=False``), averaged over classes. With ``batch_dice=True`` (nnU-Net's
  default for some 2d configurations) the batch Dice cannot be split, so the per-sample Dice is
  used instead: the per-sample losses then no longer average to nnU-Net's batch-Dice value.
  Empty masks: a class absent from both reference and prediction scores Dice ~1 (loss ~-1),
  thanks to nnU-Net's ``smooth`` term, exactly as in nnU-Net.
- Cross-entropy / BCE: nnU-Net averages over all valid voxels of the batch. Sample ``i`` gets
  ``sum_i / mean_j(count_j)``: its summed voxel losses divided by the batch's mean number of
  valid voxels. Without an ignore label every sample has the same count and this is simply the
  sample's own voxel mean. With an ignore label a case whose patch is mostly unannotated gets a
  proportionally smaller CE term (the voxel weighting nnU-Net itself applies), and a batch with
  no annotated voxel contributes 0, as in nnU-Net.
- Deep supervision: ``sum_k w_k * loss_k`` with nnU-Net's weights (outputs with weight 0 are
  skipped, as in ``DeepSupervisionWrapper``).

>>> import torch
>>> from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
>>> from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss
>>> nnunet_loss = DC_and_CE_loss({'batch_dice': False, 'smooth': 1e-5, 'do_bg': False, 'ddp': False},
...                              {}, dice_class=MemoryEfficientSoftDiceLoss)
>>> per_sample = per_sample_loss_from_nnunet(nnunet_loss)
>>> x, y = torch.randn(3, 2, 8, 8), torch.randint(0, 2, (3, 1, 8, 8))
>>> per_sample(x, y).shape
torch.Size([3])
>>> bool(torch.isclose(per_sample(x, y).mean(), nnunet_loss(x, y), atol=1e-6))
True
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from nnunetv2.training.loss.compound_losses import DC_and_BCE_loss, DC_and_CE_loss
from nnunetv2.training.loss.deep_supervision import DeepSupervisionWrapper
from torch import nn
from torch._dynamo import OptimizedModule

TensorOrList = Union[torch.Tensor, Sequence[torch.Tensor]]


def _unwrap_compiled(module: nn.Module) -> nn.Module:
    return module._orig_mod if isinstance(module, OptimizedModule) else module


class PerSampleSoftDiceLoss(nn.Module):
    """Negative soft Dice per sample, averaged over classes: shape ``(b,)``.

    The formula of nnU-Net's ``MemoryEfficientSoftDiceLoss`` with ``batch_dice=False``, stopped
    before the mean over the batch. ``loss_mask`` (b, 1, ...) excludes voxels (ignore label).
    A class empty in both reference and prediction gives Dice ``smooth/smooth = 1``.
    """

    def __init__(self, apply_nonlin: Optional[Callable] = None, do_bg: bool = True, smooth: float = 1.0):
        super().__init__()
        self.apply_nonlin = apply_nonlin
        self.do_bg = do_bg
        self.smooth = smooth

    def forward(self, x: torch.Tensor, y: torch.Tensor, loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.apply_nonlin is not None:
            x = self.apply_nonlin(x)
        axes = tuple(range(2, x.ndim))
        with torch.no_grad():
            if x.ndim != y.ndim:
                y = y.view((y.shape[0], 1, *y.shape[1:]))
            if x.shape == y.shape:  # already one-hot (regions)
                y_onehot = y.to(torch.float32)
            else:
                y_onehot = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
                y_onehot.scatter_(1, y.long(), 1)
            if not self.do_bg:
                y_onehot = y_onehot[:, 1:]
            sum_gt = y_onehot.sum(axes, dtype=torch.float32) if loss_mask is None \
                else (y_onehot * loss_mask).sum(axes, dtype=torch.float32)
        if not self.do_bg:
            x = x[:, 1:]
        if loss_mask is None:
            intersect = (x * y_onehot).sum(axes, dtype=torch.float32)
            sum_pred = x.sum(axes, dtype=torch.float32)
        else:
            intersect = (x * y_onehot * loss_mask).sum(axes, dtype=torch.float32)
            sum_pred = (x * loss_mask).sum(axes, dtype=torch.float32)
        dc = (2 * intersect + self.smooth) / (sum_gt + sum_pred + float(self.smooth)).clamp_min(1e-8)
        return -dc.mean(1)


def _share_of_batch_mean(summed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``summed_i / mean_j(counts_j)``: per-sample terms whose mean is ``sum(summed) / sum(counts)``.

    A batch without any valid voxel gives zeros (nnU-Net skips the term then).
    """
    batch_size = summed.shape[0]
    return summed * batch_size / torch.clip(counts.sum(), min=1e-8)


class PerSampleDCandCELoss(nn.Module):
    """Per-sample ``weight_ce * CE + weight_dice * (-Dice)`` for label maps; target (b, 1, ...)."""

    def __init__(self, dice: PerSampleSoftDiceLoss, weight_ce: float = 1.0, weight_dice: float = 1.0,
                 ignore_label: Optional[int] = None, ce_weight: Optional[torch.Tensor] = None,
                 label_smoothing: float = 0.0):
        super().__init__()
        self.dc = dice
        self.weight_ce = weight_ce
        self.weight_dice = weight_dice
        self.ignore_label = ignore_label
        self.register_buffer("ce_weight", ce_weight, persistent=False)
        self.label_smoothing = label_smoothing

    def forward(self, net_output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch_size = net_output.shape[0]
        if self.ignore_label is not None:
            mask = target != self.ignore_label
            target_dice = torch.where(mask, target, 0)
        else:
            mask = None
            target_dice = target
        zeros = torch.zeros(batch_size, device=net_output.device, dtype=torch.float32)
        dc_loss = self.dc(net_output, target_dice, loss_mask=mask) if self.weight_dice != 0 else zeros
        if self.weight_ce != 0:
            labels = target[:, 0].long()
            ignore_index = self.ignore_label if self.ignore_label is not None else -100
            voxel_ce = F.cross_entropy(net_output, labels, weight=self.ce_weight, ignore_index=ignore_index,
                                       reduction="none", label_smoothing=self.label_smoothing)
            summed = voxel_ce.reshape(batch_size, -1).sum(1, dtype=torch.float32)
            # torch's 'mean' divides by the summed class weights of the valid voxels
            valid = labels != ignore_index
            if self.ce_weight is not None:
                voxel_weight = self.ce_weight[torch.where(valid, labels, 0)] * valid
            else:
                voxel_weight = valid
            counts = voxel_weight.reshape(batch_size, -1).sum(1, dtype=torch.float32)
            ce_loss = _share_of_batch_mean(summed, counts)
        else:
            ce_loss = zeros
        return self.weight_ce * ce_loss + self.weight_dice * dc_loss


class PerSampleDCandBCELoss(nn.Module):
    """Per-sample ``weight_ce * BCE + weight_dice * (-Dice)`` for regions; one-hot target (b, c, ...).

    With ``use_ignore_label`` the last target channel marks ignored voxels (nnU-Net's layout).
    """

    def __init__(self, dice: PerSampleSoftDiceLoss, weight_ce: float = 1.0, weight_dice: float = 1.0,
                 use_ignore_label: bool = False, bce_weight: Optional[torch.Tensor] = None,
                 pos_weight: Optional[torch.Tensor] = None):
        super().__init__()
        self.dc = dice
        self.weight_ce = weight_ce
        self.weight_dice = weight_dice
        self.use_ignore_label = use_ignore_label
        self.register_buffer("bce_weight", bce_weight, persistent=False)
        self.register_buffer("pos_weight", pos_weight, persistent=False)

    def forward(self, net_output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch_size = net_output.shape[0]
        if self.use_ignore_label:
            mask = ~target[:, -1:] if target.dtype == torch.bool else (1 - target[:, -1:]).bool()
            target_regions = target[:, :-1]
        else:
            mask = None
            target_regions = target
        dc_loss = self.dc(net_output, target_regions, loss_mask=mask)
        voxel_bce = F.binary_cross_entropy_with_logits(net_output, target_regions.float(), weight=self.bce_weight,
                                                       pos_weight=self.pos_weight, reduction="none")
        if mask is not None:
            # nnU-Net divides the masked sum over all regions by the number of valid voxels
            summed = (voxel_bce * mask).reshape(batch_size, -1).sum(1, dtype=torch.float32)
            counts = mask.reshape(batch_size, -1).sum(1, dtype=torch.float32)
            ce_loss = _share_of_batch_mean(summed, counts)
        else:
            ce_loss = voxel_bce.reshape(batch_size, -1).mean(1, dtype=torch.float32)
        return self.weight_ce * ce_loss + self.weight_dice * dc_loss


class PerSampleDeepSupervisionLoss(nn.Module):
    """``sum_k weights[k] * loss(output[k], target[k])`` per sample; zero weights are skipped."""

    def __init__(self, loss: nn.Module, weight_factors: Sequence[float]):
        super().__init__()
        if not any(w != 0 for w in weight_factors):
            raise ValueError("At least one deep-supervision weight must be non-zero")
        self.loss = loss
        self.weight_factors = tuple(float(w) for w in weight_factors)

    def forward(self, net_output: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
        terms = [w * self.loss(o, t) for w, o, t in zip(self.weight_factors, net_output, target) if w != 0.0]
        return torch.stack(terms).sum(0)


def per_sample_loss_from_nnunet(nnunet_loss: nn.Module) -> nn.Module:
    """Build the per-sample twin of an nnU-Net loss object (as made by ``nnUNetTrainer._build_loss``).

    Supports ``DC_and_CE_loss`` and ``DC_and_BCE_loss`` with ``MemoryEfficientSoftDiceLoss`` or
    ``SoftDiceLoss`` (without ``clip_tp``), optionally wrapped in ``DeepSupervisionWrapper``;
    a compiled Dice (``torch.compile``) is unwrapped. Raises ``TypeError`` for other losses:
    a trainer with a custom loss must provide its own per-sample loss.

    The returned module maps ``(output, target)`` to a float32 vector ``(b,)``.
    """
    weights = None
    inner = nnunet_loss
    if isinstance(inner, DeepSupervisionWrapper):
        weights = inner.weight_factors
        inner = inner.loss
    if not isinstance(inner, (DC_and_CE_loss, DC_and_BCE_loss)):
        raise TypeError(f"No per-sample version of {type(inner).__name__}; the DRO trainers support nnU-Net's "
                        f"DC_and_CE_loss and DC_and_BCE_loss (override _build_per_sample_loss for others)")
    nnunet_dice = _unwrap_compiled(inner.dc)
    if getattr(nnunet_dice, "clip_tp", None) is not None:
        raise TypeError("SoftDiceLoss with clip_tp has no per-sample version here")
    dice = PerSampleSoftDiceLoss(apply_nonlin=nnunet_dice.apply_nonlin, do_bg=nnunet_dice.do_bg,
                                 smooth=nnunet_dice.smooth)
    if isinstance(inner, DC_and_CE_loss):
        per_sample: nn.Module = PerSampleDCandCELoss(
            dice, weight_ce=inner.weight_ce, weight_dice=inner.weight_dice, ignore_label=inner.ignore_label,
            ce_weight=inner.ce.weight, label_smoothing=inner.ce.label_smoothing)
    else:
        per_sample = PerSampleDCandBCELoss(
            dice, weight_ce=inner.weight_ce, weight_dice=inner.weight_dice, use_ignore_label=inner.use_ignore_label,
            bce_weight=inner.ce.weight, pos_weight=inner.ce.pos_weight)
    if weights is not None:
        per_sample = PerSampleDeepSupervisionLoss(per_sample, weights)
    return per_sample


def uses_batch_dice(nnunet_loss: nn.Module) -> bool:
    """Whether an nnU-Net loss computes the Dice over the whole batch (not separable per sample)."""
    inner = nnunet_loss.loss if isinstance(nnunet_loss, DeepSupervisionWrapper) else nnunet_loss
    return bool(getattr(_unwrap_compiled(inner.dc), "batch_dice", False))
