"""Per-sample losses against nnU-Net's own loss modules (labels, regions, ignore label, deep supervision)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from nnunetv2.training.loss.compound_losses import DC_and_BCE_loss, DC_and_CE_loss
from nnunetv2.training.loss.deep_supervision import DeepSupervisionWrapper
from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss, SoftDiceLoss
from nnunetv2.training.loss.robust_ce_loss import TopKLoss

from nnunet_dro.training.losses import per_sample_loss_from_nnunet, uses_batch_dice

IGNORE = 3  # label value of the ignore label in the label-map cases (classes 0..2)


def nnunet_label_loss(batch_dice=False, ignore_label=None, dice_class=MemoryEfficientSoftDiceLoss):
    """The loss exactly as nnUNetTrainer._build_loss makes it for label training."""
    return DC_and_CE_loss({'batch_dice': batch_dice, 'smooth': 1e-5, 'do_bg': False, 'ddp': False}, {},
                          weight_ce=1, weight_dice=1, ignore_label=ignore_label, dice_class=dice_class)


def nnunet_region_loss(batch_dice=False, use_ignore_label=False):
    """The loss exactly as nnUNetTrainer._build_loss makes it for region training."""
    return DC_and_BCE_loss({}, {'batch_dice': batch_dice, 'do_bg': True, 'smooth': 1e-5, 'ddp': False},
                           use_ignore_label=use_ignore_label, dice_class=MemoryEfficientSoftDiceLoss)


def ds_weights(n):
    """nnU-Net's deep-supervision weights for n outputs (non-DDP): halving, last one 0, normalised."""
    w = np.array([1 / (2 ** i) for i in range(n)])
    w[-1] = 0
    return w / w.sum()


def label_batch(gen, b, spatial, ignore_fraction=None, num_classes=3):
    x = torch.randn((b, num_classes, *spatial), generator=gen)
    y = torch.randint(0, num_classes, (b, 1, *spatial), generator=gen)
    if ignore_fraction is not None:
        for i, frac in enumerate(ignore_fraction):  # different annotated fraction per sample
            ignored = torch.rand((1, *spatial), generator=gen) < frac
            y[i][ignored] = IGNORE
    return x, y


def region_batch(gen, b, spatial, ignore_fraction=None, num_regions=2):
    x = torch.randn((b, num_regions, *spatial), generator=gen)
    y = torch.rand((b, num_regions, *spatial), generator=gen) < 0.4
    if ignore_fraction is not None:
        ign = torch.stack([torch.rand((1, *spatial), generator=gen) < f for f in ignore_fraction])
        y = torch.cat((y, ign), 1)
    return x, y


def downsampled(t, levels):
    """Crude deep-supervision pyramid (stride-2 subsampling) of a (b, c, ...) tensor."""
    out = [t]
    for _ in range(levels - 1):
        t = t[(slice(None), slice(None)) + (slice(None, None, 2),) * (t.ndim - 2)]
        out.append(t)
    return out


CASES = [
    # id, kind, spatial, ignore fractions per sample (None = no ignore label), deep supervision levels
    ("labels-3d", "labels", (8, 8, 8), None, 0),
    ("labels-2d", "labels", (16, 16), None, 0),
    ("labels-3d-ignore", "labels", (8, 8, 8), (0.1, 0.7, 0.4), 0),
    ("labels-3d-ignore-one-sample-fully-ignored", "labels", (8, 8, 8), (0.0, 1.01, 0.5), 0),
    ("labels-3d-ds", "labels", (16, 16, 16), None, 3),
    ("labels-2d-ignore-ds", "labels", (16, 16), (0.2, 0.9, 0.5), 4),
    ("regions-3d", "regions", (8, 8, 8), None, 0),
    ("regions-3d-ignore", "regions", (8, 8, 8), (0.1, 0.8, 0.3), 0),
    ("regions-2d-ignore-ds", "regions", (16, 16), (0.3, 0.6, 0.0), 3),
]


