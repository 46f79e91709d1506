"""The per-case probability cap of scale-free DRO (``max_weight``): the loss ceiling ``tau`` with
``max softmax(beta * min(L, tau)) = c / n`` (nnunet_dro.sampling.temperature.loss_ceiling), the
joint solve with the perplexity constraint, the sampler's ceiling (sum tree, draws, importance
weights, worker copies, state) and the adaptive scheme that sets it."""
import math
import pickle

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nnunet_dro.sampling import HardnessWeightedSampler, ImportanceClip
from nnunet_dro.sampling.temperature import (
    capped_softmax,
    loss_ceiling,
    solve_beta_for_perplexity,
    solve_capped_beta_for_perplexity,
)
from nnunet_dro.weighting import AdaptiveHardnessWeighting, ImportanceWeights
from sampling_helpers import chi_square_pvalue, loss_vectors

fractions = st.floats(0.05, 0.99)
max_weights = st.floats(1.05, 50.0)
betas = st.floats(-2.0, 4.0).map(lambda e: 10.0 ** e)


def perplexity_of(p):
    nz = p[p > 0]
    return float(np.exp(-(nz * np.log(nz)).sum()))


def maximiser_over_capped_simplex(losses, beta, max_weight):
    """Independent reference: the maximiser of <q, L> - KL(q || u) / beta subject to q <= c / n,
    by bisection on the multiplier of sum(q) = 1 (q_i = min(c/n, exp(beta L_i - nu)))."""
    x = beta * np.asarray(losses, dtype=np.float64)
    cap = max_weight / x.size

    def q_at(nu):
        with np.errstate(over="ignore"):
            return np.minimum(cap, np.exp(x - nu))

    # at lo every term is capped (sum c > 1); at hi every term is below exp(-10) (sum < 1 for n <= 2e4)
    lo, hi = x.min() - 10.0, x.max() + 10.0
    for _ in range(400):
        nu = 0.5 * (lo + hi)
        lo, hi = (nu, hi) if q_at(nu).sum() > 1.0 else (lo, nu)
    q = q_at(0.5 * (lo + hi))
    return q / q.sum()


# ---------------------------------------------------------------------------- the loss ceiling
@settings(deadline=None, max_examples=80)
@given(losses=loss_vectors(max_n=500), beta=betas, max_weight=max_weights)
def test_ceiling_gives_the_maximiser_over_the_capped_simplex(losses, beta, max_weight):
    tau = loss_ceiling(losses, beta, max_weight)
    q = capped_softmax(losses, beta, tau)
    n = losses.size
    assert q.max() <= max_weight / n * (1 + 1e-9)
    if math.isfinite(tau):
        assert q.max() == pytest.approx(max_weight / n, rel=1e-7)  # the cap binds exactly
        assert tau <= losses.max()
    else:
        assert capped_softmax(losses, beta, math.inf).max() <= max_weight / n * (1 + 1e-12)
    np.testing.assert_allclose(q, maximiser_over_capped_simplex(losses, beta, max_weight), atol=1e-9)


@pytest.mark.parametrize("losses,beta,max_weight,expected_max_p", [
    ([0.0, 0.0, 0.0, 5.0], 10.0, 2.0, 0.5),          # one outlier capped at 2/4
    ([0.0, 0.0, 5.0, 5.0], 10.0, 1.5, 0.375),        # two tied outliers share the cap
    ([0.1, 0.2], 1.0, 2.0, None),                    # softmax already under the cap: no ceiling
    ([1.0, 1.0, 1.0], 100.0, 1.01, None),            # equal losses: uniform, nothing to cap
    ([0.0, 1.0, 2.0, 3.0, 4.0], 1e4, 4.9, 0.98),     # near one-hot softmax, capped just under 1
    ([0.0] * 9 + [1.0], 1e3, 10.0, None),            # c = n: the cap is the whole simplex
])
def test_ceiling_table(losses, beta, max_weight, expected_max_p):
    tau = loss_ceiling(losses, beta, max_weight)
    if expected_max_p is None:
        assert tau == math.inf
    else:
        assert capped_softmax(losses, beta, tau).max() == pytest.approx(expected_max_p, rel=1e-9)


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(max_n=300), beta=betas, max_weight=max_weights, shift=st.floats(-50.0, 50.0),
       log_a=st.floats(-2.0, 2.0))
