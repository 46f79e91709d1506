"""scripts/benchmark_robustness.py: seed and arm parsing, the statistics it aggregates over seeds,
the targets check, the reports, and the pairing it relies on (the arms of one repetition start from
the same initial weights).

End to end, one small real run (``shared_run``: 10 training cases, label noise, four arms trained
by two processes side by side, then one report run with the further scorings and the record) is
shared by every check that needs trained networks: train once, assert many. The exclude-flagged
test keeps its own run (its audited cohort is another cohort).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.errors import UserError

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_robustness.py"


@pytest.fixture(scope="module")
def bench():
    """The benchmark's analysis and runner (``scripts/benchmark_robustness.py`` is a thin script over them)."""
    from nnunet_dro.lab import benchmark, benchmark_analysis
    return SimpleNamespace(**{**vars(benchmark_analysis), **vars(benchmark)})


@pytest.mark.parametrize("text, expected", [
    ("3", [0, 1, 2]),
    ("1", [0]),
    ("4,7,9", [4, 7, 9]),
    ("5,", [5]),
])
def test_parse_seeds(bench, text, expected):
    assert bench.parse_seeds(text) == expected


def test_a_count_of_zero_says_how_to_name_seed_zero(bench):
    with pytest.raises(UserError, match="for seed 0 alone write --seeds 0,"):
        bench.parse_seeds("0")


@pytest.mark.parametrize("text", ["0", "abc", "1,1", "-1,2", "2.5", ","])
def test_parse_seeds_rejects(bench, text):
    with pytest.raises(UserError, match="--seeds"):
        bench.parse_seeds(text)


@pytest.mark.parametrize("text, expected", [
    ("ERM", ["ERM"]),
    ("DROAdaptive_f50,ERM", ["ERM", "DROAdaptive_f50"]),
    ("ERM, DRO ,DROAdaptive_f25", ["ERM", "DRO", "DROAdaptive_f25"]),
])
def test_parse_arms(bench, text, expected):
    assert bench.parse_arms(text) == expected


@pytest.mark.parametrize("text", ["", "ERM,ERM", "ERM,Nope", ","])
def test_parse_arms_rejects(bench, text):
    with pytest.raises(UserError, match="--arms"):
        bench.parse_arms(text)


def _per_case(shift_minority_low: float, seeds=(0, 1, 2)) -> pd.DataFrame:
    """10 control and 10 spina-bifida cases per seed, one region. DRO adds ``shift_minority_low``
    to the three worst spina-bifida cases of every seed and leaves everything else as ERM."""
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        for group, centre in (("control", 90.0), ("spina_bifida", 60.0)):
            values = np.sort(rng.normal(centre, 8.0, 10))
            for k, value in enumerate(values):
                case = f"{group}_{seed}_{k}"
                dro = value + (shift_minority_low if group == "spina_bifida" and k < 3 else 0.0)
                rows.append(dict(seed=seed, method="ERM", case=case, region="cerebellum", metric="dice",
                                 value=value, condition=group))
                rows.append(dict(seed=seed, method="DROAdaptive_f50", case=case, region="cerebellum", metric="dice",
                                 value=dro, condition=group))
    return pd.DataFrame(rows)


def test_statistics_match_numpy_per_seed_and_average_over_seeds(bench):
    per_case = _per_case(5.0)
    by_seed = bench.summary_by_seed(per_case)
    one = per_case[(per_case.seed == 1) & (per_case.method == "ERM") & (per_case.condition == "spina_bifida")]
    row = by_seed.query("seed == 1 and method == 'ERM' and group == 'spina_bifida'").iloc[0]
    values = one["value"].to_numpy()
    assert row["n"] == 10
    assert row["p10"] == pytest.approx(np.percentile(values, 10))
    assert row["iqr"] == pytest.approx(np.percentile(values, 75) - np.percentile(values, 25))
    assert by_seed.query("group == 'all'")["n"].eq(20).all()

    summary = bench.summary_over_seeds(by_seed)
    row = summary.query("method == 'ERM' and group == 'spina_bifida'").iloc[0]
    per_seed = by_seed.query("method == 'ERM' and group == 'spina_bifida'")["p5"]
    assert row["n_seeds"] == 3
    assert row["p5"] == pytest.approx(per_seed.mean())
    assert row["p5_sd"] == pytest.approx(per_seed.std(ddof=1))


def _runs(collapsed_arm=(0, 0, 0), collapsed_erm=(0, 1, 0)) -> pd.DataFrame:
    rows = []
    for seed in range(3):
        for arm, collapsed in (("ERM", collapsed_erm), ("DROAdaptive_f50", collapsed_arm)):
            rows.append(dict(arm=arm, seed=seed, epochs=40, collapsed_epochs=collapsed[seed], train_seconds=300.0,
                             lost_epochs=0, control_mean_dice={"cerebellum": 90.0}))
    return pd.DataFrame(rows)


def test_paired_comparison_finds_raised_minority_tail_and_unchanged_controls(bench):
    per_case = _per_case(12.0)
    by_seed = bench.summary_by_seed(per_case)
    paired = bench.paired_comparison(per_case, by_seed).set_index("group")
    assert set(paired["method"]) == {"DROAdaptive_f50"}
    minority, control = paired.loc["spina_bifida"], paired.loc["control"]
    assert minority["d_p10"] > 0 and minority["d_p10_seeds_up"] == 3 and minority["d_p10_signs"] == "+++"
    assert minority["d_p5"] > 0 and minority["d_p5_seeds_up"] == 3
    iqr = {m: [np.subtract(*np.percentile(f["value"], [75, 25])) for _, f in
               per_case.query("condition == 'spina_bifida' and method == @m").groupby("seed")]
           for m in ("DROAdaptive_f50", "ERM")}
    assert minority["d_iqr"] == pytest.approx(np.mean(np.subtract(iqr["DROAdaptive_f50"], iqr["ERM"])))
    assert minority["pooled_n"] == 30
    assert minority["pooled_mean"] == pytest.approx(12.0 * 9 / 30)
    assert minority["pooled_share_improved"] == pytest.approx(0.3)
    assert control["d_mean"] == 0 and control["d_p10_seeds_up"] == 0 and control["d_mean_signs"] == "000"
    assert control["pooled_wilcoxon_p"] == 1.0  # all differences zero

    summary = bench.summary_over_seeds(by_seed, ["ERM", "DROAdaptive_f50"])
    hardest = bench.hardest_regions(summary)
    assert hardest == {"spina_bifida": "cerebellum"}
    lines = bench.targets_check(by_seed, paired.reset_index(), _runs(), hardest)
    # raised in every seed, but by less than the 5-point target
    assert any(line.startswith("DROAdaptive_f50: spina_bifida p10 on its hardest structure (cerebellum) +4.5 vs ERM")
               and "[+++] -> not met" in line for line in lines)
    big = _per_case(0.0)
    big.loc[(big["method"] == "DROAdaptive_f50") & (big["condition"] == "spina_bifida"), "value"] += 10.0
    big_by_seed = bench.summary_by_seed(big)
    big_lines = bench.targets_check(big_by_seed, bench.paired_comparison(big, big_by_seed), _runs(), hardest)
    assert any("spina_bifida p10 on its hardest structure (cerebellum) +" in line and "[+++] -> MET" in line
               for line in big_lines)
    assert any("controls' region means vs ERM cerebellum +0.0 [000] -> MET" in line for line in lines)
    assert any("collapsed epochs per seed [0, 0, 0] vs ERM [0, 1, 0] -> MET" in line for line in lines)
    assert any("learned structure lost per seed [0, 0, 0] vs ERM [0, 0, 0] -> MET" in line for line in lines)
    lines = bench.targets_check(by_seed, paired.reset_index(), _runs(collapsed_arm=(1, 0, 0), collapsed_erm=(0, 0, 0)),
                                hardest)
    assert any("collapsed epochs per seed [1, 0, 0] vs ERM [0, 0, 0] -> not met" in line for line in lines)


