"""The small CNN of the digits experiment."""
from __future__ import annotations

import torch
from torch import nn

from nnunet_dro.lab.experiments.digits.data import NUM_CLASSES


class SmallCNN(nn.Module):
    """conv3x3(1->8)-ReLU, conv3x3(8->16)-ReLU, 2x2 max-pool, linear(256->10). ~3k parameters.

    Small on purpose: the per-iteration cost on one CPU core is dominated by framework overhead,
    and the paper's WRN-16-1 would make 25 runs take far longer than the few minutes allowed.
    """

    def __init__(self, channels: tuple[int, int] = (8, 16)):
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(c2 * 4 * 4, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 1, 8, 8) -> (N, 10) logits
        return self.classifier(self.features(x))
