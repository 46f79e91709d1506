"""Statistics over training runs (nnunet_dro.evaluation.runs) against direct computations and
against synthetic runs with a known between-run variance (interval coverage)."""
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from nnunet_dro.evaluation import runs
from nnunet_dro.evaluation.stats import bootstrap_mean_difference, bootstrap_percentile_difference

STATS = ["mean", "median", "p25", "p10", "p5"]


def _direct(row: np.ndarray, name: str) -> float:
    row = row[~np.isnan(row)]
    if name == "mean":
        return float(np.mean(row))
    return float(np.percentile(row, 50 if name == "median" else float(name[1:])))


def test_point_estimates_and_per_run_values_equal_a_direct_loop():
    rng = np.random.default_rng(1)
    values = rng.normal(70, 10, size=(4, 23))
    values[2, 5] = np.nan  # a case this run did not score (--missing skip)
    result = runs.bootstrap_method(values, STATS, n_bootstrap=50)
    for name in STATS:
        per_run = [_direct(values[k], name) for k in range(4)]
        assert result[name].per_run == pytest.approx(per_run)
        assert result[name].point == pytest.approx(np.mean(per_run))


def test_paired_difference_seed_by_seed_on_cases_both_scored_t_interval_and_signs():
    rng = np.random.default_rng(2)
    a, b = rng.normal(75, 8, size=(5, 30)), rng.normal(72, 8, size=(5, 30))
    a[1, 3] = np.nan
    b[4, 7] = np.nan
    result = runs.bootstrap_difference(a, b, STATS, paired=True, n_bootstrap=50)
    for name in STATS:
        d = []
        for k in range(5):
            keep = ~(np.isnan(a[k]) | np.isnan(b[k]))
            d.append(_direct(a[k][keep], name) - _direct(b[k][keep], name))
        d = np.array(d)
        half = scipy_stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
        r = result[name]
        assert r.per_run == pytest.approx(d)
        assert r.point == pytest.approx(d.mean())
        assert r.ci_seeds_t == pytest.approx((d.mean() - half, d.mean() + half))
        assert r.signs == (int((d > 0).sum()), int((d < 0).sum()), 0)


def test_unpaired_point_is_difference_of_means_over_runs_with_unequal_run_counts():
    rng = np.random.default_rng(3)
    a, b = rng.normal(75, 8, size=(3, 20)), rng.normal(72, 8, size=(2, 20))
    result = runs.bootstrap_difference(a, b, ["mean", "p10"], paired=False, n_bootstrap=50)
    for name in ("mean", "p10"):
        expected = np.mean([_direct(r, name) for r in a]) - np.mean([_direct(r, name) for r in b])
        assert result[name].point == pytest.approx(expected)
        assert not isinstance(result[name], runs.PairedInterval)


def test_one_run_case_interval_equals_todays_case_bootstrap_and_no_interval_over_runs():
    rng = np.random.default_rng(4)
    a, b = rng.normal(75, 8, size=(1, 25)), rng.normal(72, 8, size=(1, 25))
    result = runs.bootstrap_difference(a, b, ["mean", "p10", "p25"], paired=False, n_bootstrap=300)
    today = bootstrap_percentile_difference(a[0], b[0], [10, 25], 300)
    assert result["p10"].ci_cases == pytest.approx(today[10])
    assert result["p25"].ci_cases == pytest.approx(today[25])
    assert result["mean"].ci_cases == pytest.approx(bootstrap_mean_difference(a[0], b[0], 300))
    assert np.isnan(result["p10"].ci_runs).all()
    assert np.isnan(runs.bootstrap_method(a, ["mean"], 100)["mean"].ci_runs).all()


def test_t_interval_and_sign_count_edge_cases():
    assert np.isnan(runs.t_interval([1.0])).all()
    assert np.isnan(runs.t_interval([1.0, np.nan])).all()
    assert runs.sign_count([1.0, -2.0, 0.0, np.nan]) == (1, 1, 1)
    assert runs.t_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)


