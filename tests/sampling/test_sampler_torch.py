"""The plain-PyTorch adapter with a real DataLoader and worker processes."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nnunet_dro.sampling import HardnessWeightedSampler
from nnunet_dro.sampling.torch_sampler import HardnessWeightedBatchSampler, WithIndex, importance_weighted_mean


def test_dataloader_with_workers_delivers_hard_examples_and_updates():
    n = 10
    data = TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n))
    sampler = HardnessWeightedSampler(n, beta=10.0, init_loss=0.0, seed=0)
    sampler.update([7], [1.0])  # example 7 now has probability e^10 / (9 + e^10) ~ 0.9996
    loader = DataLoader(WithIndex(data), num_workers=2,
                        batch_sampler=HardnessWeightedBatchSampler(sampler, 4, num_batches=50))
    seen = []
    for index, x, y in loader:
        assert torch.equal(x[:, 0].long(), index) and torch.equal(y, index)  # items match indices
        seen.extend(index.tolist())
    assert len(seen) == 200 and seen.count(7) >= 190


def test_importance_weighted_mean_weights_then_updates():
    sampler = HardnessWeightedSampler(3, beta=1.0, init_loss=[0.0, 0.0, 0.0])
    losses = torch.tensor([0.5, 2.0], requires_grad=True)
    out = importance_weighted_mean(sampler, torch.tensor([0, 1]), losses)
    expected = (np.exp(0.5) * 0.5 + np.exp(2.0) * 2.0) / 2
    assert out.item() == pytest.approx(expected)
    out.backward()
    np.testing.assert_allclose(losses.grad.numpy(), np.exp([0.5, 2.0]) / 2, rtol=1e-6)
    np.testing.assert_allclose(sampler.losses, [0.5, 2.0, 0.0])


def test_batch_sampler_rejects_bad_sizes():
    with pytest.raises(ValueError):
        HardnessWeightedBatchSampler(HardnessWeightedSampler(3), 0, 5)
