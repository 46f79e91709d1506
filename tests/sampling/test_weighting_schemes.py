"""The case-weighting schemes of nnunet_dro.weighting: importance weights and their levers (clip,
first draw 1, self-normalisation, draw-time beta), the scale-free beta of the adaptive scheme
(perplexity constraint, shared with worker processes, state), loss smoothing, draw frequencies,
and KL reweighting."""
import math
import multiprocessing as mp
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nnunet_dro.sampling import HardnessWeightedSampler
from nnunet_dro.sampling.temperature import solve_beta_for_perplexity
from nnunet_dro.weighting import (
    AdaptiveHardnessWeighting,
    Chi2HardnessWeighting,
    HardnessWeighting,
    ImportanceWeights,
    KLReweighting,
)
from nnunet_dro.weighting.kl_reweighter import KLReweighter
from sampling_helpers import chi_square_pvalue

CLIP = (0.1, 10.0)


def perplexity_of(p):
    p = np.asarray(p, dtype=np.float64)
    nz = p > 0
    return float(np.exp(-(p[nz] * np.log(p[nz])).sum()))


def snapshot(scheme):
    """Everything weights() must leave alone."""
    return (np.array(scheme.losses), np.array(scheme.draw_counts), scheme.current_beta,
            getattr(scheme, "weight_scale", None), scheme.counters.num_weights, scheme.counters.weight_sum)


def assert_same_snapshot(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2:] == b[2:]


stale_vectors = arrays(np.float64, st.integers(2, 30), elements=st.floats(-1e3, 1e3))
batches = st.lists(st.tuples(st.integers(0, 29), st.floats(-1e3, 1e3)), min_size=1, max_size=12)


# ---------------------------------------------------------------------------- importance weights
@settings(deadline=None, max_examples=60)
@given(stale=stale_vectors, beta=st.floats(1e-3, 1e4), batch=batches)
def test_kl_weights_equal_the_samplers_importance_weights(stale, beta, batch):
    n = stale.size
    idx = np.array([i % n for i, _ in batch])
    fresh = np.array([l for _, l in batch])
    with HardnessWeighting(n, beta=beta, init_loss=stale) as w, \
            HardnessWeightedSampler(n, beta=beta, init_loss=stale) as ref:
        got = w.weights(idx, fresh)
        np.testing.assert_array_equal(got, ref.importance_weights(idx, fresh))
        np.testing.assert_array_equal(got, w.sampler.importance_weights(idx, fresh))
        assert np.all((CLIP[0] <= got) & (got <= CLIP[1]))
        expected = np.exp(np.clip(beta * (fresh - stale[idx]), math.log(CLIP[0]), math.log(CLIP[1])))
        np.testing.assert_allclose(got, expected, rtol=1e-12)


@settings(deadline=None, max_examples=60)
@given(stale=arrays(np.float64, st.integers(2, 30), elements=st.floats(0.0, 3.0)),
       beta=st.floats(1e-2, 1e2), batch=st.lists(st.tuples(st.integers(0, 29), st.floats(0.0, 3.0)),
                                                  min_size=1, max_size=12))
def test_chi2_weights_equal_the_samplers_importance_weights(stale, beta, batch):
    n = stale.size
    idx = np.array([i % n for i, _ in batch])
    fresh = np.array([l for _, l in batch])
    with Chi2HardnessWeighting(n, beta=beta, init_loss=stale) as w, \
            HardnessWeightedSampler(n, beta=beta, init_loss=stale, divergence="chi2") as ref:
        got = w.weights(idx, fresh)
        np.testing.assert_allclose(got, ref.importance_weights(idx, fresh), rtol=1e-12)
        assert np.all((CLIP[0] <= got) & (got <= CLIP[1]))


@pytest.mark.parametrize("fresh,expected", [
    (float("nan"), 1.0), (float("inf"), 1.0), (float("-inf"), 1.0),
    (1.0, 10.0), (-1.0, 0.1), (0.01, math.exp(0.1)), (0.0, 1.0),
], ids=["nan", "inf", "minus-inf", "clipped-high", "clipped-low", "inside", "equal"])
def test_kl_weight_table(fresh, expected):
    with HardnessWeighting(2, beta=10.0, init_loss=[0.0, 0.0]) as w:
        assert w.weights([1], [fresh])[0] == pytest.approx(expected, rel=1e-12)


