"""Statistics over several training runs per method: intervals that include run-to-run variance.

A test-case bootstrap keeps the networks fixed: it says how much a statistic would move on
another draw of test cases, not on another training run. With several runs per method (seeds,
cross-validation repeats) this module gives, for each statistic (mean, median, low percentiles):

- the **point estimate**: the mean over runs of the per-run statistic;
- the **interval over runs** (``ci_runs_*``): a two-level percentile bootstrap that resamples the
  runs, then the test cases. The test cases are the same for every run, so one draw of cases is
  shared by all runs of a resample (drawing cases per run independently would treat a hard case
  as hard in one run only and understate the interval);
- the **interval over test cases** (``ci_cases_*``, today's kind): the cases resampled, every
  network fixed;
- for a **paired** comparison (the k-th run of every method shares seed k: data split, initial
  weights), the per-seed difference ``d_k = stat(method_k) - stat(reference_k)``, its mean over
  seeds, the 95 % **t-interval over seeds** (``ci_seeds_t_*``: Student t with ``k - 1`` degrees
  of freedom on the ``d_k``, the test cases fixed), the two-level bootstrap with seeds resampled
  jointly for both methods (``ci_runs_*``) and the **sign count** (``d_k > 0`` on how many seeds).

Statistics ignore NaN scores (``--empty nan``, ``--missing skip``); in a paired comparison a
case counts for seed k only where both methods scored it. Percentiles are numpy's default (linear
interpolation), as in :mod:`~nnunet_dro.evaluation.stats`.

>>> import numpy as np
>>> erm = np.array([[60.0, 70, 80, 90], [50, 60, 70, 80], [70, 80, 90, 100]])  # 3 runs x 4 cases
>>> dro = erm + np.array([[2.0], [-1.0], [5.0]])                                # seed k's run shifted
>>> per_run_statistics(erm, ["mean", "p10"])["mean"]
array([75., 65., 85.])
>>> d = paired_differences(dro, erm, ["mean"])["mean"]
>>> d, sign_count(d)
(array([ 2., -1.,  5.]), (2, 1, 0))
>>> low, high = t_interval(d)
>>> round(float(d.mean()), 3), round(low, 3), round(high, 3)
(2.0, -5.452, 9.452)
>>> bootstrap_method(erm, ["mean"], n_bootstrap=200)["mean"].point
75.0
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.evaluation.formatting import fmt as _fmt
from nnunet_dro.evaluation.formatting import interval_text, json_value
from nnunet_dro.evaluation.groups import groupings
from nnunet_dro.evaluation.metrics import METRIC_INFO

CONFIDENCE = 0.95
RUNS_INTERVAL_TEXT = "interval over runs (runs and test cases resampled)"
PAIRED_RUNS_INTERVAL_TEXT = "interval over runs (seeds and test cases resampled)"
CASES_INTERVAL_TEXT = "interval over test cases (networks fixed)"
SEEDS_T_TEXT = "95% t-interval over seeds (test cases fixed)"


def statistic_names(percentiles: Sequence[float]) -> list[str]:
    """``mean``, ``median`` and one ``pXX`` per percentile: the statistics given over runs.

    >>> statistic_names([25, 10, 5])
    ['mean', 'median', 'p25', 'p10', 'p5']
    """
    return ["mean", "median"] + [f"p{float(q):g}" for q in percentiles]


def _quantile_of(name: str, higher_is_better: bool = True) -> float | None:
    """The numpy percentile of a statistic: ``pXX`` is the worst XX % by the metric's direction (the
    XXth percentile where higher is better, the (100 - XX)th where lower is better, as the summary's)."""
    if name == "mean":
        return None
    if name == "median":
        return 50.0
    q = float(name[1:])
    return q if higher_is_better else 100.0 - q