def test_ceiling_moves_with_the_losses(losses, beta, max_weight, shift, log_a):
    """Shift: the ceiling shifts with the losses; scale by a with beta / a: the ceiling scales."""
    a = 10.0 ** log_a
    tau = loss_ceiling(losses, beta, max_weight)
    tau_shift = loss_ceiling(losses + shift, beta, max_weight)
    tau_scale = loss_ceiling(a * losses, beta / a, max_weight)
    if math.isinf(tau):
        assume(math.isinf(tau_shift) and math.isinf(tau_scale))  # rounding at the boundary aside
    else:
        span = max(1.0, float(np.ptp(losses)))
        assert tau_shift - shift == pytest.approx(tau, abs=1e-7 * span + 1e-9 * abs(shift))
        assert tau_scale / a == pytest.approx(tau, abs=1e-7 * span)


@pytest.mark.parametrize("kwargs,match", [
    (dict(losses=[0.0, 1.0], beta=1.0, max_weight=1.0), "max_weight"),
    (dict(losses=[0.0, 1.0], beta=1.0, max_weight=0.5), "max_weight"),
    (dict(losses=[0.0, 1.0], beta=0.0, max_weight=2.0), "beta"),
    (dict(losses=[0.0, np.nan], beta=1.0, max_weight=2.0), "finite"),
    (dict(losses=[], beta=1.0, max_weight=2.0), "non-empty"),
])
def test_ceiling_rejects_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        loss_ceiling(**kwargs)


# ---------------------------------------------------------------------------- the joint solve
@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(max_n=500), fraction=fractions, max_weight=max_weights,
       beta_max=st.floats(-1.0, 4.0).map(lambda e: 10.0 ** e))
def test_capped_solution_meets_both_constraints_and_is_the_largest_beta(losses, fraction, max_weight, beta_max):
    n = losses.size
    beta, tau = solve_capped_beta_for_perplexity(losses, fraction, beta_max, max_weight)
    q = capped_softmax(losses, beta, tau)
    assert 0 < beta <= beta_max
    assert q.max() <= max_weight / n * (1 + 1e-8)
    assert perplexity_of(q) >= fraction * n * (1 - 1e-9)
    # the cap only adds entropy: at least the uncapped beta
    assert beta >= solve_beta_for_perplexity(losses, fraction, beta_max) * (1 - 1e-8)
    if beta < beta_max:
        assert perplexity_of(q) == pytest.approx(fraction * n, rel=1e-6)
        bigger = beta * (1 + 1e-4)
        assert perplexity_of(capped_softmax(losses, bigger, loss_ceiling(losses, bigger, max_weight))) \
            < fraction * n


@settings(deadline=None, max_examples=40)
@given(losses=loss_vectors(max_n=300), fraction=fractions, max_weight=max_weights, shift=st.floats(-50.0, 50.0))
def test_capped_solution_is_invariant_to_a_constant(losses, fraction, max_weight, shift):
    b, t = solve_capped_beta_for_perplexity(losses, fraction, 100.0, max_weight)
    b2, t2 = solve_capped_beta_for_perplexity(losses + shift, fraction, 100.0, max_weight)
    assert b2 == pytest.approx(b, rel=1e-6)
    np.testing.assert_allclose(capped_softmax(losses + shift, b2, t2), capped_softmax(losses, b, t), atol=1e-7)


def test_cap_spreads_the_single_outlier_of_the_benchmark():
    """The measured failure (n = 177, f = 0.5): one outlier takes ~42x uniform; capped at 5x."""
    losses = np.r_[np.linspace(0.0, 0.5, 176), 3.5]
    p = capped_softmax(losses, solve_beta_for_perplexity(losses, 0.5, 100.0), math.inf)
    assert p.max() * 177 > 30
    beta, tau = solve_capped_beta_for_perplexity(losses, 0.5, 100.0, 5.0)
    q = capped_softmax(losses, beta, tau)
    assert q.max() * 177 == pytest.approx(5.0, rel=1e-9)
    # the probability the outlier gave up goes to the next hardest cases, not back to uniform
    assert q[-2] > p[-2] and q[-10] > p[-10]