@pytest.mark.parametrize("kind,spatial,ignore_fraction,levels", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mean_of_per_sample_losses_equals_nnunet_loss_and_gradient(kind, spatial, ignore_fraction, levels):
    gen = torch.Generator().manual_seed(0)
    b = 3
    if kind == "labels":
        loss = nnunet_label_loss(ignore_label=IGNORE if ignore_fraction else None)
        x, y = label_batch(gen, b, spatial, ignore_fraction)
    else:
        loss = nnunet_region_loss(use_ignore_label=ignore_fraction is not None)
        x, y = region_batch(gen, b, spatial, ignore_fraction)
    if levels:
        loss = DeepSupervisionWrapper(loss, ds_weights(levels))
        x, y = downsampled(x, levels), downsampled(y, levels)
    per_sample = per_sample_loss_from_nnunet(loss)

    leaves_a = [t.clone().requires_grad_(True) for t in (x if levels else [x])]
    leaves_b = [t.clone().requires_grad_(True) for t in (x if levels else [x])]
    ref = loss(leaves_a if levels else leaves_a[0], y)
    ours = per_sample(leaves_b if levels else leaves_b[0], y)

    assert ours.shape == (b,) and ours.dtype == torch.float32
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours.mean(), ref, rtol=1e-6, atol=1e-6)
    ref.backward()
    ours.mean().backward()
    for ga, gb in zip(leaves_a, leaves_b):
        torch.testing.assert_close(gb.grad, ga.grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind", ["labels", "regions"])
def test_each_per_sample_loss_is_the_nnunet_loss_of_that_sample_alone(kind):
    """Without ignore label, sample i's loss is nnU-Net's loss on a batch made of sample i only."""
    gen = torch.Generator().manual_seed(1)
    if kind == "labels":
        loss, (x, y) = nnunet_label_loss(), label_batch(gen, 4, (8, 8, 8))
    else:
        loss, (x, y) = nnunet_region_loss(), region_batch(gen, 4, (8, 8, 8))
    ours = per_sample_loss_from_nnunet(loss)(x, y)
    alone = torch.stack([loss(x[i:i + 1], y[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(ours, alone, rtol=1e-6, atol=1e-6)
    assert ours.std() > 0  # the samples really differ


@pytest.mark.parametrize("kind", ["labels", "regions"])
def test_batch_dice_configuration_uses_per_sample_dice(kind):
    """batch_dice=True (2d configs): nnU-Net's batch loss is not separable; we use per-sample Dice."""
    gen = torch.Generator().manual_seed(2)
    if kind == "labels":
        batch_loss, sample_loss = nnunet_label_loss(batch_dice=True), nnunet_label_loss(batch_dice=False)
        x, y = label_batch(gen, 3, (16, 16))
    else:
        batch_loss, sample_loss = nnunet_region_loss(batch_dice=True), nnunet_region_loss(batch_dice=False)
        x, y = region_batch(gen, 3, (16, 16))
    assert uses_batch_dice(batch_loss) and not uses_batch_dice(sample_loss)
    ours = per_sample_loss_from_nnunet(batch_loss)(x, y)
    torch.testing.assert_close(ours.mean(), sample_loss(x, y), rtol=1e-6, atol=1e-6)
    assert not torch.isclose(ours.mean(), batch_loss(x, y), rtol=0, atol=1e-4)


def test_soft_dice_class_and_compiled_dice_are_unwrapped():
    gen = torch.Generator().manual_seed(3)
    x, y = label_batch(gen, 2, (8, 8))
    loss = nnunet_label_loss(dice_class=SoftDiceLoss)
    torch.testing.assert_close(per_sample_loss_from_nnunet(loss)(x, y).mean(), loss(x, y), rtol=1e-6, atol=1e-6)


def test_empty_masks_score_dice_one():
    """A class absent from reference and prediction gives Dice ~1, as in nnU-Net (smooth term)."""
    x = torch.full((2, 3, 4, 4), -20.0)
    x[:, 0] = 20.0  # confident background everywhere
    y = torch.zeros((2, 1, 4, 4), dtype=torch.long)
    ours = per_sample_loss_from_nnunet(nnunet_label_loss())(x, y)
    torch.testing.assert_close(ours, torch.full((2,), -1.0), atol=1e-4, rtol=0)


@pytest.mark.filterwarnings("ignore:size_average and reduce")
def test_unsupported_loss_is_refused_with_clear_message():
    with pytest.raises(TypeError, match="TopKLoss"):
        per_sample_loss_from_nnunet(TopKLoss())
