"""Multiplicative KL reweighting (Sow et al., arXiv:2308.00311): log-space running mean and annealed temperature."""
import math

import numpy as np
import pytest
from scipy.special import softmax

from nnunet_dro.weighting.kl_reweighter import KLReweighter


def test_single_batch_weights_are_n_times_the_softmax():
    losses = np.array([0.1, 0.5, 0.9])
    rw = KLReweighter(schedule=((0.0, 0.5),), momentum=1.0)
    w = rw.weights(losses, progress=0.0)
    np.testing.assert_allclose(w, 3 * softmax(losses / 0.5))  # mean weight 1, hardest heaviest
    assert w.mean() == pytest.approx(1.0)


def test_running_mean_in_log_space_matches_the_direct_formula():
    rng = np.random.default_rng(0)
    rw = KLReweighter(schedule=((0.0, 2.0),), momentum=0.2)
    u = None
    for _ in range(20):
        batch = rng.uniform(0, 1, 4)
        w = rw.weights(batch, 0.5)
        m = np.exp(batch / 2.0).mean()
        u = m if u is None else 0.8 * u + 0.2 * m
        np.testing.assert_allclose(w, np.exp(batch / 2.0) / u, rtol=1e-12)


def test_no_overflow_at_low_temperature_and_nan_is_neutral():
    rw = KLReweighter(schedule=((0.0, 0.1),))
    w = rw.weights([80.0, 79.0, float("nan")], 0.0)  # exp(800) would overflow
    assert np.all(np.isfinite(w)) and w[2] == 1.0 and w[0] > w[1]


def test_schedule_anneals_and_restarts_the_mean():
    rw = KLReweighter()
    assert [rw.temperature(p) for p in (0.0, 0.3, 0.34, 0.7, 1.0)] == [10.0, 10.0, 1.0, 0.1, 0.1]
    rw.weights([0.1, 0.2], 0.0)
    log_u_r10 = rw.log_u
    rw.weights([0.1, 0.2], 0.5)
    assert rw.r == 1.0 and rw.log_u == pytest.approx(math.log(np.exp([0.1, 0.2]).mean()))
    assert rw.log_u != log_u_r10


@pytest.mark.parametrize("schedule,momentum", [((), 0.1), (((0.5, 1.0),), 0.1), (((0.0, -1.0),), 0.1),
                                               (((0.0, 1.0),), 0.0), (((0.0, 1.0), (0.0, 2.0)), 0.1)])
def test_invalid_settings(schedule, momentum):
    with pytest.raises(ValueError):
        KLReweighter(schedule, momentum)
