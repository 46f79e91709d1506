"""Small voxel-space label maps and images for tests and benchmarks: spheres, nested ellipsoids,
imperfect predictions.

Unlike the cohorts of :mod:`~nnunet_dro.data.synthetic_fetal` and
:mod:`~nnunet_dro.data.synthetic_brats` (anatomy-like, in normalised coordinates, one generator
per case), these are the plain shapes a test or a timing needs: cheap, in voxel units, drawn from
the caller's ``numpy.random.Generator`` in a fixed order, so the same seed gives the same arrays
byte for byte (the trainer tests' datasets and the evaluation benchmark's cohort rely on it).

>>> import numpy as np
>>> image, label = noisy_sphere(np.random.default_rng(0), (24, 24, 24), core=True)
>>> image.dtype, label.dtype, sorted(np.unique(label).tolist())
(dtype('float64'), dtype('uint8'), [0, 1, 2])
>>> truth = nested_ellipsoids(np.random.default_rng(0), 32, labels=3)
>>> prediction = imperfect_prediction(np.random.default_rng(1), truth, labels=3)
>>> truth.shape == prediction.shape, sorted(np.unique(truth).tolist())
(True, [0, 1, 2, 3])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def voxel_grid(shape: Sequence[int]) -> np.ndarray:
    """Voxel indices as float32 coordinates, shape ``(*shape, 3)`` (index order, not mm)."""
    return np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), axis=-1).astype(np.float32)


def noisy_sphere(rng: np.random.Generator, shape: Sequence[int], *, core: bool = False,
                 centre_range: tuple[float, float] = (9.0, 15.0), radius_range: tuple[float, float] = (4.0, 7.0),
                 noise_sd: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
    """(image, label): a sphere (label 1; with ``core``, its inner half-radius ball is label 2) at a
    random centre and radius, and an image of 100 inside, 150 in the core, plus Gaussian noise.

    The smallest segmentation task nnU-Net can plan, train and validate in seconds; the default
    ranges fit a 24^3 grid. Draws centre, radius, then the noise.
    """
    shape = tuple(int(s) for s in shape)
    centre = rng.uniform(*centre_range, len(shape))
    radius = rng.uniform(*radius_range)
    distance = np.linalg.norm(voxel_grid(shape) - centre, axis=-1)
    label = (distance < radius).astype(np.uint8)
    if core:
        label[distance < radius / 2] = 2
    image = 100.0 * (label > 0) + 50.0 * (label == 2) + rng.normal(0, noise_sd, shape)
    return image, label


def nested_ellipsoids(rng: np.random.Generator, size: int, labels: int) -> np.ndarray:
    """A ``size^3`` label map of nested, randomly placed ellipsoids (label k inside label k-1), like
    organ and tumour maps: each inner one shifted a little and 0.5-0.7 times as large per axis."""
    grid = voxel_grid((size,) * 3)
    array = np.zeros((size,) * 3, np.uint8)
    centre = rng.uniform(0.4, 0.6, 3) * size
    radii = rng.uniform(0.25, 0.35, 3) * size
    for label in range(1, labels + 1):
        inside = (((grid - centre) / radii) ** 2).sum(-1) <= 1
        array[inside] = label
        centre = centre + rng.normal(0, 0.03 * size, 3)
        radii = radii * rng.uniform(0.5, 0.7, 3)
    return array


def imperfect_prediction(rng: np.random.Generator, truth: np.ndarray, labels: int, *, max_shift: int = 2,
                         flip_fraction: float = 0.01) -> np.ndarray:
    """A plausible imperfect segmentation of ``truth``: shifted by up to ``max_shift`` voxels per
    axis, and a ``flip_fraction`` of voxels set to a random label in 0..``labels``."""
    prediction = np.roll(truth, tuple(int(v) for v in rng.integers(-max_shift, max_shift + 1, truth.ndim)),
                         axis=tuple(range(truth.ndim)))
    flipped = rng.random(truth.shape) < flip_fraction
    prediction[flipped] = rng.integers(0, labels + 1, int(flipped.sum()), dtype=np.uint8)
    return prediction
