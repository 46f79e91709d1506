"""Related methods (docs/methods.md) as rows of the digits experiment: each row's draws and
weights are what the package's core computes (chi-square sampler, KL reweighter, learning to
reweight), and every row runs in the training loop with its cost measured.

Budget: a few seconds (tens of iterations on 8x8 images, a handful of look-ahead steps).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nnunet_dro.lab.experiments import digits
from nnunet_dro.sampling.distributions import chi2_dro_probabilities, kl_dro_probabilities
from nnunet_dro.weighting.learning_to_reweight import learning_to_reweight

RELATED = ["dro-warmup-beta10", "dro-chi2-beta1", "dro-chi2-beta10", "dro-chi2-warmup", "kl-reweight",
           "kl-reweight-beta10", "l2rw"]


@pytest.fixture(scope="module")
def split() -> digits.DigitsSplit:
    return digits.load_imbalanced_digits(rare_fraction=0.035)


def _context(split, seed=0, iterations=100, model=None):
    if model is None:
        torch.manual_seed(seed)
        model = digits.SmallCNN()
    return digits.MethodContext(split.num_train, split.y_train, seed, iterations=iterations,
                                lr=digits.DEFAULT_LR, model=model,
                                inputs=torch.from_numpy(split.x_train).unsqueeze(1),
                                targets=torch.from_numpy(split.y_train))


def test_related_rows_are_registered_and_run_by_default():
    for name in RELATED:
        assert name in digits.METHODS and digits.METHODS[name].description
        assert name in digits.DEFAULT_METHODS
    # the required baselines stay in the default; the KL beta sweep stays selectable
    assert {"erm", "dro-is-beta10", "dro-beta10"} <= set(digits.DEFAULT_METHODS)
    assert {"dro-is-beta0.1", "dro-is-beta1", "dro-is-beta100"} <= set(digits.METHODS)
    assert set(digits.DEFAULT_METHODS) <= set(digits.METHODS)
    assert digits.METHODS["kl-reweight"].settings["beta"] == "0.1→1→10"


@pytest.mark.parametrize("name, beta", [("dro-chi2-beta1", 1.0), ("dro-chi2-beta10", 10.0)])
def test_chi2_rows_draw_from_the_chi2_rule_of_the_stale_losses(split, name, beta):
    method = digits.METHODS[name].build(_context(split))
    try:
        n = split.num_train
        easy = np.arange(0, n, 2)  # half the examples become 1 nat easier than the rest
        fresh = np.full(easy.size, math.log(10) - 1.0)
        np.testing.assert_array_equal(method.weigh(easy, fresh), np.ones(easy.size))  # no IS
        stale = np.array(method.sampler.losses)
        np.testing.assert_allclose(stale[easy], fresh)
        p = method.sampling_probabilities()
        np.testing.assert_allclose(p, chi2_dro_probabilities(stale, beta), rtol=1e-12, atol=0)
        if beta == 10.0:  # 1 + 10 * (L_easy - lam) < 0: the easy half is never drawn
            assert p[easy].max() == 0.0
            drawn = method.sample(2000)
            assert not np.isin(drawn, easy).any()
        else:  # beta 1 clips nothing here: every example keeps a chance, the harder half more
            assert p[easy].min() > 0 and p[1::2].min() > p[easy].max()
    finally:
        method.close()


@pytest.mark.parametrize("name, divergence", [("dro-chi2-warmup", "chi2"), ("dro-warmup-beta10", "kl")])
def test_warmup_rows_visit_every_example_uniformly_before_hardness_sampling(split, name, divergence):
    method = digits.METHODS[name].build(_context(split))
    try:
        n, seen = split.num_train, np.zeros(split.num_train, dtype=bool)
        assert method.sampler.divergence == divergence and method.sampler.in_warmup
        while method.sampler.in_warmup:
            p = method.sampling_probabilities()  # uniform over the examples not seen yet
            np.testing.assert_allclose(p[~seen], 1.0 / (~seen).sum())
            assert p[seen].sum() == 0.0
            idx = method.sample(64)
            assert not seen[idx].any()
            w = method.weigh(idx, np.full(idx.size, 0.5))
            np.testing.assert_array_equal(w, np.ones(idx.size))
            seen[idx] = True
        assert seen.all()  # warm-up ends exactly when every example has a fresh loss
        assert n == seen.size
        rule = chi2_dro_probabilities if divergence == "chi2" else kl_dro_probabilities
        expected = rule(np.array(method.sampler.losses), 10.0)
        np.testing.assert_allclose(method.sampling_probabilities(), expected, rtol=1e-9)
    finally:
        method.close()


def test_kl_reweight_weights_follow_the_core_formula_and_schedule(split):
    # 3 iterations: progress 0, 1/3, 2/3 -> r = 10, 1, 0.1 (the paper's schedule)
    method = digits.METHODS["kl-reweight"].build(_context(split, iterations=3))
    rng = np.random.default_rng(0)
    momentum = digits.KL_REWEIGHT_MOMENTUM
    for r in (10.0, 1.0, 0.1):
        idx = method.sample(8)
        assert idx.min() >= 0 and idx.max() < split.num_train
        losses = rng.uniform(0.0, 5.0, 8)
        w = method.weigh(idx, losses)
        # a new r restarts the running mean u: on its first batch u is the batch mean of exp(l/r)
        expected = np.exp(losses / r) / np.mean(np.exp(losses / r))
        np.testing.assert_allclose(w, expected, rtol=1e-9)
        assert method.reweighter.r == r
    # with a fixed r the running mean carries over: u = (1 - eta) u_1 + eta * mean_2
    fixed = digits.METHODS["kl-reweight-beta10"].build(_context(split, iterations=10))
    l1, l2 = rng.uniform(0, 3, 8), rng.uniform(0, 3, 8)
    fixed.weigh(fixed.sample(8), l1)
    w2 = fixed.weigh(fixed.sample(8), l2)
    u = (1 - momentum) * np.mean(np.exp(l1 / 0.1)) + momentum * np.mean(np.exp(l2 / 0.1))
    np.testing.assert_allclose(w2, np.exp(l2 / 0.1) / u, rtol=1e-9)
    # sampling stays uniform
    np.testing.assert_allclose(fixed.sampling_probabilities(), 1.0 / split.num_train)
    # a batch far harder than the running mean: the weight saturates at batch / eta, no overflow
    spike = np.zeros(8)
    spike[0] = 80.0
    w3 = fixed.weigh(fixed.sample(8), spike)
    assert np.all(np.isfinite(w3)) and w3[0] == pytest.approx(8 / momentum, rel=1e-9)


def test_l2rw_validation_set_is_one_training_image_per_digit(split):
    method = digits.METHODS["l2rw"].build(_context(split, seed=3))
    val = method.validation
    assert val.size == 10 and np.unique(val).size == 10
    np.testing.assert_array_equal(np.sort(split.y_train[val]), np.arange(10))  # includes a rare 3
    other_seed = digits.METHODS["l2rw"].build(_context(split, seed=4)).validation
    assert not np.array_equal(val, other_seed)  # drawn per training seed


def test_l2rw_weights_are_the_cores_times_batch_size(split):
    context = _context(split, seed=1)
    method = digits.METHODS["l2rw"].build(context)
    for _ in range(3):
        idx = method.sample(16)
        losses = context.loss_fn(context.model(context.inputs[idx]), context.targets[idx])
        w = method.weigh(idx, losses.detach().double().numpy())
        assert w.shape == (16,) and np.all(w >= 0)
        assert math.isclose(w.sum(), 16.0, rel_tol=1e-5) or not w.any()  # sum_i w_i l_i = mean(w * l)
        core = learning_to_reweight(context.model, context.loss_fn, context.inputs[idx], context.targets[idx],
                                    context.inputs[method.validation], context.targets[method.validation],
                                    inner_lr=context.lr)
        np.testing.assert_allclose(w, 16 * core.double().numpy(), rtol=1e-5, atol=1e-9)
    with pytest.raises(ValueError, match="model"):
        digits.LearningToReweight(digits.MethodContext(split.num_train, split.y_train, 0))


def test_every_related_row_trains_and_reports_its_cost(split):
    torch.set_num_threads(1)
    runs = digits.run_experiment(split, ["erm", *RELATED], seeds=[0], iterations=8, eval_every=4)
    for run in runs:
        np.testing.assert_array_equal(run.iterations, [0, 4, 8])
        assert np.all(np.isfinite(run.train_loss))
        assert run.step_cpu_seconds > 0 and run.step_seconds > 0
        assert 0.0 <= run.rare_weight_share <= 1.0
        assert np.all((run.rare_mass > 0) & (run.rare_mass < 1))
    assert len({r.accuracy[0] for r in runs}) == 1  # paired: the same initial network for all rows
    summary = digits.summarise(runs)
    assert summary.loc[summary.method == "erm", "step_time_vs_erm"].item() == pytest.approx(1.0)
    assert (summary.step_time_vs_erm > 0).all()
    table = digits.format_markdown(summary, split.rare_class)
    assert "| kl-reweight | 0.1→1→10 | off |" in table and "| l2rw | - | off |" in table
    assert "step time vs ERM" in table.splitlines()[0]
    legend = digits.format_legend(summary.method)
    assert len(legend.splitlines()) == 1 + len(RELATED) and "Ren et al., arXiv:1803.09050" in legend
