"""The stability guard's decisions (:func:`nnunet_dro.training.guard.replay_guard`), without
nnU-Net: a table of edge cases, properties over random pseudo-Dice histories, and the lever it
pulls on the adaptive weighting (:meth:`AdaptiveHardnessWeighting.set_backoff`)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnunet_dro.training.guard import escalated_fraction, replay_guard
from nnunet_dro.training.stability import lost_epochs
from nnunet_dro.weighting import AdaptiveHardnessWeighting
from nnunet_dro.weighting.hardness import UNIFORM_BETA

NAN = math.nan

# (history, events as (epoch, kind, structures), epochs trained under a back-off, backed off at the end)
CASES = {
    "empty history": ([], [], (), False),
    "never learned, then 0": ([[0.3], [0.0], [0.4]], [], (), False),
    "learned, dips to 0.05 exactly (not below)": ([[0.6], [0.05], [0.6]], [], (), False),
    "learned then lost, recovered next epoch": ([[0.6], [0.0], [0.6]], [(1, "back-off", (0,)), (2, "return", (0,))],
                                                (2,), False),
    "recovery needs half of the best": ([[0.8], [0.0], [0.39], [0.4]], [(1, "back-off", (0,)), (3, "return", (0,))],
                                        (2, 3), False),
    "NaN is no evidence either way": ([[0.8], [NAN], [0.0], [NAN], [0.7]], [(2, "back-off", (0,)), (4, "return", (0,))],
                                      (3, 4), False),
    "still lost at the end": ([[0.8], [0.01], [0.02]], [(1, "back-off", (0,))], (2,), True),
    "second structure lost while backed off": ([[0.8, 0.9], [0.0, 0.9], [0.8, 0.0], [0.8, 0.9]],
                                               [(1, "back-off", (0,)), (3, "return", (0, 1))], (2, 3), False),
    "two structures lost together": ([[0.8, 0.9], [0.0, 0.01], [0.8, 0.2], [0.8, 0.5]],
                                     [(1, "back-off", (0, 1)), (3, "return", (0, 1))], (2, 3), False),
    "a new maximum raises the bar": ([[0.6], [0.9], [0.0], [0.44], [0.45]],
                                     [(2, "back-off", (0,)), (4, "return", (0,))], (3, 4), False),
    "an epoch of another length is skipped": ([[0.8], [0.0, 0.0], [0.8]], [], (), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_guard_edge_cases(name):
    history, events, under, at_end = CASES[name]
    state, got = replay_guard(history)
    assert [(e.epoch, e.kind, e.structures) for e in got] == events
    assert state.backed_off_epochs == under and state.backed_off is at_end
    assert state.backoffs == sum(e[1] == "back-off" for e in events)


dice = st.one_of(st.floats(0.0, 1.0), st.just(NAN))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3).flatmap(lambda k: st.lists(st.lists(dice, min_size=k, max_size=k), max_size=30)))
def test_guard_properties(history):
    state, events = replay_guard(history)
    # back-offs and returns alternate, starting with a back-off; each return follows its back-off
    kinds = [e.kind for e in events]
    assert kinds == ["back-off", "return"] * (len(kinds) // 2) + (["back-off"] if len(kinds) % 2 else [])
    assert state.backed_off == (kinds[-1:] == ["back-off"])
    # a back-off happens exactly at an epoch that lost_epochs counts, and never without one
    for e in events:
        if e.kind == "back-off":
            assert lost_epochs(history[:e.epoch + 1]) == lost_epochs(history[:e.epoch]) + 1
    if lost_epochs(history) == 0:
        assert not events and not state.backed_off_epochs
    # the epochs under a back-off are exactly those after a back-off up to (and with) its return
    expected = []
    for i in range(0, len(events), 2):
        stop = events[i + 1].epoch if i + 1 < len(events) else len(history) - 1
        expected += range(events[i].epoch + 1, stop + 1)
    assert list(state.backed_off_epochs) == expected
    # replaying a prefix gives the state of that moment (resume safety: a pure function of the log)
    for cut in range(len(history) + 1):
        prefix_state, prefix_events = replay_guard(history[:cut])
        assert prefix_events == [e for e in events if e.epoch < cut]


@pytest.mark.parametrize("backoffs, expected", [(0, 0.5), (1, 0.5), (2, 0.75), (3, 0.875), (10, 1 - 0.5 ** 10)])
def test_escalated_fraction(backoffs, expected):
    assert escalated_fraction(0.5, backoffs) == pytest.approx(expected)
    assert escalated_fraction(1.0, backoffs) == 1.0


@pytest.mark.parametrize("bad", [dict(recover=0.0), dict(recover=1.5), dict(learned=0.05, lost=0.05),
                                 dict(lost=-0.1), dict(learned=1.2)])
def test_guard_settings_are_checked(bad):
    with pytest.raises(ValueError):
        replay_guard([[0.5]], **bad)


def test_backoff_makes_the_weighting_uniform_and_state_round_trips():
    losses = np.linspace(0.1, 2.0, 20)
    w = AdaptiveHardnessWeighting(20, fraction=0.5, init_loss=losses, max_weight=5.0, seed=0)
    try:
        robust_beta = w.current_beta
        assert robust_beta > 1e-6
        assert w.set_backoff(True)
        assert w.current_beta == UNIFORM_BETA and np.allclose(w.probabilities(), 1 / 20)
        assert w.epoch_stats()["backed_off"] is True
        # the updates of a backed-off epoch keep beta uniform (it is re-solved after every update)
        idx, beta = w.sample_with_beta(2)
        w.update(idx, [5.0, 5.0], beta)
        assert w.current_beta == UNIFORM_BETA
        state = w.state_dict()
        assert w.set_backoff(False, 0.75) and w.fraction == 0.75 and w.current_beta > 1e-6
        perplexity = math.exp(w.epoch_stats()["entropy"])
        assert perplexity >= 0.75 * 20 - 1e-6
        w.load_state_dict(state)
        assert w.backed_off is True and w.fraction == 0.5 and w.current_beta == UNIFORM_BETA
        with pytest.raises(ValueError, match="fraction"):
            w.set_backoff(False, 0.0)
    finally:
        w.close()
