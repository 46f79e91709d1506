"""The decision rule of issue 78 ("Evidence at convergence"), fixed before the converged regime's
runs: which single-training arm becomes the default, whether Just Train Twice is worth its second
training, and how many paired seeds the design needs to see a gain of a given size.

It reads one table of paired gains: per arm, seed and statistic, the arm's value minus ERM's on the
same seed (same cohort, same initial weights; ERM's value the mean of its runs on that seed).
Every interval is a two-sided Student-t interval over seeds (k - 1 degrees of freedom), paired by
seed. The clauses, each of which can change the verdict (tests/lab/test_decision_rule.py flips each
one on a hand-made table):

1. **Eligible**: (a) the arm's primary gain over ERM has its Holm-adjusted interval above 0 (Holm's
   step-down over every arm compared: the arm ranked r-th by its two-sided p-value out of m is read
   at level alpha / (m - r + 1), and only while every better-ranked arm was rejected), and (b) every
   control region's mean gain has a 95 % lower bound above ``-margin`` (majority non-inferiority).
2. **The default** is the eligible single-training arm with the largest mean primary gain; arms
   within ``tie`` points of the largest are told apart by their worst control cost (the smallest
   mean control gain; the arm whose worst control is least lowered wins). No single-training arm
   eligible: the current default stays, and nothing single-training is shown to help.
3. **Just Train Twice** (two trainings) is recommended over that default only where it is eligible
   itself and the paired JTT - default interval on the primary statistic lies above 0.
4. **The design**: the smallest gain a paired two-sided t-test detects with 80 % power at Holm's
   strictest level (alpha / m: one arm carrying the effect) from the spread of per-seed gains; seeds
   are added until that gain is at most the target.

Secondary statistics are reported beside the verdict by the caller, never used to pick.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.runs import t_interval

ALPHA = 0.05
#: a control region's mean gain must have its lower bound above -MARGIN (points of Dice)
MARGIN = 1.0
#: primary gains closer than this (points) count as a tie, broken by the worst control cost
TIE = 1.0
#: the power the design must have for its detectable gain, and that gain's ceiling (points)
POWER = 0.8
TARGET_GAIN = 8.0
MIN_SEEDS = 10


@dataclass(frozen=True)
class Rule:
    """What the rule reads: the primary statistic, the control statistics, the arms that may become
    the default (one training each), the default now, and the two-training arm."""

    primary: str
    controls: tuple[str, ...]
    single_training: tuple[str, ...]
    current_default: str
    two_trainings: str = "JTT"
    alpha: float = ALPHA
    margin: float = MARGIN
    tie: float = TIE


@dataclass(frozen=True)
class Verdict:
    """The rule's output: one row per arm (``arms``), the default it picks, and JTT's reading."""

    arms: pd.DataFrame
    default: str
    changed: bool
    nothing_shown: bool
    jtt_minus_default: tuple[float, float, float, int] | None  # mean, low, high, seeds
    jtt_recommended: bool

    def lines(self, rule: Rule) -> list[str]:
        """The verdict in words, for the script's output and the docs."""
        out = []
        if self.nothing_shown:
            out.append(f"No single-training arm is eligible: the default stays `{self.default}`, and nothing "
                       "single-training is shown to help.")
        elif self.changed:
            out.append(f"The default becomes `{self.default}` (eligible, largest mean primary gain).")
        else:
            out.append(f"The default `{self.default}` is eligible and stays (largest mean primary gain).")
        if self.jtt_minus_default is None:
            out.append(f"{rule.two_trainings} was not compared.")
        else:
            mean, low, high, seeds = self.jtt_minus_default
            verb = "is recommended over" if self.jtt_recommended else "is not recommended over"
            out.append(f"{rule.two_trainings} (two trainings) {verb} `{self.default}`: paired "
                       f"{rule.two_trainings} - default on {rule.primary} {mean:+.1f} ({low:.1f} to {high:.1f}), "
                       f"{seeds} seeds.")
        return out


def _per_seed(gains: pd.DataFrame, method: str, statistic: str) -> pd.Series:
    part = gains[(gains["method"] == method) & (gains["statistic"] == statistic)]
    if part.empty:
        raise UserError(f"decision rule: no gains of arm {method!r} on statistic {statistic!r}")
    series = part.set_index("seed")["gain"].astype(float)
    if series.index.duplicated().any():
        raise UserError(f"decision rule: arm {method!r} has two gains on one seed for {statistic!r}")
    return series.sort_index()


