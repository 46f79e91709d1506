"""The inner maximisation of GI-LS (Wang et al., arXiv:2408.05082, Algorithm 1): gradient ascent on
the features that enter a classification layer, against a quadratic transport penalty.

Pure torch, no nnU-Net: :func:`ascend_features` takes the features ``z0``, the layer (any callable)
and a per-sample loss, and returns the perturbation ``delta`` after ``steps`` ascent steps on

    scale * loss(head(z0 + delta)) - gamma / 2 * ||delta||^2        (per sample, summed over the batch)

``delta <- delta + step_size * (scale * d loss / d z - gamma * delta)``. ``scale`` multiplies the
loss gradient: the segmentation trainers pass the number of voxels, so that each voxel (a sample of
the per-voxel classification layer) is ascended as the paper ascends one image's feature vector
(the loss is a mean over voxels; its gradient per voxel is ``1 / voxels`` of a voxel's own). The
ascent runs in float32 with autocast off, so it is the same under AMP; it never writes ``.grad``
of the layer's parameters (the gradient is taken with respect to the features only).

With a linear layer and the squared loss the penalised problem is a concave quadratic when
``gamma`` exceeds the largest eigenvalue of ``W^T W``, and the ascent converges to its maximiser
``(gamma I - W^T W)^-1 (gamma z0 - W^T y)`` (the test suite checks this):

>>> import torch
>>> W, y, z0 = torch.tensor([[1.0, 0.0], [0.0, 0.5]]), torch.tensor([[1.0, 1.0]]), torch.zeros(1, 2)
>>> loss = lambda out: 0.5 * ((out - y) ** 2).sum(1)
>>> delta = ascend_features(z0, lambda z: z @ W.T, loss, steps=200, step_size=0.1, gamma=2.0)
>>> torch.allclose(delta, torch.linalg.solve(2.0 * torch.eye(2) - W.T @ W, -(W.T @ y[0])).unsqueeze(0), atol=1e-5)
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["ascend_features", "penalised_objective"]



@dataclass(frozen=True, kw_only=True)
class GILSSettings:
    """The hyper-parameters of GI-LS (defaults and their sources: docs/methods.md); a trainer holds
    them as ``gils_settings`` and a variant replaces fields.

    - ``steps`` (T): ascent steps per iteration (paper's search range 1-15, Section 4.2).
    - ``step_size`` (eta): ascent step size (paper's range 1.5-3.0, Section 4.2).
    - ``gamma``: transport penalty (paper: 1e-3, Section 4.2).
    - ``alpha``: label smoothing of the CE term, torch's convention (target ``1 - alpha + alpha/k``);
      the Dice term is not smoothed.
    - ``clean_weight``: weight of the loss at the clean features in the step (0: perturbed only).
    - ``ascent_dice``: whether the ascent's loss adds nnU-Net's Dice term to the smoothed CE (True)
      or is the smoothed CE alone, the paper's loss (False); the step's loss keeps the Dice either way.

    >>> from dataclasses import replace
    >>> replace(GILSSettings(), steps=1).steps
    1
    >>> GILSSettings(alpha=1.0)
    Traceback (most recent call last):
    ...
    ValueError: GILSSettings.alpha = 1.0: expected 0 <= alpha < 1
    """

    steps: int = 6
    step_size: float = 1.5
    gamma: float = 1e-3
    alpha: float = 0.1
    clean_weight: float = 0.5
    ascent_dice: bool = True

    def __post_init__(self) -> None:
        def fail(name: str, expected: str) -> None:
            raise ValueError(f"GILSSettings.{name} = {getattr(self, name)!r}: expected {expected}")

        def number(value: object) -> bool:
            return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)

        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            fail("steps", "an integer >= 0")
        for name in ("step_size", "gamma"):
            if not (number(getattr(self, name)) and getattr(self, name) >= 0):
                fail(name, "a number >= 0")
        if not (number(self.alpha) and 0 <= self.alpha < 1):
            fail("alpha", "0 <= alpha < 1")
        if not (number(self.clean_weight) and 0 <= self.clean_weight <= 1):
            fail("clean_weight", "a weight in [0, 1]")
        if not isinstance(self.ascent_dice, bool):
            fail("ascent_dice", "True or False")


def penalised_objective(z: torch.Tensor, z0: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                        loss: Callable[[torch.Tensor], torch.Tensor], gamma: float,
                        scale: float = 1.0) -> torch.Tensor:
    """``scale * loss(head(z)) - gamma / 2 * ||z - z0||^2`` per sample, shape ``(b,)``, in the dtype of ``z``.

    >>> import torch
    >>> z0 = torch.zeros(2, 3)
    >>> penalised_objective(z0 + 1, z0, lambda z: z, lambda o: o.sum(1), gamma=2.0).tolist()
    [0.0, 0.0]
    """
    penalty = 0.5 * float(gamma) * (z - z0.to(z.dtype)).pow(2).reshape(z.shape[0], -1).sum(1)
    return float(scale) * loss(head(z)).to(z.dtype) - penalty


def ascend_features(z0: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                    loss: Callable[[torch.Tensor], torch.Tensor], steps: int, step_size: float, gamma: float,
                    scale: float = 1.0) -> torch.Tensor:
    """The perturbation ``delta`` (float32, detached, shape of ``z0``) after ``steps`` gradient-ascent
    steps of size ``step_size`` on :func:`penalised_objective` from ``delta = 0``; ``loss`` maps the
    head's output to one value per sample, shape ``(b,)``. ``steps = 0`` gives zeros.

    >>> import torch
    >>> z0 = torch.ones(1, 2)
    >>> ascend_features(z0, lambda z: z, lambda o: o.sum(1), steps=1, step_size=0.5, gamma=1.0).tolist()
    [[0.5, 0.5]]
    """
    if steps < 0 or step_size < 0 or gamma < 0:
        raise ValueError(f"ascend_features: steps ({steps}), step_size ({step_size}) and gamma ({gamma}) must be >= 0")
    z0 = z0.detach().float()
    delta = torch.zeros_like(z0)
    # float32 whatever the caller's autocast: the ascent gradients are small differences of logits
    with torch.autocast(device_type=z0.device.type, enabled=False), torch.enable_grad():
        for _ in range(int(steps)):
            z = (z0 + delta).requires_grad_(True)
            objective = float(scale) * loss(head(z)).float().sum()
            (grad,) = torch.autograd.grad(objective, z)
            delta = delta + float(step_size) * (grad - float(gamma) * delta)
    return delta.detach()
