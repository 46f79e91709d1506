"""The plain shapes of the trainer tests and the evaluation benchmark: same seed, same bytes;
the labels are the shapes they claim to be."""
from __future__ import annotations

import numpy as np
import pytest

from nnunet_dro.data.synthetic_shapes import imperfect_prediction, nested_ellipsoids, noisy_sphere, voxel_grid


def _drawn(seed: int):
    rng = np.random.default_rng(seed)  # one generator for a whole dataset, as the callers use it
    spheres = [noisy_sphere(rng, (24, 24, 24), core=core) for core in (False, True)]
    truth = nested_ellipsoids(rng, 24, 3)
    return spheres, truth, imperfect_prediction(rng, truth, 3)


def test_same_seed_same_bytes_other_seed_other_shapes():
    (spheres, truth, prediction), (spheres2, truth2, prediction2) = _drawn(5), _drawn(5)
    for (image, label), (image2, label2) in zip(spheres, spheres2):
        assert image.tobytes() == image2.tobytes() and label.tobytes() == label2.tobytes()
    assert truth.tobytes() == truth2.tobytes() and prediction.tobytes() == prediction2.tobytes()
    assert _drawn(6)[1].tobytes() != truth.tobytes()


def test_sphere_and_its_core():
    image, label = noisy_sphere(np.random.default_rng(0), (24, 24, 24), core=True, noise_sd=0.0)
    centre = np.argwhere(label == 2).mean(axis=0)
    outer, inner = (np.linalg.norm(np.argwhere(label >= k) - centre, axis=1).max() for k in (1, 2))
    assert 3 <= outer <= 7 and inner <= outer / 2 + 1
    assert set(np.unique(image)) == {0.0, 100.0, 150.0}  # no noise: the label's intensities
    assert set(np.unique(noisy_sphere(np.random.default_rng(0), (24, 24, 24))[1])) == {0, 1}


@pytest.mark.parametrize("labels", [1, 3])
def test_ellipsoids_nest_and_the_prediction_is_close(labels):
    rng = np.random.default_rng(1)
    truth = nested_ellipsoids(rng, 32, labels)
    counts = [int((truth >= k).sum()) for k in range(1, labels + 1)]
    assert counts == sorted(counts, reverse=True) and counts[-1] > 0
    prediction = imperfect_prediction(rng, truth, labels)
    assert prediction.dtype == truth.dtype and 0.5 < (prediction == truth).mean() < 1
    assert prediction.max() <= labels


def test_voxel_grid_is_index_coordinates():
    grid = voxel_grid((2, 3, 4))
    assert grid.shape == (2, 3, 4, 3) and grid.dtype == np.float32
    assert grid[1, 2, 3].tolist() == [1.0, 2.0, 3.0]
