"""Disparity between subgroups: how far apart the best and the worst group are, and whether a
method brought them closer.

Per grouping attribute (group column), region, metric and method, from the group means of the
per-case scores (as Fairlearn's ``MetricFrame`` does with ``group_max``/``group_min``,
``difference()`` and ``ratio()``):

- ``best_group`` / ``worst_group``: the groups with the best and the worst mean, by the metric's
  direction (highest Dice, lowest HD95); ties go to the first group in display order, and when
  every group has the same mean both read ``(all groups tie)``;
- ``gap`` = best mean - worst mean for a metric better high, worst - best for one better low: how
  much better the best group does, in the metric's unit, never negative (= max - min of the group
  means);
- ``ratio`` = smallest / largest group mean (1 = parity; NaN when the largest is 0);
- ``equity_scaled`` (metrics in percent that are better high: Dice, NSD, VS), Harvard-FairSeg's
  equity-scaled metric (Tian et al., ICLR 2024, arXiv:2311.02189) computed on the 0-1 scale and
  reported in percent: ``100 * o / (1 + sum_g |m_g - o|)`` with ``o`` the overall mean and ``m_g``
  the group means, both as fractions (``o`` is the mean over every case that has a group in the
  column). Equal to the overall mean when every group has it, lower as groups drift apart.

Groups: those of the group column with at least one score; the group ``(not in table)``
(``--groups-partial``) is not a subgroup and is left out; fewer than two groups give NaN.

Intervals (``n_bootstrap > 0``): percentile bootstrap, resampling cases *within each group* (each
group keeps its size), the statistic recomputed on each resample (best and worst group chosen
again each time). Between methods, ``gap_change`` = gap(method) - gap(first method) on the cases
both scored, with the same resamples for both methods (paired), so its interval says how much
the change depends on which cases were drawn. These are case-resampling intervals: they do not
stand for run-to-run (training) variance.

>>> values = {"a": np.array([90.0, 80.0]), "b": np.array([60.0, 70.0])}
>>> stats = gap_statistics(values, higher_is_better=True, percent_scale=True)
>>> stats["best_group"], stats["worst_group"], stats["gap"], round(stats["ratio"], 4)
('a', 'b', 20.0, 0.7647)
>>> round(stats["equity_scaled"], 4)  # 0.75 / (1 + 0.10 + 0.10), in percent
62.5
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from nnunet_dro.evaluation.groups import NOT_IN_TABLE
from nnunet_dro.evaluation.metrics import METRIC_INFO

STATISTICS = ("gap", "ratio", "equity_scaled")
#: best_group and worst_group when every group has the same mean
ALL_TIED = "(all groups tie)"


def uses_equity_scaling(metric: str) -> bool:
    """Equity scaling is defined for scores in percent that are better high (Dice, NSD, VS)."""
    info = METRIC_INFO[metric]
    return info.higher_is_better and info.unit.startswith("percent")


def _from_means(means: np.ndarray, overall: np.ndarray, percent_scale: bool) -> dict[str, np.ndarray]:
    """Gap, ratio and equity-scaled score from group means (last axis: groups) and overall means."""
    largest, smallest = means.max(axis=-1), means.min(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(largest > 0, smallest / largest, np.nan)
    if percent_scale:
        spread = np.abs(means - overall[..., None]).sum(axis=-1) / 100.0
        equity = overall / (1.0 + spread)
    else:
        equity = np.full(np.shape(overall), np.nan)
    return {"gap": largest - smallest, "ratio": ratio, "equity_scaled": equity}


def gap_statistics(values: dict[str, np.ndarray], higher_is_better: bool, percent_scale: bool) -> dict:
    """Best and worst group, gap, ratio and equity-scaled score of one method's scores by group
    (NaN values dropped, groups without values left out; fewer than two groups: NaN)."""
    values = {g: v[~np.isnan(v)] for g, v in values.items()}
    values = {g: v for g, v in values.items() if v.size}
    result = {"n_groups": len(values), "n_cases": int(sum(v.size for v in values.values())),
              "overall_mean": np.nan, "best_group": "", "best_mean": np.nan, "worst_group": "",
              "worst_mean": np.nan, "gap": np.nan, "ratio": np.nan, "equity_scaled": np.nan}
    if len(values) < 2:
        return result
    names = list(values)
    means = np.array([values[g].mean() for g in names])
    overall = np.concatenate(list(values.values())).mean()
    best = int(np.argmax(means) if higher_is_better else np.argmin(means))
    worst = int(np.argmin(means) if higher_is_better else np.argmax(means))
    # Every group at the same mean: no group is best or worst ("best group control, worst group
    # control" named one group twice); float rounding of equal means counts as a tie.
    tied = bool(np.ptp(means) <= 1e-9 * max(1.0, float(np.abs(means).max())))
    result.update(overall_mean=float(overall), best_group=ALL_TIED if tied else names[best],
                  best_mean=float(means[best]), worst_group=ALL_TIED if tied else names[worst],
                  worst_mean=float(means[worst]))
    result.update({k: float(v) for k, v in _from_means(means, np.asarray(overall), percent_scale).items()})
    return result


def _resampled_means(groups: Sequence[np.ndarray], indices: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Group means (n_bootstrap, G) and pooled overall means (n_bootstrap,) of resampled groups."""
    sums = np.stack([g[i].sum(axis=1) for g, i in zip(groups, indices)], axis=1)
    sizes = np.array([g.size for g in groups], dtype=float)
    return sums / sizes, sums.sum(axis=1) / sizes.sum()


