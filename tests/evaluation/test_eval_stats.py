"""Summary statistics equal numpy's; paired tests, Holm and bootstrap behave as documented."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import wilcoxon

from nnunet_dro.evaluation.stats import bootstrap_percentile_difference, holm, paired_wilcoxon, summarize


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40),
       st.lists(st.floats(0, 100), min_size=1, max_size=4, unique=True))
def test_summary_equals_numpy(values, percentiles):
    s = summarize(values + [float("nan")], percentiles)
    v = np.asarray(values)
    assert s["n"] == len(values)
    assert s["mean"] == pytest.approx(np.mean(v))
    assert s["median"] == pytest.approx(np.median(v))
    assert s["iqr"] == pytest.approx(np.percentile(v, 75) - np.percentile(v, 25), abs=1e-9)
    for q in percentiles:
        assert s[f"p{q:g}"] == pytest.approx(np.percentile(v, q))
    if len(values) > 1:
        assert s["std"] == pytest.approx(np.std(v, ddof=1))
    else:
        assert np.isnan(s["std"])


def test_summary_of_nothing_is_nan_with_n_zero():
    s = summarize([float("nan")], [10])
    assert s["n"] == 0 and np.isnan(s["mean"]) and np.isnan(s["p10"])


@pytest.mark.parametrize("pvalues,expected", [
    ([0.01, 0.04, 0.03], [0.03, 0.06, 0.06]),
    ([0.5, 0.001], [0.5, 0.002]),
    ([0.4, 0.4, 0.9], [1.0, 1.0, 1.0]),
    ([np.nan, 0.02], [np.nan, 0.02]),
    ([], []),
])
def test_holm(pvalues, expected):
    np.testing.assert_allclose(holm(pvalues), expected)


def test_paired_wilcoxon_matches_scipy_and_drops_nan_pairs():
    rng = np.random.default_rng(0)
    a, b = rng.normal(70, 10, 15), rng.normal(75, 10, 15)
    assert paired_wilcoxon(a, b) == pytest.approx(wilcoxon(a, b).pvalue)
    a2, b2 = np.append(a, np.nan), np.append(b, 3.0)
    assert paired_wilcoxon(a2, b2) == pytest.approx(wilcoxon(a, b).pvalue)
    assert paired_wilcoxon([1.0, 2.0], [1.0, 2.0]) == 1.0
    assert np.isnan(paired_wilcoxon([np.nan], [1.0]))


def test_bootstrap_interval_brackets_the_difference_and_is_seeded():
    rng = np.random.default_rng(3)
    b = rng.uniform(40, 90, 60)
    a = b + 10 + rng.normal(0, 1, 60)
    ci = bootstrap_percentile_difference(a, b, [25, 10], n_bootstrap=300, seed=1)
    for q, (low, high) in ci.items():
        assert low <= np.percentile(a, q) - np.percentile(b, q) <= high
        assert 5 < low < high < 15
    assert ci == bootstrap_percentile_difference(a, b, [25, 10], n_bootstrap=300, seed=1)