def holm(p_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Holm's step-down over ``p_values``: per test its rank (1 = smallest p), the level it is read
    at (alpha-free: the divisor m - rank + 1) and its adjusted p-value (monotone, capped at 1).

    >>> ranks, divisors, adjusted = holm(np.array([0.01, 0.04, 0.03]))
    >>> ranks.tolist(), divisors.tolist(), adjusted.round(3).tolist()
    ([1, 3, 2], [3, 1, 2], [0.03, 0.06, 0.06])
    """
    p = np.asarray(p_values, dtype=float)
    m = p.size
    order = np.argsort(p, kind="stable")
    ranks = np.empty(m, dtype=int)
    ranks[order] = np.arange(1, m + 1)
    divisors = m - ranks + 1
    stepped = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return ranks, divisors, adjusted


def decide(gains: pd.DataFrame, rule: Rule) -> Verdict:
    """The rule on ``gains`` (columns ``method``, ``seed``, ``statistic``, ``gain``: each arm minus ERM
    on one seed); every arm in the table is one of the arms compared (Holm's family)."""
    methods = sorted(set(gains["method"]))
    if rule.current_default not in methods:
        raise UserError(f"decision rule: the current default {rule.current_default!r} has no gains")
    rows = []
    for method in methods:
        primary = _per_seed(gains, method, rule.primary)
        if len(primary) < 2:
            raise UserError(f"decision rule: arm {method!r} has {len(primary)} seed(s); an interval needs 2")
        low, high = t_interval(primary.to_numpy(), 1 - rule.alpha)
        p = float(stats.ttest_1samp(primary.to_numpy(), 0.0).pvalue) if primary.std() > 0 else (
            0.0 if primary.mean() != 0 else 1.0)
        control_means = {c: float(_per_seed(gains, method, c).mean()) for c in rule.controls}
        control_lows = {c: t_interval(_per_seed(gains, method, c).to_numpy(), 1 - rule.alpha)[0]
                        for c in rule.controls}
        rows.append({"method": method, "seeds": len(primary), "gain": float(primary.mean()),
                     "ci_low": low, "ci_high": high, "p": p,
                     "worst_control": min(control_means, key=control_means.get),
                     "worst_control_gain": min(control_means.values()),
                     "lowest_control_bound": min(control_lows.values()),
                     "single_training": method in rule.single_training})
    arms = pd.DataFrame(rows)
    ranks, divisors, adjusted = holm(arms["p"].to_numpy())
    arms["holm_rank"], arms["holm_level"], arms["holm_p"] = ranks, rule.alpha / divisors, adjusted
    holm_bounds = []
    for method, level in zip(arms["method"], arms["holm_level"]):
        holm_bounds.append(t_interval(_per_seed(gains, method, rule.primary).to_numpy(), 1 - level))
    arms["holm_low"] = [b[0] for b in holm_bounds]
    arms["holm_high"] = [b[1] for b in holm_bounds]
    # (a): Holm rejects the arm's null (its adjusted p, which carries the step-down's stopping) and
    # the gain is positive, i.e. its interval at its step's level lies above 0
    arms["primary_above_0"] = (arms["holm_p"] <= rule.alpha) & (arms["gain"] > 0)
    arms["controls_noninferior"] = arms["lowest_control_bound"] > -rule.margin
    arms["eligible"] = arms["primary_above_0"] & arms["controls_noninferior"]

    candidates = arms[arms["eligible"] & arms["single_training"]]
    if candidates.empty:
        default, changed, nothing = rule.current_default, False, True
    else:
        close = candidates[candidates["gain"] >= candidates["gain"].max() - rule.tie]
        # within the tie: the smaller worst control cost, i.e. the larger worst control gain
        best = close.sort_values(["worst_control_gain", "gain"], ascending=False).iloc[0]
        default, changed, nothing = str(best["method"]), best["method"] != rule.current_default, False
    arms["default"] = arms["method"] == default

    jtt, recommended = None, False
    if rule.two_trainings in methods and rule.two_trainings != default:
        both = pd.concat([_per_seed(gains, rule.two_trainings, rule.primary),
                          _per_seed(gains, default, rule.primary)], axis=1, join="inner").dropna()
        difference = (both.iloc[:, 0] - both.iloc[:, 1]).to_numpy()
        low, high = t_interval(difference, 1 - rule.alpha)
        jtt = (float(difference.mean()), low, high, int(difference.size))
        eligible = bool(arms.set_index("method").loc[rule.two_trainings, "eligible"])
        recommended = eligible and bool(low > 0)
    return Verdict(arms, default, bool(changed), nothing, jtt, recommended)


def power(gain: float, sd: float, seeds: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided paired t-test at level ``alpha`` over ``seeds`` seeds to detect a true
    mean gain ``gain`` when the per-seed gains spread with standard deviation ``sd`` (noncentral t).

    >>> round(power(10.0, 8.3, 8), 2)   # the record's largest per-seed gain sd, 8 seeds, a +10 gain
    0.83
    """
    df = seeds - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    shift = gain * np.sqrt(seeds) / sd
    # the lower tail as the upper tail of the mirrored shift: scipy's nct.cdf returns NaN far out in
    # the tail, its sf returns 0
    return float(stats.nct.sf(critical, df, shift) + stats.nct.sf(critical, df, -shift))


def detectable_gain(sd: float, seeds: int, alpha: float = ALPHA, target_power: float = POWER) -> float:
    """The smallest true gain detected with ``target_power`` (the root of :func:`power` in the gain)."""
    if sd <= 0 or seeds < 2:
        raise UserError(f"detectable gain: needs a positive spread and at least 2 seeds (sd {sd}, seeds {seeds})")
    # bracket: at a shift of the critical value plus 5 the power is above 0.99
    upper = sd * (stats.t.ppf(1 - alpha / 2, seeds - 1) + 5) / np.sqrt(seeds)
    return float(optimize.brentq(lambda g: power(g, sd, seeds, alpha) - target_power, 1e-9, upper))


def seeds_needed(sd: float, arms: int, target: float = TARGET_GAIN, min_seeds: int = MIN_SEEDS,
                 alpha: float = ALPHA) -> int:
    """The fewest seeds (at least ``min_seeds``) at which the gain detected with 80 % power at Holm's
    strictest level (``alpha / arms``) is at most ``target``: the rule that adds seeds."""
    seeds = min_seeds
    while detectable_gain(sd, seeds, alpha / arms) > target:
        seeds += 1
    return seeds