def statistics_along_cases(values: np.ndarray, statistics: Sequence[str],
                           higher_is_better: bool = True) -> dict[str, np.ndarray]:
    """Each statistic over the last axis (the cases) of ``values``, NaN scores left out; NaN where
    a row has no score at all. Percentiles as numpy's default (linear interpolation between the
    order statistics, virtual index ``q / 100 * (n - 1)``), from one sort for all of them: the
    bootstrap calls this on arrays of resamples x runs x cases.

    >>> v = np.array([[3.0, 1.0, 2.0, np.nan], [4.0, 8.0, 6.0, 2.0]])
    >>> {k: x.tolist() for k, x in statistics_along_cases(v, ["mean", "median", "p25"]).items()}
    {'mean': [2.0, 5.0], 'median': [2.0, 5.0], 'p25': [1.5, 3.5]}
    """
    values = np.asarray(values, dtype=float)
    if values.shape[-1] == 0:  # no case at all (a group without cases)
        return {name: np.full(values.shape[:-1], np.nan) for name in statistics}
    missing = np.isnan(values)
    n = values.shape[-1] - np.sum(missing, axis=-1)
    needs_order = any(_quantile_of(name, higher_is_better) is not None for name in statistics)
    ordered = np.sort(values, axis=-1) if needs_order else values  # NaN sort last
    empty = n == 0
    last = np.maximum(n - 1, 0)
    out: dict[str, np.ndarray] = {}
    for name in statistics:
        q = _quantile_of(name, higher_is_better)
        if q is None:
            total = np.where(missing, 0.0, values).sum(axis=-1)
            out[name] = np.where(empty, np.nan, total / np.maximum(n, 1))
            continue
        position = (q / 100) * last
        low = np.floor(position).astype(int)
        high = np.minimum(low + 1, last)
        fraction = position - low
        a = np.take_along_axis(ordered, low[..., None], axis=-1)[..., 0]
        b = np.take_along_axis(ordered, high[..., None], axis=-1)[..., 0]
        # numpy's _lerp: from the nearer end, so that the result stays between a and b
        value = np.where(fraction >= 0.5, b - (b - a) * (1 - fraction), a + (b - a) * fraction)
        out[name] = np.where(empty, np.nan, value)
    return out


def per_run_statistics(values: np.ndarray, statistics: Sequence[str],
                       higher_is_better: bool = True) -> dict[str, np.ndarray]:
    """``values``: runs x cases. Returns each statistic per run (one value per row)."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 2:
        raise ValueError(f"expected runs x cases, got shape {values.shape}")
    return statistics_along_cases(values, statistics, higher_is_better)


def pair_masked(values: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both runs x cases arrays with NaN wherever either side is NaN (seed by seed)."""
    a, b = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired runs need equal shapes, got {a.shape} and {b.shape}")
    missing = np.isnan(a) | np.isnan(b)
    return np.where(missing, np.nan, a), np.where(missing, np.nan, b)


def paired_differences(values: np.ndarray, reference: np.ndarray,
                       statistics: Sequence[str]) -> dict[str, np.ndarray]:
    """Per seed k: ``stat(values[k]) - stat(reference[k])`` on the cases both scored."""
    a, b = pair_masked(values, reference)
    sa, sb = per_run_statistics(a, statistics), per_run_statistics(b, statistics)
    return {name: sa[name] - sb[name] for name in statistics}


def sign_count(differences: Sequence[float]) -> tuple[int, int, int]:
    """(seeds with a positive difference, negative, zero); NaN seeds are not counted."""
    d = np.asarray(differences, dtype=float)
    d = d[~np.isnan(d)]
    return int((d > 0).sum()), int((d < 0).sum()), int((d == 0).sum())


