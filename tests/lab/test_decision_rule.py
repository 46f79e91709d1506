"""The decision rule of issue 78 (nnunet_dro.lab.decision_rule) on hand-made tables of paired gains:
each clause (Holm's adjustment, the controls' non-inferiority, the largest gain, the tie broken by
the worst control cost, no eligible arm, JTT's paired interval, JTT's own eligibility) is shown to
change the verdict by a table that differs from another in that clause alone; the power calculation
is checked against a simulation of the paired t-test it describes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from nnunet_dro.errors import UserError
from nnunet_dro.lab.decision_rule import Rule, decide, detectable_gain, holm, power, seeds_needed

SEEDS = 8
#: a fixed pattern over 8 seeds with mean 0 and sd 1, so a column's mean and sd are exactly as set
Z = np.array([0.3, -1.2, 0.8, 1.5, -0.4, 0.1, -0.9, -0.2])
Z = (Z - Z.mean()) / Z.std(ddof=1)
#: the half-width of a 95 % t-interval over 8 seeds, per unit of sd
HALF = stats.t.ppf(0.975, SEEDS - 1) / np.sqrt(SEEDS)
RULE = Rule(primary="p", controls=("c1", "c2"), single_training=("D", "A", "B"), current_default="D")
#: controls that pass non-inferiority comfortably (lower bound -0.2 - 0.5 * HALF > -1)
GOOD = {"c1": (-0.2, 0.5), "c2": (0.0, 0.5)}


def arm(method: str, primary: tuple[float, float], controls: dict = GOOD, pattern: np.ndarray = Z) -> list[dict]:
    """Per-seed gains of one arm: (mean, sd) of its primary gain and of each control's mean gain."""
    rows = [{"method": method, "seed": s, "statistic": "p", "gain": primary[0] + primary[1] * z}
            for s, z in enumerate(pattern)]
    for name, (mean, sd) in controls.items():
        rows += [{"method": method, "seed": s, "statistic": name, "gain": mean + sd * z} for s, z in enumerate(Z)]
    return rows


