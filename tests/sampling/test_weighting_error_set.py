"""JTT's error set inside one training (``ErrorSetWeighting``): the set is the one ``nnunet_dro jtt``
picks from the same scores, ties and all-tie cohorts are handled as it handles them, the draws
follow the fixed weights, the guard's lever, and the state a resumed run restores."""
from __future__ import annotations

import multiprocessing

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from nnunet_dro.errors import UserError
from nnunet_dro.weighting import ErrorSetSettings, ErrorSetWeighting
from nnunet_dro.weighting.error_set import error_set_probabilities
from nnunet_dro.workflows.jtt import error_set as jtt_error_set

#: a goodness-of-fit test at this level fails a correct sampler once in 10,000 runs (the seeds are
#: fixed, so a pass is reproducible); a wrong weight (4 instead of 5) gives p < 1e-30 at these sizes
ALPHA = 1e-4


def _weighting(losses, upweight=5.0, seed=0, shared=False):
    w = ErrorSetWeighting(len(losses), upweight=upweight, seed=seed, shared=shared)
    w.update(np.arange(len(losses)), losses)
    return w


def _jtt_pick(losses, fraction):
    """What ``nnunet_dro jtt`` picks when a case's score is minus its loss (lower: fitted worse)."""
    per_case = pd.DataFrame({"case": [f"case_{i:03d}" for i in range(len(losses))], "region": "x",
                             "value": -np.asarray(losses, dtype=np.float64)})
    return [int(c.split("_")[1]) for c in jtt_error_set(per_case, fraction, rule="mean-dice")]


@pytest.mark.parametrize("seed", range(40))
def test_the_set_is_what_jtt_picks_from_the_same_scores(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 60))
    losses = rng.uniform(0.0, 1.0, n)
    if seed % 2:  # coarse values: ties at the boundary are common
        losses = np.round(losses, 1)
    fraction = float(rng.choice([0.1, 0.2, 0.25, 0.5]))
    with _weighting(losses) as w:
        try:
            expected = _jtt_pick(losses, fraction)
        except UserError as e:
            with pytest.raises(UserError, match="every case would be upweighted"):
                w.fix(fraction, epoch=0)
            assert "tie at score" in str(e)
            return
        assert list(w.fix(fraction, epoch=0).cases) == expected


def test_every_case_tied_at_the_boundary_is_in():
    losses = [0.1, 0.5, 0.5, 0.5, 0.2, 0.3, 0.05, 0.0, 0.01, 0.02]   # asked: ceil(0.2 * 10) = 2
    with _weighting(losses) as w:
        choice = w.fix(0.2, epoch=4)
        assert choice.cases == (1, 2, 3) and choice.tied == (1, 2, 3) and choice.asked == 2
        assert w.fixed_at_epoch == 4 and w.in_error_set().tolist() == [False, True, True, True] + [False] * 6
    # a tie above the boundary changes nothing
    with _weighting([0.9, 0.5, 0.5, 0.1, 0.1]) as w:
        choice = w.fix(0.2, epoch=0)
        assert choice.cases == (0,) and choice.tied == () and w.choices[-1][2] == ()


def test_a_cohort_where_every_case_ties_is_refused_as_jtt_refuses_it():
    with _weighting([0.4] * 6) as w:
        with pytest.raises(UserError) as caught:
            w.fix(0.2, epoch=0)
        assert w.held_uniform and w.error_set == ()  # nothing changed: still ERM
    message = str(caught.value)
    assert message.startswith("6 of the 6 cases tie at score 0.4 (stale loss) at the boundary of the error set")
    assert "\n" not in message
    with pytest.raises(UserError, match="6 of the 6 cases tie at score -0.4 .mean-dice. at the boundary"):
        _jtt_pick([0.4] * 6, 0.2)


def test_a_case_never_drawn_counts_as_the_hardest():
    with ErrorSetWeighting(5, seed=0) as w:
        w.update([0, 1, 2, 3], [0.9, 0.1, 0.2, 0.3])
        assert w.selection_losses()[4] == np.inf
        assert w.fix(0.2, epoch=0).cases == (4,)
    with ErrorSetWeighting(6, seed=0) as w:  # two never drawn, one asked: both (a tie at inf)
        w.update([0, 1, 2, 3], [0.9, 0.1, 0.2, 0.3])
        choice = w.fix(0.1, epoch=0)
        assert choice.cases == (4, 5) and choice.tied == (4, 5)