def test_kl_weights_of_overflowing_exponents_match_the_sampler():
    with HardnessWeighting(2, beta=1e4, init_loss=[0.0, 0.0]) as w:
        fresh = [1e308, -1e308]
        np.testing.assert_array_equal(w.weights([1, 1], fresh), w.sampler.importance_weights([1, 1], fresh))


def test_non_finite_fresh_loss_gets_weight_one_and_is_not_counted():
    with HardnessWeighting(3, beta=10.0, init_loss=[0.0, 0.0, 0.0]) as w:
        idx, fresh = [0, 1, 2], [float("nan"), 0.01, float("inf")]
        np.testing.assert_allclose(w.weights(idx, fresh), [1.0, math.exp(0.1), 1.0], rtol=1e-12)
        with pytest.warns(RuntimeWarning, match="non-finite"):
            w.update(idx, fresh)
        stats_ = w.epoch_stats()
        assert stats_["num_weights"] == 1
        assert stats_["mean_raw_weight"] == pytest.approx(math.exp(0.1))
        assert stats_["num_skipped"] == 2
        assert w.draw_counts.tolist() == [0, 1, 0]


def test_clip_counters():
    with HardnessWeighting(3, beta=10.0, init_loss=[0.0, 0.0, 0.0]) as w:
        w.update([0, 1, 2], [1.0, -1.0, 0.01])  # log weights 10 (clipped), -10 (clipped), 0.1
        s = w.epoch_stats()
        assert s["clipped_fraction"] == pytest.approx(2 / 3)
        assert s["mean_raw_weight"] == pytest.approx((10.0 + 0.1 + math.exp(0.1)) / 3)
        assert s["max_raw_weight"] == pytest.approx(10.0)
        assert s["num_weights"] == 3


@pytest.mark.parametrize("importance", [
    ImportanceWeights(), ImportanceWeights(first_draw_one=True),
    ImportanceWeights(self_normalise=True), ImportanceWeights(first_draw_one=True, self_normalise=True),
    ImportanceWeights(enabled=False),
], ids=["plain", "first-draw-one", "self-normalise", "both", "off"])
@pytest.mark.parametrize("cls", [HardnessWeighting, AdaptiveHardnessWeighting, Chi2HardnessWeighting],
                         ids=["kl", "kl-adaptive", "chi2"])
def test_weights_are_pure(cls, importance):
    rng = np.random.default_rng(0)
    with cls(12, init_loss=rng.uniform(0, 1, 12), importance=importance, seed=0) as w:
        for _ in range(5):  # some history: counts, a running mean, a re-solved beta
            idx, beta = w.sample_with_beta(4)
            w.update(idx, rng.uniform(0, 1, 4), beta)
        idx, beta = w.sample_with_beta(6)
        fresh = rng.uniform(0, 1, 6)
        before = snapshot(w)
        first = w.weights(idx, fresh, beta)
        second = w.weights(idx, fresh, beta)
        np.testing.assert_array_equal(first, second)
        assert_same_snapshot(before, snapshot(w))
        if not importance.enabled:
            np.testing.assert_array_equal(first, 1.0)


def test_importance_weights_off_counts_nothing_and_gives_ones():
    with HardnessWeighting(3, beta=10.0, init_loss=[0.0, 0.0, 0.0], importance=ImportanceWeights(enabled=False)) as w:
        np.testing.assert_array_equal(w.weights([0, 1], [5.0, -5.0]), [1.0, 1.0])


