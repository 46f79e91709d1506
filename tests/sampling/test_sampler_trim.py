"""The outlier trim of scale-free DRO (``trim_fraction``, after DORO): the hardest ``ceil(f n)``
cases leave the hardness distribution and are drawn at exactly the uniform rate ``1 / n``, the
others share the rest as the capped softmax solved over them alone
(nnunet_dro.sampling.temperature.outlier_trim); the sampler's trim (sum tree, draws, importance
weights, worker copies, state) and the adaptive scheme that sets it."""
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnunet_dro.sampling import HardnessWeightedSampler, ImportanceClip
from nnunet_dro.sampling.temperature import (
    NO_TRIM,
    capped_softmax,
    effective_losses,
    loss_ceiling,
    outlier_trim,
    solve_capped_beta_for_perplexity,
    trim_count,
)
from nnunet_dro.weighting import AdaptiveHardnessWeighting, ImportanceWeights
from sampling_helpers import chi_square_pvalue, loss_vectors

betas = st.floats(-1.0, 3.0).map(lambda e: 10.0 ** e)


def perplexity_of(p):
    nz = p[p > 0]
    return float(np.exp(-(nz * np.log(nz)).sum()))


def distinct(losses, n_min):
    x = np.asarray(losses, dtype=np.float64)
    return x.size >= n_min and np.unique(x).size == x.size


# ---------------------------------------------------------------------------- the trim itself
@settings(deadline=None, max_examples=80)
@given(losses=loss_vectors(max_n=300), beta=betas, count=st.integers(1, 20))
def test_trimmed_cases_get_the_uniform_rate_and_the_others_keep_their_softmax(losses, beta, count):
    x = np.asarray(losses, dtype=np.float64)
    if not distinct(x, count + 1):
        return
    trim = outlier_trim(x, count, beta)
    p = capped_softmax(x, beta, math.inf, trim)
    top = np.argsort(-x)[:count]
    kept = np.setdiff1d(np.arange(x.size), top)
    np.testing.assert_allclose(p[top], 1.0 / x.size, rtol=1e-9)
    reference = capped_softmax(x[kept], beta, math.inf)  # the softmax over the kept cases alone
    np.testing.assert_allclose(p[kept] / p[kept].sum(), reference, rtol=1e-8, atol=1e-300)
    assert trim[1] <= trim[0] == x[kept].max()


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(max_n=300), fraction=st.floats(0.1, 0.9), max_weight=st.floats(1.5, 20.0),
       trim_fraction=st.floats(0.01, 0.3))
def test_adaptive_trim_keeps_cap_and_perplexity_over_the_kept_cases(losses, fraction, max_weight, trim_fraction):
    x = np.asarray(losses, dtype=np.float64)
    k = trim_count(x.size, trim_fraction)
    if not distinct(x, 3) or k == 0:
        return
    with AdaptiveHardnessWeighting(x.size, fraction=fraction, max_weight=max_weight, init_loss=x,
                                   trim_fraction=trim_fraction) as w:
        p = w.probabilities()
        top = np.argsort(-x)[:k]
        kept = np.setdiff1d(np.arange(x.size), top)
        np.testing.assert_allclose(p[top], 1.0 / x.size, rtol=1e-9)
        assert p.max() <= max_weight / x.size * (1 + 1e-9)
        sub = p[kept] / p[kept].sum()
        beta = w.current_beta
        if beta < w.beta_max * (1 - 1e-9):  # the constraint binds over the kept cases
            assert perplexity_of(sub) == pytest.approx(fraction * kept.size, rel=1e-5)
        assert beta == pytest.approx(solve_capped_beta_for_perplexity(x[kept], fraction, w.beta_max, max_weight)[0])
        assert sorted(w.epoch_stats()["trimmed_cases"]) == sorted(top.tolist())


@pytest.mark.parametrize("n, fraction, expected", [
    (177, 0.05, 9), (64, 0.05, 4), (40, 0.05, 2), (35, 0.05, 2), (20, 0.05, 1), (2, 0.5, 1), (1, 0.05, 0),
    (100, 0.0, 0), (100, 0.05, 5),  # 0.05 * 100 rounds to 5.000000000000001: still 5
])
def test_trim_count_table(n, fraction, expected):
    assert trim_count(n, fraction) == expected


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0])
def test_trim_fraction_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match="trim_fraction"):
        AdaptiveHardnessWeighting(10, trim_fraction=bad)