# ---------------------------------------------------------------------------- the sampler's ceiling
def test_sampler_without_ceiling_is_unchanged():
    with HardnessWeightedSampler(6, beta=3.0, init_loss=np.arange(6.0)) as s:
        assert s.ceiling == math.inf
        np.testing.assert_allclose(s.probabilities(), np.exp(3.0 * np.arange(6)) / np.exp(3.0 * np.arange(6)).sum())


@pytest.mark.parametrize("batch_size", [1, 8])
def test_sampler_draws_follow_the_capped_distribution(batch_size):
    n, draws_wanted = 30, 30000
    losses = np.r_[np.random.default_rng(3).uniform(0.0, 1.0, n - 2), 4.0, 5.0]
    with HardnessWeightedSampler(n, beta=4.0, init_loss=losses, seed=11) as s:
        tau = loss_ceiling(losses, 4.0, 3.0)
        s.set_beta(4.0, tau)
        p = s.probabilities()
        assert p.max() == pytest.approx(3.0 / n, rel=1e-9)
        np.testing.assert_allclose(p, capped_softmax(losses, 4.0, tau), rtol=1e-12)
        draws = np.concatenate([s.sample(batch_size) for _ in range(draws_wanted // batch_size)])
        assert chi_square_pvalue(np.bincount(draws, minlength=n), p * draws.size) > 1e-3


def test_sampler_updates_keep_the_tree_equal_to_a_rebuild_under_a_ceiling():
    rng = np.random.default_rng(0)
    with HardnessWeightedSampler(50, beta=20.0, init_loss=rng.uniform(0, 1, 50), seed=0) as s:
        s.set_beta(20.0, 0.6)
        for _ in range(200):
            idx = s.sample(4)
            s.update(idx, rng.uniform(0, 2, idx.size))
        tree_after_updates = np.array(s._storage.tree)
        centre = s._storage.header_float[1]
        s._rebuild()
        # a rebuild re-centres: compare the root sums scaled to the same reference
        ratio = math.exp(20.0 * (s._storage.header_float[1] - centre))
        assert tree_after_updates[1] == pytest.approx(s._storage.tree[1] * ratio, rel=1e-9)
        np.testing.assert_allclose(s.probabilities(), capped_softmax(s.losses, 20.0, 0.6), rtol=1e-12)


def test_importance_weights_compare_clipped_losses():
    with HardnessWeightedSampler(4, beta=2.0, init_loss=[0.0, 1.0, 2.0, 3.0],
                                 importance=ImportanceClip(clip=(1e-6, 1e6))) as s:
        s.set_beta(2.0, 1.5)
        w = s.importance_weights([0, 2, 3], [1.0, 5.0, 0.0])
        # case 0: 0 -> 1 (both under 1.5); case 2: 1.5 -> 1.5 (both above); case 3: 1.5 -> 0
        np.testing.assert_allclose(w, [math.exp(2.0), 1.0, math.exp(-3.0)])


def test_set_beta_keeps_the_ceiling_unless_given():
    with HardnessWeightedSampler(5, beta=1.0, init_loss=np.arange(5.0)) as s:
        s.set_beta(2.0, 3.0)
        s.set_beta(4.0)
        assert (s.beta, s.ceiling) == (4.0, 3.0)
        s.set_beta(4.0, math.inf)
        assert s.ceiling == math.inf
        with pytest.raises(ValueError, match="nan"):
            s.set_beta(4.0, math.nan)


def test_chi2_sampler_refuses_a_ceiling():
    with HardnessWeightedSampler(5, beta=1.0, divergence="chi2") as s:
        with pytest.raises(ValueError, match="KL"):
            s.set_beta(1.0, 0.5)


def test_pickled_private_sampler_keeps_its_ceiling():
    with HardnessWeightedSampler(8, beta=3.0, init_loss=np.arange(8.0), seed=0) as s:
        s.set_beta(3.0, 5.5)
        copy = pickle.loads(pickle.dumps(s))
        try:
            assert copy.ceiling == 5.5
            np.testing.assert_array_equal(copy.probabilities(), s.probabilities())
        finally:
            copy.close()
        assert "ceiling=5.5" in repr(s)


# ---------------------------------------------------------------------------- the adaptive scheme
def test_adaptive_scheme_with_max_weight_caps_and_keeps_the_perplexity():
    losses = np.r_[np.linspace(0.0, 0.5, 176), 3.5]
    with AdaptiveHardnessWeighting(177, fraction=0.5, max_weight=5.0, init_loss=losses, seed=0) as w:
        p = w.probabilities()
        assert p.max() * 177 == pytest.approx(5.0, rel=1e-9)
        assert perplexity_of(p) == pytest.approx(0.5 * 177, rel=1e-6)
        assert "5 / n" in w.describe()
        assert w.robust_loss() <= losses.max()
        assert w.robust_loss() >= float(p @ losses) - math.log(177) / w.current_beta


def test_adaptive_capped_pickled_copy_follows_the_owner():
    init = np.r_[np.zeros(31), 2.0]
    with AdaptiveHardnessWeighting(32, fraction=0.5, max_weight=3.0, init_loss=init, seed=0, shared=True) as owner:
        copy = pickle.loads(pickle.dumps(owner))
        try:
            owner.update(np.arange(32), np.r_[np.linspace(0.0, 0.1, 31), 5.0])
            assert copy.sampler.ceiling == owner.sampler.ceiling < math.inf
            np.testing.assert_array_equal(copy.probabilities(), owner.probabilities())
        finally:
            copy.close()


def test_adaptive_capped_state_round_trip_restores_beta_and_ceiling():
    iw = ImportanceWeights(enabled=False)
    init = np.r_[np.linspace(0.0, 0.2, 39), 3.0]
    with AdaptiveHardnessWeighting(40, fraction=0.5, max_weight=4.0, init_loss=init, importance=iw, seed=1) as w, \
            AdaptiveHardnessWeighting(40, fraction=0.5, max_weight=4.0, importance=iw, seed=2) as other:
        state = pickle.loads(pickle.dumps(w.state_dict()))
        assert math.isfinite(state["loss_ceiling"])
        other.load_state_dict(state)
        assert (other.current_beta, other.sampler.ceiling) == (w.current_beta, w.sampler.ceiling)
        np.testing.assert_array_equal(other.probabilities(), w.probabilities())


def test_uncapped_scheme_ignores_a_saved_ceiling():
    init = np.r_[np.linspace(0.0, 0.2, 39), 3.0]
    with AdaptiveHardnessWeighting(40, fraction=0.5, max_weight=4.0, init_loss=init, seed=1) as capped, \
            AdaptiveHardnessWeighting(40, fraction=0.5, seed=2) as plain:
        plain.load_state_dict(capped.state_dict())
        assert plain.sampler.ceiling == math.inf


def test_spread_rule_with_max_weight_fits_the_ceiling_to_its_beta():
    init = np.r_[np.zeros(19), 10.0]
    with AdaptiveHardnessWeighting(20, rule="spread", kappa=1.0, max_weight=2.0, init_loss=init) as w:
        assert w.current_beta == pytest.approx(1.0 / np.std(init))
        assert w.probabilities().max() == pytest.approx(2.0 / 20, rel=1e-9)


@pytest.mark.parametrize("bad", [1.0, 0.5, -2.0])
def test_adaptive_rejects_a_max_weight_of_at_most_one(bad):
    with pytest.raises(ValueError, match="max_weight"):
        AdaptiveHardnessWeighting(10, max_weight=bad)


def test_a_cap_that_cannot_bind_gives_the_uncapped_beta_exactly():
    """max_weight >= n: no case can exceed probability 1, so the capped solve is the uncapped one,
    to the last bit, also where the perplexity is flat in beta (these are the stale losses of an
    end-to-end run: two undrawn cases tied near the initial loss, the target perplexity 2 of 4
    reached by every large beta, where two root finders used to stop 1e-4 apart)."""
    losses = np.array([-0.1878778, 100.00001972, 0.11027841, 100.00002073])
    for max_weight in (4.0, 5.0):
        beta, ceiling = solve_capped_beta_for_perplexity(losses, 0.5, 100.0, max_weight)
        assert beta == solve_beta_for_perplexity(losses, 0.5, 100.0) and ceiling == math.inf