# ---------------------------------------------------------------------------- first draw 1
def test_first_draw_one():
    iw = ImportanceWeights(first_draw_one=True)
    with HardnessWeighting(4, beta=10.0, init_loss=[0.0, 0.0, 0.0, 0.0], importance=iw) as w:
        w.update([0], [0.05])  # case 0 has been drawn; cases 1..3 never
        got = w.weights([0, 1, 0, 3], [0.1, 0.1, 1.0, -1.0])
        assert got[0] == pytest.approx(math.exp(10 * (0.1 - 0.05)), rel=1e-12)
        assert got[1] == 1.0 and got[3] == 1.0  # exactly 1 (the plain weights would be e^1 and 0.1)
        assert got[2] == pytest.approx(10.0)
        w.epoch_stats()
        w.update([0, 1, 3], [0.1, 0.1, -1.0])  # only case 0's weight is a real importance weight
        s = w.epoch_stats()
        assert s["num_weights"] == 1 and s["clipped_fraction"] == 0.0
        # now they have all been drawn: plain importance weights
        assert w.weights([1], [0.2])[0] == pytest.approx(math.exp(1.0), rel=1e-12)


def test_first_draw_one_ignores_cases_whose_only_loss_was_non_finite():
    iw = ImportanceWeights(first_draw_one=True)
    with HardnessWeighting(2, beta=10.0, init_loss=[0.0, 0.0], importance=iw) as w:
        with pytest.warns(RuntimeWarning):
            w.update([1], [float("nan")])
        assert w.weights([1], [0.5])[0] == 1.0


# ---------------------------------------------------------------------------- self-normalisation
def test_self_normalisation_divides_out_a_constant_raw_weight():
    beta, c = 10.0, 2.0
    d = math.log(c) / beta  # fresh = stale + d: every raw weight is exactly c (inside the clip)
    iw = ImportanceWeights(self_normalise=True)
    with HardnessWeighting(8, beta=beta, init_loss=np.zeros(8), importance=iw, seed=0) as w:
        rng = np.random.default_rng(1)
        first = None
        for step in range(400):
            idx = rng.integers(0, 8, 4)
            fresh = np.array(w.losses)[idx] + d
            got = w.weights(idx, fresh, beta)
            if first is None:
                first = got
            w.update(idx, fresh, beta)
        np.testing.assert_allclose(first, c, rtol=1e-9)  # running mean starts at 1
        assert w.weight_scale == pytest.approx(c, rel=1e-3)
        np.testing.assert_allclose(got, 1.0, atol=1e-3)
        s = w.epoch_stats()
        assert s["num_weights"] == 400 * 4
        assert s["mean_raw_weight"] == pytest.approx(c, rel=1e-9)
        assert s["clipped_fraction"] == 0.0
        # the counters reset with every epoch_stats call
        s = w.epoch_stats()
        assert s["num_weights"] == 0
        assert math.isnan(s["clipped_fraction"]) and math.isnan(s["mean_raw_weight"])
        w.update([0], [w.losses[0] + d])
        assert w.epoch_stats()["num_weights"] == 1


def test_self_normalisation_leaves_uncounted_weights_at_one():
    iw = ImportanceWeights(self_normalise=True, first_draw_one=True)
    with HardnessWeighting(3, beta=10.0, init_loss=[0.0, 0.0, 0.0], importance=iw) as w:
        w.weight_scale = 4.0
        w.update([0], [0.0])  # a first draw: weight 1, not counted, the running mean stays
        assert w.weight_scale == 4.0
        w.update([0], [0.0])  # counted: raw weight 1, running mean 0.98 * 4 + 0.02 * 1
        scale = 0.98 * 4.0 + 0.02 * 1.0
        assert w.weight_scale == pytest.approx(scale)
        got = w.weights([0, 1, 2], [0.1, 0.1, float("nan")])
        assert got[0] == pytest.approx(math.e / scale)
        assert got[1] == 1.0 and got[2] == 1.0  # never drawn / non-finite: not normalised


# ---------------------------------------------------------------------------- draw-time beta
def test_weights_use_the_draw_time_beta():
    with HardnessWeighting(3, beta=10.0, init_loss=[0.0, 0.0, 0.0]) as w:
        fresh = [0.1, 0.1]
        np.testing.assert_allclose(w.weights([0, 1], fresh), math.exp(1.0), rtol=1e-12)
        np.testing.assert_allclose(w.weights([0, 1], fresh, draw_beta=5.0), math.exp(0.5), rtol=1e-12)
        # per sample; a missing (NaN) or non-positive beta falls back to the current one
        np.testing.assert_allclose(w.weights([0, 1], fresh, draw_beta=[5.0, float("nan")]),
                                   [math.exp(0.5), math.exp(1.0)], rtol=1e-12)
        np.testing.assert_allclose(w.weights([0, 1], fresh, draw_beta=[0.0, 2.0]),
                                   [math.exp(1.0), math.exp(0.2)], rtol=1e-12)
        assert w.current_beta == 10.0