def test_outlier_trim_rejects_bad_inputs():
    with pytest.raises(ValueError, match="at least one"):
        outlier_trim([0.1, 0.2], 2, beta=1.0)
    with pytest.raises(ValueError, match="beta"):
        outlier_trim([0.1, 0.2], 1, beta=0.0)
    assert outlier_trim([0.1, 0.2], 0, beta=1.0) == NO_TRIM


@pytest.mark.parametrize("losses, ceiling, trim, expected", [
    ([0.1, 0.7, 0.9, 5.0], 0.8, (1.0, 0.4), [0.1, 0.7, 0.8, 0.4]),  # trimmed, then capped
    ([0.1, 5.0], math.inf, NO_TRIM, [0.1, 5.0]),                    # neither
    ([0.1, 5.0], 0.05, (1.0, 0.4), [0.05, 0.05]),                   # the cap below the trim value
    ([math.nan, math.inf, -math.inf, 2.0], math.inf, (1.0, 0.4), [math.nan, math.inf, -math.inf, 0.4]),
])
def test_effective_losses_table(losses, ceiling, trim, expected):
    """A loss above the trim counts as the trim's value, then everything is capped; NaN and inf pass
    through to the callers, which weigh a non-finite loss neutrally."""
    np.testing.assert_array_equal(effective_losses(losses, ceiling, trim), expected)