def t_interval(differences: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student-t interval of the mean of ``differences`` (``k - 1`` degrees of freedom); NaN with
    fewer than 2 values. Exact when the per-seed differences are normal and independent."""
    from scipy import stats as scipy_stats

    d = np.asarray(differences, dtype=float)
    d = d[~np.isnan(d)]
    if d.size < 2:
        return float("nan"), float("nan")
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))
    return float(d.mean() - half), float(d.mean() + half)


@dataclass(frozen=True)
class Interval:
    """A statistic over runs: its point estimate (mean over runs), the per-run values and two
    95 % percentile-bootstrap intervals (over runs and cases; over cases with networks fixed)."""

    point: float
    per_run: tuple[float, ...]
    ci_runs: tuple[float, float]
    ci_cases: tuple[float, float]


@dataclass(frozen=True)
class PairedInterval(Interval):
    """A paired difference over seeds: adds the t-interval over seeds and the sign count."""

    ci_seeds_t: tuple[float, float] = (float("nan"), float("nan"))
    signs: tuple[int, int, int] = (0, 0, 0)


def _bounds(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return float("nan"), float("nan")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _case_draws(rng: np.random.Generator, n_bootstrap: int, n_cases: int) -> np.ndarray:
    # the same call as stats.bootstrap_*: with one run and no NaN, ci_cases equals today's interval
    return rng.integers(0, n_cases, size=(n_bootstrap, n_cases))


def _resampled(values: np.ndarray, runs: np.ndarray | None, cases: np.ndarray) -> np.ndarray:
    """values (K, N); runs (B, K) or None (runs fixed); cases (B, N) -> (B, K, N)."""
    if runs is None:
        return np.transpose(values[:, cases], (1, 0, 2))
    return values[runs[:, :, None], cases[:, None, :]]


def _mean_over_runs(stat: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(stat, axis=-1)


def bootstrap_method(values: np.ndarray, statistics: Sequence[str], n_bootstrap: int = 2000,
                     confidence: float = CONFIDENCE, seed: int = 0,
                     higher_is_better: bool = True) -> dict[str, Interval]:
    """Each statistic of one method over its runs (``values``: runs x cases, the same cases in
    every run). With one run, ``ci_runs`` is NaN: one run says nothing about run-to-run variance."""
    values = np.asarray(values, dtype=float)
    k, n = values.shape
    per_run = per_run_statistics(values, statistics, higher_is_better)
    nan2 = (float("nan"), float("nan"))
    if n == 0 or n_bootstrap <= 0:
        return {s: Interval(float(_mean_over_runs(per_run[s])), tuple(map(float, per_run[s])), nan2, nan2)
                for s in statistics}
    cases = _case_draws(np.random.default_rng(seed), n_bootstrap, n)
    fixed = statistics_along_cases(_resampled(values, None, cases), statistics, higher_is_better)
    resampled = None
    if k > 1:
        rng = np.random.default_rng(seed + 1)
        runs = rng.integers(0, k, size=(n_bootstrap, k))
        resampled = statistics_along_cases(_resampled(values, runs, _case_draws(rng, n_bootstrap, n)), statistics,
                                           higher_is_better)
    out = {}
    for s in statistics:
        ci_runs = _bounds(_mean_over_runs(resampled[s]), confidence) if resampled is not None else nan2
        out[s] = Interval(float(_mean_over_runs(per_run[s])), tuple(map(float, per_run[s])), ci_runs,
                          _bounds(_mean_over_runs(fixed[s]), confidence))
    return out


def bootstrap_difference(values: np.ndarray, reference: np.ndarray, statistics: Sequence[str], *,
                         paired: bool, n_bootstrap: int = 2000, confidence: float = CONFIDENCE,
                         seed: int = 0, higher_is_better: bool = True) -> dict[str, Interval | PairedInterval]:
    """Difference ``method - reference`` of each statistic (its mean over runs).

    Unpaired (``paired=False``): the runs of each method are resampled independently, the test
    cases once for both (the same test set); ``per_run`` holds the method's per-run values minus
    the reference's mean over runs. Paired: seed k's runs are compared with each other (cases both
    scored), the seeds resampled jointly; adds the t-interval over seeds and the sign count.
    ``ci_runs`` is NaN where a side has a single run.
    """
    a, b = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    if paired:
        a, b = pair_masked(a, b)
    (ka, n), kb = a.shape, b.shape[0]
    nan2 = (float("nan"), float("nan"))
    pa, pb = per_run_statistics(a, statistics, higher_is_better), per_run_statistics(b, statistics, higher_is_better)
    if paired:
        per_run = {s: pa[s] - pb[s] for s in statistics}
    else:
        per_run = {s: pa[s] - _mean_over_runs(pb[s]) for s in statistics}
    point = {s: float(_mean_over_runs(pa[s]) - _mean_over_runs(pb[s])) for s in statistics}
    fixed = resampled = None
    if n > 0 and n_bootstrap > 0:
        cases = _case_draws(np.random.default_rng(seed), n_bootstrap, n)
        fa = statistics_along_cases(_resampled(a, None, cases), statistics, higher_is_better)
        fb = statistics_along_cases(_resampled(b, None, cases), statistics, higher_is_better)
        fixed = {s: _mean_over_runs(fa[s]) - _mean_over_runs(fb[s]) for s in statistics}
        if ka > 1 and kb > 1:
            rng = np.random.default_rng(seed + 1)
            runs_a = rng.integers(0, ka, size=(n_bootstrap, ka))
            runs_b = runs_a if paired else rng.integers(0, kb, size=(n_bootstrap, kb))
            cases = _case_draws(rng, n_bootstrap, n)
            ra = statistics_along_cases(_resampled(a, runs_a, cases), statistics, higher_is_better)
            rb = statistics_along_cases(_resampled(b, runs_b, cases), statistics, higher_is_better)
            resampled = {s: _mean_over_runs(ra[s]) - _mean_over_runs(rb[s]) for s in statistics}
    out: dict[str, Interval | PairedInterval] = {}
    for s in statistics:
        common = dict(point=point[s], per_run=tuple(map(float, per_run[s])),
                      ci_runs=_bounds(resampled[s], confidence) if resampled is not None else nan2,
                      ci_cases=_bounds(fixed[s], confidence) if fixed is not None else nan2)
        if paired:
            out[s] = PairedInterval(**common, ci_seeds_t=t_interval(per_run[s], confidence),
                                    signs=sign_count(per_run[s]))
        else:
            out[s] = Interval(**common)
    return out



RUN_SEPARATOR = "#"
TABLE_COLUMNS = ["kind", "method", "reference_method", "group_column", "group", "region", "metric", "statistic",
                 "paired", "n_runs", "n_runs_reference", "n_cases", "point", "ci_runs_low", "ci_runs_high",
                 "ci_cases_low", "ci_cases_high", "ci_seeds_t_low", "ci_seeds_t_high", "positive_seeds",
                 "negative_seeds", "zero_seeds", "per_run", "note"]


def run_label(method: str, k: int) -> str:
    """The name of run ``k`` (from 1) of ``method`` in ``per_case.csv`` and ``summary.csv``: ``ERM#2``."""
    return f"{method}{RUN_SEPARATOR}{k}"


@dataclass(frozen=True)
class _Cell:
    """Where a row of ``runs.csv`` belongs: shared by every method, difference and statistic of it."""

    group_column: str
    group: str
    region: str
    metric: str
    paired: bool
    n_cases: int


def _row(cell: _Cell, method: str, statistic: str, interval: Interval, note: str, *, n_runs: int,
         reference: str = "", n_ref: int | None = None) -> dict:
    """One row of ``runs.csv``: a method over its runs, or (with a ``reference``) its difference with it."""
    row = dict(kind="difference" if reference else "method", method=method, reference_method=reference,
               group_column=cell.group_column, group=cell.group, region=cell.region, metric=cell.metric,
               statistic=statistic, paired=cell.paired, n_runs=n_runs,
               n_runs_reference=n_ref, n_cases=cell.n_cases, point=interval.point,
               ci_runs_low=interval.ci_runs[0], ci_runs_high=interval.ci_runs[1],
               ci_cases_low=interval.ci_cases[0], ci_cases_high=interval.ci_cases[1],
               ci_seeds_t_low=float("nan"), ci_seeds_t_high=float("nan"), positive_seeds=None,
               negative_seeds=None, zero_seeds=None,
               per_run=";".join(f"{v:.10g}" for v in interval.per_run), note=note)
    if isinstance(interval, PairedInterval):
        row.update(ci_seeds_t_low=interval.ci_seeds_t[0], ci_seeds_t_high=interval.ci_seeds_t[1],
                   positive_seeds=interval.signs[0], negative_seeds=interval.signs[1], zero_seeds=interval.signs[2])
    return row


@dataclass(frozen=True)
class RunsTableScope:
    """What :func:`runs_table` spans: the ``regions``, ``metrics`` and ``percentiles`` (a ``pXX``
    statistic each, besides mean and median) of the evaluation, and its ``group_columns`` with the
    display order of each column's groups (``group_orders``: column -> groups; the ``all`` rows
    come first). Sequences are kept as tuples; a group column without an order is a ValueError.

    >>> scope = RunsTableScope(["wm"], ["dice"], [10], ["site"], {"site": ["A", "B"]})
    >>> scope.statistics, scope.group_columns
    (['mean', 'median', 'p10'], ('site',))
    >>> RunsTableScope(["wm"], ["dice"], [10], ["site"])
    Traceback (most recent call last):
    ...
    ValueError: group column 'site' has no group order (group_orders names [])
    """

    regions: Sequence[str]
    metrics: Sequence[str]
    percentiles: Sequence[float]
    group_columns: Sequence[str] = ()
    group_orders: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # frozen: the normalised sequences are set once, here
        for name in ("regions", "metrics", "percentiles", "group_columns"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "group_orders", {c: tuple(g) for c, g in (self.group_orders or {}).items()})
        for column in self.group_columns:
            if column not in self.group_orders:
                raise ValueError(f"group column {column!r} has no group order (group_orders names "
                                 f"{sorted(self.group_orders)})")

    @property
    def statistics(self) -> list[str]:
        return statistic_names(self.percentiles)


def runs_table(per_case: pd.DataFrame, method_runs: Mapping[str, Sequence[str]], scope: RunsTableScope, *,
               paired: bool, n_bootstrap: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The table of ``runs.csv``: one row per method (``kind = method``) and per difference with the
    first method (``kind = difference``), group, region, metric and statistic of ``scope``.

    ``per_case`` is the per-case table of an evaluation whose methods are the runs
    (``method_runs``: method -> its run names in ``per_case``, in seed order when ``paired``).
    """
    statistics = scope.statistics
    names = list(method_runs)
    base = names[0]
    rows: list[dict] = []
    for metric in scope.metrics:
        by_metric = per_case[per_case["metric"] == metric]
        higher = METRIC_INFO[metric].higher_is_better if metric in METRIC_INFO else True
        for group_column, group, _ in groupings(scope.group_columns, scope.group_orders):
            selected = by_metric if group_column == "all" else by_metric[by_metric[group_column] == group]
            for region in scope.regions:
                wide = selected[selected["region"] == region].pivot(index="method", columns="case", values="value")
                wide = wide.reindex(columns=sorted(wide.columns))
                matrices = {m: wide.reindex(index=list(method_runs[m])).to_numpy(float) for m in names}
                cell = _Cell(group_column, group, region, metric, paired, int(wide.shape[1]))
                for m in names:
                    k = len(method_runs[m])
                    note = "" if k > 1 else "1 run: no interval over runs"
                    for s, interval in bootstrap_method(matrices[m], statistics, n_bootstrap, seed=seed,
                                                        higher_is_better=higher).items():
                        rows.append(_row(cell, m, s, interval, note, n_runs=k))
                for m in names[1:]:
                    k, kb = len(method_runs[m]), len(method_runs[base])
                    if paired:
                        note = f"paired by seed: {k} seeds, t-interval with {k - 1} degrees of freedom"
                    elif k < 2 or kb < 2:
                        note = "a side with 1 run: no interval over runs"
                    else:
                        note = "unpaired: the runs of each method resampled independently"
                    intervals = bootstrap_difference(matrices[m], matrices[base], statistics, paired=paired,
                                                     n_bootstrap=n_bootstrap, seed=seed, higher_is_better=higher)
                    for s, interval in intervals.items():
                        rows.append(_row(cell, m, s, interval, note, n_runs=k, reference=base, n_ref=kb))
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for column in ("n_runs_reference", "positive_seeds", "negative_seeds", "zero_seeds"):
        table[column] = table[column].astype("Int64")
    return table


def _interval_text(low, high, decimals: int, signed: bool) -> str:
    return interval_text(low, high, lambda v: _fmt(v, decimals, signed))


def _signs_text(row) -> str:
    k = int(row["positive_seeds"]) + int(row["negative_seeds"]) + int(row["zero_seeds"])
    return f"+ on {int(row['positive_seeds'])} of {k} seeds"


def explanation(paired: bool, n_bootstrap: int) -> str:
    """What the point estimate and each interval of ``runs.csv`` mean (one paragraph)."""
    text = (f"Point estimate: the mean over runs of each run's statistic. **{RUNS_INTERVAL_TEXT.capitalize()}** "
            f"(`ci_runs_*`): 95 % percentile bootstrap, {n_bootstrap} resamples; each resample draws the runs "
            f"of each method with replacement, then the test cases with replacement (one draw of cases shared by "
            f"every run: they are the same test cases). **{CASES_INTERVAL_TEXT.capitalize()}** (`ci_cases_*`): "
            f"the test cases resampled, every trained network kept; it leaves out run-to-run variance and is "
            f"no evidence that another training would give the same result.")
    if paired:
        text += (" Paired runs (`--paired-runs`): the k-th run of every method shares seed k; a difference is "
                 "computed seed by seed on the cases both scored, and the seeds are resampled jointly for both "
                 f"methods. **{SEEDS_T_TEXT}** (`ci_seeds_t_*`): Student t with k - 1 degrees of freedom on the "
                 "per-seed differences; with few seeds it is wide, and with 2 or 3 seeds a bootstrap over seeds "
                 "would be too narrow, which is why the t-interval is the one given over seeds. Sign count: on "
                 "how many seeds the difference is positive.")
    return text


def markdown_section(table: pd.DataFrame, metric_titles: Mapping[str, str], paired: bool, n_bootstrap: int,
                     decimals: Mapping[str, int]) -> list[str]:
    """The 'Several trainings per method' section of ``table.md``."""
    lines = ["## Several trainings per method", "", explanation(paired, n_bootstrap), ""]
    runs_heading = PAIRED_RUNS_INTERVAL_TEXT if paired else RUNS_INTERVAL_TEXT
    for metric, by_metric in table.groupby("metric", sort=False):
        title, dec = metric_titles.get(metric, metric), decimals.get(metric, 1)
        methods = by_metric[by_metric["kind"] == "method"]
        lines += [f"### {title}: each method over its runs", "",
                  f"| group | method | region | runs | statistic | mean over runs | {RUNS_INTERVAL_TEXT} | "
                  f"{CASES_INTERVAL_TEXT} |", "|---|---|---|---:|---|---:|---:|---:|"]
        for _, r in methods.iterrows():
            lines.append(f"| {r['group']} | {r['method']} | {r['region']} | {r['n_runs']} | {r['statistic']} | "
                         f"{_fmt(r['point'], dec)} | {_interval_text(r['ci_runs_low'], r['ci_runs_high'], dec, False)}"
                         f" | {_interval_text(r['ci_cases_low'], r['ci_cases_high'], dec, False)} |")
        lines.append("")
        differences = by_metric[by_metric["kind"] == "difference"]
        if differences.empty:
            continue
        reference = differences["reference_method"].iloc[0]
        if paired:
            lines += [f"### {title}: paired differences with {reference}, seed by seed", "",
                      f"| group | method | region | seeds | statistic | mean difference over seeds | {SEEDS_T_TEXT} | "
                      f"{runs_heading} | {CASES_INTERVAL_TEXT} | sign count |",
                      "|---|---|---|---:|---|---:|---:|---:|---:|---|"]
        else:
            lines += [f"### {title}: differences with {reference} (runs not paired)", "",
                      f"| group | method | region | runs | statistic | difference of the means over runs | "
                      f"{runs_heading} | {CASES_INTERVAL_TEXT} |", "|---|---|---|---|---|---:|---:|---:|"]
        for _, r in differences.iterrows():
            cells = [r["group"], r["method"], r["region"],
                     str(r["n_runs"]) if paired else f"{r['n_runs']} vs {r['n_runs_reference']}", r["statistic"],
                     _fmt(r["point"], dec, True)]
            if paired:
                cells.append(_interval_text(r["ci_seeds_t_low"], r["ci_seeds_t_high"], dec, True))
            cells += [_interval_text(r["ci_runs_low"], r["ci_runs_high"], dec, True),
                      _interval_text(r["ci_cases_low"], r["ci_cases_high"], dec, True)]
            if paired:
                cells.append(_signs_text(r))
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        lines.append("")
    return lines


def terminal_lines(table: pd.DataFrame, statistics: Sequence[str], metric: str, metric_title: str, decimals: int = 1) -> list[str]:
    """One line per difference with the first method (``metric``, the given ``statistics``)."""
    lines = []
    rows = table[(table["kind"] == "difference") & (table["metric"] == metric) & table["statistic"].isin(statistics)]
    for _, r in rows.iterrows():
        head = (f"{r['method']} - {r['reference_method']}, {r['group']}, {r['region']}, {metric_title} "
                f"{r['statistic']}: {_fmt(r['point'], decimals, True)}")
        cases = f"{CASES_INTERVAL_TEXT} {_interval_text(r['ci_cases_low'], r['ci_cases_high'], decimals, True)}"
        if r["paired"]:
            lines.append(f"{head} mean over {r['n_runs']} seeds, {SEEDS_T_TEXT} "
                         f"{_interval_text(r['ci_seeds_t_low'], r['ci_seeds_t_high'], decimals, True)}, "
                         f"{_signs_text(r)}; {cases}")
        else:
            lines.append(f"{head} (means over {r['n_runs']} and {r['n_runs_reference']} runs), {RUNS_INTERVAL_TEXT} "
                         f"{_interval_text(r['ci_runs_low'], r['ci_runs_high'], decimals, True)}; {cases}")
    return lines


@dataclass
class RunsReport:
    """What ``runs.csv`` / ``runs.json`` and the markdown section show: the table of
    :func:`runs_table` and the settings (runs of each method, pairing, resamples)."""

    table: pd.DataFrame
    settings: dict

    def json_text(self) -> str:
        import json

        records = [{k: json_value(v) for k, v in row.items()}
                   for row in self.table.astype(object).to_dict(orient="records")]
        for record in records:
            values = [float(v) for v in record["per_run"].split(";")] if record["per_run"] else []
            record["per_run"] = [json_value(v) for v in values]
        return json.dumps({"settings": self.settings, "statistics": records}, indent=2, allow_nan=False) + "\n"

    def write(self, folder) -> None:
        """Write ``runs.csv`` and ``runs.json`` into ``folder`` (the report's folder under construction,
        which :func:`nnunet_dro.evaluation.reports.write_report` renames into place atomically)."""
        from pathlib import Path

        self.table.to_csv(Path(folder) / "runs.csv", index=False)
        (Path(folder) / "runs.json").write_text(self.json_text(), encoding="utf-8")

