"""The imbalanced digits split (scikit-learn's bundled 8x8 digits, no download)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nnunet_dro.errors import UserError

NUM_CLASSES = 10
# Paper, section 4.1: lr 0.01, no momentum, no weight decay, no augmentation. It does not state
# the batch size; 32 is our choice.
DEFAULT_LR = 0.01
DEFAULT_BATCH_SIZE = 32
DEFAULT_RARE_CLASS = 3
# 0.035 of the 146 training threes of the default split = 5 images (the paper kept 1% of MNIST's
# ~6000 threes, i.e. ~60; 1% of 146 would leave a single image).
DEFAULT_RARE_FRACTION = 0.035
DEFAULT_TEST_SIZE = 0.2
DEFAULT_BETAS = (0.1, 1.0, 10.0, 100.0)
DEFAULT_CLIP = (0.1, 10.0)


# ---------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DigitsSplit:
    """Imbalanced training split and full test split; images are float32 in [0, 1], (N, 8, 8)."""

    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    rare_class: int
    rare_fraction: float
    rare_kept: int        # images of the rare class left in the training split
    rare_available: int   # images of the rare class the stratified training split had

    @property
    def num_train(self) -> int:
        return int(self.y_train.size)

    def describe(self) -> str:
        counts = np.bincount(self.y_train, minlength=NUM_CLASSES)
        return (f"training: {self.num_train} images, digit {self.rare_class}: kept {self.rare_kept} "
                f"of {self.rare_available} (fraction {self.rare_fraction:g}); other digits "
                f"{counts[np.arange(NUM_CLASSES) != self.rare_class].min()}-"
                f"{counts[np.arange(NUM_CLASSES) != self.rare_class].max()} each; test: "
                f"{self.y_test.size} images, digit {self.rare_class}: "
                f"{int((self.y_test == self.rare_class).sum())}")


def rare_count(available: int, fraction: float) -> int:
    """Images of the rare class to keep: ``round(fraction * available)``, at least 1.

    >>> rare_count(146, 0.035), rare_count(146, 0.01), rare_count(146, 1.0)
    (5, 1, 146)
    """
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise UserError(f"rare fraction must lie in (0, 1], got {fraction!r}")
    return max(1, min(available, int(round(fraction * available))))


def load_imbalanced_digits(rare_class: int = DEFAULT_RARE_CLASS,
                           rare_fraction: float = DEFAULT_RARE_FRACTION,
                           test_size: float = DEFAULT_TEST_SIZE, data_seed: int = 0) -> DigitsSplit:
    """scikit-learn's ``load_digits``, stratified split, rare class thinned in training only.

    The split and the choice of the kept rare images depend on ``data_seed`` only, so every
    method and every training seed sees the same data.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if rare_class not in range(NUM_CLASSES):
        raise UserError(f"rare class must be a digit 0-9, got {rare_class!r}")
    if not 0.0 < test_size < 1.0:
        raise UserError(f"test size must lie in (0, 1), got {test_size!r}")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # pixel values are 0..16
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_size, stratify=labels, random_state=data_seed)
    rare_idx = np.flatnonzero(y_train == rare_class)
    keep = rare_count(rare_idx.size, rare_fraction)
    kept = np.random.default_rng(data_seed).choice(rare_idx, size=keep, replace=False)
    mask = y_train != rare_class
    mask[kept] = True
    return DigitsSplit(x_train[mask], y_train[mask], x_test, y_test, rare_class, float(rare_fraction),
                       keep, int(rare_idx.size))