def test_a_lowered_tail_fails_the_target(bench):
    per_case = _per_case(-12.0)
    by_seed = bench.summary_by_seed(per_case)
    paired = bench.paired_comparison(per_case, by_seed)
    row = paired.set_index("group").loc["spina_bifida"]
    assert row["d_p10"] < 0 and row["d_p10_signs"] == "---"
    lines = bench.targets_check(by_seed, paired, _runs(), {"spina_bifida": "cerebellum"})
    assert any("spina_bifida p10" in line and "-> not met" in line for line in lines)


def test_reports_and_tradeoff_plot_render(bench, tmp_path):
    per_case = _per_case(3.0)
    by_seed = bench.summary_by_seed(per_case)
    summary = bench.summary_over_seeds(by_seed, ["ERM", "DROAdaptive_f50"])
    paired = bench.paired_comparison(per_case, by_seed)
    hardest = bench.hardest_regions(summary)
    targets = bench.targets_check(by_seed, paired, _runs(), hardest)
    settings = {"seeds": [0, 1, 2], "arms": ["ERM", "DROAdaptive_f50"], "cohort": {"n_train": 40, "n_test": 30, "size": 32},
                "budget": "CPU budget defaults", "device": "cpu", "seconds": 1.0, "runs": "x"}
    text = bench.markdown_report(summary, paired, _runs(), settings, hardest, targets)
    assert "| spina_bifida | cerebellum | DROAdaptive_f50 |" in text and "Δp10" in text and "## Targets" in text
    assert "## Headline" in text and "| DROAdaptive_f50 | 3 |" in text
    assert "spina_bifida" in bench.terminal_report(summary, paired, targets)
    bench.plot_tradeoff(tmp_path / "tradeoff.png", by_seed, hardest, ["ERM", "DROAdaptive_f50"])
    assert (tmp_path / "tradeoff.png").stat().st_size > 10_000


def test_terminal_report_keeps_a_long_arm_name_apart_from_the_group(bench):
    per_case = _per_case(3.0)
    per_case["method"] = per_case["method"].replace("DROAdaptive_f50", "DROAdaptive_noIS_smooth25")
    by_seed = bench.summary_by_seed(per_case)
    summary = bench.summary_over_seeds(by_seed, ["ERM", "DROAdaptive_noIS_smooth25"])
    paired = bench.paired_comparison(per_case, by_seed)
    text = bench.terminal_report(summary, paired, [])
    assert "DROAdaptive_noIS_smooth25 spina_bifida" in text and "Adaptive_untilLearnedspina" not in text


def test_headline_shows_erm_in_dice_and_each_arm_as_its_paired_difference(bench):
    """The headline: ERM's row holds Dice (mean ± sd over seeds), the other arm's the paired
    difference with its sign per seed; the controls' cell of an arm that changed only the
    minority's tail reads +0.0."""
    per_case = _per_case(12.0)
    by_seed = bench.summary_by_seed(per_case)
    summary = bench.summary_over_seeds(by_seed, ["ERM", "DROAdaptive_f50"])
    paired = bench.paired_comparison(per_case, by_seed)
    runs = _runs().assign(draw_share_spina_bifida=0.3, draw_share_other=0.1)
    lines = bench.headline_table(summary, paired, runs, {"spina_bifida": "cerebellum"})
    assert lines[0].startswith("| arm | seeds | spina_bifida cerebellum p10 | control cerebellum mean |")
    erm, arm = lines[2].split(" | "), lines[3].split(" | ")
    erm_p10 = summary.set_index(["method", "group"]).loc[("ERM", "spina_bifida")]
    assert erm[:2] == ["| ERM", "3"] and erm[2] == f"{erm_p10['p10']:.1f} ± {erm_p10['p10_sd']:.1f}"
    assert arm[:2] == ["| DROAdaptive_f50", "3"] and arm[2].endswith("[+++]") and arm[3].startswith("+0.0")
    assert arm[4:] == ["0, 0, 0", "0.40 |"]


def test_report_only_without_runs_is_a_clear_error(bench, tmp_path, capsys):
    code = bench.main(["--seeds", "1", "--report-only", "-o", str(tmp_path)])
    assert code == 2 and "no finished runs" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--epochs", "0"), ("--iterations", "0"), ("--n-train", "4"),
                                         ("--n-test", "2"), ("--size", "8"), ("--large-test", "-1"),
                                         ("--label-noise", "-1"), ("--torch-threads", "0")])
