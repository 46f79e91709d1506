"""Summary statistics, paired tests and bootstrap intervals for per-case scores.

All statistics ignore NaN values (cases left out by ``--empty nan``); ``n`` counts the values
used. Percentiles are numpy's default (linear interpolation); ``iqr = p75 - p25``; ``std`` is the
sample standard deviation (``ddof=1``; NaN when ``n < 2``).

>>> s = summarize([10.0, 20.0, 30.0, 40.0, float("nan")], (25, 10, 5))
>>> s["n"], s["mean"], s["median"], s["iqr"], s["p10"]
(4, 25.0, 25.0, 15.0, 13.0)
>>> holm([0.01, 0.04, 0.03, float("nan")])
[0.03, 0.06, 0.06, nan]
>>> [n for n in range(1, 9) if wilcoxon_can_reach(n)]  # two-sided exact signed-rank: 2 / 2**n < 0.05
[6, 7, 8]
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

STD_DDOF = 1


def percentile_column(q: float) -> str:
    """Column name of a percentile: 25 -> ``p25``, 2.5 -> ``p2.5``."""
    return f"p{q:g}"


def summarize(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """``n, mean, std, median, iqr`` and one ``pXX`` per requested percentile (NaN values dropped)."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    result: dict[str, float] = {"n": int(array.size)}
    if array.size == 0:
        result.update(mean=np.nan, std=np.nan, median=np.nan, iqr=np.nan)
        result.update({percentile_column(q): np.nan for q in percentiles})
        return result
    p25, p75 = np.percentile(array, [25, 75])
    result.update(mean=float(np.mean(array)),
                  std=float(np.std(array, ddof=STD_DDOF)) if array.size > STD_DDOF else np.nan,
                  median=float(np.median(array)), iqr=float(p75 - p25))
    result.update({percentile_column(q): float(np.percentile(array, q)) for q in percentiles})
    return result


def paired_wilcoxon(values: Sequence[float], reference: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of case-matched pairs (scipy's default method).

    Pairs with a NaN on either side are dropped; no pairs -> NaN; all differences zero -> 1.0.
    """
    a, b = _paired(values, reference)
    if a.size == 0:
        return float("nan")
    if np.all(a == b):
        return 1.0
    from scipy import stats as scipy_stats  # imported here: a second of start-up for one-method runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(scipy_stats.wilcoxon(a, b).pvalue)


def wilcoxon_can_reach(n_pairs: int, alpha: float = 0.05) -> bool:
    """Whether a two-sided exact Wilcoxon signed-rank test of ``n_pairs`` pairs can give p < ``alpha``
    at all: its smallest p-value, all differences of one sign, is ``2 / 2**n`` (0.0625 for 5 pairs).
    With fewer pairs a p-value says nothing (scipy's normal approximation, used with ties or zero
    differences, may still print one below 0.05)."""
    return n_pairs > 0 and 2.0 / 2.0 ** n_pairs < alpha


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); NaN stays NaN and is not
    counted in the family size."""
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m = valid.size
    if m:
        order = valid[np.argsort(p[valid], kind="stable")]
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p[i]))
            adjusted[i] = running
    return [float(round(v, 12)) if not np.isnan(v) else float("nan") for v in adjusted]


def bootstrap_percentile_difference(values: Sequence[float], reference: Sequence[float], percentiles: Sequence[float],
                                    n_bootstrap: int = 1000, confidence: float = 0.95,
                                    seed: int = 0) -> dict[float, tuple[float, float]]:
    """Percentile-bootstrap confidence interval of ``percentile(values) - percentile(reference)``,
    resampling cases (pairs kept together). Returns ``{q: (low, high)}``; NaN without pairs."""
    a, b = _paired(values, reference)
    if a.size == 0 or n_bootstrap <= 0:
        return {q: (np.nan, np.nan) for q in percentiles}
    rng = np.random.default_rng(seed)
    index = rng.integers(0, a.size, size=(n_bootstrap, a.size))
    qs = np.asarray(percentiles, dtype=float)
    differences = np.percentile(a[index], qs, axis=1) - np.percentile(b[index], qs, axis=1)  # (len(qs), n_boot)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(differences, [tail, 100 - tail], axis=1)
    return {q: (float(lo), float(hi)) for q, lo, hi in zip(percentiles, low, high)}


def bootstrap_mean_difference(values: Sequence[float], reference: Sequence[float], n_bootstrap: int = 1000,
                              confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean paired difference ``values - reference``,
    resampling cases (the same resamples as :func:`bootstrap_percentile_difference` for one seed).
    ``(NaN, NaN)`` without pairs."""
    a, b = _paired(values, reference)
    if a.size == 0 or n_bootstrap <= 0:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    index = rng.integers(0, a.size, size=(n_bootstrap, a.size))
    means = (a - b)[index].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _paired(values, reference) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(values, dtype=float)
    b = np.asarray(reference, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]
