"""The sampler against the theory of arXiv:2001.02658 (exactness, KL-DRO facts, IS weights)."""
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nnunet_dro.sampling import (
    NO_IMPORTANCE,
    HardnessWeightedSampler,
    ImportanceClip,
    kl_dro_objective,
    kl_dro_probabilities,
)
from sampling_helpers import chi_square_pvalue


def reference_softmax(losses, beta):
    """Independent float64 softmax, the definition of the target distribution."""
    x = beta * np.asarray(losses, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


loss_vectors = arrays(np.float64, st.integers(1, 60),
                      elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))
betas = st.floats(1e-3, 1e4)


@settings(max_examples=150, deadline=None)
@given(losses=loss_vectors, beta=betas)
def test_probabilities_match_float64_softmax(losses, beta):
    with HardnessWeightedSampler(losses.size, beta=beta, init_loss=losses) as s:
        p = s.probabilities()
    ref = reference_softmax(losses, beta)
    np.testing.assert_allclose(p, ref, rtol=1e-9, atol=1e-300)
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(losses=loss_vectors, beta=betas, updates=st.lists(
    st.tuples(st.integers(0, 59), st.floats(-1e3, 1e3, allow_nan=False)), max_size=30))
def test_tree_stays_consistent_under_updates(losses, beta, updates):
    """After any update sequence (including re-centring), the sum tree's draws follow p:
    the internal nodes equal a from-scratch rebuild (up to the centre's factor), and the total is positive and finite."""
    n = losses.size
    with HardnessWeightedSampler(n, beta=beta, init_loss=losses, seed=0) as s:
        for i, value in updates:
            s.update([i % n], [value])
        tree = np.array(s._storage.tree)
        s._rebuild()
        rebuilt = np.array(s._storage.tree)
        assert n == 1 or (0 < tree[1] < math.inf and 0 < rebuilt[1] < math.inf)
        if n > 1:  # the reference c may differ: compare the normalised sums
            np.testing.assert_allclose(tree[1:] / tree[1], rebuilt[1:] / rebuilt[1],
                                       rtol=1e-9, atol=1e-300)
        idx = s.sample(64)
        assert idx.dtype == np.int64 and idx.min() >= 0 and idx.max() < n
        # every drawn volume has non-negligible probability
        assert np.all(s.probabilities()[idx] > 0)


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("beta,spread", [(100.0, 0.02), (1.0, 2.0), (10.0, 0.3)])
def test_draw_frequencies_pass_chi_square(batch_size, beta, spread):
    rng = np.random.default_rng(1)
    n = 40
    losses = rng.uniform(0, spread, n)
    s = HardnessWeightedSampler(n, beta=beta, init_loss=losses, seed=123)
    draws = np.concatenate([s.sample(batch_size) for _ in range(40000 // batch_size)])
    expected = s.probabilities() * draws.size
    observed = np.bincount(draws, minlength=n)
    assert expected.min() > 5, "test design: every cell needs an expected count > 5"
    p_value = chi_square_pvalue(observed, expected)
    assert p_value > 1e-3, p_value
    s.close()


def test_draw_frequencies_follow_updates_and_recentring():
    n = 30
    s = HardnessWeightedSampler(n, beta=100.0, init_loss=0.5, seed=7)
    # large jumps force re-centring both ways (overflow guard and underflow guard)
    s.update(np.arange(n), np.linspace(10.0, 10.05, n))
    s.update(np.arange(n), np.linspace(-20.0, -19.97, n))
    s.update([3, 3, 5], [-19.95, -19.97, -19.99])  # duplicates: mean -19.96
    assert s.losses[3] == pytest.approx(-19.96)
    draws = s.sample(40000)
    expected = s.probabilities() * draws.size
    assert chi_square_pvalue(np.bincount(draws, minlength=n), expected) > 1e-3
    s.close()


@pytest.mark.parametrize("batch_size", [1, 2, 7])
def test_draws_are_with_replacement(batch_size):
    # n=1: every draw is the one volume, whatever the batch size (without replacement would fail)
    with HardnessWeightedSampler(1, seed=0) as s:
        assert s.sample(batch_size).tolist() == [0] * batch_size
    # n=2, very skewed: duplicates in a batch are frequent
    with HardnessWeightedSampler(2, beta=100.0, init_loss=[1.0, 0.0], seed=0) as s:
        batches = [s.sample(4) for _ in range(200)]
    assert all(b.tolist() == [0, 0, 0, 0] for b in batches)


def test_small_beta_is_uniform():
    losses = np.random.default_rng(0).uniform(0, 1, 50)
    with HardnessWeightedSampler(50, beta=1e-9, init_loss=losses) as s:
        np.testing.assert_allclose(s.probabilities(), np.full(50, 1 / 50), rtol=1e-8)


@settings(max_examples=100, deadline=None)
@given(losses=arrays(np.float64, st.integers(2, 30), elements=st.floats(-10, 10)),
       beta=st.floats(1e-2, 1e2), i=st.integers(0, 29), j=st.integers(0, 29),
       delta=st.floats(1e-3, 5.0))
def test_probability_increases_with_own_loss_only(losses, beta, i, j, delta):
    n = losses.size
    i, j = i % n, j % n
    p = kl_dro_probabilities(losses, beta)
    raised = losses.copy()
    raised[i] += delta
    q = kl_dro_probabilities(raised, beta)
    assert q[i] >= p[i] * (1 - 1e-12)
    if j != i:
        assert q[j] <= p[j] * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(losses=arrays(np.float64, st.integers(1, 30), elements=st.floats(-10, 10)),
       beta=st.floats(1e-2, 1e3), shift=st.floats(-100, 100))
def test_shift_invariance_and_objective_bounds(losses, beta, shift):
    np.testing.assert_allclose(kl_dro_probabilities(losses + shift, beta),
                               kl_dro_probabilities(losses, beta), rtol=1e-6, atol=1e-300)
    r = kl_dro_objective(losses, beta)
    tol = 1e-9 * (1 + np.abs(losses).max())
    assert losses.mean() - tol <= r <= losses.max() + tol


def test_objective_limits():
    losses = np.array([0.1, 0.4, 0.9])
    assert kl_dro_objective(losses, 1e-8) == pytest.approx(losses.mean(), abs=1e-6)
    assert kl_dro_objective(losses, 1e6) == pytest.approx(losses.max(), abs=1e-5)


@settings(max_examples=200, deadline=None)
@given(stale=st.floats(-1e3, 1e3), fresh=st.floats(-1e3, 1e3), beta=st.floats(1e-3, 1e4))
def test_importance_weight_formula_and_clipping(stale, fresh, beta):
    with HardnessWeightedSampler(3, beta=beta, init_loss=[stale, 0.0, 0.0]) as s:
        w = s.importance_weights([0], [fresh])
    assert w.dtype == np.float64 and np.all(np.isfinite(w))
    log_ref = beta * (fresh - stale)
    expected = math.exp(min(max(log_ref, math.log(0.1)), math.log(10.0)))
    assert w[0] == pytest.approx(expected, rel=1e-12)
    assert 0.1 <= w[0] <= 10.0


@pytest.mark.parametrize("fresh,expected", [
    # non-finite losses are refused by update(), so they get the neutral weight
    (float("inf"), 1.0), (float("-inf"), 1.0), (float("nan"), 1.0),
    (1e308, 10.0), (-1e308, 0.1), (1e-300, 1.0)])
def test_importance_weights_of_extreme_losses(fresh, expected):
    with HardnessWeightedSampler(2, beta=1e4, init_loss=[0.0, 0.0]) as s:
        assert s.importance_weights([1], [fresh])[0] == pytest.approx(expected)


def test_importance_sampling_off_gives_ones():
    with HardnessWeightedSampler(4, importance=NO_IMPORTANCE) as s:
        np.testing.assert_array_equal(s.importance_weights([0, 1, 1], [9.0, -9.0, 0.5]), 1.0)


def test_non_finite_losses_are_skipped_counted_and_warned():
    with HardnessWeightedSampler(4, init_loss=[1.0, 2.0, 3.0, 4.0], seed=0) as s:
        with pytest.warns(RuntimeWarning, match="skipped 2 non-finite"):
            s.update([0, 1, 2], [float("nan"), 0.5, float("inf")])
        np.testing.assert_array_equal(s.losses, [1.0, 0.5, 3.0, 4.0])
        assert s.num_skipped == 2
        np.testing.assert_array_equal(s.draw_counts, [0, 1, 0, 0])
        assert np.all(np.isfinite(s.probabilities()))
        with pytest.warns(RuntimeWarning):
            s.update([3], [float("nan")])
        assert s.num_skipped == 3


def test_duplicates_take_the_mean_and_count_every_occurrence():
    with HardnessWeightedSampler(3, init_loss=[0.0, 0.0, 0.0]) as s:
        w = s.importance_weights([1, 1], [0.002, 0.004])  # each against the stale loss 0
        np.testing.assert_allclose(w, np.exp([0.2, 0.4]))
        s.update([1, 1], [0.002, 0.004])
        assert s.losses[1] == pytest.approx(0.003)
        assert s.draw_counts.tolist() == [0, 2, 0]


def test_scalar_init_breaks_ties_reproducibly_and_vector_init_is_exact():
    a = HardnessWeightedSampler(5, init_loss=2.0, seed=3)
    b = HardnessWeightedSampler(5, init_loss=2.0, seed=3)
    np.testing.assert_array_equal(a.losses, b.losses)
    assert len(set(a.losses.tolist())) == 5
    assert np.all(np.abs(a.losses - 2.0) <= 2e-6)
    c = HardnessWeightedSampler(3, init_loss=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(c.losses, [1.0, 2.0, 3.0])


def test_state_dict_round_trip_restores_losses_counts_and_rng():
    s = HardnessWeightedSampler(20, beta=10.0, seed=5)
    for _ in range(10):
        idx = s.sample(3)
        s.update(idx, np.random.default_rng(int(idx[0])).uniform(0, 1, 3))
    state = pickle.loads(pickle.dumps(s.state_dict()))
    t = HardnessWeightedSampler(20, beta=10.0, seed=999)
    t.load_state_dict(state)
    np.testing.assert_array_equal(t.losses, s.losses)
    np.testing.assert_array_equal(t.draw_counts, s.draw_counts)
    np.testing.assert_array_equal(t.sample(50), s.sample(50))  # same RNG stream from here on
    with pytest.raises(ValueError, match="state is for 20 volumes"):
        HardnessWeightedSampler(21).load_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_cases": 0}, "num_cases"),
    ({"num_cases": 3, "beta": 0.0}, "beta"),
    ({"num_cases": 3, "beta": float("nan")}, "beta"),
    ({"num_cases": 3, "importance": ImportanceClip(clip=(0.0, 10.0))}, "clip"),
    ({"num_cases": 3, "importance": ImportanceClip(clip=(10.0, 0.1))}, "clip"),
    ({"num_cases": 3, "init_loss": [1.0, 2.0]}, "shape"),
    ({"num_cases": 2, "init_loss": [1.0, float("nan")]}, "NaN"),
    ({"num_cases": 2, "init_loss": float("inf")}, "finite"),
])
def test_invalid_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HardnessWeightedSampler(**kwargs)


@pytest.mark.parametrize("idx,losses,error", [
    ([3], [0.1], IndexError), ([-1], [0.1], IndexError),
    ([0, 1], [0.1], ValueError), ([0.5], [0.1], ValueError)])
def test_invalid_updates(idx, losses, error):
    with HardnessWeightedSampler(3) as s:
        with pytest.raises(error):
            s.update(idx, losses)


def test_memory_is_at_most_24_bytes_per_volume():
    with HardnessWeightedSampler(100_000) as s:
        assert s.state_nbytes <= 24 * 100_000 + 80


def test_stats_report_entropy_ess_and_hardest():
    losses = np.array([0.1, 0.9, 0.5, 0.7])
    with HardnessWeightedSampler(4, beta=5.0, init_loss=losses) as s:
        st_ = s.stats(k=2)
    p = reference_softmax(losses, 5.0)
    assert st_["entropy"] == pytest.approx(-(p * np.log(p)).sum())
    assert st_["effective_sample_size"] == pytest.approx(1 / (p ** 2).sum())
    assert st_["max_probability"] == pytest.approx(p.max())
    assert st_["hardest"] == [(1, 0.9), (3, 0.7)]
    with HardnessWeightedSampler(4, beta=1e-12) as s:
        st_ = s.stats()
        assert st_["effective_sample_size"] == pytest.approx(4)
        assert st_["entropy"] == pytest.approx(math.log(4))