def test_out_of_range_settings_are_one_line_errors_naming_the_flag(bench, tmp_path, capsys, flag, value):
    assert bench.main(["--seeds", "1", flag, value, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {value}: must be at least" in err
    assert not (tmp_path / "runs").exists()


def test_benchmark_needs_the_erm_arm(bench, tmp_path, capsys):
    assert bench.main(["--arms", "DROAdaptive_f50", "-o", str(tmp_path)]) == 2
    assert "needs the ERM arm" in capsys.readouterr().err


@pytest.mark.slow
def test_seeded_budget_trainers_start_from_the_same_weights(tmp_path):
    """The paired comparison assumes every arm of a repetition starts from the same initial weights:
    ``nnUNet_dro_seed`` seeds them (and the DRO draws); without it they differ."""
    env = {**os.environ, "nnUNet_raw": str(tmp_path / "raw"), "nnUNet_preprocessed": str(tmp_path / "pre"),
           "nnUNet_results": str(tmp_path / "res"), "nnUNet_compile": "f", "nnUNet_def_n_proc": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("nnUNet_dro_seed", None)
    bin_dir = Path(sys.executable).parent
    subprocess.run([sys.executable, "-m", "nnunet_dro", "make-synthetic", "--kind", "fetal", "--id", "993",
                    "--n-train", "3", "--n-test", "0", "--size", "16"], env=env, check=True, capture_output=True)
    subprocess.run([str(bin_dir / "nnUNetv2_plan_and_preprocess"), "-d", "993", "-c", "3d_fullres", "-np", "1",
                    "-npfp", "1"], env=env, check=True, capture_output=True)
    check = textwrap.dedent(f"""
        import torch
        from batchgenerators.utilities.file_and_folder_operations import join, load_json
        from nnunet_dro.lab.budget import nnUNetTrainer_CPUBudget, nnUNetTrainerDROAdaptive_CPUBudget
        folder = join({str(tmp_path / 'pre')!r}, 'Dataset993_SyntheticFetal')
        plans, dataset = load_json(join(folder, 'nnUNetPlans.json')), load_json(join(folder, 'dataset.json'))
        weights, seeds, widths = [], [], []
        for cls in (nnUNetTrainer_CPUBudget, nnUNetTrainerDROAdaptive_CPUBudget):
            # nnU-Net 2.8's run_training sets this key before building a trainer
            trainer = cls({{**plans, 'continue_training': False}}, '3d_fullres', 'all', dataset,
                          device=torch.device('cpu'))
            trainer.initialize()
            weights.append(torch.cat([p.detach().flatten() for p in trainer.network.parameters()]))
            widths.append(trainer.network.encoder.stages[0][0].convs[0].conv.out_channels)
            seeds.append(getattr(getattr(trainer, 'dro_settings', None), 'seed', None))
            if hasattr(trainer, 'case_weighting'):
                trainer.case_weighting.close()
        full = plans['configurations']['3d_fullres']['architecture']['arch_kwargs']['features_per_stage'][0]
        print('SAME' if torch.equal(*weights) else 'DIFFERENT', seeds[1], widths[0] * 4 == full)
    """)
    outputs = {}
    for label, extra in (("seeded", {"nnUNet_dro_seed": "7"}), ("unseeded", {})):
        done = subprocess.run([sys.executable, "-c", check], env={**env, **extra}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[label] = done.stdout.strip().splitlines()[-1]
    assert outputs["seeded"] == "SAME 7 True"
    assert outputs["unseeded"] == "DIFFERENT None True"


def test_draw_shares_count_the_sampler_draws_or_fall_back_to_uniform(tmp_path):
    """The runs table's "minorities' share of draws": from the hardness report's draw counts of a
    case-weighting run, from the training cases' groups for nnU-Net's uniform sampling, and
    nothing for a run whose folder is gone; and how well the stale losses rank minorities first."""
    from nnunet_dro.lab.cohort_folder import Cohort
    from nnunet_dro.lab.pipeline import Workspace

    ws = Workspace(tmp_path, 991, "SyntheticFetalBenchmark", Cohort(5, 1, 16, 0), echo=lambda text: None)
    ws.cohort_folder.raw.mkdir(parents=True)
    (ws.cohort_folder.raw / "subgroups.tsv").write_text(
        "case\tcondition\tsplit\n" + "".join(f"c{i}\t{g}\ttrain\n" for i, g in
                                             enumerate(["control", "control", "control", "spina_bifida", "other"]))
        + "t0\tother\ttest\n")
    dro, erm = ws.arms.fold_folder("DROTrainer"), ws.arms.fold_folder("ERMTrainer")
    dro.mkdir(parents=True)
    erm.mkdir(parents=True)
    pd.DataFrame({"case": ["c0", "c1", "c2", "c3", "c4"], "stale_loss": [0.1, 0.2, 0.3, 0.25, 0.5],
                  "probability": 0.2, "times_drawn": [10, 10, 0, 20, 10],
                  "group": ["control"] * 3 + ["spina_bifida", "other"]}).to_csv(dro / "dro_hardness.csv", index=False)
    (erm / "checkpoint_final.pth").write_bytes(b"")
    assert ws.draws.draw_shares("DROTrainer") == pytest.approx({"control": 0.4, "spina_bifida": 0.4, "other": 0.2})
    assert ws.draws.draw_shares("ERMTrainer") == pytest.approx({"control": 0.6, "spina_bifida": 0.2, "other": 0.2})
    assert ws.draws.draw_shares("NeverTrained") == {}
    assert ws.draws.draw_shares("NeverTrained", finished=True) == pytest.approx({"control": 0.6, "spina_bifida": 0.2,
                                                                           "other": 0.2})
    # spina bifida beats 2 of 3 controls, other all 3: AUC 5/6
    assert ws.draws.minority_hardness_auc("DROTrainer") == pytest.approx(5 / 6)
    assert np.isnan(ws.draws.minority_hardness_auc("ERMTrainer"))
    # c3 drew 20 of 50, uniform gives each of the 5 cases 10
    assert ws.draws.busiest_case_draws("DROTrainer") == pytest.approx(2.0)
    assert np.isnan(ws.draws.busiest_case_draws("ERMTrainer"))


@pytest.mark.parametrize("shares, shown", [
    ({"draw_share_spina_bifida": 0.4, "draw_share_other": 0.2}, "0.60"),
    ({"draw_share_spina_bifida": 0.4}, "0.40"),
    ({}, "-"),
    ({"draw_share_spina_bifida": float("nan"), "draw_share_other": float("nan")}, "-"),
])
def test_minority_share_cell(bench, shares, shown):
    assert bench._minority_share(pd.Series({"arm": "x", **shares})) == shown


def test_an_arm_missing_a_seed_does_not_shrink_the_seed_count_of_the_others(bench):
    """Arms are added in pieces: a third arm run on seeds 0 and 1 only must not make the other arm's
    3-seed comparison count as 2 seeds (and fail its "better in every seed" target)."""
    per_case = _per_case(12.0)
    partial = per_case[(per_case.method == "DROAdaptive_f50") & (per_case.seed < 2)].assign(method="GroupDRO")
    per_case = pd.concat([per_case, partial], ignore_index=True)
    by_seed = bench.summary_by_seed(per_case)
    paired = bench.paired_comparison(per_case, by_seed).set_index(["method", "group"])
    assert paired.loc[("DROAdaptive_f50", "spina_bifida"), "n_seeds"] == 3
    assert paired.loc[("GroupDRO", "spina_bifida"), "n_seeds"] == 2
    row = paired.loc[("DROAdaptive_f50", "spina_bifida")]
    assert row["d_p10_seeds_up"] == row["n_seeds"] == 3  # what the "better in every seed" target compares


@pytest.mark.parametrize("shift, resolved", [
    (4.0, "+"),    # every spina bifida case up by 4: p10 up by exactly 4 in every resample
    (-4.0, "-"),
    (0.0, "0"),    # the arm equals ERM: interval [0, 0], which holds 0
])
def test_p10_interval_of_a_constant_shift_is_that_shift(bench, shift, resolved):
    """Pairs are resampled together: a shift of every case moves each resample's p10 by exactly the
    shift, so the interval collapses onto it (resampled apart, it would be several points wide)."""
    per_case = _per_case(0.0)
    dro = (per_case["method"] == "DROAdaptive_f50") & (per_case["condition"] == "spina_bifida")
    per_case.loc[dro, "value"] += shift
    intervals = bench.p10_intervals(per_case, {"spina_bifida": "cerebellum"})
    assert list(intervals["seed"]) == [0, 1, 2] and set(intervals["n"]) == {10}
    for column in ("d_p10", "low", "high"):
        assert intervals[column].to_numpy() == pytest.approx(shift)
    assert set(intervals["resolved"]) == {resolved}


def test_p10_interval_holds_the_difference_and_widens_with_noise(bench):
    """Noise in the arm's cases (not a shift) leaves a point difference inside a wide interval."""
    per_case = _per_case(0.0)
    dro = (per_case["method"] == "DROAdaptive_f50") & (per_case["condition"] == "spina_bifida")
    per_case.loc[dro, "value"] += np.random.default_rng(7).normal(0.0, 6.0, dro.sum())
    intervals = bench.p10_intervals(per_case, {"spina_bifida": "cerebellum"})
    assert ((intervals["low"] <= intervals["d_p10"]) & (intervals["d_p10"] <= intervals["high"])).all()
    assert (intervals["high"] - intervals["low"]).min() > 2.0
    again = bench.p10_intervals(per_case, {"spina_bifida": "cerebellum"})
    pd.testing.assert_frame_equal(intervals, again)  # fixed bootstrap seed: the tables re-make identically


def test_p10_intervals_skip_seeds_and_groups_an_arm_lacks(bench):
    per_case = _per_case(4.0)
    per_case = per_case[~((per_case["method"] == "DROAdaptive_f50") & (per_case["seed"] == 1))]
    intervals = bench.p10_intervals(per_case, {"spina_bifida": "cerebellum", "other": "intra_axial_csf"})
    assert list(intervals["seed"]) == [0, 2] and set(intervals["group"]) == {"spina_bifida"}
    lines = bench.p10_interval_section(intervals)
    assert lines[0].startswith("## Is a seed's p10 difference") and len([x for x in lines if x.startswith("| DROAdaptive")]) == 2
    assert bench.p10_interval_section(bench.p10_intervals(per_case[per_case["method"] == "ERM"], {"spina_bifida": "cerebellum"})) == []


def test_docstring_examples_of_the_benchmark_modules_run():
    import doctest

    from nnunet_dro.lab import benchmark, benchmark_analysis
    attempted = 0
    for module in (benchmark_analysis, benchmark):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
        assert result.failed == 0
        attempted += result.attempted
    assert attempted >= 4


@pytest.mark.parametrize("learned, early, late", [
    ((20, 20, 20), [0, 1, 2], []),
    ((20, 21, 41), [0], [1, 2]),        # epoch 20 of 40 is still the first half, 21 is not
    ((None, 5, float("nan")), [1], [0, 2]),  # never, and unknown, count as late
    ((39, 40, 39), [], [0, 1, 2]),
])
def test_learning_split_goes_by_erm_alone(bench, learned, early, late):
    runs = _runs().assign(all_learned_epoch=None).astype({"all_learned_epoch": object})
    for seed, epoch in enumerate(learned):
        runs.loc[(runs.arm == "ERM") & (runs.seed == seed), "all_learned_epoch"] = epoch
    # the DRO arm's own epochs must not matter
    runs.loc[runs.arm != "ERM", "all_learned_epoch"] = 0
    assert bench.learning_split(runs) == (early, late)


def test_learning_time_section_repeats_the_headline_per_set_of_seeds(bench):
    """Seeds 0-1 early, seed 2 late; the arm lifts the minority tail by 12 on seeds 0-1 only, so
    the two tables show [++] and a zero [0]."""
    per_case = _per_case(12.0)
    late_dro = (per_case.seed == 2) & (per_case.method == "DROAdaptive_f50")
    late_erm = (per_case.seed == 2) & (per_case.method == "ERM")
    per_case.loc[late_dro, "value"] = per_case.loc[late_erm, "value"].to_numpy()
    runs = _runs().assign(all_learned_epoch=[10, 10, 15, 15, 30, 30])
    lines = bench.learning_time_section(per_case, runs, {"spina_bifida": "cerebellum"}, ["ERM", "DROAdaptive_f50"])
    text = "\n".join(lines)
    assert "### ERM learned every structure within the first half: seeds 0, 1" in text
    assert "### ERM learned every structure later or never: seeds 2" in text
    rows = [line for line in lines if line.startswith("| DROAdaptive_f50 |")]
    assert len(rows) == 2 and rows[0].split(" | ")[1] == "2" and "[++]" in rows[0]
    assert rows[1].split(" | ")[1] == "1" and rows[1].split(" | ")[2].startswith("+0.0")
    assert bench.learning_time_section(per_case, _runs(), {"spina_bifida": "cerebellum"}, ["ERM"]) == []
    settings = {"seeds": [0, 1, 2], "arms": ["ERM", "DROAdaptive_f50"], "cohort": {"n_train": 40, "n_test": 30, "size": 32},
                "budget": "CPU budget defaults", "device": "cpu", "seconds": 1.0, "runs": "x"}
    by_seed = bench.summary_by_seed(per_case)
    report = bench.markdown_report(bench.summary_over_seeds(by_seed, ["ERM", "DROAdaptive_f50"]),
                                   bench.paired_comparison(per_case, by_seed), runs, settings,
                                   {"spina_bifida": "cerebellum"}, [], lines)
    assert report.index("## By how early ERM") < report.index("## Runs: convergence")
    assert "| ERM | 2 | control:" not in report and "| ERM | 2 | cerebellum 90.0 | 30 |" in report


def test_all_learned_epoch_is_read_from_the_final_checkpoint(tmp_path):
    """Results stored before the runs table had the column get it from the run's checkpoint log."""
    import torch

    from nnunet_dro.lab.cohort_folder import Cohort
    from nnunet_dro.lab.pipeline import Workspace

    ws = Workspace(tmp_path, 991, "SyntheticFetalBenchmark", Cohort(5, 1, 16, 0), echo=lambda text: None)
    folder = ws.arms.fold_folder("Trainer")
    folder.mkdir(parents=True)
    dice = [[0.0, 0.0], [0.3, 0.1], [0.3, float("nan")], [0.9, 0.25]]
    torch.save({"logging": {"dice_per_class_or_region": dice, "train_losses": [1.0] * 4}},
               folder / "checkpoint_final.pth")
    assert ws.arms.all_learned_epoch("Trainer") == 2  # a NaN (structure absent) is not held against an epoch
    assert ws.arms.all_learned_epoch("NeverTrained") is None


def _stored_seed(root: Path, seed: int, arms: dict, large_test: bool = False, noisy: tuple[str, ...] = ()) -> None:
    """A finished seed as the benchmark leaves it, without the gigabytes: cohort settings, the
    subgroup table, and per arm its result, per-case Dice and (case-weighting arms) hardness report;
    with ``large_test`` also its Dice on a larger test set (40 cases per group); with ``noisy`` the
    record of those training cases' corrupted labels."""
    from nnunet_dro.lab.cohort_folder import Cohort
    from nnunet_dro.lab.pipeline import Workspace

    ws = Workspace(root / "runs" / f"seed_{seed}", 991, "SyntheticFetalBenchmark",
                   Cohort(seed=seed, label_noise=len(noisy)), echo=lambda text: None)
    if noisy:
        (ws.cohort_folder.folder / "label_noise.json").write_text(json.dumps([{"case": case, "kind": "erase"} for case in noisy]))
    groups = ["control"] * 8 + ["spina_bifida", "other"]
    ws.cohort_folder.raw.mkdir(parents=True)
    (ws.cohort_folder.raw / "subgroups.tsv").write_text("case\tcondition\tsplit\n" + "".join(
        f"c{i}\t{g}\ttrain\n" for i, g in enumerate(groups)))
    rng = np.random.default_rng(seed)
    for arm, (trainer, lift) in arms.items():
        rows = [dict(method=arm, case=f"t{k}", region=region, metric="dice", note="",
                     value=min(100.0, centre + rng.normal(0, 4) + (lift if group != "control" else 0.0)),
                     condition=group)
                for k, group in enumerate(["control"] * 6 + ["spina_bifida"] * 6 + ["other"] * 6)
                for region, centre in (("white_matter", 95.0), ("intra_axial_csf", 85.0), ("cerebellum", 80.0))]
        ws.arms.arm_folder(arm).mkdir(parents=True)
        pd.DataFrame(rows).to_csv(ws.arms.arm_folder(arm) / "per_case.csv", index=False)
        if large_test:
            pd.DataFrame([dict(method=arm, case=f"c{i}", region="cerebellum", metric="dice", note="",
                               value=90.0 - 20.0 * (g != "control") + lift, condition=g) for i, g in enumerate(groups)]
                         ).to_csv(ws.arms.arm_folder(arm) / "per_case_training.csv", index=False)
            (ws.cohort_folder.folder / "large_test.json").write_text(json.dumps({"per_group": 40}))
            pd.DataFrame([dict(method=arm, case=f"L{k}", region="cerebellum", metric="dice", note="",
                               value=80.0 + k % 7 + (lift if group != "control" else 0.0), condition=group)
                          for k, group in enumerate(["control"] * 40 + ["spina_bifida"] * 40 + ["other"] * 40)]
                         ).to_csv(ws.arms.arm_folder(arm) / "per_case_large_test.csv", index=False)
            # the same cases at a new centre: 20 lower, the minority lift doubled
            (ws.cohort_folder.folder / "shifted_test.json").write_text(json.dumps({"per_group": 40, "site": "site_C"}))
            pd.DataFrame([dict(method=arm, case=f"L{k}", region="cerebellum", metric="dice", note="",
                               value=60.0 + k % 7 + (2 * lift if group != "control" else 0.0), condition=group)
                          for k, group in enumerate(["control"] * 40 + ["spina_bifida"] * 40 + ["other"] * 40)]
                         ).to_csv(ws.arms.arm_folder(arm) / "per_case_shifted_test.csv", index=False)
        summary = {"arm": arm, "trainer": trainer, "seed": seed, "budget": {"epochs": None, "iterations_per_epoch": None},
                   "train_seconds": 1500.0, "epochs": 120, "collapsed_epochs": 20, "lost_epochs": 0,
                   "all_learned_epoch": 40, "control_mean_dice": {"white_matter": 95.0, "intra_axial_csf": 85.0,
                                                                  "cerebellum": 80.0}}
        (ws.arms.arm_folder(arm) / "result.json").write_text(json.dumps(summary))
        if lift:
            ws.arms.fold_folder(trainer).mkdir(parents=True)
            pd.DataFrame({"case": [f"c{i}" for i in range(10)], "stale_loss": np.linspace(0.1, 0.9, 10),
                          "probability": 0.1, "times_drawn": [5] * 8 + [30, 20]}).to_csv(
                ws.draws.hardness_report_file(trainer), index=False)


def test_export_record_keeps_what_the_tables_are_made_from(bench, tmp_path):
    """--export-record copies kilobytes per run; --report-only on the record re-makes the same tables
    (the per-group statistics, the paired differences, the DRO arm's share of draws)."""
    runs, record = tmp_path / "results", tmp_path / "record"
    arms = {"ERM": ("nnUNetTrainer_CPUBudget", 0.0), "DROAdaptive_fromStart": ("DROTrainer", 6.0)}
    for seed in (3, 4):
        _stored_seed(runs, seed, arms)
    common = ["--seeds", "3,4", "--arms", ",".join(arms), "--report-only"]
    assert bench.main(common + ["-o", str(runs), "--export-record", str(record)]) == 0
    copied = sorted(str(p.relative_to(record)) for p in record.rglob("*") if p.is_file())
    hardness = ("runs/seed_{s}/nnunet/nnUNet_results/Dataset991_SyntheticFetalBenchmark/"
                "DROTrainer__nnUNetPlans__3d_fullres/fold_all/dro_hardness.csv")
    assert copied == sorted(
        f.format(s=s) for s in (3, 4) for f in
        ["runs/seed_{s}/cohort.json", "runs/seed_{s}/nnunet/nnUNet_raw/Dataset991_SyntheticFetalBenchmark/subgroups.tsv",
         "runs/seed_{s}/arms/ERM/result.json", "runs/seed_{s}/arms/ERM/per_case.csv",
         "runs/seed_{s}/arms/DROAdaptive_fromStart/result.json",
         "runs/seed_{s}/arms/DROAdaptive_fromStart/per_case.csv", hardness])

    assert bench.main(common + ["-o", str(record)]) == 0
    for table in ("summary.csv", "paired.csv", "p10_intervals.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(record / table), pd.read_csv(runs / table))
    from_runs, from_record = (pd.read_csv(folder / "runs.csv").set_index(["arm", "seed"]) for folder in (runs, record))
    dro = ("DROAdaptive_fromStart", 3)
    assert from_record.loc[dro, "draw_share_spina_bifida"] == pytest.approx(30 / 90)  # 8 controls x 5 + 30 + 20 draws
    assert from_record.loc[dro, "draw_share_spina_bifida"] == from_runs.loc[dro, "draw_share_spina_bifida"]
    # ERM keeps no hardness report and the record no checkpoint: the cohort's share, as in the runs
    erm = ("ERM", 3)
    assert from_record.loc[erm, "draw_share_spina_bifida"] == pytest.approx(1 / 10)
    assert from_record.loc[erm, "draw_share_spina_bifida"] == from_runs.loc[erm, "draw_share_spina_bifida"]


def test_export_record_keeps_the_label_noise_record(bench, tmp_path):
    """With --label-noise the record keeps which cases were corrupted, so --report-only on it gives
    the same share of draws on them as the runs (the DRO arm drew c8 30 and c0 5 of 90 times; ERM
    their share of the training cases, the 10 of the kept subgroup table)."""
    runs, record = tmp_path / "results", tmp_path / "record"
    arms = {"ERM": ("nnUNetTrainer_CPUBudget", 0.0), "DROAdaptive": ("DROTrainer", 6.0)}
    _stored_seed(runs, 3, arms, noisy=("c8", "c0"))
    common = ["--seeds", "3,", "--arms", ",".join(arms), "--label-noise", "2", "--report-only"]
    assert bench.main(common + ["-o", str(runs), "--export-record", str(record)]) == 0
    assert (record / "runs" / "seed_3" / "label_noise.json").is_file()
    assert bench.main(common + ["-o", str(record)]) == 0
    for folder in (runs, record):
        shares = pd.read_csv(folder / "runs.csv").set_index("arm")["noisy_draw_share"]
        assert shares["DROAdaptive"] == pytest.approx(35 / 90) and shares["ERM"] == pytest.approx(2 / 10)
        assert "## Label noise: are the noisy cases chased?" in (folder / "summary.md").read_text()


def test_export_record_into_the_output_folder_is_refused(bench, tmp_path, capsys):
    code = bench.main(["--seeds", "1", "--report-only", "-o", str(tmp_path), "--export-record", str(tmp_path)])
    assert code == 2 and "--export-record" in capsys.readouterr().err


def test_erm_alone_reports_its_tables_and_no_comparison(bench, tmp_path, capsys):
    """ERM alone (to see which seeds have a tight budget before any DRO run) reports its own
    statistics; the paired table is empty with its columns (was: KeyError 'method')."""
    _stored_seed(tmp_path, 5, {"ERM": ("nnUNetTrainer_CPUBudget", 0.0)})
    assert bench.main(["--seeds", "5,", "--arms", "ERM", "--report-only", "-o", str(tmp_path)]) == 0
    paired = pd.read_csv(tmp_path / "paired.csv")
    assert len(paired) == 0 and {"method", "d_p10", "pooled_holm_p"} <= set(paired.columns)
    assert len(pd.read_csv(tmp_path / "summary.csv").query("method == 'ERM'")) == 12  # 4 groups x 3 regions
    assert "every structure's pseudo-Dice >= 0.2 from epoch 40 of 120" in capsys.readouterr().out


def test_further_scorings_are_reported_and_kept_in_the_record(bench, tmp_path):
    """Stored larger-test and new-centre Dice get their own headline and p10 intervals (the hardest
    structures are still chosen on the main test set), stored training-case Dice the fit table, and
    the record keeps them all, so --report-only on the record re-makes the same tables."""
    runs, record = tmp_path / "results", tmp_path / "record"
    arms = {"ERM": ("nnUNetTrainer_CPUBudget", 0.0), "DROAdaptive_fromStart": ("DROTrainer", 3.0)}
    for seed in (3, 4):
        _stored_seed(runs, seed, arms, large_test=True)
    common = ["--seeds", "3,4", "--arms", ",".join(arms), "--report-only"]
    assert bench.main(common + ["-o", str(runs), "--export-record", str(record)]) == 0
    text = (runs / "summary.md").read_text()
    large = text[text.index("## On a larger test set"):]
    assert "control 40, spina_bifida 40, other 40 cases" in large
    assert "### Is a seed's p10 difference" in large
    # the Dice targets judged again on the larger test set: +3 in every seed is under the +5 asked for
    assert ("- DROAdaptive_fromStart: spina_bifida p10 on its hardest structure (cerebellum) +3.0 vs ERM [++] "
            "-> not met") in large
    assert "### Dice targets on the larger test set" in large and "collapsed epochs" not in large.split("## Fit")[0]
    intervals = pd.read_csv(runs / "p10_intervals_large_test.csv")
    # every minority case +3 in the DRO arm: the interval of each seed collapses onto +3
    assert intervals["d_p10"].to_numpy() == pytest.approx(3.0) and set(intervals["resolved"]) == {"+"}
    fit = pd.read_csv(runs / "training_fit.csv").set_index(["method", "seed", "group"])
    assert "## Fit on the training cases" in text and len(fit) == 2 * 2 * 2  # arms x seeds x minorities
    assert fit.loc[("ERM", 3, "spina_bifida"), "training_mean"] == pytest.approx(70.0)
    assert fit.loc[("DROAdaptive_fromStart", 3, "spina_bifida"), "training_mean"] == pytest.approx(73.0)
    assert (record / "runs/seed_3/large_test.json").is_file()
    assert (record / "runs/seed_4/arms/ERM/per_case_large_test.csv").is_file()
    assert (record / "runs/seed_4/arms/ERM/per_case_training.csv").is_file()
    # the new centre: its own section and intervals, where the lift is +6, and kept in the record
    shifted = text[text.index("## At the new centre"):]
    assert "acquired at site_C" in shifted and "### Dice targets at the new centre" in shifted
    assert pd.read_csv(runs / "p10_intervals_shifted_test.csv")["d_p10"].to_numpy() == pytest.approx(6.0)
    assert (record / "runs/seed_3/shifted_test.json").is_file()
    assert (record / "runs/seed_4/arms/ERM/per_case_shifted_test.csv").is_file()
    assert bench.main(common + ["-o", str(record)]) == 0
    for table in ("per_case_large_test.csv", "p10_intervals_large_test.csv", "training_fit.csv",
                  "per_case_shifted_test.csv", "p10_intervals_shifted_test.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(record / table), pd.read_csv(runs / table))


def test_also_against_pairs_every_arm_with_a_rerun_as_well(bench, tmp_path):
    """--also-against ARM,ARM: every arm's p10 intervals against each of several other arms (runs trained
    under the same conditions), on the test cases and the larger test set, beside the intervals
    against ERM; a seed where ARM did not run gives no row."""
    arms = {"ERM": ("nnUNet_CPUBudget", 0.0), "ERM_repeat": ("nnUNetTrainer_CPUBudget_repeat", 2.0),
            "DROAdaptive": ("DROTrainer", 5.0)}
    _stored_seed(tmp_path, 3, arms, large_test=True)
    _stored_seed(tmp_path, 4, {arm: arms[arm] for arm in ("ERM", "DROAdaptive")}, large_test=True)
    common = ["--seeds", "3,4", "--arms", ",".join(arms), "--report-only", "-o", str(tmp_path)]
    assert bench.main(common + ["--also-against", "ERM_repeat,DROAdaptive"]) == 0
    large = pd.read_csv(tmp_path / "p10_intervals_large_test_vs_ERM_repeat.csv")
    # every minority case of the larger test set is shifted by the arm's lift: exact differences
    assert set(large["seed"]) == {3} and set(large["method"]) == {"ERM", "DROAdaptive"}
    by_arm = large.groupby("method")["d_p10"]
    assert by_arm.min()["DROAdaptive"] == pytest.approx(3.0) == by_arm.max()["DROAdaptive"]
    assert by_arm.min()["ERM"] == pytest.approx(-2.0) == by_arm.max()["ERM"]
    assert set(pd.read_csv(tmp_path / "p10_intervals_vs_ERM_repeat.csv")["seed"]) == {3}
    text = (tmp_path / "summary.md").read_text()
    section = text[text.index("## Against ERM_repeat, paired like ERM"):]
    assert "### On the test cases" in section and "### On the larger test set" in section
    assert "paired p10 difference to ERM_repeat" in section
    assert "## Against DROAdaptive, paired like ERM" in section
    second = pd.read_csv(tmp_path / "p10_intervals_large_test_vs_DROAdaptive.csv").groupby(["method", "seed"])["d_p10"]
    assert second.min().to_dict() == pytest.approx({("ERM", 3): -5.0, ("ERM", 4): -5.0, ("ERM_repeat", 3): -3.0})
    # the intervals against ERM are unchanged beside it
    assert set(pd.read_csv(tmp_path / "p10_intervals_large_test.csv")["method"]) == {"ERM_repeat", "DROAdaptive"}


@pytest.mark.parametrize("against", ["ERM", "JTT", "DROAdaptive,JTT", "DROAdaptive,DROAdaptive"])
def test_also_against_needs_other_arms_of_the_run(bench, tmp_path, capsys, against):
    code = bench.main(["--seeds", "1", "--arms", "ERM,DROAdaptive", "--report-only", "-o", str(tmp_path),
                       "--also-against", against])
    err = capsys.readouterr().err
    assert code == 2 and f"--also-against {against!r}" in err and "DROAdaptive" in err
    assert len(err.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_large_test_needs_the_trained_network(tmp_path):
    """A record keeps no checkpoint: scoring a larger test set from it is refused, naming the folder."""
    from nnunet_dro.lab.cohort_folder import Cohort
    from nnunet_dro.lab.pipeline import Workspace

    ws = Workspace(tmp_path, 991, "SyntheticFetalBenchmark", Cohort(5, 1, 16, 0), echo=lambda text: None)
    with pytest.raises(UserError, match="no checkpoint_final.pth to score the large_test cases"):
        ws.arms.score_further("ERM", "nnUNetTrainer_CPUBudget", "large_test", 992)


@pytest.mark.parametrize("training, test, expected", [
    # (training Dice, test Dice) of one group's hardest structure -> (training mean, test mean)
    ([80.0, 90.0], [60.0, 70.0], (85.0, 65.0)),       # fitted, not generalised
    ([70.0, 70.0], [70.0, 70.0], (70.0, 70.0)),       # as low on its own training cases
    ([100.0, float("nan")], [50.0, 50.0], (100.0, 50.0)),  # NaN (no score) does not count
])
def test_training_fit_sets_training_beside_test(bench, training, test, expected):
    def table(values, prefix):
        return pd.DataFrame([dict(method="ERM", seed=0, case=f"{prefix}{k}", region="cerebellum", value=v,
                                  condition="spina_bifida") for k, v in enumerate(values)])
    fit = bench.training_fit(table(training, "tr"), table(test, "ts"), {"spina_bifida": "cerebellum",
                                                                         "other": "intra_axial_csf"})
    assert len(fit) == 1  # the "other" group has no cases here: no row
    row = fit.iloc[0]
    assert (row["training_mean"], row["test_mean"]) == pytest.approx(expected)
    assert row["n_training"] == sum(v == v for v in training)
    assert bench.training_fit_section(fit.iloc[:0]) == []


def test_the_script_is_a_thin_entry_point_to_the_module():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--report-only" in proc.stdout and "--export-record" in proc.stdout
    assert len(SCRIPT.read_text().splitlines()) < 30



@pytest.mark.slow
def test_a_seed_folder_restored_from_a_record_gets_its_label_noise_again(tmp_path):
    """A record keeps label_noise.json but not the raw images: when the cohort is generated again
    (an arm added to a recorded seed), the same cases are corrupted again, not left clean; a record
    that names other cases than the seed gives is refused, and the next attempt generates afresh."""
    import nibabel as nib

    from nnunet_dro.lab.cohort_folder import Cohort
    from nnunet_dro.lab.pipeline import Workspace

    def labels(ws, cases):
        return {case: np.asarray(nib.load(str(ws.cohort_folder.raw / "labelsTr" / f"{case}.nii.gz")).dataobj) for case in cases}

    cohort = Cohort(n_train=10, n_test=6, size=16, seed=0, label_noise=2)
    ws = Workspace(tmp_path / "seed_0", 991, "SyntheticFetalBenchmark", cohort, echo=lambda text: None)
    ws.cohort_folder.prepare()
    record = ws.cohort_folder.folder / "label_noise.json"
    noisy = [row["case"] for row in json.loads(record.read_text())]
    corrupted = labels(ws, noisy)

    kept = record.read_text()
    for path in ws.cohort_folder.raw.iterdir():  # what a record keeps of the raw folder: its subgroup table
        if path.name != "subgroups.tsv":
            path.unlink() if path.is_file() else shutil.rmtree(path)
    ws.cohort_folder.prepare()
    assert record.read_text() == kept and not (ws.cohort_folder.folder / "label_noise.json.new").exists()
    for case, seg in labels(ws, noisy).items():
        assert np.array_equal(seg, corrupted[case]), case

    rows = json.loads(kept)
    rows[0]["case"] = "fetal_999"
    record.write_text(json.dumps(rows))
    (ws.cohort_folder.raw / "dataset.json").unlink()
    with pytest.raises(UserError, match="label_noise.json"):
        ws.cohort_folder.prepare()
    assert not (ws.cohort_folder.raw / "dataset.json").is_file() and json.loads(record.read_text()) == rows


@pytest.fixture(scope="module")
def shared_run(bench, tmp_path_factory):
    """One small real benchmark run that the end-to-end checks below share (train once, assert
    many): a cohort of 10 training cases with two labels corrupted (one minority, one control), the
    test cases clean. Two benchmark processes start together on one folder: this one trains ERM and
    Just Train Twice, a second one (``--train-only``, ERM not among its arms) the default DRO trainer
    and nnU-Net's own TopK10 loss, with one torch thread each. A third run with all four arms
    predicts and reports without training anything again, scores the networks on a larger test set
    and on their own training cases, and exports the record."""
    from nnunet_dro.lab import arm_runs

    tmp = tmp_path_factory.mktemp("shared_benchmark_run")
    out, record = tmp / "bench", tmp / "record"
    common = ["--seeds", "1", "--epochs", "1", "--iterations", "2", "--n-train", "10", "--n-test", "6",
              "--size", "16", "--label-noise", "2", "--torch-threads", "1", "-o", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        # after one epoch of two iterations every case's worst region scores 0, so the recorded rule
        # (worst-dice) ties every case and `jtt` rightly refuses; the mean Dice separates them
        patch.setitem(arm_runs.JTT_SETTINGS, "rule", "mean-dice")
        patch.setenv("nnUNet_n_proc_DA", "0")
        log = tmp / "second_process.log"  # a file, not a pipe: a full pipe would stall the process
        with open(log, "w") as sink:
            other = subprocess.Popen([sys.executable, str(SCRIPT), *common, "--arms", "DROAdaptive,TopK10",
                                      "--train-only"], text=True, stdout=sink, stderr=subprocess.STDOUT)
            try:
                with contextlib.redirect_stdout(io.StringIO()) as printed:
                    first_code = bench.main([*common, "--arms", "ERM,JTT"])
            finally:
                other.wait(timeout=900)
        other_output = log.read_text()
        with contextlib.redirect_stdout(io.StringIO()) as reported:
            report_code = bench.main([*common, "--arms", "ERM,DROAdaptive,TopK10,JTT", "--large-test", "3",
                                      "--training-fit", "--export-record", str(record)])
    return SimpleNamespace(out=out, record=record, common=common, seed=out / "runs" / "seed_0",
                           codes=(first_code, other.returncode, report_code),
                           outputs=(printed.getvalue(), other_output), report=reported.getvalue())


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_processes_train_the_arms_of_one_seed_side_by_side(shared_run):
    """The preparation lock lets one process make and preprocess the cohort, the other waits and
    reuses it (one cohort in the command said once); each trains its own arms on it; the report run
    trains nothing again."""
    assert shared_run.codes == (0, 0, 0), shared_run.outputs
    first, second = shared_run.outputs
    assert "DROAdaptive: trained" in second and "TopK10: trained" in second and "## " not in second
    said = first + second
    assert said.count("  cohort: 10 train") == 1 and said.count("  nnUNetv2_plan_and_preprocess") == 1
    assert all("nnUNetv2_train 991" in text for text in shared_run.outputs)
    assert (shared_run.seed / "arms" / "DROAdaptive" / "train_seconds.txt").is_file()
    assert "nnUNetv2_train" not in shared_run.report  # nothing trained again
    runs = pd.read_csv(shared_run.out / "runs.csv")
    assert set(runs["arm"]) == {"ERM", "DROAdaptive", "TopK10", "JTT"}
    assert (runs["augmentation_processes"] == 0).all()  # nnUNet_n_proc_DA of the runs, on the record


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_smoke_run_with_label_noise_and_nnunet_alternatives(shared_run):
    """The label noise (two training cases, one minority, one control, the test cases clean) and the
    report's share of draws on the noisy cases per arm; Just Train Twice's two stages."""
    assert shared_run.codes == (0, 0, 0), shared_run.outputs
    seed = shared_run.seed
    _check_jtt_arm(seed, shared_run.record, shared_run.outputs[0])
    noisy = json.loads((seed / "label_noise.json").read_text())
    groups = pd.read_csv(seed / "nnunet" / "nnUNet_raw" / "Dataset991_SyntheticFetalBenchmark" / "subgroups.tsv",
                         sep="\t").set_index("case")["condition"]
    assert [r["kind"] for r in noisy] == ["erase", "swap"]
    assert sorted(groups[r["case"]] == "control" for r in noisy) == [False, True]
    report = (shared_run.out / "summary.md").read_text()
    assert "## Label noise: are the noisy cases chased?" in report
    runs = pd.read_csv(shared_run.out / "runs.csv").set_index("arm")
    assert runs.loc["ERM", "noisy_draw_share"] == pytest.approx(2 / 10)
    assert 0 <= runs.loc["DROAdaptive", "noisy_draw_share"] <= 1 and runs.loc["TopK10", "noisy_cases"] == 2


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_further_scorings_of_the_shared_run(shared_run):
    assert shared_run.codes == (0, 0, 0), shared_run.outputs
    _check_further_scorings(shared_run.out)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_folder_holding_one_cohort_refuses_another(bench, shared_run, capsys):
    """A clean cohort in the noisy cohort's folder, and another size of larger test set, are refused."""
    assert shared_run.codes == (0, 0, 0), shared_run.outputs
    at = shared_run.common.index("--label-noise")
    clean = shared_run.common[:at] + shared_run.common[at + 2:]
    assert "--label-noise" not in clean and len(clean) == len(shared_run.common) - 2
    capsys.readouterr()
    assert bench.main([*clean, "--arms", "ERM"]) == 2
    assert "label_noise" in capsys.readouterr().err
    assert bench.main([*shared_run.common, "--arms", "ERM", "--large-test", "4"]) == 2
    assert "larger test set was drawn as" in capsys.readouterr().err


def _check_jtt_arm(seed: Path, record: Path, printed: str, n_train: int = 10) -> None:
    """Just Train Twice's two stages: the ERM network scored on its own training cases, its worst
    fifth by mean region Dice (the rule ``shared_run`` sets) up-weighted with every case tied at the
    boundary, a second training in its own folder reading that table, and the table kept in the record."""
    from nnunet_dro.lab.arm_runs import JTT_SETTINGS
    from nnunet_dro.workflows.jtt import TIE_TOLERANCE

    fit = pd.read_csv(seed / "arms" / "ERM" / "per_case_training.csv", dtype={"case": str})
    score = fit.dropna(subset=["value"]).groupby("case")["value"].mean()
    assert len(score) == n_train
    table_file = seed / "arms" / "JTT" / "case_weights.tsv"
    table = pd.read_csv(table_file, sep="\t", dtype={"case": str})
    assert sorted(table["case"]) == sorted(score.index)
    chosen = set(table.loc[table["weight"] == JTT_SETTINGS["upweight"], "case"])
    # the fifth asked for, and every case tied with the last of it (nnunet_dro.workflows.jtt: after an
    # epoch of two iterations several cases can share a mean Dice of 0)
    asked = int(np.ceil(JTT_SETTINGS["fraction"] * n_train))
    boundary = score.sort_values().iloc[asked - 1]
    assert chosen == set(score.index[score <= boundary + TIE_TOLERANCE]) and len(chosen) >= asked
    assert set(table["weight"]) == {1.0, JTT_SETTINGS["upweight"]}
    assert "error set of the ERM network on its training cases" in printed
    result = json.loads((seed / "arms" / "JTT" / "result.json").read_text())
    assert (result["trainer"], result["plans"]) == ("nnUNetTrainerCaseWeights_CPUBudget", "nnUNetPlans_JTT")
    fold = (seed / "nnunet" / "nnUNet_results" / "Dataset991_SyntheticFetalBenchmark"
            / "nnUNetTrainerCaseWeights_CPUBudget__nnUNetPlans_JTT__3d_fullres" / "fold_all")
    assert f"case weights from {table_file}" in next(fold.glob("training_log_*.txt")).read_text()
    assert (record / "runs" / seed.name / "arms" / "JTT" / "case_weights.tsv").read_text() == table_file.read_text()


@pytest.mark.slow
def test_exclude_flagged_trains_without_the_cases_the_audit_flags(bench, tmp_path, capsys):
    """--exclude-flagged: after the label noise the audit (within condition) takes its flagged cases
    out of the raw dataset before preprocessing; every arm trains on what is left, the test cases
    are kept, the report's uniform share counts the cases trained on, and a seed folder restored
    from a record takes out the same cases again (a record naming others is refused)."""
    from nnunet_dro.lab.cohort_folder import AUDIT_EXCLUDED_RECORD, Cohort
    from nnunet_dro.lab.pipeline import Workspace

    out, record = tmp_path / "bench", tmp_path / "record"
    cohort = Cohort(n_train=30, n_test=6, size=16, seed=0, label_noise=3, exclude_flagged=True)
    ws = Workspace(out / "runs" / "seed_0", 991, "SyntheticFetalBenchmark", cohort, echo=lambda text: None)
    ws.cohort_folder.prepare()
    noise = json.loads((ws.cohort_folder.folder / "label_noise.json").read_text())
    excluded = json.loads((ws.cohort_folder.folder / AUDIT_EXCLUDED_RECORD).read_text())
    erased = [r["case"] for r in noise if r["kind"] == "erase"]
    gone = {r["case"] for r in excluded}
    assert erased and set(erased) <= gone  # the erased structure is what the audit finds
    trained = {p.name[:-len(".nii.gz")] for p in (ws.cohort_folder.raw / "labelsTr").iterdir()}
    assert not gone & trained and len(trained) == 30 - len(gone)
    assert not any(p.name.startswith(tuple(f"{c}_" for c in gone)) for p in (ws.cohort_folder.raw / "imagesTr").iterdir())
    assert len(list((ws.cohort_folder.raw / "labelsTs").iterdir())) == 6  # the test cases are kept
    assert json.loads((ws.cohort_folder.raw / "dataset.json").read_text())["numTraining"] == len(trained)
    assert set(ws.cohort_folder.training_groups()["case"]) == trained and ws.cohort_folder.is_preprocessed()
    assert ws.cohort_folder.noisy_cases() == [r["case"] for r in noise if r["case"] not in gone]

    args = ["--seeds", "1", "--arms", "ERM", "--epochs", "1", "--iterations", "2", "--n-train", "30", "--n-test", "6",
            "--size", "16", "--label-noise", "3", "--exclude-flagged", "-o", str(out), "--export-record", str(record)]
    assert bench.main(args) == 0
    runs = pd.read_csv(out / "runs.csv").set_index("arm")
    assert runs.loc["ERM", "training_cases"] == len(trained)
    assert runs.loc["ERM", "noisy_draw_share"] == pytest.approx(len(ws.cohort_folder.noisy_cases()) / len(trained))
    assert (record / "runs" / "seed_0" / AUDIT_EXCLUDED_RECORD).read_text() == (ws.cohort_folder.folder / AUDIT_EXCLUDED_RECORD).read_text()
    capsys.readouterr()
    assert bench.main([a for a in args if a != "--exclude-flagged"][:-2]) == 2  # the folder holds the audited cohort
    assert "exclude_flagged" in capsys.readouterr().err

    kept = (ws.cohort_folder.folder / AUDIT_EXCLUDED_RECORD).read_text()
    shutil.rmtree(ws.cohort_folder.folder / "nnunet")  # what a restored record lacks: the raw images, the preprocessed data
    ws.cohort_folder.prepare()
    assert (ws.cohort_folder.folder / AUDIT_EXCLUDED_RECORD).read_text() == kept
    assert {p.name[:-len(".nii.gz")] for p in (ws.cohort_folder.raw / "labelsTr").iterdir()} == trained
    rows = json.loads(kept)
    rows[0]["case"] = "fetal_999"
    (ws.cohort_folder.folder / AUDIT_EXCLUDED_RECORD).write_text(json.dumps(rows))
    shutil.rmtree(ws.cohort_folder.folder / "nnunet")
    with pytest.raises(UserError, match=AUDIT_EXCLUDED_RECORD):
        ws.cohort_folder.prepare()
    assert not (ws.cohort_folder.raw / "dataset.json").is_file()


def test_train_only_and_report_only_together_are_refused(bench, tmp_path, capsys):
    assert bench.main(["--arms", "DROAdaptive", "--train-only", "--report-only", "-o", str(tmp_path)]) == 2
    assert "choose one" in capsys.readouterr().err


def _check_further_scorings(out: Path) -> None:
    """The trained networks scored again (the report run of ``shared_run``): a larger test set drawn
    apart from the cohort, and the arms' own training cases. The trainings ran with one torch thread (``--torch-threads 1``; nnU-Net alone
    would give them every core), as their logs say."""
    seed = out / "runs" / "seed_0"
    logs = list((seed / "nnunet" / "nnUNet_results").rglob("training_log_*.txt"))
    assert len(logs) == 4 and all("torch threads 1, seed 0" in log.read_text() for log in logs)
    training = pd.read_csv(seed / "arms" / "ERM" / "per_case_training.csv")
    assert training["case"].nunique() == 10 and training["value"].between(0, 100).all()
    summary = (out / "summary.md").read_text()
    assert "## Fit on the training cases" in summary and "## On a larger test set" in summary
    for arm in ("ERM", "DROAdaptive"):
        scored = pd.read_csv(seed / "arms" / arm / "per_case_large_test.csv")
        assert scored.groupby("condition")["case"].nunique().to_dict() == {"control": 3, "other": 3,
                                                                           "spina_bifida": 3}
        assert set(scored["region"]) == {"white_matter", "intra_axial_csf", "cerebellum"}
        assert scored["value"].between(0, 100).all()
    main_cases = set(pd.read_csv(seed / "arms" / "ERM" / "per_case.csv")["case"])
    assert len(main_cases) == 6 and json.loads((seed / "large_test.json").read_text())["seed"] == 1_000_000
