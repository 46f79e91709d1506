"""Learning to reweight (Ren et al., arXiv:1803.09050; see docs/methods.md): per-batch example weights from a
one-step look-ahead and the loss on a small clean validation batch.

For a training batch with per-example losses ``l_i(theta)`` and perturbations ``eps_i`` (0):

    theta'(eps) = theta - lr * grad_theta sum_i eps_i l_i(theta)
    w_i ~ max(0, -d L_val(theta'(eps)) / d eps_i) at eps = 0,     normalised to sum 1

At ``eps = 0`` the derivative is ``-lr * <grad L_val(theta), grad l_i(theta)>``: an example is
up-weighted in proportion to how well its gradient agrees with the clean validation gradient,
and dropped when it disagrees (a label error, an outlier). If every example disagrees, all
weights are 0 and the step does nothing (as in the paper).

Computed with ``torch.func.functional_call`` and double backprop; costs about three plain steps
(forward + backward with graph, forward + backward at the look-ahead, and the weighted step).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.func import functional_call

PerExampleLoss = Callable[[object, object], torch.Tensor]

__all__ = ["learning_to_reweight"]


def learning_to_reweight(model: torch.nn.Module, loss_fn: PerExampleLoss, inputs: torch.Tensor, targets,
                         val_inputs: torch.Tensor, val_targets, inner_lr: float) -> torch.Tensor:
    """Example weights (detached, sum 1 or all 0) for one training batch.

    ``loss_fn(outputs, targets)`` returns per-example losses, shape ``(batch,)``. ``targets``
    can be anything ``loss_fn`` understands (e.g. nnU-Net's list of deep supervision targets).
    """
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())
    per_example = loss_fn(model(inputs), targets)
    eps = torch.zeros_like(per_example, requires_grad=True)
    grads = torch.autograd.grad((eps * per_example).sum(), list(params.values()), create_graph=True,
                                allow_unused=True)
    lookahead = {name: p if g is None else p - inner_lr * g for (name, p), g in zip(params.items(), grads)}
    # tie_weights=False: a module reachable twice (nnU-Net's decoder holds its encoder) would
    # otherwise get the look-ahead tensors written back as its parameters after the call
    val_loss = loss_fn(functional_call(model, {**lookahead, **buffers}, (val_inputs,), tie_weights=False),
                       val_targets).mean()
    (grad_eps,) = torch.autograd.grad(val_loss, eps)
    w = torch.clamp(-grad_eps, min=0).detach()
    total = w.sum()
    return w / total if total > 0 else w
