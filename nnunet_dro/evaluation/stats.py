"""Summary statistics, paired tests and bootstrap intervals for per-case scores.

All statistics ignore NaN values (cases left out by ``--empty nan``); ``n`` counts the values
used. Percentiles are numpy's default (linear interpolation); ``iqr = p75 - p25``; ``std`` is the
sample standard deviation (``ddof=1``; NaN when ``n < 2``).

Tails are direction-aware: ``pXX`` is the value of the worst XX % of cases, the XXth percentile
of a metric that is better high (Dice) and the (100 - XX)th of one better low (HD95);
``cvar10`` is the mean of the worst ``ceil(n / 10)`` cases (:func:`tail_count`).

>>> s = summarize([10.0, 20.0, 30.0, 40.0, float("nan")], (25, 10, 5))
>>> s["n"], s["mean"], s["median"], s["iqr"], s["p10"], s["cvar10"]
(4, 25.0, 25.0, 15.0, 13.0, 10.0)
>>> summarize([10.0, 20.0, 30.0, 40.0], (10,), higher_is_better=False)["p10"]  # a distance: worst is high
37.0
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
CVAR_PERCENT = 10
CVAR_COLUMN = f"cvar{CVAR_PERCENT}"


def percentile_column(q: float) -> str:
    """Column name of a percentile: 25 -> ``p25``, 2.5 -> ``p2.5``."""
    return f"p{q:g}"


def tail_quantile(q: float, higher_is_better: bool) -> float:
    """The numpy percentile that is the worst ``q`` %: ``q`` (better high) or ``100 - q`` (better low).

    >>> tail_quantile(10, True), tail_quantile(10, False)
    (10, 90)
    """
    return q if higher_is_better else 100 - q


def tail_count(n: int, percent: int = CVAR_PERCENT) -> int:
    """Number of cases in the worst ``percent`` %: ``ceil(percent * n / 100)`` in integer
    arithmetic (so 10 % of 30 cases is 3, not ``ceil(3.0000000000000004)``), at least 1 when n > 0.

    >>> [tail_count(n) for n in (1, 9, 10, 11, 30, 41)]
    [1, 1, 1, 2, 3, 5]
    """
    return -(-percent * n // 100)


def cvar(values: Sequence[float], higher_is_better: bool = True, percent: int = CVAR_PERCENT) -> float:
    """Mean of the worst :func:`tail_count` values (NaN dropped; NaN if none).

    >>> cvar([50, 90, 10, 80, 70, 60, 95, 85, 75, 65, 55]), cvar([1, 2, 3, 9], higher_is_better=False)
    (30.0, 9.0)
    """
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return float("nan")
    k = tail_count(array.size, percent)
    ordered = np.sort(array)
    return float(ordered[:k].mean() if higher_is_better else ordered[-k:].mean())


def _cvar_rows(samples: np.ndarray, higher_is_better: bool, percent: int = CVAR_PERCENT) -> np.ndarray:
    """:func:`cvar` of every row of a 2-D array without NaN (one bootstrap resample per row)."""
    k = tail_count(samples.shape[1], percent)
    ordered = np.sort(samples, axis=1)
    return ordered[:, :k].mean(axis=1) if higher_is_better else ordered[:, -k:].mean(axis=1)


def summarize(values: Sequence[float], percentiles: Sequence[float],
              higher_is_better: bool = True) -> dict[str, float]:
    """``n, mean, std, median, iqr``, one ``pXX`` per requested percentile (the worst XX %, by the
    metric's direction) and ``cvar10`` (NaN values dropped)."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    result: dict[str, float] = {"n": int(array.size)}
    if array.size == 0:
        result.update(mean=np.nan, std=np.nan, median=np.nan, iqr=np.nan)
        result.update({percentile_column(q): np.nan for q in percentiles})
        result[CVAR_COLUMN] = np.nan
        return result
    p25, p75 = np.percentile(array, [25, 75])
    result.update(mean=float(np.mean(array)),
                  std=float(np.std(array, ddof=STD_DDOF)) if array.size > STD_DDOF else np.nan,
                  median=float(np.median(array)), iqr=float(p75 - p25))
    result.update({percentile_column(q): float(np.percentile(array, tail_quantile(q, higher_is_better)))
                   for q in percentiles})
    result[CVAR_COLUMN] = cvar(array, higher_is_better)
    return result


def bootstrap_summary_intervals(values: Sequence[float], higher_is_better: bool = True, n_bootstrap: int = 1000,
                                confidence: float = 0.95, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Case-resampling percentile-bootstrap intervals of the mean and of ``cvar10`` of one
    method's scores in one group: ``{"mean": (low, high), "cvar10": (low, high)}`` (NaN without
    values). Resamples cases of that group only, so it says how much the statistic depends on
    which cases were drawn; it is not run-to-run (training) variance."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0 or n_bootstrap <= 0:
        return {"mean": (np.nan, np.nan), CVAR_COLUMN: (np.nan, np.nan)}
    rng = np.random.default_rng(seed)
    samples = array[rng.integers(0, array.size, size=(n_bootstrap, array.size))]
    return {"mean": _interval(samples.mean(axis=1), confidence),
            CVAR_COLUMN: _interval(_cvar_rows(samples, higher_is_better), confidence)}


def _interval(statistics: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(statistics, [tail, 100 - tail])
    return float(low), float(high)


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
                                    seed: int = 0, higher_is_better: bool = True) -> dict[float, tuple[float, float]]:
    """Percentile-bootstrap confidence interval of ``pXX(values) - pXX(reference)`` (``pXX`` the
    worst XX %, see :func:`tail_quantile`), resampling cases (pairs kept together). Returns
    ``{q: (low, high)}``; NaN without pairs."""
    a, b = _paired(values, reference)
    if a.size == 0 or n_bootstrap <= 0:
        return {q: (np.nan, np.nan) for q in percentiles}
    rng = np.random.default_rng(seed)
    index = rng.integers(0, a.size, size=(n_bootstrap, a.size))
    qs = np.asarray([tail_quantile(q, higher_is_better) for q in percentiles], dtype=float)
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


def bootstrap_cvar_difference(values: Sequence[float], reference: Sequence[float], higher_is_better: bool = True,
                              n_bootstrap: int = 1000, confidence: float = 0.95,
                              seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``cvar10(values) - cvar10(reference)`` on paired cases
    (pairs resampled together; the same resamples as the other differences for one seed)."""
    a, b = _paired(values, reference)
    if a.size == 0 or n_bootstrap <= 0:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    index = rng.integers(0, a.size, size=(n_bootstrap, a.size))
    return _interval(_cvar_rows(a[index], higher_is_better) - _cvar_rows(b[index], higher_is_better), confidence)


def _paired(values, reference) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(values, dtype=float)
    b = np.asarray(reference, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]