def _simulate(rng, k, n, s_run, s_case, s_noise, mu=70.0):
    """Per-case scores of k runs on one test set of n cases: run effect ~ N(0, s_run^2) (known
    between-run variance), case difficulty ~ N(0, s_case^2) shared by the runs, noise."""
    return (mu + rng.normal(0, s_run, size=(k, 1)) + rng.normal(0, s_case, size=(1, n))
            + rng.normal(0, s_noise, size=(k, n)))


def test_runs_interval_covers_the_expected_mean_and_case_interval_does_not_when_run_variance_is_large():
    rng = np.random.default_rng(10)
    reps, k, n, s_run, s_case, s_noise, mu = 300, 10, 40, 6.0, 5.0, 2.0, 70.0
    cover_runs = cover_cases = 0
    narrower = 0
    for rep in range(reps):
        r = runs.bootstrap_method(_simulate(rng, k, n, s_run, s_case, s_noise, mu), ["mean"], 400, seed=rep)["mean"]
        cover_runs += r.ci_runs[0] <= mu <= r.ci_runs[1]
        cover_cases += r.ci_cases[0] <= mu <= r.ci_cases[1]
        narrower += (r.ci_cases[1] - r.ci_cases[0]) < (r.ci_runs[1] - r.ci_runs[0])
    # percentile bootstrap over 10 runs: nominal 95 %, a little under (factor sqrt(9/10) on the spread);
    # 300 replications: sampling error of a coverage about 0.013
    assert 0.86 <= cover_runs / reps <= 0.99
    # the case-only interval sees var(case)/n = 0.7 of the estimate's variance 3.6 + 0.7: coverage about 0.6
    assert cover_cases / reps < 0.75
    assert narrower / reps > 0.95


def test_runs_interval_covers_the_expected_p10():
    rng = np.random.default_rng(11)
    reps, k, n, s_run, s_case, s_noise, mu = 200, 10, 100, 5.0, 6.0, 3.0, 70.0
    truth = mu + scipy_stats.norm.ppf(0.10) * np.hypot(s_case, s_noise)  # E over runs of each run's p10
    cover = 0
    for rep in range(reps):
        r = runs.bootstrap_method(_simulate(rng, k, n, s_run, s_case, s_noise, mu), ["p10"], 400, seed=rep)["p10"]
        cover += r.ci_runs[0] <= truth <= r.ci_runs[1]
    assert 0.84 <= cover / reps <= 1.0


def _paired_methods(rng, k, n, delta, s_seed, s_run, s_case, s_noise):
    """Seed effect ~ N(0, s_seed^2) shared by both methods' runs of a seed, plus each run's own effect."""
    seed_effect = rng.normal(0, s_seed, size=(k, 1))
    case = rng.normal(0, s_case, size=(1, n))
    ref = 70 + seed_effect + rng.normal(0, s_run, size=(k, 1)) + case + rng.normal(0, s_noise, size=(k, n))
    new = 70 + delta + seed_effect + rng.normal(0, s_run, size=(k, 1)) + case + rng.normal(0, s_noise, size=(k, n))
    return new, ref


def test_paired_t_interval_over_seeds_has_its_nominal_coverage():
    rng = np.random.default_rng(12)
    reps, k, delta = 400, 8, 2.0
    cover_t = cover_runs = cover_cases = 0
    for rep in range(reps):
        new, ref = _paired_methods(rng, k, 40, delta, s_seed=5.0, s_run=3.0, s_case=5.0, s_noise=2.0)
        r = runs.bootstrap_difference(new, ref, ["mean"], paired=True, n_bootstrap=300, seed=rep)["mean"]
        cover_t += r.ci_seeds_t[0] <= delta <= r.ci_seeds_t[1]
        cover_runs += r.ci_runs[0] <= delta <= r.ci_runs[1]
        cover_cases += r.ci_cases[0] <= delta <= r.ci_cases[1]
    # the per-seed differences are independent normals here: the t-interval is exact (0.95 +- 0.011)
    assert 0.915 <= cover_t / reps <= 0.98
    assert 0.83 <= cover_runs / reps <= 0.99  # bootstrap over 8 seeds: somewhat under nominal
    assert cover_cases / reps < 0.6  # run-to-run variance (s_run = 3 per run) left out