def _frequencies(w, draws, batch=50):
    counts = np.zeros(w.num_cases, dtype=np.int64)
    for _ in range(draws // batch):
        np.add.at(counts, w.sample(batch), 1)
    return counts


def test_draws_are_uniform_until_fixed_and_follow_the_fixed_weights_after():
    losses = np.linspace(0.1, 1.0, 10)
    with _weighting(losses, upweight=5.0, seed=7) as w:
        assert np.allclose(w.probabilities(), 0.1)
        held = _frequencies(w, 20_000)
        assert stats.chisquare(held, np.full(10, 2_000.0)).pvalue > ALPHA
        w.fix(0.2, epoch=2)
        expected = error_set_probabilities(10, [8, 9], 5.0)
        assert expected[9] == pytest.approx(5 / 18) and expected[0] == pytest.approx(1 / 18)
        np.testing.assert_allclose(w.probabilities(), expected)
        fixed = _frequencies(w, 40_000)
        assert stats.chisquare(fixed, 40_000 * expected).pvalue > ALPHA
        # the pooled share of the set: a binomial interval that excludes lambda = 4 (16/32 = 0.5)
        share = stats.binomtest(int(fixed[[8, 9]].sum()), 40_000).proportion_ci(confidence_level=1 - ALPHA)
        assert share.low <= 10 / 18 <= share.high and share.low > 0.5
        # the shares the report shows count what update() received after the set was chosen
        w.update(np.arange(10), losses)
        w.update([9, 9, 8], [1.0, 1.0, 0.9])
        assert w.draws_since_fixed.tolist() == [1] * 8 + [2, 3] and w.draw_shares()[9] == pytest.approx(3 / 13)


def _child_draws(w, queue):
    queue.put(_frequencies(w, 20_000))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_data_loading_worker_follows_the_set_chosen_after_it_started():
    """The augmentation workers hold copies made before the ERM phase ended: the set reaches them
    through shared memory."""
    ctx = multiprocessing.get_context("fork")
    with _weighting(np.linspace(0.1, 1.0, 10), upweight=5.0, seed=3, shared=True) as w:
        queue = ctx.Queue()
        w.fix(0.2, epoch=0)
        worker = ctx.Process(target=_child_draws, args=(w, queue))
        worker.start()
        counts = queue.get(timeout=120)
        worker.join(timeout=60)
        expected = 20_000 * error_set_probabilities(10, [8, 9], 5.0)
        assert stats.chisquare(counts, expected).pvalue > ALPHA


def test_the_guard_backs_off_to_uniform_and_returns_with_the_escalated_upweight():
    with _weighting(np.linspace(0.1, 1.0, 10)) as w:
        w.fix(0.2, epoch=0)
        assert w.set_backoff(True) and np.allclose(w.probabilities(), 0.1)
        assert w.set_backoff(False, 3.0)
        np.testing.assert_allclose(w.probabilities(), error_set_probabilities(10, [8, 9], 3.0))
        assert w.error_set == (8, 9)  # the guard never changes the set
        with pytest.raises(ValueError, match="upweight"):
            w.set_backoff(False, 0.5)


def test_the_state_restores_the_set_the_weights_and_the_next_draws():
    losses = np.linspace(0.1, 1.0, 10)
    with _weighting(losses, seed=11) as w:
        w.fix(0.2, epoch=5)
        w.update([1, 9], [0.3, 0.2])
        w.set_backoff(False, 3.0)
        state = w.state_dict()
        nxt = w.sample(20)
    with ErrorSetWeighting(10, upweight=5.0, seed=99) as resumed:
        resumed.load_state_dict(state)
        assert resumed.error_set == (8, 9) and resumed.fixed_at_epoch == 5 and not resumed.held_uniform
        np.testing.assert_allclose(resumed.probabilities(), error_set_probabilities(10, [8, 9], 3.0))
        np.testing.assert_array_equal(resumed.draws_since_fixed, [0, 1] + [0] * 7 + [1])
        np.testing.assert_array_equal(resumed.sample(20), nxt)
    with ErrorSetWeighting(10, upweight=4.0) as other, pytest.raises(ValueError, match="upweight 5"):
        other.load_state_dict(state)


def test_the_refresh_chooses_again_from_the_losses_then():
    with _weighting(np.linspace(0.1, 1.0, 10)) as w:
        w.fix(0.2, epoch=1)
        w.update([8, 9, 0, 1], [0.0, 0.0, 2.0, 3.0])
        assert w.fix(0.2, epoch=7).cases == (0, 1)
        assert [c[:2] for c in w.choices] == [(1, (8, 9)), (7, (0, 1))] and w.draws_since_fixed.sum() == 0


@pytest.mark.parametrize("field, value, expected", [
    ("error_fraction", 0.0, "0 < error_fraction < 1"), ("error_fraction", 1.0, "0 < error_fraction < 1"),
    ("upweight", 0.5, "a finite number >= 1"), ("upweight", float("inf"), "a finite number >= 1"),
    ("uniform_until_learned", None, "a pseudo-Dice in [0, 1]"), ("refresh_at", 1.0, "None or a fraction"),
    ("guard", 1, "True or False"), ("guard_recover", 0.0, "(0, 1]")])
def test_bad_settings_are_one_line_errors_naming_the_field(field, value, expected):
    with pytest.raises(ValueError) as caught:
        ErrorSetSettings(**{field: value})
    assert str(caught.value).startswith(f"ErrorSetSettings.{field} = ") and expected in str(caught.value)
    assert "\n" not in str(caught.value)