def test_adaptive_weights_use_the_beta_the_batch_was_drawn_with():
    losses = np.linspace(0.2, 1.0, 16)
    with AdaptiveHardnessWeighting(16, fraction=0.5, init_loss=losses, seed=3) as w:
        idx, draw_beta = w.sample_with_beta(4)
        assert draw_beta == w.current_beta
        w.update(np.arange(8), np.linspace(0.2, 0.3, 8))  # another batch moves beta
        assert w.current_beta != draw_beta
        fresh = np.array(w.losses)[idx] + 0.01
        expected = np.exp(np.clip(draw_beta * 0.01, math.log(0.1), math.log(10.0)))
        np.testing.assert_allclose(w.weights(idx, fresh, draw_beta), expected, rtol=1e-9)
        now = np.exp(np.clip(w.current_beta * 0.01, math.log(0.1), math.log(10.0)))
        np.testing.assert_allclose(w.weights(idx, fresh), now, rtol=1e-9)


# ---------------------------------------------------------------------------- adaptive beta
def assert_meets_perplexity_constraint(w):
    n, f = w.num_cases, w.fraction
    ppl = perplexity_of(w.probabilities())
    assert ppl >= f * n * (1 - 1e-9)
    if w.current_beta < w.beta_max:
        assert ppl == pytest.approx(f * n, rel=1e-6)
    else:
        assert w.current_beta == w.beta_max


@settings(deadline=None, max_examples=40)
@given(init=arrays(np.float64, st.integers(2, 300), elements=st.floats(0.0, 3.0)),
       fraction=st.floats(0.05, 0.95), beta_max=st.floats(-1.0, 4.0).map(lambda e: 10.0 ** e),
       seed=st.integers(0, 2 ** 16), spread=st.sampled_from([1e-4, 0.1, 3.0, 100.0]))
def test_adaptive_beta_keeps_the_perplexity_constraint(init, fraction, beta_max, seed, spread):
    with AdaptiveHardnessWeighting(init.size, fraction=fraction, beta_max=beta_max, init_loss=init,
                                   seed=seed) as w:
        assert w.adapt_every == 1
        assert w.current_beta == pytest.approx(max(solve_beta_for_perplexity(init, fraction, beta_max), 1e-12))
        assert_meets_perplexity_constraint(w)
        rng = np.random.default_rng(seed)
        for _ in range(3):
            idx, beta = w.sample_with_beta(8)
            w.update(idx, rng.uniform(0, spread, idx.size), beta)
            assert_meets_perplexity_constraint(w)
        stats_ = w.epoch_stats()
        assert stats_["beta"] == w.current_beta
        assert stats_["perplexity_fraction"] >= fraction * (1 - 1e-9)


@pytest.mark.parametrize("n,expected", [(1, 1), (100, 1), (255, 1), (256, 1), (511, 1), (512, 2),
                                        (1000, 3), (10_000, 39)])
