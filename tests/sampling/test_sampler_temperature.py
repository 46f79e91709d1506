"""The scale-free inverse temperature of KL-DRO (nnunet_dro.sampling.temperature): the perplexity
root finder ``solve_beta_for_perplexity`` against its definition (the largest beta <= beta_max with
``exp(H(softmax(beta L))) >= f n``), its invariances, its edge cases, and ``beta_from_spread``."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nnunet_dro.sampling.temperature import beta_from_spread, entropy_of_softmax, perplexity, solve_beta_for_perplexity
from sampling_helpers import loss_vectors

# How close the perplexity at the solution must be to the target f * n (the solver works to a
# relative tolerance of 1e-9 on beta; 1e-6 leaves room for dH/dlog(beta) = -Var_p(beta L)).
PERPLEXITY_RTOL = 1e-6
# "at least f * n" up to the rounding of the entropy itself
FEASIBLE_RTOL = 1e-9


def reference_perplexity(losses, beta):
    """Independent float64 perplexity exp(-sum p log p) of softmax(beta * losses)."""
    x = beta * np.asarray(losses, dtype=np.float64)
    x = x - x.max()
    p = np.exp(x)
    p /= p.sum()
    nz = p > 0
    return float(np.exp(-(p[nz] * np.log(p[nz])).sum()))


realistic_losses = arrays(np.float64, st.integers(2, 200), elements=st.floats(0.0, 3.0))
fractions = st.floats(0.01, 0.99)
beta_maxes = st.floats(-2.0, 6.0).map(lambda e: 10.0 ** e)


def check_solution(losses, fraction, beta_max, beta):
    """The defining properties of the solver's answer."""
    n = np.asarray(losses).size
    target = fraction * n
    assert 0.0 < beta <= beta_max
    ppl = perplexity(losses, beta)
    assert ppl >= target * (1 - FEASIBLE_RTOL), (ppl, target)
    assert reference_perplexity(losses, beta) >= target * (1 - FEASIBLE_RTOL)
    if beta < beta_max:
        assert ppl == pytest.approx(target, rel=PERPLEXITY_RTOL)


# ---------------------------------------------------------------------------- the root finder
@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(), fraction=fractions, beta_max=beta_maxes)
def test_solution_meets_the_perplexity_target(losses, fraction, beta_max):
    beta = solve_beta_for_perplexity(losses, fraction, beta_max)
    check_solution(losses, fraction, beta_max, beta)


@settings(deadline=None, max_examples=60)
@given(losses=realistic_losses, fraction=fractions, beta_max=beta_maxes)
def test_solution_meets_the_perplexity_target_for_realistic_losses(losses, fraction, beta_max):
    assume(np.ptp(losses) > 0)
    beta = solve_beta_for_perplexity(losses, fraction, beta_max)
    check_solution(losses, fraction, beta_max, beta)


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(), fraction=fractions, beta_max=beta_maxes)
def test_solution_is_the_largest_feasible_beta(losses, fraction, beta_max):
    beta = solve_beta_for_perplexity(losses, fraction, beta_max)
    if beta < beta_max:
        # the entropy decreases with beta: a slightly larger beta breaks the constraint
        assert perplexity(losses, beta * (1 + 1e-4)) < fraction * losses.size
    else:
        assert beta == beta_max
        assert perplexity(losses, beta_max) >= fraction * losses.size * (1 - FEASIBLE_RTOL)


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(), f1=st.floats(0.01, 1.0), f2=st.floats(0.01, 1.0), beta_max=beta_maxes)
def test_beta_is_non_increasing_in_the_fraction(losses, f1, f2, beta_max):
    f1, f2 = min(f1, f2), max(f1, f2)
    assume(f1 < f2)
    b1 = solve_beta_for_perplexity(losses, f1, beta_max)
    b2 = solve_beta_for_perplexity(losses, f2, beta_max)
    # a smaller fraction is a looser constraint (up to the solver's 1e-9 tolerance on beta)
    assert b1 >= b2 * (1 - 1e-8), (b1, b2)


@settings(deadline=None, max_examples=60)
@given(n=st.integers(2, 2000), fraction=fractions, beta_max=beta_maxes,
       rel_spread=st.floats(1e-9, 1e-3), offset=st.floats(-3.0, 3.0), seed=st.integers(0, 2 ** 16))
def test_nearly_equal_losses_give_beta_max(n, fraction, beta_max, rel_spread, offset, seed):
    # spread tiny relative to 1/beta_max: even beta_max keeps the distribution almost uniform
    losses = offset + (rel_spread / beta_max) * np.random.default_rng(seed).uniform(0, 1, n)
    assert solve_beta_for_perplexity(losses, fraction, beta_max) == beta_max