# ---------------------------------------------------------------------------- the sampler's trim
@pytest.mark.parametrize("batch_size", [1, 8])
def test_sampler_draws_follow_the_trimmed_distribution(batch_size):
    n, draws_wanted = 30, 30000
    losses = np.r_[np.random.default_rng(3).uniform(0.0, 1.0, n - 3), 4.0, 5.0, 6.0]
    with HardnessWeightedSampler(n, beta=4.0, init_loss=losses, seed=11) as s:
        tau = loss_ceiling(losses[:-3], 4.0, 3.0)
        s.set_beta(4.0, tau, outlier_trim(losses, 3, 4.0, tau))
        p = s.probabilities()
        np.testing.assert_allclose(p[-3:], 1.0 / n, rtol=1e-9)
        draws = np.concatenate([s.sample(batch_size) for _ in range(draws_wanted // batch_size)])
        counts = np.bincount(draws, minlength=n)
        assert chi_square_pvalue(counts, p * draws.size) > 1e-3
        # the three outliers together: 3 / 30 of the draws, within 4 binomial standard deviations
        share, sd = counts[-3:].sum() / draws.size, math.sqrt(0.1 * 0.9 / draws.size)
        assert abs(share - 0.1) < 4 * sd


def test_sampler_updates_keep_the_tree_equal_to_a_rebuild_under_a_trim():
    rng = np.random.default_rng(0)
    with HardnessWeightedSampler(50, beta=20.0, init_loss=rng.uniform(0, 1, 50), seed=0) as s:
        s.set_beta(20.0, 0.9, (1.2, 0.5))
        for _ in range(200):
            idx = s.sample(4)
            s.update(idx, rng.uniform(0, 2, idx.size))  # cases cross the trim threshold both ways
        tree_after_updates = np.array(s._storage.tree)
        centre = s._storage.header_float[1]
        s._rebuild()
        ratio = math.exp(20.0 * (s._storage.header_float[1] - centre))
        assert tree_after_updates[1] == pytest.approx(s._storage.tree[1] * ratio, rel=1e-9)
        np.testing.assert_allclose(s.probabilities(), capped_softmax(s.losses, 20.0, 0.9, (1.2, 0.5)), rtol=1e-12)


def test_importance_weights_compare_trimmed_losses():
    with HardnessWeightedSampler(4, beta=2.0, init_loss=[0.0, 1.0, 2.0, 3.0],
                                 importance=ImportanceClip(clip=(1e-6, 1e6))) as s:
        s.set_beta(2.0, math.inf, (2.5, 0.5))
        w = s.importance_weights([0, 2, 3], [3.0, 1.0, 0.0])
        # case 0: 0 -> 3 counted as 0.5; case 2: 2 -> 1; case 3: 3 counted as 0.5 -> 0
        np.testing.assert_allclose(w, [math.exp(1.0), math.exp(-2.0), math.exp(-1.0)])


def test_set_beta_keeps_the_trim_unless_given_and_refuses_bad_ones():
    with HardnessWeightedSampler(5, beta=1.0, init_loss=np.arange(5.0)) as s:
        assert s.trim == NO_TRIM
        s.set_beta(2.0, 3.0, (3.5, 1.0))
        s.set_beta(4.0)
        assert (s.beta, s.ceiling, s.trim) == (4.0, 3.0, (3.5, 1.0))
        assert "trim=(3.5, 1)" in repr(s)
        s.set_beta(4.0, trim=NO_TRIM)
        assert s.trim == NO_TRIM
        for bad in [(math.nan, 1.0), (1.0, math.inf)]:
            with pytest.raises(ValueError, match="outlier trim"):
                s.set_beta(4.0, trim=bad)
    with HardnessWeightedSampler(5, beta=1.0, divergence="chi2") as s:
        with pytest.raises(ValueError, match="KL"):
            s.set_beta(1.0, trim=(0.5, 0.1))


def test_pickled_private_sampler_keeps_its_trim():
    with HardnessWeightedSampler(8, beta=3.0, init_loss=np.arange(8.0), seed=0) as s:
        s.set_beta(3.0, math.inf, outlier_trim(s.losses, 2, 3.0))
        copy = pickle.loads(pickle.dumps(s))
        try:
            assert copy.trim == s.trim != NO_TRIM
            np.testing.assert_array_equal(copy.probabilities(), s.probabilities())
        finally:
            copy.close()


# ---------------------------------------------------------------------------- the adaptive scheme
def test_noisy_cases_of_a_benchmark_sized_cohort_are_drawn_at_their_uniform_share():
    """177 cases, 8 of them with wrong labels whose loss stays far above the rest: the default
    (f = 0.5, cap 5 / n) gives them 5 times their uniform share; the trim of 5 % (9 cases) gives them
    exactly their uniform share."""
    rng = np.random.default_rng(0)
    losses = np.r_[rng.uniform(-0.9, -0.6, 169), rng.uniform(0.5, 1.0, 8)]
    noisy = np.arange(169, 177)
    with AdaptiveHardnessWeighting(177, fraction=0.5, max_weight=5.0, init_loss=losses, seed=0) as default, \
            AdaptiveHardnessWeighting(177, fraction=0.5, max_weight=5.0, init_loss=losses, seed=0,
                                      trim_fraction=0.05) as trimmed:
        assert default.probabilities()[noisy].sum() == pytest.approx(8 * 5.0 / 177, rel=1e-9)
        assert trimmed.probabilities()[noisy].sum() == pytest.approx(8 / 177, rel=1e-9)
        assert "9 hardest case(s) (5%)" in trimmed.describe()


def test_no_trim_in_the_uniform_phase():
    losses = np.r_[np.linspace(0.0, 0.5, 39), 3.0]
    with AdaptiveHardnessWeighting(40, trim_fraction=0.05, init_loss=losses, hold_uniform=True) as w:
        assert w.sampler.trim == NO_TRIM
        np.testing.assert_allclose(w.probabilities(), 1 / 40)
        assert "trimmed_cases" in w.epoch_stats() and w.epoch_stats()["trimmed_cases"] == []
        w.release()
        assert w.sampler.trim != NO_TRIM and w.probabilities()[-1] == pytest.approx(1 / 40)


def test_trimmed_state_round_trip_and_shared_copy():
    iw = ImportanceWeights(enabled=False)
    init = np.r_[np.linspace(0.0, 0.2, 38), 3.0, 4.0]
    kwargs = dict(fraction=0.5, max_weight=4.0, importance=iw, trim_fraction=0.05)
    with AdaptiveHardnessWeighting(40, init_loss=init, seed=1, shared=True, **kwargs) as w, \
            AdaptiveHardnessWeighting(40, seed=2, **kwargs) as other, \
            AdaptiveHardnessWeighting(40, fraction=0.5, max_weight=4.0, importance=iw, seed=3) as untrimmed:
        copy = pickle.loads(pickle.dumps(w))
        try:
            w.update(np.arange(40), np.r_[np.linspace(0.0, 0.1, 38), 5.0, 6.0])
            assert copy.sampler.trim == w.sampler.trim != NO_TRIM
            np.testing.assert_array_equal(copy.probabilities(), w.probabilities())
        finally:
            copy.close()
        state = pickle.loads(pickle.dumps(w.state_dict()))
        other.load_state_dict(state)
        assert (other.current_beta, other.sampler.ceiling, other.sampler.trim) == \
               (w.current_beta, w.sampler.ceiling, w.sampler.trim)
        np.testing.assert_array_equal(other.probabilities(), w.probabilities())
        untrimmed.load_state_dict(state)  # a scheme without the trim ignores a saved one
        assert untrimmed.sampler.trim == NO_TRIM
