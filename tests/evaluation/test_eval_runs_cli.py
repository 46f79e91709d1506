"""``nnunet_dro evaluate -pred NAME=RUN1,RUN2,...`` (several training runs per method), the real CLI on
NIfTI prediction folders: outputs checked against a direct computation from per_case.csv, bad input."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from eval_testdata import perturb, random_label_map, run_cli, write_label_map

PREFIX = "nnunet_dro evaluate: error: "
N_CASES, N_SEEDS = 6, 3


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """References, 3 runs of ERM and of DRO (run k noisier with k: a run effect), a group table."""
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    truths = [random_label_map(rng) for _ in range(N_CASES)]
    for i, truth in enumerate(truths):
        write_label_map(root / "ref" / f"case_{i:03d}.nii.gz", truth)
    runs = {}
    for method, base in (("ERM", 0.12), ("DRO", 0.08)):
        runs[method] = []
        for k in range(N_SEEDS):
            folder = root / f"{method}_seed{k}"
            for i, truth in enumerate(truths):
                write_label_map(folder / f"case_{i:03d}.nii.gz", perturb(rng, truth, base + 0.04 * k))
            runs[method].append(folder)
    (root / "groups.tsv").write_text("case\tcondition\n" + "".join(
        f"case_{i:03d}\t{'sb' if i % 2 else 'control'}\n" for i in range(N_CASES)))
    return root, runs


def _pred(runs, method):
    return f"{method}={','.join(map(str, runs[method]))}"


@pytest.fixture(scope="module")
def paired_report(cohort, tmp_path_factory):
    root, runs = cohort
    out = tmp_path_factory.mktemp("paired") / "report"
    done = run_cli("-ref", root / "ref", "-pred", _pred(runs, "ERM"), _pred(runs, "DRO"), "--paired-runs", "-o", out,
                   "-groups", root / "groups.tsv", "--percentiles", "25", "10", "--bootstrap", "200", "-np", "2")
    assert done.returncode == 0, done.stderr
    return out, done


def test_paired_outputs_against_a_direct_computation(paired_report):
    out, done = paired_report
    assert "Traceback" not in done.stderr
    table = pd.read_csv(out / "runs.csv")
    per_case = pd.read_csv(out / "per_case.csv")
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(per_case["method"].unique()) == sorted(f"{m}#{k}" for m in ("ERM", "DRO") for k in (1, 2, 3))
    assert not (out / "comparison.csv").exists()  # single-run comparisons against ERM#1 are not written
    for group in ("all", "control", "sb"):
        for region in (1, 2, 3):  # the default regions: the labels, read back as numbers
            where = f"group == '{group}' and region == {region}"
            for method in ("ERM", "DRO"):
                rows = summary.query(f"{where} and method.str.startswith('{method}#')", engine="python")
                for statistic in ("mean", "median", "p25", "p10"):
                    row = table.query(f"kind == 'method' and method == '{method}' and {where} and "
                                      f"statistic == '{statistic}'").iloc[0]
                    assert row["point"] == pytest.approx(rows[statistic].mean())
                    assert row["ci_runs_low"] <= row["ci_runs_high"] and row["ci_cases_low"] <= row["ci_cases_high"]
            selected = per_case.query(f"region == {region}") if group == "all" else \
                per_case.query(f"region == {region} and condition == '{group}'")
            wide = selected.pivot(index="case", columns="method", values="value")
            d = np.array([np.percentile(wide[f"DRO#{k}"], 10) - np.percentile(wide[f"ERM#{k}"], 10) for k in (1, 2, 3)])
            row = table.query(f"kind == 'difference' and {where} and statistic == 'p10'").iloc[0]
            half = scipy_stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
            assert row["point"] == pytest.approx(d.mean())
            assert [float(v) for v in row["per_run"].split(";")] == pytest.approx(d)
            assert (row["ci_seeds_t_low"], row["ci_seeds_t_high"]) == pytest.approx((d.mean() - half, d.mean() + half))
            assert row["positive_seeds"] == (d > 0).sum() and row["negative_seeds"] == (d < 0).sum()
            assert f"DRO - ERM, {group}, {region}, Dice (%) p10: {d.mean():+.1f} mean over 3 seeds" in done.stdout
            assert f"+ on {(d > 0).sum()} of 3 seeds" in done.stdout


def test_paired_report_files_name_the_intervals_apart(paired_report):
    out, done = paired_report
    markdown = (out / "table.md").read_text()
    assert "## Several trainings per method" in markdown
    assert "interval over runs (seeds and test cases resampled)" in markdown
    assert "interval over test cases (networks fixed)" in markdown
    assert "95% t-interval over seeds (test cases fixed)" in markdown
    content = json.loads((out / "runs.json").read_text())
    assert content["settings"]["paired"] is True and content["settings"]["n_bootstrap"] == 200
    assert content["settings"]["run_names"]["DRO"] == ["DRO#1", "DRO#2", "DRO#3"]
    assert len(content["statistics"]) == len(pd.read_csv(out / "runs.csv"))
    assert json.loads((out / "summary.json").read_text())["settings"]["runs"]["paired"] is True


def test_unpaired_unequal_run_counts_and_cross_validation_folders(cohort, tmp_path):
    root, runs = cohort
    # two cross-validation trainer folders for DRO: fold_0 and fold_1 validation predictions
    trainers = []
    for k in range(2):
        trainer = tmp_path / f"Trainer{k}__nnUNetPlans__3d_fullres"
        for i, file in enumerate(sorted(runs["DRO"][k].iterdir())):
            (trainer / f"fold_{i % 2}" / "validation").mkdir(parents=True, exist_ok=True)
            shutil.copy(file, trainer / f"fold_{i % 2}" / "validation" / file.name)
        trainers.append(trainer)
    out = tmp_path / "report"
    done = run_cli("-ref", root / "ref", "-pred", _pred(runs, "ERM"), f"DRO={trainers[0]},{trainers[1]}", "-o", out,
                   "--bootstrap", "100", "-np", "1")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "runs.csv")
    row = table.query("kind == 'difference' and group == 'all' and region == 1 and statistic == 'mean'").iloc[0]
    assert (row["n_runs"], row["n_runs_reference"]) == (2, 3) and not row["paired"]
    assert np.isnan(row["ci_seeds_t_low"]) and row["ci_runs_low"] < row["point"] < row["ci_runs_high"]
    summary = pd.read_csv(out / "summary.csv").query("group == 'all' and region == 1")
    expected = summary[summary["method"].str.startswith("DRO#")]["mean"].mean() - \
        summary[summary["method"].str.startswith("ERM#")]["mean"].mean()
    assert row["point"] == pytest.approx(expected)
    assert "interval over runs (runs and test cases resampled)" in done.stdout
    assert "Cross-validation: DRO#1 = fold_N/validation" in (out / "table.md").read_text()
    # the same folder, evaluated once per method again: runs.csv of the earlier run is gone
    done = run_cli("-ref", root / "ref", "-pred", f"ERM={runs['ERM'][0]}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    assert not (out / "runs.csv").exists() and not (out / "runs.json").exists()


def test_missing_cases_in_one_run_follow_the_missing_policy(cohort, tmp_path):
    root, runs = cohort
    partial = tmp_path / "ERM_partial"
    shutil.copytree(runs["ERM"][1], partial)
    (partial / "case_002.nii.gz").unlink()
    pred = f"ERM={runs['ERM'][0]},{partial},{runs['ERM'][2]}"
    out = tmp_path / "report"
    done = run_cli("-ref", root / "ref", "-pred", pred, _pred(runs, "DRO"), "--paired-runs", "-o", out, "-np", "1")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(PREFIX) and "ERM#2 has no prediction for 1 case(s)" in lines[-1]
    assert "case_002" in lines[-1] and f"(ERM#2 = {partial})" in lines[-1] and not out.exists()
    done = run_cli("-ref", root / "ref", "-pred", pred, _pred(runs, "DRO"), "--paired-runs", "-o", out, "-np", "1",
                   "--missing", "skip", "--bootstrap", "50")
    assert done.returncode == 0, done.stderr
    per_case = pd.read_csv(out / "per_case.csv").query("region == 1")
    wide = per_case.pivot(index="case", columns="method", values="value")
    keep = wide["ERM#2"].notna()
    d2 = wide.loc[keep, "DRO#2"].mean() - wide.loc[keep, "ERM#2"].mean()  # seed 2 on the cases both scored
    row = pd.read_csv(out / "runs.csv").query(
        "kind == 'difference' and group == 'all' and region == 1 and statistic == 'mean'").iloc[0]
    assert float(row["per_run"].split(";")[1]) == pytest.approx(d2)


@pytest.mark.parametrize("name", ["unequal_paired", "paired_single", "duplicate_within", "duplicate_across",
                                  "empty_entry", "separator_in_name"])
def test_bad_run_lists_one_line_exit_2_nothing_written(cohort, tmp_path, name):
    root, runs = cohort
    erm, dro = runs["ERM"], runs["DRO"]
    pred = {
        "unequal_paired": [_pred(runs, "ERM"), f"DRO={dro[0]},{dro[1]}", "--paired-runs"],
        "paired_single": [f"ERM={erm[0]}", f"DRO={dro[0]}", "--paired-runs"],
        "duplicate_within": [f"ERM={erm[0]},{erm[1]},{erm[0]}"],
        "duplicate_across": [_pred(runs, "ERM"), f"DRO={dro[0]},{erm[1]}"],
        "empty_entry": [f"ERM={erm[0]},,{erm[1]}"],
        "separator_in_name": [f"E#RM={erm[0]},{erm[1]}"],
    }[name]
    expected = {
        "unequal_paired": "--paired-runs: every method needs the same number of runs, one per seed, in seed order "
                          "(given: ERM 3, DRO 2)",
        "paired_single": "--paired-runs: each method has one run",
        "duplicate_within": f"-pred: {erm[0]} is given twice (ERM run 1 and ERM run 3)",
        "duplicate_across": f"-pred: {erm[1]} is given twice (ERM run 2 and DRO run 2)",
        "empty_entry": "an empty run folder name",
        "separator_in_name": "cannot contain '#'",
    }[name]
    out = tmp_path / "report"
    flags = [p for p in pred if p.startswith("--")]
    done = run_cli("-ref", root / "ref", "-pred", *[p for p in pred if not p.startswith("--")], *flags, "-o", out)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX) and expected in lines[0], lines
    assert not out.exists()