@pytest.mark.parametrize("fraction", [0.01, 0.5, 1.0])
@pytest.mark.parametrize("loss", [0.0, 2.5, -7.0, 1e3])
def test_single_case_gives_beta_max(fraction, loss):
    assert solve_beta_for_perplexity([loss], fraction, 42.0) == 42.0


@pytest.mark.parametrize("n", [2, 3, 10, 257, 2000])
@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.99])
def test_equal_losses_give_beta_max(n, fraction):
    assert solve_beta_for_perplexity(np.full(n, 0.7), fraction, 100.0) == 100.0


@pytest.mark.parametrize("n", [3, 9, 10, 17])
def test_equal_losses_with_fraction_one_give_beta_max(n):
    assert solve_beta_for_perplexity(np.full(n, 0.5), 1.0, 100.0) == 100.0


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(), fraction=fractions, beta_max=beta_maxes, shift=st.floats(-100.0, 100.0))
def test_invariant_to_adding_a_constant(losses, fraction, beta_max, shift):
    b = solve_beta_for_perplexity(losses, fraction, beta_max)
    b_shifted = solve_beta_for_perplexity(losses + shift, fraction, beta_max)
    assert b_shifted == pytest.approx(b, rel=1e-6)


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(), fraction=fractions, beta_max=beta_maxes, log_a=st.floats(-3.0, 3.0))
def test_scaling_losses_and_beta_max_scales_beta(losses, fraction, beta_max, log_a):
    a = 10.0 ** log_a
    b = solve_beta_for_perplexity(losses, fraction, beta_max)
    b_scaled = solve_beta_for_perplexity(a * losses, fraction, beta_max / a)
    assert b_scaled == pytest.approx(b / a, rel=1e-6)


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(), beta_max=beta_maxes)
def test_fraction_one_with_differing_losses_gives_zero(losses, beta_max):
    # the losses must differ at the scale of beta_max: with beta_max * spread ~ 1e-8 the entropy
    # deficit (~1e-17) is below float64 resolution and softmax(beta_max L) is uniform to rounding
    assume(beta_max * np.ptp(losses) >= 1e-3)
    assert solve_beta_for_perplexity(losses, 1.0, beta_max) == 0.0


@pytest.mark.parametrize("losses,fraction,beta_max,expected", [
    # perplexity can never fall below the number of tied maxima: beta_max
    ([1.0, 1.0, 0.0, 0.0], 0.5, 1e3, 1e3),
    # f * n < 1: every distribution is spread over at least one case
    ([0.0, 1.0, 2.0], 0.2, 50.0, 50.0),
    # two cases: perplexity 1.5 of softmax(beta [0, 1]) (symmetric in the sign of the gap)
    ([0.0, 1.0], 0.75, 1e3, None),
    ([1.0, 0.0], 0.75, 1e3, None),
], ids=["ties-at-max", "f-times-n-below-1", "two-cases", "two-cases-reversed"])
def test_small_hand_checked_cases(losses, fraction, beta_max, expected):
    beta = solve_beta_for_perplexity(losses, fraction, beta_max)
    if expected is not None:
        assert beta == expected
    else:
        check_solution(np.array(losses), fraction, beta_max, beta)
        assert beta < beta_max
        # two cases: p = sigmoid(beta); H(p) = log 1.5 has one root with p > 1/2
        p = 1 / (1 + math.exp(-beta))
        assert -(p * math.log(p) + (1 - p) * math.log(1 - p)) == pytest.approx(math.log(1.5), rel=1e-8)


def test_docstring_example():
    losses = [0.1, 0.2, 0.3, 0.9]
    beta = solve_beta_for_perplexity(losses, fraction=0.5, beta_max=1e3)
    assert perplexity(losses, beta) / 4 == pytest.approx(0.5, rel=1e-8)


