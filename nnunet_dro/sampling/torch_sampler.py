"""The hardness weighted sampler in a plain PyTorch training loop.

A standard :class:`torch.utils.data.DataLoader` iterates its batch sampler in the main process
and sends index lists to its workers, so the sampler needs no shared memory here; draws run
``num_workers * prefetch_factor`` batches ahead of the updates, i.e. the losses they use are a
few batches staler than in Algorithm 1, which the importance weights are there to correct.

Example::

    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from nnunet_dro.sampling import HardnessWeightedSampler
    from nnunet_dro.sampling.torch_sampler import (HardnessWeightedBatchSampler, WithIndex,
                                                   importance_weighted_mean)

    data = TensorDataset(images, labels)
    sampler = HardnessWeightedSampler(len(data), beta=10.0, seed=0)
    loader = DataLoader(WithIndex(data), num_workers=2,
                        batch_sampler=HardnessWeightedBatchSampler(sampler, 32, num_batches=1000))
    for index, x, y in loader:
        per_example = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = importance_weighted_mean(sampler, index, per_example)  # also updates the sampler
        optimizer.zero_grad(); loss.backward(); optimizer.step()

The related methods (docs/methods.md) fit the same loop. Chi-square DRO sampling with a
uniform warm-up pass (Fidon et al. 2020) only changes the sampler:
``HardnessWeightedSampler(len(data), beta=10.0, divergence="chi2", warmup=True,
importance=NO_IMPORTANCE, seed=0)``; the rest is as above (the weights are then ones, and the
update still feeds the sampler). The two reweighting methods draw uniformly, so use a plain
``DataLoader(data, batch_size=32, shuffle=True)`` and weigh the fresh per-example losses:

* KL-DRO by multiplicative weights (Sow et al., arXiv:2308.00311): ``rw = KLReweighter()`` (from
  :mod:`nnunet_dro.weighting.kl_reweighter`) once, then per step
  ``w = rw.weights(per_example.detach().cpu().numpy(), progress=step / num_steps)`` and
  ``loss = (torch.as_tensor(w, dtype=per_example.dtype) * per_example).mean()``.
* Learning to reweight (Ren et al., arXiv:1803.09050): keep a small clean balanced batch ``x_val, y_val`` and per
  step ``w = learning_to_reweight(model, loss_fn, x, y, x_val, y_val, inner_lr=lr)`` (from
  :mod:`nnunet_dro.weighting.learning_to_reweight`; ``loss_fn(outputs, targets)`` returns
  per-example losses), then ``loss = (w * per_example).sum()``: the weights sum to 1 (or are all
  0, and the step does nothing). It costs about three plain steps.

``nnunet_dro.lab.experiments.digits`` runs all of them side by side in such a loop.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from nnunet_dro.sampling.hardness import HardnessWeightedSampler


class HardnessWeightedBatchSampler(Sampler[list[int]]):
    """Yields ``num_batches`` batches of ``batch_size`` indices drawn i.i.d. from ``p``.

    Pass it as ``batch_sampler=`` to a DataLoader. With replacement, like Algorithm 1.
    """

    def __init__(self, sampler: HardnessWeightedSampler, batch_size: int, num_batches: int):
        if batch_size < 1 or num_batches < 0:
            raise ValueError(f"batch_size must be >= 1 and num_batches >= 0, got "
                             f"{batch_size}, {num_batches}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.num_batches = int(num_batches)

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.num_batches):
            yield self.sampler.sample(self.batch_size).tolist()

    def __len__(self) -> int:
        return self.num_batches


class WithIndex(Dataset):
    """Wraps a dataset so each item starts with its index: ``(index, *item)``.

    The training loop needs the indices of a batch to update the sampler.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        item = self.dataset[index]
        return (index, *item) if isinstance(item, tuple) else (index, item)


def importance_weighted_mean(sampler: HardnessWeightedSampler, indices, losses: torch.Tensor,
                             update: bool = True) -> torch.Tensor:
    """``mean_i(w_i * l_i)`` with the sampler's clipped importance weights; then ``update``.

    ``losses`` are per-example losses (``reduction='none'``) with gradient; the weights are
    constants. The fresh losses (detached) replace the stale ones unless ``update=False``.
    """
    idx = np.asarray(indices.cpu() if torch.is_tensor(indices) else indices, dtype=np.int64)
    fresh = losses.detach().to("cpu", torch.float64).numpy().reshape(-1)
    weights = sampler.importance_weights(idx, fresh)
    if update:
        sampler.update(idx, fresh)
    return (torch.as_tensor(weights, dtype=losses.dtype, device=losses.device) * losses).mean()