def test_pairing_removes_a_shared_seed_effect():
    rng = np.random.default_rng(13)
    new, ref = _paired_methods(rng, 8, 40, 2.0, s_seed=10.0, s_run=1.0, s_case=5.0, s_noise=2.0)
    paired = runs.bootstrap_difference(new, ref, ["mean"], paired=True, n_bootstrap=500)["mean"]
    unpaired = runs.bootstrap_difference(new, ref, ["mean"], paired=False, n_bootstrap=500)["mean"]
    assert paired.point == pytest.approx(unpaired.point)
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(paired.ci_seeds_t) * 3 < width(unpaired.ci_runs)
    assert width(paired.ci_runs) * 3 < width(unpaired.ci_runs)


def test_runs_table_rows_against_a_direct_computation():
    rng = np.random.default_rng(5)
    cases = [f"c{i}" for i in range(12)]
    rows = []
    for method, shift in (("ERM", 0.0), ("DRO", 3.0)):
        for k in range(1, 4):
            for i, case in enumerate(cases):
                rows.append((runs.run_label(method, k), case, "wm", "dice", 70 + shift + rng.normal(0, 5),
                             "sb" if i % 3 == 0 else "control"))
    per_case = pd.DataFrame(rows, columns=["method", "case", "region", "metric", "value", "condition"])
    labels = {m: [runs.run_label(m, k) for k in (1, 2, 3)] for m in ("ERM", "DRO")}
    scope = runs.RunsTableScope(regions=["wm"], metrics=["dice"], percentiles=[10], group_columns=["condition"],
                                group_orders={"condition": ["control", "sb"]})
    table = runs.runs_table(per_case, labels, scope, paired=True, n_bootstrap=100)
    assert list(table.columns) == runs.TABLE_COLUMNS
    # 3 groupings x (2 methods + 1 difference) x 3 statistics
    assert len(table) == 3 * 3 * 3
    sb = per_case[per_case["condition"] == "sb"]
    wide = sb.pivot(index="method", columns="case", values="value")
    d = [np.percentile(wide.loc[f"DRO#{k}"], 10) - np.percentile(wide.loc[f"ERM#{k}"], 10) for k in (1, 2, 3)]
    row = table.query("kind == 'difference' and group == 'sb' and statistic == 'p10'").iloc[0]
    assert row["point"] == pytest.approx(np.mean(d))
    assert row["n_cases"] == 4 and row["n_runs"] == 3
    assert row["positive_seeds"] + row["negative_seeds"] + row["zero_seeds"] == 3
    report = runs.RunsReport(table, {"paired": True})
    import json
    content = json.loads(report.json_text())
    assert content["statistics"][0]["per_run"] and len(content["statistics"]) == len(table)


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 1), (2, 3, 50), (4, 0)])
def test_statistics_along_cases_equal_numpys_nan_aware_ones(shape):
    rng = np.random.default_rng(sum(shape))
    values = rng.normal(size=shape)
    values[rng.random(shape) < 0.2] = np.nan
    names = ["mean", "median", "p0", "p5", "p10", "p25", "p99", "p100"]
    result = runs.statistics_along_cases(values, names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows
        assert np.allclose(result["mean"], np.nanmean(values, axis=-1), equal_nan=True, atol=1e-12)
        for name in names[1:]:
            q = 50 if name == "median" else float(name[1:])
            expected = np.nanpercentile(values, q, axis=-1) if shape[-1] else np.full(shape[:-1], np.nan)
            assert np.allclose(result[name], expected, equal_nan=True, rtol=0, atol=1e-12), name
