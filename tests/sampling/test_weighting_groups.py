"""Fixed case weights, group-balanced sampling and group DRO (nnunet_dro.weighting.groups)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from nnunet_dro.weighting import FixedWeighting, GroupBalancedWeighting, GroupDROWeighting
from nnunet_dro.weighting.groups import group_balanced_weights
from sampling_helpers import chi_square_pvalue

GROUPS = ["control"] * 8 + ["spina_bifida"] * 3 + ["other"]


def _draw_counts(scheme, draws=40_000, batch=2):
    counts = np.zeros(scheme.num_cases, dtype=np.int64)
    for _ in range(draws // batch):
        np.add.at(counts, scheme.sample(batch), 1)
    return counts


def test_fixed_weights_draw_frequencies_match_the_weights_and_zero_is_never_drawn():
    weights = np.array([1.0, 2.0, 0.0, 4.0, 0.5, 0.0, 8.0])
    with FixedWeighting(weights, seed=3) as scheme:
        counts = _draw_counts(scheme)
        np.testing.assert_allclose(scheme.probabilities(), weights / weights.sum())
    assert counts[[2, 5]].sum() == 0
    keep = weights > 0
    assert chi_square_pvalue(counts[keep], counts.sum() * weights[keep] / weights.sum()) > 1e-3


def test_group_balanced_draws_each_group_equally_often_and_cases_uniformly_within():
    with GroupBalancedWeighting(GROUPS, seed=5) as scheme:
        counts = _draw_counts(scheme, draws=60_000)
    labels = np.array(GROUPS)
    per_group = np.array([counts[labels == g].sum() for g in ("control", "other", "spina_bifida")])
    assert chi_square_pvalue(per_group, np.full(3, counts.sum() / 3)) > 1e-3
    controls = counts[labels == "control"]
    assert chi_square_pvalue(controls, np.full(controls.size, controls.sum() / controls.size)) > 1e-3


def test_group_balanced_weights_table():
    np.testing.assert_allclose(group_balanced_weights(["a", "b", "b", "b"]), [0.5, 1 / 6, 1 / 6, 1 / 6])
    np.testing.assert_allclose(group_balanced_weights(["x"] * 4), [0.25] * 4)  # one group: uniform


def test_group_dro_follows_the_exponentiated_gradient_rule_by_hand():
    # groups a (cases 0, 1) and b (case 2); eta 1; q starts uniform (1/2, 1/2)
    with GroupDROWeighting(["a", "a", "b"], eta=1.0, seed=0) as scheme:
        # batch 1: a's mean loss (0.2 + 0.4) / 2 = 0.3, b's 1.0
        w = scheme.weights([0, 1, 2], [0.2, 0.4, 1.0])
        qa, qb = math.exp(0.3) / (math.exp(0.3) + math.exp(1.0)), math.exp(1.0) / (math.exp(0.3) + math.exp(1.0))
        np.testing.assert_allclose(w, [2 * qa, 2 * qa, 2 * qb], rtol=1e-12)  # weights use the updated q
        assert scheme.group_weights() == pytest.approx({"a": 0.5, "b": 0.5})  # weights() is pure
        scheme.update([0, 1, 2], [0.2, 0.4, 1.0])
        assert scheme.group_weights() == pytest.approx({"a": qa, "b": qb}, rel=1e-12)
        # batch 2: only group a present (loss -0.5): only q_a moves, then q is renormalised
        scheme.update([1], [-0.5])
        za, zb = qa * math.exp(-0.5), qb
        assert scheme.group_weights() == pytest.approx({"a": za / (za + zb), "b": zb / (za + zb)}, rel=1e-12)
        # a non-finite loss moves nothing and weighs 1
        before = scheme.group_weights()
        assert scheme.weights([2], [float("nan")]).tolist() == [1.0]
        scheme.update([2], [float("nan")])
        assert scheme.group_weights() == pytest.approx(before)
        assert scheme.draw_counts.tolist() == [1, 2, 1]


def test_group_dro_state_round_trip_and_mismatches():
    with GroupDROWeighting(GROUPS, eta=0.1, seed=1) as a:
        for _ in range(20):
            idx = a.sample(2)
            a.update(idx, np.random.default_rng(int(idx[0])).uniform(0, 1, 2))
        state = a.state_dict()
        with GroupDROWeighting(GROUPS, eta=0.1, seed=9) as b:
            b.load_state_dict(state)
            assert b.group_weights() == pytest.approx(a.group_weights())
            np.testing.assert_array_equal(b.draw_counts, a.draw_counts)
            np.testing.assert_array_equal(b.sample(6), a.sample(6))  # the RNG stream continues
        with GroupDROWeighting(GROUPS[::-1], seed=0) as other, pytest.raises(ValueError, match="groups"):
            other.load_state_dict(state)
    with FixedWeighting([1.0, 2.0], seed=0) as fixed, FixedWeighting([2.0, 1.0], seed=0) as changed:
        with pytest.raises(ValueError, match="other case weights"):
            changed.load_state_dict(fixed.state_dict())


@pytest.mark.parametrize("weights, message", [
    ([], "no case weights"),
    ([1.0, -1.0], "finite and >= 0"),
    ([1.0, float("nan")], "finite and >= 0"),
    ([1.0, float("inf")], "finite and >= 0"),
    ([0.0, 0.0], "every case weight is 0"),
])
def test_bad_weights_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        FixedWeighting(weights)


@pytest.mark.parametrize("eta", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_eta_is_refused(eta):
    with pytest.raises(ValueError, match="eta"):
        GroupDROWeighting(["a", "b"], eta=eta)


def test_epoch_stats_report_draws_and_q_per_group():
    with GroupDROWeighting(["a", "a", "b"], eta=1.0, seed=0) as scheme:
        scheme.update([0, 2, 2], [0.1, 0.5, 0.7])
        stats = scheme.epoch_stats()
        assert stats["group_draws"] == {"a": 1, "b": 2}
        assert sum(stats["group_weights"].values()) == pytest.approx(1.0)
        assert scheme.epoch_stats()["group_draws"] == {"a": 0, "b": 0}  # per epoch
        assert scheme.group_draw_counts() == {"a": 1, "b": 2}  # since the start