def table(*arms: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([r for a in arms for r in a])


def verdict_of(*arms: list[dict], rule: Rule = RULE):
    return decide(table(*arms), rule)


def test_the_intervals_are_paired_t_intervals_over_seeds():
    verdict = verdict_of(arm("D", (6.0, 4.0)), arm("A", (1.0, 4.0)))
    row = verdict.arms.set_index("method").loc["D"]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((6 - 4 * HALF, 6 + 4 * HALF))
    assert row["p"] == pytest.approx(stats.ttest_1samp(6 + 4 * Z, 0).pvalue)
    assert row["lowest_control_bound"] == pytest.approx(-0.2 - 0.5 * HALF)


def test_holm_matches_the_step_down_by_hand():
    ranks, divisors, adjusted = holm(np.array([0.02, 0.001, 0.04, 0.5]))
    assert ranks.tolist() == [2, 1, 3, 4] and divisors.tolist() == [3, 4, 2, 1]
    assert adjusted.tolist() == pytest.approx([0.06, 0.004, 0.08, 0.5])


def test_holm_adjustment_flips_eligibility():
    """A gains +4 (sd 4, p = 0.0255 over 8 seeds): its unadjusted interval lies above 0. With the
    default, A and a null arm B compared it is first in Holm's order (level 0.05 / 3) and fails; with
    only a clearly positive default ranked before it, A is read at 0.05 / 1 and passes; a null arm B
    added to that family reads A at 0.05 / 2, which p = 0.0255 misses."""
    a = arm("A", (4.0, 4.0))
    assert verdict_of(a, arm("D", (0.0, 4.0)), arm("B", (0.5, 4.0))).arms.set_index("method").loc["A", "ci_low"] > 0
    fails = verdict_of(a, arm("D", (0.0, 4.0)), arm("B", (0.5, 4.0)))
    assert not fails.arms.set_index("method").loc["A", "eligible"] and fails.nothing_shown
    passes = verdict_of(a, arm("D", (12.0, 4.0)))
    assert passes.arms.set_index("method").loc["A", "eligible"]
    # and a third arm that joins the family pushes A back below its level
    assert not verdict_of(a, arm("D", (12.0, 4.0)), arm("B", (0.5, 4.0))).arms.set_index("method").loc["A", "eligible"]


def test_control_non_inferiority_flips_eligibility():
    """A control mean gain with lower bound -0.9 keeps the arm; -1.1 drops it (margin 1 point)."""
    sd = 1.0
    keep = {"c1": (-0.9 + sd * HALF, sd), "c2": (0.0, 0.5)}
    drop = {"c1": (-1.1 + sd * HALF, sd), "c2": (0.0, 0.5)}
    assert verdict_of(arm("D", (1.0, 4.0)), arm("A", (12.0, 4.0), keep)).default == "A"
    lost = verdict_of(arm("D", (1.0, 4.0)), arm("A", (12.0, 4.0), drop))
    assert lost.default == "D" and lost.nothing_shown
    assert lost.arms.set_index("method").loc["A", "primary_above_0"]


def test_the_largest_mean_gain_becomes_the_default():
    verdict = verdict_of(arm("D", (8.0, 4.0)), arm("A", (12.0, 4.0)), arm("B", (10.0, 4.0)))
    assert verdict.default == "A" and verdict.changed and not verdict.nothing_shown
    kept = verdict_of(arm("D", (14.0, 4.0)), arm("A", (12.0, 4.0)))
    assert kept.default == "D" and not kept.changed


def test_within_a_point_the_smaller_worst_control_cost_wins():
    """A's gain is 0.8 above B's: a tie, so B's smaller worst control cost (-0.1 against -0.6)
    decides; at 1.2 above, A's larger gain does."""
    costly = {"c1": (-0.6, 0.2), "c2": (0.0, 0.2)}
    cheap = {"c1": (-0.1, 0.2), "c2": (-0.05, 0.2)}
    tie = verdict_of(arm("D", (1.0, 4.0)), arm("A", (12.8, 4.0), costly), arm("B", (12.0, 4.0), cheap))
    assert tie.default == "B"
    apart = verdict_of(arm("D", (1.0, 4.0)), arm("A", (13.2, 4.0), costly), arm("B", (12.0, 4.0), cheap))
    assert apart.default == "A"


def test_no_eligible_single_training_arm_keeps_the_default_and_says_so():
    verdict = verdict_of(arm("D", (1.0, 4.0)), arm("A", (2.0, 4.0)), arm("JTT", (14.0, 4.0)))
    assert verdict.default == "D" and verdict.nothing_shown and not verdict.changed
    assert verdict.arms.set_index("method").loc["JTT", "eligible"]  # JTT is not a single training
    assert "nothing single-training is shown to help" in verdict.lines(RULE)[0]


def test_jtt_is_recommended_only_when_its_paired_interval_over_the_default_is_above_0():
    """The same JTT gain (+14): over a default of +12 whose seeds move with JTT's, the paired
    interval is above 0 only when the default's pattern differs little from JTT's."""
    default = arm("A", (12.0, 4.0))
    close = arm("JTT", (14.0, 4.0))  # the same per-seed pattern: the difference is exactly +2 on each seed
    verdict = verdict_of(arm("D", (1.0, 4.0)), default, close)
    assert verdict.default == "A" and verdict.jtt_recommended
    assert verdict.jtt_minus_default[:3] == pytest.approx((2.0, 2.0, 2.0))
    shuffled = arm("JTT", (14.0, 4.0), pattern=Z[::-1])  # the same mean and sd, paired differently
    loose = verdict_of(arm("D", (1.0, 4.0)), default, shuffled)
    assert loose.default == "A" and not loose.jtt_recommended and loose.jtt_minus_default[1] < 0
    assert "is not recommended over `A`" in loose.lines(RULE)[1]


def test_jtt_must_be_eligible_itself():
    """A JTT far ahead of the default but lowering a control beyond the margin is not recommended."""
    costly = {"c1": (-3.0, 0.5), "c2": (0.0, 0.5)}
    verdict = verdict_of(arm("D", (8.0, 4.0)), arm("JTT", (30.0, 4.0), costly))
    assert verdict.jtt_minus_default[1] > 0 and not verdict.jtt_recommended
    assert verdict_of(arm("D", (8.0, 4.0)), arm("JTT", (30.0, 4.0))).jtt_recommended


def test_bad_tables_are_refused_in_one_line():
    with pytest.raises(UserError, match="'D' has no gains"):
        decide(table(arm("A", (5.0, 1.0))), RULE)
    one_seed = table(arm("D", (5.0, 1.0)))
    with pytest.raises(UserError, match="1 seed"):
        decide(one_seed[one_seed["seed"] == 0], RULE)
    missing = table(arm("D", (5.0, 1.0)))
    with pytest.raises(UserError, match="statistic 'c2'"):
        decide(missing[missing["statistic"] != "c2"], RULE)


def test_detectable_gain_has_the_power_it_claims():
    """Simulated paired t-tests at the detectable gain reject at the stated 80 % (20,000 designs of
    12 seeds, sd 7.4, level 0.01: standard error of the rate 0.003, tolerance 0.015)."""
    gain = detectable_gain(7.4, 12, 0.01)
    assert power(gain, 7.4, 12, 0.01) == pytest.approx(0.8, abs=1e-6)
    rng = np.random.default_rng(78)
    samples = gain + 7.4 * rng.standard_normal((20_000, 12))
    rate = np.mean(stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.01)
    assert rate == pytest.approx(0.8, abs=0.015)
    assert power(0.0, 7.4, 12, 0.01) == pytest.approx(0.01, abs=1e-9)


def test_seeds_are_added_until_the_detectable_gain_is_at_most_the_target():
    """The record's per-seed gain sd (6.6 to 8.3) with the five arms of the converged decision."""
    for sd in (6.6, 8.3):
        n = seeds_needed(sd, arms=5)
        assert detectable_gain(sd, n, 0.05 / 5) <= 8.0 < detectable_gain(sd, n - 1, 0.05 / 5)
    assert seeds_needed(1.0, arms=5) == 10  # never fewer than 10 fresh seeds
    with pytest.raises(UserError, match="positive spread"):
        detectable_gain(0.0, 10)