def test_adapt_every_default(n, expected):
    with AdaptiveHardnessWeighting(n, init_loss=0.5) as w:
        assert w.adapt_every == expected == max(1, n // 256)


def test_beta_is_re_solved_every_adapt_every_updates():
    rng = np.random.default_rng(0)
    with AdaptiveHardnessWeighting(20, fraction=0.5, init_loss=rng.uniform(0, 1, 20), adapt_every=3, seed=0) as w:
        betas = [w.current_beta]
        for step in range(1, 10):
            w.update([step % 20, (step + 7) % 20], rng.uniform(0, 1 + step, 2))
            betas.append(w.current_beta)
            if step % 3:
                assert betas[-1] == betas[-2], step  # no solve in between
            else:
                assert betas[-1] == pytest.approx(solve_beta_for_perplexity(w.losses, 0.5, 100.0), rel=1e-12)
                assert_meets_perplexity_constraint(w)


@pytest.mark.parametrize("kwargs,match", [
    ({"fraction": 0.0}, "fraction"), ({"fraction": 1.5}, "fraction"),
    ({"beta_max": 0.0}, "beta_max"), ({"beta_max": float("inf")}, "beta_max"),
    ({"rule": "entropy"}, "rule"), ({"loss_smoothing": 0.0}, "loss_smoothing"),
    ({"loss_smoothing": 1.5}, "loss_smoothing"),
], ids=["f-zero", "f-above-1", "beta-max-zero", "beta-max-inf", "unknown-rule", "smoothing-zero",
        "smoothing-above-1"])
def test_adaptive_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveHardnessWeighting(4, **kwargs)


def test_spread_rule():
    losses = np.array([0.0, 0.2, 0.4, 0.6])
    with AdaptiveHardnessWeighting(4, rule="spread", kappa=2.0, beta_max=1e3, init_loss=losses) as w:
        assert w.current_beta == pytest.approx(2.0 / np.std(losses))


def _report_beta_after_signal(scheme, go, conn):
    """Worker: the beta it sees before and after the parent's update."""
    conn.send(scheme.current_beta)
    go.wait(timeout=60)
    idx, beta = scheme.sample_with_beta(4)
    conn.send((scheme.current_beta, beta, np.array(scheme.losses).tolist()))
    conn.close()


def test_pickled_copy_follows_the_owners_beta():
    init = np.linspace(0.0, 1.0, 32)
    with AdaptiveHardnessWeighting(32, fraction=0.5, init_loss=init, seed=0, shared=True) as owner:
        copy = pickle.loads(pickle.dumps(owner))  # what a spawned data-loading worker gets
        try:
            assert copy.current_beta == owner.current_beta
            old = owner.current_beta
            owner.update(np.arange(32), np.linspace(0.0, 0.01, 32))  # 100x smaller spread
            assert owner.current_beta != old
            assert copy.current_beta == owner.current_beta
            assert copy.sample_with_beta(4)[1] == owner.current_beta
            np.testing.assert_array_equal(copy.losses, owner.losses)
            np.testing.assert_array_equal(copy.probabilities(), owner.probabilities())
        finally:
            copy.close()
        assert owner.current_beta > 0  # the owner's block is still alive after the copy closed


def test_forked_worker_follows_the_owners_beta():
    ctx = mp.get_context("fork")
    init = np.linspace(0.0, 1.0, 32)
    with AdaptiveHardnessWeighting(32, fraction=0.5, init_loss=init, seed=0, shared=True) as owner:
        go = ctx.Event()
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=_report_beta_after_signal, args=(owner, go, child_conn))
        worker.start()  # the worker's copy is made before the update
        try:
            assert parent_conn.poll(60)
            before = parent_conn.recv()
            assert before == owner.current_beta
            owner.update(np.arange(32), np.linspace(0.0, 0.01, 32))
            assert owner.current_beta != before
            go.set()
            assert parent_conn.poll(60)
            seen, drawn_with, losses = parent_conn.recv()
        finally:
            go.set()
            worker.join(timeout=60)
        assert worker.exitcode == 0
        assert seen == drawn_with == owner.current_beta
        np.testing.assert_array_equal(losses, owner.losses)


