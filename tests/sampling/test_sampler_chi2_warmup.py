"""Pearson chi-square DRO sampling (Fidon et al. 2020) and the uniform warm-up pass."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import optimize, stats

from nnunet_dro.sampling import HardnessWeightedSampler
from nnunet_dro.sampling.distributions import chi2_dro_objective, chi2_dro_probabilities


def solve_chi2_dro_numerically(losses, beta):
    """Generic convex solver: maximise <q, L> - n * sum((q - 1/n)^2) / (2 beta) on the simplex."""
    n = losses.size
    objective = lambda q: -(q @ losses - n * np.square(q - 1 / n).sum() / (2 * beta))
    gradient = lambda q: -(losses - n * (q - 1 / n) / beta)
    result = optimize.minimize(objective, np.full(n, 1 / n), jac=gradient, method="SLSQP",
                               bounds=[(0, 1)] * n,
                               constraints=[{"type": "eq", "fun": lambda q: q.sum() - 1,
                                             "jac": lambda q: np.ones(n)}],
                               options={"ftol": 1e-14, "maxiter": 1000})
    assert result.success, result.message
    return result.x


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("beta", [0.5, 10.0, 100.0])
def test_closed_form_matches_a_generic_convex_solver(seed, beta):
    losses = np.random.default_rng(seed).uniform(0, 0.3, 12)
    exact = chi2_dro_probabilities(losses, beta)
    numeric = solve_chi2_dro_numerically(losses, beta)
    np.testing.assert_allclose(exact, numeric, atol=2e-5)
    n = losses.size
    numeric_value = numeric @ losses - n * np.square(numeric - 1 / n).sum() / (2 * beta)
    assert chi2_dro_objective(losses, beta) >= numeric_value - 1e-9  # exact is at least as good


@settings(max_examples=150, deadline=None)
@given(losses=arrays(np.float64, st.integers(1, 40), elements=st.floats(-50, 50)),
       beta=st.floats(1e-3, 1e3))
def test_chi2_probabilities_are_a_distribution_with_the_kkt_structure(losses, beta):
    p = chi2_dro_probabilities(losses, beta)
    n = losses.size
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0, abs=1e-12)
    active = p > 1e-12
    # on the active set p is affine in L with slope beta / n: a common threshold lam
    lam = losses[active] - (p[active] * n - 1) / beta
    assert np.ptp(lam) <= 1e-6 * (1 + np.abs(losses).max())
    # the inactive volumes are those below the threshold
    assert np.all(1 + beta * (losses[~active] - lam[0]) <= 1e-6 * (1 + beta * np.abs(losses).max()))
    # mean <= objective <= max
    r = chi2_dro_objective(losses, beta)
    assert losses.mean() - 1e-9 * (1 + np.abs(losses).max()) <= r <= losses.max() + 1e-9


def test_chi2_without_clipping_is_the_papers_formula():
    losses = np.array([0.30, 0.32, 0.35, 0.31])
    beta = 5.0
    paper = (1 + beta * (losses - losses.mean())) / losses.size
    np.testing.assert_allclose(chi2_dro_probabilities(losses, beta), paper)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_chi2_sampler_draw_frequencies(batch_size):
    losses = np.random.default_rng(3).uniform(0, 0.2, 20)
    with HardnessWeightedSampler(20, beta=10.0, init_loss=losses, divergence="chi2", seed=4) as s:
        draws = np.concatenate([s.sample(batch_size) for _ in range(30000 // batch_size)])
        p = s.probabilities()
    np.testing.assert_allclose(p, chi2_dro_probabilities(losses, 10.0))
    keep = p > 0
    assert np.all(np.bincount(draws, minlength=20)[~keep] == 0)  # clipped volumes never drawn
    assert stats.chisquare(np.bincount(draws, minlength=20)[keep], p[keep] * draws.size).pvalue > 1e-3


def test_chi2_importance_weight_is_the_clipped_probability_ratio():
    losses = np.array([0.30, 0.32, 0.35, 0.31])
    beta = 5.0
    with HardnessWeightedSampler(4, beta=beta, init_loss=losses, divergence="chi2") as s:
        w = s.importance_weights([2], [0.40])
    lam = losses.mean()
    assert w[0] == pytest.approx((1 + beta * (0.40 - lam)) / (1 + beta * (0.35 - lam)))


def test_warmup_visits_every_volume_once_then_samples_by_hardness():
    n, b = 10, 3
    with HardnessWeightedSampler(n, beta=100.0, init_loss=0.0, warmup=True, seed=0) as s:
        assert s.in_warmup
        seen = []
        while s.in_warmup:
            idx = s.sample(b)
            np.testing.assert_array_equal(s.importance_weights(idx, np.ones(b)), 1.0)
            seen.extend(idx.tolist())
            s.update(idx, np.where(idx == 7, 1.0, 0.0))  # volume 7 is the hard one
            assert len(seen) <= 2 * n, "warm-up should fill every volume in about one pass"
        assert set(seen) == set(range(n))
        assert np.all(s.draw_counts > 0)
        draws = s.sample(1000)
        assert (draws == 7).mean() > 0.99  # hardness sampling took over
        state = s.state_dict()
    assert state["warmup"] is False


def test_warmup_flag_survives_state_dict_and_reaches_workers():
    with HardnessWeightedSampler(5, warmup=True, shared=True) as s:
        state = s.state_dict()
        t = HardnessWeightedSampler(5, warmup=False)
        t.load_state_dict(state)
        assert t.in_warmup
        import pickle
        copy = pickle.loads(pickle.dumps(s))  # what a spawned worker gets
        s.update(np.arange(5), np.zeros(5))
        assert not copy.in_warmup  # the worker follows the owner's switch
        copy.close()


def test_unknown_divergence():
    with pytest.raises(ValueError, match="divergence"):
        HardnessWeightedSampler(3, divergence="tv")
