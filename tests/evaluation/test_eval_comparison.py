"""The comparison where people look: the terminal and table.md show each method's paired
difference to the first (mean and p10, bootstrap intervals, pairs), and a Wilcoxon test that
cannot reach p < 0.05 says so instead of printing a p-value."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from eval_testdata import make_cohort, run_cli
from nnunet_dro.evaluation.reports import _p_text, _signed, comparison_percentile
from nnunet_dro.evaluation.stats import bootstrap_mean_difference, wilcoxon_can_reach


@pytest.mark.parametrize("n, reachable", [(0, False), (1, False), (3, False), (5, False), (6, True), (20, True)])
def test_wilcoxon_reachability_matches_scipys_exact_test(n, reachable):
    assert wilcoxon_can_reach(n) is reachable
    if n:
        from scipy.stats import wilcoxon

        smallest = wilcoxon(np.arange(1.0, n + 1), np.zeros(n), method="exact").pvalue  # every difference > 0
        assert bool(smallest < 0.05) is reachable and smallest == pytest.approx(2 / 2 ** n)


@pytest.mark.parametrize("value, metric, text", [
    (1.234, "dice", "+1.2"), (-0.04, "dice", "+0.0"), (-0.06, "dice", "-0.1"), (0.0, "dice", "+0.0"),
    (12.0, "vs", "+12.0"), (-3.456, "hd95", "-3.46"), (float("nan"), "dice", "n/a"),
])
def test_signed_differences_are_rounded_for_reading(value, metric, text):
    assert _signed(value, metric) == text


@pytest.mark.parametrize("p, note, text", [
    (0.0312, "", "0.031"), (0.0004, "", "<0.001"), (1.0, "", "1.000"), (float("nan"), "", "n/a"),
    (0.043, "n = 5: too few for p < 0.05", "n = 5: too few for p < 0.05"),  # never the p-value alone
])
def test_p_value_cells(p, note, text):
    assert _p_text(p, note) == text


@pytest.mark.parametrize("percentiles, shown", [([25, 10, 5], 10), ([25, 5], 5), ([50], 50), ([], None)])
def test_the_comparison_shows_p10_or_the_lowest_percentile(percentiles, shown):
    assert comparison_percentile(percentiles) == shown


def test_bootstrap_mean_interval():
    a, b = np.array([70.0, 80.0, 90.0, 60.0, np.nan]), np.array([65.0, 78.0, 80.0, 61.0, 50.0])
    low, high = bootstrap_mean_difference(a, b, 500)
    assert low <= np.mean((a - b)[:4]) <= high and (low, high) == bootstrap_mean_difference(a, b, 500)
    assert all(math.isnan(v) for v in bootstrap_mean_difference([np.nan], [1.0], 100))


def _table(text: str, title: str) -> pd.DataFrame:
    """The Markdown table under the heading ``title`` as a DataFrame of strings."""
    lines = text.splitlines()
    start = lines.index(title)
    end = next((i for i, line in enumerate(lines[start + 1:]) if line.startswith("## ")), len(lines))
    rows = [line for line in lines[start + 1:start + 1 + end] if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    return pd.DataFrame(cells[2:], columns=cells[0])


def test_terminal_and_table_md_show_the_paired_comparison(tmp_path):
    ref, preds = make_cohort(tmp_path, n_cases=9, methods=("ERM", "DRO"))
    groups = tmp_path / "groups.tsv"
    groups.write_text("case\tcondition\n" + "".join(f"case_{i:03d}\t{'sb' if i < 3 else 'control'}\n"
                                                    for i in range(9)))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"ERM={preds['ERM']}", f"DRO={preds['DRO']}", "-o", out, "-np", "1",
                   "-groups", groups, "--bootstrap", "200")
    assert done.returncode == 0, done.stderr
    comparison = pd.read_csv(out / "comparison.csv", keep_default_na=False, na_values=[""])
    assert {"mean_difference_ci_low", "mean_difference_ci_high", "wilcoxon_note"} <= set(comparison.columns)
    markdown = (out / "table.md").read_text()
    for text in (done.stdout, markdown):
        everyone = _table(text, "## Dice (%), all cases: paired difference to ERM")
        by_condition = _table(text, "## Dice (%), by condition: paired difference to ERM")
        assert list(everyone.columns) == ["group", "method", "region", "pairs", "Δ mean", "Δ p10", "Δ cvar10",
                                          "Wilcoxon p", "Holm p"]
        for shown in (everyone, by_condition):
            for _, cell in shown.iterrows():
                row = comparison.query(f"group == '{cell['group']}' and region == {int(cell['region'])} "
                                       f"and metric == 'dice'").iloc[0]
                assert int(cell["pairs"]) == row["n_pairs"]
                assert cell["Δ mean"] == (f"{round(row['mean_difference'], 1) + 0:+.1f} "
                                          f"[{round(row['mean_difference_ci_low'], 1) + 0:+.1f}, "
                                          f"{round(row['mean_difference_ci_high'], 1) + 0:+.1f}]")
                assert cell["Δ p10"].startswith(f"{round(row['p10_difference'], 1) + 0:+.1f} [")
                assert cell["Δ cvar10"].startswith(f"{round(row['cvar10_difference'], 1) + 0:+.1f} [")
                if row["n_pairs"] <= 5:  # sb: 3 cases
                    assert cell["Wilcoxon p"] == f"n = {row['n_pairs']}: too few for p < 0.05"
                    assert cell["Holm p"] == "–" and row["wilcoxon_note"] == cell["Wilcoxon p"]
                else:
                    assert cell["Wilcoxon p"] == (f"{row['wilcoxon_p']:.3f}" if row["wilcoxon_p"] >= 0.001
                                                  else "<0.001")
        assert set(by_condition["pairs"]) == {"3", "6"}
    assert "## Dice (%), all cases: paired difference to ERM" in done.stdout


def test_one_method_has_no_comparison_and_no_bootstrap_has_no_interval(tmp_path):
    ref, preds = make_cohort(tmp_path, n_cases=6, methods=("A", "B"))
    single = run_cli("-ref", ref, "-pred", f"A={preds['A']}", "-o", tmp_path / "one", "-np", "1")
    assert single.returncode == 0, single.stderr
    assert "paired difference" not in single.stdout
    pair = run_cli("-ref", ref, "-pred", f"A={preds['A']}", f"B={preds['B']}", "-o", tmp_path / "two", "-np", "1",
                   "--percentiles", "25", "5")
    assert pair.returncode == 0, pair.stderr
    shown = _table(pair.stdout, "## Dice (%), all cases: paired difference to A")
    assert list(shown.columns)[4:6] == ["Δ mean", "Δ p5"] and not shown["Δ mean"].str.contains(r"\[").any()
    assert "bootstrap" not in pair.stdout