def _run(scheme, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx, beta = scheme.sample_with_beta(4)
        scheme.update(idx, rng.uniform(0, 2, idx.size), beta)


def _load_quietly(scheme, state):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # see test_resume_of_adaptive_state_does_not_warn
        scheme.load_state_dict(state)


@pytest.mark.parametrize("fresh_object", [True, False], ids=["into-fresh-object", "into-itself"])
def test_adaptive_state_round_trip(fresh_object):
    iw = ImportanceWeights(self_normalise=True, first_draw_one=True)
    with AdaptiveHardnessWeighting(40, fraction=0.3, init_loss=np.linspace(0, 1, 40), importance=iw,
                                   seed=1, adapt_every=3) as w:
        _run(w, 25, seed=0)
        state = pickle.loads(pickle.dumps(w.state_dict()))
        assert w.current_beta < w.beta_max and w.weight_scale != 1.0
        expected = (np.array(w.losses), np.array(w.draw_counts), w.current_beta, w.weight_scale,
                    w._updates_since_solve)
        next_draws = [w.sample_with_beta(5)[0].tolist() for _ in range(3)]
        if fresh_object:
            other = AdaptiveHardnessWeighting(40, fraction=0.3, importance=iw, seed=99, adapt_every=3)
        else:
            _run(w, 7, seed=1)  # move on, then go back
            other = w
        try:
            _load_quietly(other, state)
            np.testing.assert_array_equal(other.losses, expected[0])
            np.testing.assert_array_equal(other.draw_counts, expected[1])
            assert other.current_beta == expected[2]
            assert other.weight_scale == expected[3]
            assert other._updates_since_solve == expected[4]
            assert [other.sample_with_beta(5)[0].tolist() for _ in range(3)] == next_draws
        finally:
            if other is not w:
                other.close()


def test_resume_of_adaptive_state_does_not_warn():
    with AdaptiveHardnessWeighting(10, fraction=0.5, init_loss=np.linspace(0, 1, 10), seed=0) as w, \
            AdaptiveHardnessWeighting(10, fraction=0.5, seed=1) as other:
        state = w.state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            other.load_state_dict(state)
        assert other.current_beta == w.current_beta


def test_adaptive_loads_a_fixed_beta_state_and_re_solves_beta():
    losses = np.linspace(0.0, 2.0, 30)
    with HardnessWeighting(30, beta=100.0, init_loss=losses, seed=0) as fixed, \
            AdaptiveHardnessWeighting(30, fraction=0.4, beta_max=50.0, seed=1) as w:
        fixed.update([0, 1], [1.5, 1.7])
        state = fixed.state_dict()
        assert "beta" not in state
        _load_quietly(w, state)
        np.testing.assert_array_equal(w.losses, fixed.losses)
        assert w.current_beta == pytest.approx(solve_beta_for_perplexity(fixed.losses, 0.4, 50.0), rel=1e-12)
        assert_meets_perplexity_constraint(w)


# ---------------------------------------------------------------------------- loss smoothing
@pytest.mark.parametrize("cls", [HardnessWeighting, AdaptiveHardnessWeighting], ids=["kl", "kl-adaptive"])
def test_loss_smoothing(cls):
    with cls(4, init_loss=[100.0, 100.0, 100.0, 100.0], loss_smoothing=0.5) as w:
        w.update([0], [2.0])  # first fresh loss replaces L_init
        assert w.losses[0] == 2.0
        w.update([0], [4.0])  # later: L += s (l - L)
        assert w.losses[0] == pytest.approx(3.0)
        w.update([0], [0.0])
        assert w.losses[0] == pytest.approx(1.5)
        w.update([1, 1], [1.0, 3.0])  # both occurrences are first draws: the mean of the two
        assert w.losses[1] == pytest.approx(2.0)
        w.update([1, 1], [4.0, 6.0])  # each moved halfway from 2: 3 and 4, mean 3.5
        assert w.losses[1] == pytest.approx(3.5)
        with pytest.warns(RuntimeWarning):
            w.update([2], [float("nan")])  # no fresh loss: L_init stays, the next one still replaces it
        assert w.losses[2] == 100.0
        w.update([2], [0.7])
        assert w.losses[2] == 0.7
        assert w.losses[3] == 100.0
        assert w.draw_counts.tolist() == [3, 4, 1, 0]


def test_no_smoothing_replaces():
    with HardnessWeighting(2, init_loss=[1.0, 1.0]) as w:
        w.update([0], [0.2])
        w.update([0], [0.9])
        assert w.losses[0] == 0.9


# ---------------------------------------------------------------------------- draw frequencies
@pytest.mark.parametrize("fraction,batch_size", [(0.3, 8), (0.7, 1)])
def test_adaptive_draw_frequencies_pass_chi_square(fraction, batch_size):
    n, draws_wanted = 40, 20000
    losses = np.random.default_rng(5).uniform(0.0, 3.0, n)
    with AdaptiveHardnessWeighting(n, fraction=fraction, init_loss=losses, seed=123) as w:
        assert w.current_beta < w.beta_max
        draws, betas = [], set()
        for _ in range(draws_wanted // batch_size):
            idx, beta = w.sample_with_beta(batch_size)
            draws.append(idx)
            betas.add(beta)
        draws = np.concatenate(draws)
        assert betas == {w.current_beta}
        expected = w.probabilities() * draws.size
        p_value = chi_square_pvalue(np.bincount(draws, minlength=n), expected)
        assert p_value > 1e-3, p_value


# ---------------------------------------------------------------------------- KL reweighting
def test_kl_reweighting_draws_uniformly():
    assert KLReweighting.uniform_draws is True
    rw = KLReweighting(10, seed=0)
    assert rw.uniform_draws
    idx, beta = rw.sample_with_beta(20000)
    assert math.isnan(beta)
    assert chi_square_pvalue(np.bincount(idx, minlength=10), np.full(10, 2000.0)) > 1e-3
    np.testing.assert_array_equal(rw.probabilities(), np.full(10, 0.1))


def test_kl_reweighting_weights_are_pure_and_equal_what_update_commits():
    schedule = ((0.0, 1.0), (0.5, 0.25))
    rw = KLReweighting(16, schedule=schedule, momentum=0.5, seed=0)
    ref = KLReweighter(schedule, momentum=0.5)
    rng = np.random.default_rng(2)
    for step in range(12):
        progress = step / 12
        rw.set_progress(progress)
        idx = rw.sample(4)
        fresh = rng.uniform(0.0, 2.0, 4)
        before = (rw.reweighter.state_dict(), np.array(rw._losses), rw.draw_counts, rw.counters.num_weights)
        w1 = rw.weights(idx, fresh)
        w2 = rw.weights(idx, fresh)
        np.testing.assert_array_equal(w1, w2)
        after = (rw.reweighter.state_dict(), np.array(rw._losses), rw.draw_counts, rw.counters.num_weights)
        assert before[0] == after[0] and before[3] == after[3]
        np.testing.assert_array_equal(before[1], after[1])
        np.testing.assert_array_equal(before[2], after[2])
        expected = ref.weights(fresh, progress)  # the reference update with the same batch
        np.testing.assert_array_equal(w1, expected)
        rw.update(idx, fresh)
        assert rw.reweighter.state_dict() == ref.state_dict()
        last = {int(i): l for i, l in zip(idx, fresh)}  # the latest loss of every case drawn
        np.testing.assert_array_equal(rw.losses[list(last)], list(last.values()))
        assert rw.current_beta == 1.0 / ref.temperature(progress)
    assert rw.draw_counts.sum() == 12 * 4


def test_kl_reweighting_equal_losses_give_weights_one():
    rw = KLReweighting(5, schedule=((0.0, 0.1),), seed=0)
    for _ in range(4):
        w = rw.weights([0, 1, 2], [0.8, 0.8, 0.8])
        np.testing.assert_allclose(w, 1.0, rtol=1e-12)
        rw.update([0, 1, 2], [0.8, 0.8, 0.8])


def test_kl_reweighting_non_finite_loss():
    rw = KLReweighting(3, seed=0)
    w = rw.weights([0, 1], [float("nan"), 0.5])
    assert w[0] == 1.0
    rw.update([0, 1], [float("nan"), 0.5])
    assert rw.draw_counts.tolist() == [0, 1, 0]
    assert rw.epoch_stats()["num_weights"] == 1


def test_kl_reweighting_state_round_trip():
    rw = KLReweighting(8, schedule=((0.0, 1.0), (0.5, 0.1)), seed=0)
    rng = np.random.default_rng(0)
    for step in range(6):
        rw.set_progress(step / 6)
        idx = rw.sample(3)
        rw.update(idx, rng.uniform(0, 1, 3))
    state = pickle.loads(pickle.dumps(rw.state_dict()))
    other = KLReweighting(8, schedule=((0.0, 1.0), (0.5, 0.1)), seed=42)
    other.load_state_dict(state)
    assert other.reweighter.state_dict() == rw.reweighter.state_dict()
    np.testing.assert_array_equal(other._losses, rw._losses)
    np.testing.assert_array_equal(other.draw_counts, rw.draw_counts)
    np.testing.assert_array_equal(other.losses, rw.losses)
    np.testing.assert_array_equal(other.sample(10), rw.sample(10))
    other.set_progress(rw.progress)
    np.testing.assert_array_equal(other.weights([0, 1], [0.3, 0.9]), rw.weights([0, 1], [0.3, 0.9]))


def test_hardness_weighting_state_round_trip():
    iw = ImportanceWeights(self_normalise=True)
    with HardnessWeighting(15, beta=20.0, init_loss=0.5, importance=iw, seed=0) as w, \
            HardnessWeighting(15, beta=20.0, importance=iw, seed=9) as other:
        _run(w, 10, seed=3)
        state = pickle.loads(pickle.dumps(w.state_dict()))
        assert state["scheme"] == "kl" and "beta" not in state
        other.load_state_dict(state)
        np.testing.assert_array_equal(other.losses, w.losses)
        np.testing.assert_array_equal(other.draw_counts, w.draw_counts)
        assert other.weight_scale == w.weight_scale != 1.0
        np.testing.assert_array_equal(other.sample(8), w.sample(8))


def test_adaptive_uniform_phase_is_erm_then_the_constraint_takes_over():
    """``uniform_until``: uniform draws and unit weights before it (stale losses still refreshed),
    the perplexity constraint from it on, and back if progress is set back (a resumed run)."""
    losses = np.linspace(0.1, 0.9, 10)
    with AdaptiveHardnessWeighting(10, fraction=0.5, init_loss=losses, uniform_until=0.5, seed=0,
                                   importance=ImportanceWeights(self_normalise=True)) as w:
        assert w.in_uniform_phase and w.current_beta == pytest.approx(1e-12)
        np.testing.assert_allclose(w.probabilities(), np.full(10, 0.1), rtol=1e-9)
        idx, beta = w.sample_with_beta(4)
        np.testing.assert_allclose(w.weights(idx, losses[idx] + 0.5, beta), 1.0, rtol=1e-9)
        w.update([0], [2.0], beta)
        assert w.losses[0] == 2.0 and w.current_beta == pytest.approx(1e-12)
        w.set_progress(0.5)
        assert not w.in_uniform_phase and w.current_beta > 1.0
        p = w.probabilities()
        assert np.exp(-(p * np.log(p)).sum()) == pytest.approx(5.0, rel=1e-6)
        w.set_progress(0.2)
        assert w.current_beta == pytest.approx(1e-12)


def test_adaptive_hold_is_erm_until_released_and_the_state_keeps_the_phase():
    """``hold_uniform``: uniform draws and unit weights until :meth:`release` (idempotent), the
    constraint from then on; the flag round-trips through the state, and a state written before the
    flag existed loads as released."""
    losses = np.linspace(0.1, 0.9, 10)
    with AdaptiveHardnessWeighting(10, fraction=0.5, init_loss=losses, hold_uniform=True, seed=0,
                                   importance=ImportanceWeights(self_normalise=True)) as w, \
            AdaptiveHardnessWeighting(10, fraction=0.5, init_loss=losses, hold_uniform=True, seed=1) as other:
        w.set_progress(0.9)  # progress alone does not end the hold
        assert w.in_uniform_phase and w.current_beta == pytest.approx(1e-12)
        idx, beta = w.sample_with_beta(4)
        np.testing.assert_allclose(w.weights(idx, losses[idx] + 0.5, beta), 1.0, rtol=1e-9)
        held = w.state_dict()
        assert held["held_uniform"] is True
        w.release()
        w.release()
        assert not w.in_uniform_phase and w.current_beta > 1.0
        p = w.probabilities()
        assert np.exp(-(p * np.log(p)).sum()) == pytest.approx(5.0, rel=1e-6)
        other.load_state_dict(pickle.loads(pickle.dumps(w.state_dict())))
        assert not other.held_uniform
        np.testing.assert_allclose(other.probabilities(), p, rtol=1e-12)
        other.load_state_dict(held)
        assert other.held_uniform and other.current_beta == pytest.approx(1e-12)
        legacy = {k: v for k, v in held.items() if k != "held_uniform"}
        other.load_state_dict(legacy)
        assert not other.held_uniform


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_adaptive_uniform_until_is_a_fraction(bad):
    with pytest.raises(ValueError, match="uniform_until"):
        AdaptiveHardnessWeighting(4, uniform_until=bad)