def _indices(rng: np.random.Generator, sizes: Sequence[int], n_bootstrap: int) -> list[np.ndarray]:
    return [rng.integers(0, n, size=(n_bootstrap, n)) for n in sizes]


def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return np.nan, np.nan
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_gap_intervals(values: dict[str, np.ndarray], percent_scale: bool, n_bootstrap: int,
                            confidence: float = 0.95, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Intervals of gap, ratio and equity-scaled score, cases resampled within each group."""
    groups = [v[~np.isnan(v)] for v in values.values()]
    groups = [g for g in groups if g.size]
    if len(groups) < 2 or n_bootstrap <= 0:
        return {k: (np.nan, np.nan) for k in STATISTICS}
    rng = np.random.default_rng(seed)
    means, overall = _resampled_means(groups, _indices(rng, [g.size for g in groups], n_bootstrap))
    return {k: _interval(v, confidence) for k, v in _from_means(means, overall, percent_scale).items()}


def paired_gap_change(values: dict[str, np.ndarray], reference: dict[str, np.ndarray], higher_is_better: bool,
                      percent_scale: bool, n_bootstrap: int = 0, confidence: float = 0.95,
                      seed: int = 0) -> dict:
    """``gap(values) - gap(reference)`` (and the change of the equity-scaled score) on the cases
    both scored (arrays of a group are case-matched), with paired within-group bootstrap
    intervals when ``n_bootstrap > 0``.

    >>> a = {"x": np.array([90.0, 92.0]), "y": np.array([80.0, 84.0])}
    >>> b = {"x": np.array([90.0, 94.0]), "y": np.array([70.0, 74.0])}
    >>> paired_gap_change(a, b, True, True)["gap_change"]  # 9 - 20
    -11.0
    """
    pairs = {}
    for g in values:
        if g not in reference:
            continue
        keep = ~(np.isnan(values[g]) | np.isnan(reference[g]))
        if keep.any():
            pairs[g] = (values[g][keep], reference[g][keep])
    result = {"paired_cases": int(sum(a.size for a, _ in pairs.values())), "gap_change": np.nan,
              "gap_change_ci_low": np.nan, "gap_change_ci_high": np.nan, "equity_scaled_change": np.nan,
              "equity_scaled_change_ci_low": np.nan, "equity_scaled_change_ci_high": np.nan}
    if len(pairs) < 2:
        return result
    mine = gap_statistics({g: a for g, (a, _) in pairs.items()}, higher_is_better, percent_scale)
    theirs = gap_statistics({g: b for g, (_, b) in pairs.items()}, higher_is_better, percent_scale)
    result["gap_change"] = mine["gap"] - theirs["gap"]
    result["equity_scaled_change"] = mine["equity_scaled"] - theirs["equity_scaled"]
    if n_bootstrap > 0:
        rng = np.random.default_rng(seed)
        indices = _indices(rng, [a.size for a, _ in pairs.values()], n_bootstrap)
        a_means, a_overall = _resampled_means([a for a, _ in pairs.values()], indices)
        b_means, b_overall = _resampled_means([b for _, b in pairs.values()], indices)
        a_stats = _from_means(a_means, a_overall, percent_scale)
        b_stats = _from_means(b_means, b_overall, percent_scale)
        result["gap_change_ci_low"], result["gap_change_ci_high"] = _interval(a_stats["gap"] - b_stats["gap"],
                                                                              confidence)
        if percent_scale:
            result["equity_scaled_change_ci_low"], result["equity_scaled_change_ci_high"] = _interval(
                a_stats["equity_scaled"] - b_stats["equity_scaled"], confidence)
    return result


def _values_by_group(wide: pd.DataFrame, labels: pd.Series, method: str, order: Sequence[str]) -> dict:
    if method not in wide:
        return {}
    column = wide[method]
    return {g: column[labels.reindex(column.index) == g].to_numpy(float) for g in order}


def disparity_table(per_case: pd.DataFrame, method_names: Sequence[str], region_names: Sequence[str],
                    metrics: Sequence[str], group_columns: Sequence[str], group_orders: dict[str, list[str]],
                    n_bootstrap: int = 0) -> pd.DataFrame:
    """One row per metric, method, group column and region (see the module docstring); the
    change columns compare each method with the first (empty for the first itself)."""
    rows = []
    base = method_names[0]
    for metric in metrics:
        higher = METRIC_INFO[metric].higher_is_better
        percent = uses_equity_scaling(metric)
        scores = per_case[per_case["metric"] == metric]
        for column in group_columns:
            order = [g for g in group_orders[column] if g != NOT_IN_TABLE]
            for region in region_names:
                frame = scores[scores["region"] == region]
                wide = frame.pivot(index="case", columns="method", values="value")
                labels = frame.drop_duplicates("case").set_index("case")[column]
                reference = _values_by_group(wide, labels, base, order)
                for method in method_names:
                    values = _values_by_group(wide, labels, method, order)
                    row = {"metric": metric, "method": method, "group_column": column, "region": region,
                           "direction": "higher is better" if higher else "lower is better",
                           **gap_statistics(values, higher, percent)}
                    if n_bootstrap > 0:
                        for k, (low, high) in bootstrap_gap_intervals(values, percent, n_bootstrap).items():
                            row[f"{k}_ci_low"], row[f"{k}_ci_high"] = low, high
                    row["reference_method"] = base if method != base else ""
                    change = paired_gap_change(values, reference, higher, percent, n_bootstrap) \
                        if method != base else {}
                    row.update(change)
                    rows.append(row)
    return pd.DataFrame(rows)