@pytest.mark.parametrize("losses,fraction,beta_max,match", [
    ([0.1, 0.2], 0.0, 10.0, "fraction"),
    ([0.1, 0.2], -0.5, 10.0, "fraction"),
    ([0.1, 0.2], 1.0000001, 10.0, "fraction"),
    ([0.1, 0.2], 2.0, 10.0, "fraction"),
    ([0.1, 0.2], float("nan"), 10.0, "fraction"),
    ([0.1, 0.2], 0.5, 0.0, "beta_max"),
    ([0.1, 0.2], 0.5, -1.0, "beta_max"),
    ([0.1, 0.2], 0.5, float("inf"), "beta_max"),
    ([0.1, 0.2], 0.5, float("nan"), "beta_max"),
    ([0.1, float("nan")], 0.5, 10.0, "finite"),
    ([0.1, float("inf")], 0.5, 10.0, "finite"),
    ([float("-inf"), 0.1], 0.5, 10.0, "finite"),
    ([], 0.5, 10.0, "non-empty"),
], ids=["f-zero", "f-negative", "f-just-above-1", "f-two", "f-nan", "beta-max-zero", "beta-max-negative",
        "beta-max-inf", "beta-max-nan", "loss-nan", "loss-inf", "loss-minus-inf", "empty"])
def test_bad_inputs_raise(losses, fraction, beta_max, match):
    with pytest.raises(ValueError, match=match):
        solve_beta_for_perplexity(losses, fraction, beta_max)


@pytest.mark.parametrize("n", [2, 100, 2000])
def test_extreme_spreads(n):
    """Spreads of 1e-6 and 1e3 with the same shape: the same beta * spread (scale-free)."""
    base = np.random.default_rng(n).uniform(0, 1, n)
    for beta_max in (1e12, 1e3):
        betas = [solve_beta_for_perplexity(spread * base, 0.3, beta_max / spread) * spread
                 for spread in (1e-6, 1.0, 1e3)]
        assert betas == pytest.approx([betas[1]] * 3, rel=1e-6)


# ---------------------------------------------------------------------------- helpers
@pytest.mark.parametrize("losses,beta,expected", [
    ([0.3, 0.3, 0.3], 5.0, 3.0),
    ([0.0, 1.0, 2.0, 3.0], 0.0, 4.0),
    ([0.0, 1.0], 1e6, 1.0),
    ([0.0, 1e3], 1e6, 1.0),  # beta * L = 1e9: no overflow
], ids=["equal", "beta-zero", "one-dominates", "huge-exponent"])
def test_perplexity_basics(losses, beta, expected):
    assert perplexity(losses, beta) == pytest.approx(expected, rel=1e-12)
    assert entropy_of_softmax(losses, beta) == pytest.approx(math.log(expected), abs=1e-12)


@settings(deadline=None, max_examples=60)
@given(losses=realistic_losses, beta=st.floats(0.0, 1e3))
def test_perplexity_matches_reference(losses, beta):
    assert perplexity(losses, beta) == pytest.approx(reference_perplexity(losses, beta), rel=1e-9)
    assert 1.0 - 1e-12 <= perplexity(losses, beta) <= losses.size * (1 + 1e-12)


@pytest.mark.parametrize("losses,kappa,beta_max,expected", [
    ([0.0, 0.2], 1.0, 100.0, 10.0),          # kappa / std
    ([0.0, 0.2], 3.0, 100.0, 30.0),
    ([0.0, 0.2], 1.0, 5.0, 5.0),             # capped
    ([0.4, 0.4, 0.4], 1.0, 100.0, 100.0),    # equal losses
    ([0.0, 1e-4], 1.0, 100.0, 100.0),        # std 5e-5 < kappa / beta_max
    ([7.0], 1.0, 100.0, 100.0),              # one case
], ids=["kappa-over-std", "kappa-3", "capped", "equal", "tiny-spread", "single"])
def test_beta_from_spread(losses, kappa, beta_max, expected):
    assert beta_from_spread(losses, kappa, beta_max) == pytest.approx(expected, rel=1e-12)


@settings(deadline=None, max_examples=60)
@given(losses=loss_vectors(max_n=500), kappa=st.floats(0.01, 10.0), beta_max=beta_maxes,
       shift=st.floats(-10.0, 10.0), log_a=st.floats(-3.0, 3.0))
def test_beta_from_spread_is_scale_free(losses, kappa, beta_max, shift, log_a):
    a = 10.0 ** log_a
    b = beta_from_spread(losses, kappa, beta_max)
    assert b == pytest.approx(min(beta_max, kappa / np.std(losses)), rel=1e-12)
    assert beta_from_spread(losses + shift, kappa, beta_max) == pytest.approx(b, rel=1e-6)
    assert beta_from_spread(a * losses, kappa, beta_max / a) == pytest.approx(b / a, rel=1e-9)


@pytest.mark.parametrize("kappa", [0.0, -1.0, float("nan")], ids=["zero", "negative", "nan"])
def test_beta_from_spread_rejects_bad_kappa(kappa):
    with pytest.raises(ValueError, match="kappa"):
        beta_from_spread([0.0, 1.0], kappa, 100.0)
