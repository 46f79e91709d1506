"""Direction-aware tails, CVaR10, winners (issue 65 items 4 and 5) and the disparity between
groups (issue 66 items 2 and 3), each against an independent computation."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from eval_testdata import make_cohort, run_cli, write_label_map
from nnunet_dro.evaluation import evaluate, reports
from nnunet_dro.evaluation.stats import bootstrap_summary_intervals, tail_count


def worst_mean(values, k, higher_is_better):
    ordered = sorted(values, reverse=not higher_is_better)  # worst first
    return sum(ordered[:k]) / k


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("tails")
    ref, preds = make_cohort(root, n_cases=12, methods=("A", "B"), seed=4)
    return root, ref, preds


def test_every_tail_statistic_is_the_worst_tail_by_direction(cohort):
    root, ref, preds = cohort
    result = evaluate(str(ref), {k: str(v) for k, v in preds.items()}, None, metrics=["dice", "hd95"],
                      num_processes=1, progress=False)
    pc, summary, comparison = result.per_case, result.summary, result.comparison
    for _, row in summary.iterrows():
        values = pc[(pc.metric == row.metric) & (pc.method == row.method) & (pc.region == row.region)]["value"]
        values = values.to_numpy(float)
        higher = row.metric == "dice"
        for q in (25, 10, 5):  # issue 65 item 4: HD95's p10 was the best tenth
            assert row[f"p{q}"] == pytest.approx(np.percentile(values, q if higher else 100 - q))
        k = math.ceil(len(values) / 10)
        assert row["cvar10"] == pytest.approx(worst_mean(values, k, higher))
        assert row["direction"] == ("higher is better" if higher else "lower is better")
    hd95 = summary[summary.metric == "hd95"]
    assert (hd95["p10"] >= hd95["median"]).all() and (hd95["cvar10"] >= hd95["p10"] - 1e-9).all()
    for _, row in comparison[comparison.metric == "hd95"].iterrows():
        wide = pc[(pc.metric == "hd95") & (pc.region == row.region)].pivot(index="case", columns="method",
                                                                            values="value")
        assert row["p10_difference"] == pytest.approx(np.percentile(wide["B"], 90) - np.percentile(wide["A"], 90))
        k = tail_count(len(wide))
        assert row["cvar10_difference"] == pytest.approx(worst_mean(wide["B"], k, False) -
                                                         worst_mean(wide["A"], k, False))


def _bold_cells(markdown: str, title: str) -> dict[tuple[str, str, str], set[str]]:
    lines = markdown.split(title + "\n", 1)[1].strip().splitlines()[0:]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    bold = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        bold[tuple(cells[:3])] = {h for h, c in zip(header, cells) if c.startswith("**")}
    return bold


def test_bold_marks_the_best_by_direction_and_never_spread(cohort):
    root, ref, preds = cohort
    result = evaluate(str(ref), {k: str(v) for k, v in preds.items()}, None, metrics=["dice", "hd95"],
                      num_processes=1, progress=False)
    markdown = reports.markdown_tables(result)
    summary = result.summary
    for metric, title in (("dice", "## Dice (%), all cases"), ("hd95", "## HD95 (mm), all cases")):
        bold = _bold_cells(markdown, title)
        assert bold, metric
        for (group, method, region), columns in bold.items():
            assert not columns & {"n", "std", "iqr"}
            rows = summary[(summary.metric == metric) & (summary.region == region) & (summary.group == group)]
            for column in columns:
                others = rows.set_index("method")[column]
                best = others.max() if metric == "dice" else others.min()
                assert others[method] == pytest.approx(best, abs=0.06), (metric, column)
        # the method with the lowest HD95 mean is the bold one
        for region in summary.region.unique():
            rows = summary[(summary.metric == metric) & (summary.region == region) & (summary.group == "all")]
            winner = rows.loc[rows["mean"].idxmax() if metric == "dice" else rows["mean"].idxmin(), "method"]
            assert "mean" in bold[("all", winner, str(region))]


def test_missing_skip_crowns_no_winner_across_different_case_sets(tmp_path):
    """Issue 65 item 5: n = 4 against n = 3 was bold on every statistic."""
    ref, preds = make_cohort(tmp_path, n_cases=5, methods=("A", "B"), seed=2)
    (preds["B"] / "case_000.nii.gz").unlink()
    result = evaluate(str(ref), {k: str(v) for k, v in preds.items()}, None, metrics=["dice", "hd95"],
                      missing="skip", num_processes=1, progress=False, echo=lambda _: None)
    assert set(result.summary.loc[result.summary.method == "B", "n"]) == {4}
    assert not result.summary["same_cases"].any()
    markdown = reports.markdown_tables(result)
    tables = markdown.split("paired difference")[0]
    assert "**" not in tables.split("\n", 3)[3]  # no bold anywhere in the statistics tables
    # the same folders without the missing case: a winner again
    (preds["A"] / "case_000.nii.gz").unlink()
    (ref / "case_000.nii.gz").unlink()
    result = evaluate(str(ref), {k: str(v) for k, v in preds.items()}, None, metrics=["dice"], num_processes=1,
                      progress=False)
    assert result.summary["same_cases"].all() and "**" in reports.markdown_tables(result)


def test_all_equal_zero_region_wins_nothing_on_spread(tmp_path):
    ref = np.zeros((8, 8, 8), np.uint8)
    ref[2:5, 2:5, 2:5] = 1
    ref[6:8, 6:8, 6:8] = 2
    for i in range(4):
        write_label_map(tmp_path / "ref" / f"c{i}.nii.gz", ref)
        good = ref.copy()
        good[2, 2, 2 + i % 2] = 0
        write_label_map(tmp_path / "A" / f"c{i}.nii.gz", good)
        bad = ref.copy()
        bad[ref == 2] = 0  # region 2 missed everywhere: Dice 0 with std 0, iqr 0
        write_label_map(tmp_path / "B" / f"c{i}.nii.gz", bad)
    result = evaluate(str(tmp_path / "ref"), {"A": str(tmp_path / "A"), "B": str(tmp_path / "B")}, None,
                      num_processes=1, progress=False)
    bold = _bold_cells(reports.markdown_tables(result), "## Dice (%), all cases")
    assert bold[("all", "B", "2")] == set()
    assert "mean" in bold[("all", "A", "2")]


def test_terminal_says_where_the_other_metrics_are(cohort, tmp_path):
    root, ref, preds = cohort
    out = tmp_path / "report"
    result = evaluate(str(ref), {"A": str(preds["A"])}, str(out), metrics=["dice", "hd95", "nsd"], num_processes=1,
                      progress=False)
    assert reports.terminal_table(result).rstrip().endswith(f"Shown: dice only; hd95, nsd are in {out}/table.md.")
    assert "## HD95 (mm), all cases" in (out / "table.md").read_text()
    result = evaluate(str(ref), {"A": str(preds["A"])}, None, metrics=["hd95", "dice"], num_processes=1,
                      progress=False)
    assert reports.terminal_table(result).rstrip().endswith("Shown: hd95 only; dice is in table.md.")


def test_cvar_bootstrap_interval_equals_an_independent_loop():
    rng = np.random.default_rng(5)
    values = rng.normal(70, 10, 23)
    got = bootstrap_summary_intervals(values, higher_is_better=True, n_bootstrap=300, seed=0)
    draws = np.random.default_rng(0).integers(0, 23, size=(300, 23))
    k = 3  # ceil(2.3)
    cvars = [worst_mean(list(values[row]), k, True) for row in draws]
    means = [values[row].mean() for row in draws]
    assert got["cvar10"] == pytest.approx(tuple(np.percentile(cvars, [2.5, 97.5])))
    assert got["mean"] == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))


# ---- disparity: a synthetic cohort with a known gap -------------------------------------------

CUBE = 8  # an 8^3 cube of label 1: 512 voxels; a prediction keeps the first 8 - k slabs of it
REMOVED = {"ERM": {"a": [0, 0, 0, 0], "b": [3, 4, 4, 5]}, "DRO": {"a": [0, 0, 1, 0], "b": [1, 2, 1, 3]}}


def slab_dice(k: int) -> float:
    kept = (CUBE - k) * CUBE * CUBE
    return 200.0 * kept / (CUBE ** 3 + kept)


@pytest.fixture(scope="module")
def gap_cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("gap")
    rows = ["case\tcondition"]
    for group in ("a", "b"):
        for i in range(4):
            case = f"{group}{i}"
            rows.append(f"{case}\t{group}")
            ref = np.zeros((12, 12, 12), np.uint8)
            ref[2:10, 2:10, 2:10] = 1
            write_label_map(root / "ref" / f"{case}.nii.gz", ref)
            for method, removed in REMOVED.items():
                pred = ref.copy()
                k = removed[group][i]
                if k:
                    pred[10 - k:10] = 0
                write_label_map(root / method / f"{case}.nii.gz", pred)
    (root / "groups.tsv").write_text("\n".join(rows) + "\n")
    return root


def expected_gap(method):
    means = {g: np.mean([slab_dice(k) for k in ks]) for g, ks in REMOVED[method].items()}
    overall = np.mean([slab_dice(k) for ks in REMOVED[method].values() for k in ks])
    equity = 100 * (overall / 100) / (1 + sum(abs(m / 100 - overall / 100) for m in means.values()))
    return means, means["a"] - means["b"], min(means.values()) / max(means.values()), equity


def test_gap_and_its_change_match_an_independent_computation(gap_cohort, tmp_path):
    root = gap_cohort
    out = tmp_path / "report"
    done = run_cli("-ref", root / "ref", "-pred", f"ERM={root / 'ERM'}", f"DRO={root / 'DRO'}", "-o", out,
                   "-np", "1", "-groups", root / "groups.tsv", "--bootstrap", "2000", "--metrics", "dice", "hd95")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "disparity.csv", keep_default_na=False, na_values=[""])
    dice = table[table.metric == "dice"].set_index("method")
    for method in ("ERM", "DRO"):
        means, gap, ratio, equity = expected_gap(method)
        row = dice.loc[method]
        assert (row.best_group, row.worst_group) == ("a", "b")
        assert row.gap == pytest.approx(gap) and row.ratio == pytest.approx(ratio)
        assert row.equity_scaled == pytest.approx(equity)
        assert row.gap_ci_low <= row.gap_ci_high
    change = expected_gap("DRO")[1] - expected_gap("ERM")[1]
    assert dice.loc["DRO", "gap_change"] == pytest.approx(change) and change < 0

    # the paired bootstrap of the change, against the exact bootstrap distribution (every one of the
    # 4^4 x 4^4 equally likely resamples of the two groups' cases, the same cases for both methods)
    per_case = {m: {g: np.array([slab_dice(k) for k in ks]) for g, ks in REMOVED[m].items()} for m in REMOVED}
    resamples = np.array(list(itertools.product(range(4), repeat=4)))
    gap_of = {m: per_case[m]["a"][resamples].mean(1)[:, None] - per_case[m]["b"][resamples].mean(1)[None, :]
              for m in REMOVED}
    exact = np.abs(gap_of["DRO"]).ravel() - np.abs(gap_of["ERM"]).ravel()
    low, high = np.percentile(exact, [2.5, 97.5])
    spread = high - low
    assert dice.loc["DRO", "gap_change_ci_low"] == pytest.approx(low, abs=0.08 * spread)
    assert dice.loc["DRO", "gap_change_ci_high"] == pytest.approx(high, abs=0.08 * spread)

    # HD95 is better low: the best group is the one with the lowest mean
    hd95 = table[table.metric == "hd95"].set_index("method")
    assert hd95.loc["ERM", "best_group"] == "a" and hd95.loc["ERM", "best_mean"] == 0.0
    assert np.isnan(hd95.loc["ERM", "equity_scaled"])  # defined for scores in percent, better high

    # one line per attribute in the terminal, with the change and its interval
    line = next(l for l in done.stdout.splitlines() if l.startswith("Gap by condition"))
    expected = (f"DRO shrank it by {-change:.1f} (Δ gap {change:+.1f} [{dice.loc['DRO', 'gap_change_ci_low']:+.1f}, "
                f"{dice.loc['DRO', 'gap_change_ci_high']:+.1f}]")
    assert expected in line, line
    assert "## Dice (%): gap between groups" in done.stdout
    assert (out / "disparity_dice.png").read_bytes()[:4] == b"\x89PNG"
    assert "gap between the best and the worst group" in (out / "table.tex").read_text()


def test_no_group_table_no_disparity_and_single_group_gives_nan(gap_cohort, tmp_path):
    root = gap_cohort
    result = evaluate(str(root / "ref"), {"ERM": str(root / "ERM")}, None, num_processes=1, progress=False)
    assert result.disparity is None
    one_group = tmp_path / "one.tsv"
    one_group.write_text("case\tcondition\n" + "".join(f"{g}{i}\tsame\n" for g in "ab" for i in range(4)))
    result = evaluate(str(root / "ref"), {"ERM": str(root / "ERM")}, None, groups=str(one_group), num_processes=1,
                      progress=False)
    row = result.disparity.iloc[0]
    assert row.n_groups == 1 and np.isnan(row.gap) and row.best_group == ""
